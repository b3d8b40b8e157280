"""Never lose a run: time budget (`budget`), graceful stop on SIGTERM/SIGINT (`signals`), in-training evaluation
(`evaluation`) with keep-best (`keep_best`), auto-resume (`resume`) and a disk-space check (`disk`), all as
`TrainerCallback`s; `safety` wires them from the recipe keys
(`build_run_callbacks`). Kept empty so that `open-r1-plot-run --help` (`keep_best`) answers without torch."""
