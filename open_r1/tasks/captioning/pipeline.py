"""The humor-r1 chain in one process: trace synthesis -> SFT + merge -> RM (+ blind RM) -> GRPO x seeds -> best-of-N
evaluation, on prepared data (``open-r1-caption-prepare``), with one results folder.

    open-r1-caption --config configs/captioning/real_qwen3vl2b.yaml --out $OUT
    python -m standin.captioning.demo --config configs/captioning/standin_demo.yaml     # make humor-demo

A stage is a module (``stage_<name>.py``: its section's ``Config`` or ``parse``, ``inputs``, ``outputs``, ``run``,
optionally ``check``, ``markdown``, ``TAKES``) whose functions take ``recipe.args(stage)``: its own section, the
paths, the seed and what ``TAKES`` names of other sections (synthesize: ``sft.top_k``); `main` takes the ordered
stages, so the stand-in runs its own around these.
Every section is parsed and every run stage's inputs checked before any stage runs; ``--stages`` runs a subset.
Results: ``<work_dir>/results/pipeline.json`` and ``results.md``; ``--out DIR`` copies the small result files there.
"""

import dataclasses
import logging
import os
import shutil
import signal
import sys
import time

from open_r1.errors import OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.jsonio import read_json, write_json, write_text
from open_r1.tasks.captioning import config, stage_eval, stage_grpo, stage_rm, stage_sft, stage_synthesize

logger = logging.getLogger(__name__)

STAGES = (stage_synthesize, stage_sft, stage_rm, stage_grpo, stage_eval)


def outputs(recipe, stage) -> list[str]:
    return stage.outputs(*recipe.args(stage)) if hasattr(stage, "outputs") else []


def preflight(recipe, stages, run: list[str]) -> None:
    """Each run stage's own checks, and its inputs on disk or written by a stage that runs before it: a chain whose
    work_dir is gone fails at once naming the stage to run, not minutes in."""
    makers = {path: stage.NAME for stage in stages for path in outputs(recipe, stage)}
    produced = []
    for stage in stages:
        if stage.NAME in run:
            args = recipe.args(stage)
            if hasattr(stage, "check"):
                stage.check(*args)
            config.check_inputs(stage.inputs(*args), produced, makers)
            produced += outputs(recipe, stage)


def run_pipeline(recipe, stages=STAGES, run: list[str] | None = None, out: str | None = None, runner=None) -> dict:
    """Run the `run` stages (default: all) of `stages` in order; `runner(stage) -> (start time, result)` (default:
    the stage's `run`; the stand-in's runs sub-jobs as processes)."""
    import torch  # deferred: heavy

    run = [stage.NAME for stage in stages] if run is None else list(run)
    runner = runner or (lambda stage: (time.time(), stage.run(*recipe.args(stage))))
    preflight(recipe, stages, run)  # before anything is written into the work_dir
    paths = recipe.paths
    summary_path = os.path.join(paths.results, "pipeline.json")
    summary = read_json(summary_path, default=None) or {"stages": {}}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    summary.update(recipe=recipe.path, device=device)
    started = time.time()
    by_name = {stage.NAME: stage for stage in stages}
    for name in run:
        logger.info(f"[pipeline] stage {name} (elapsed {time.time() - started:.0f} s)")
        try:
            t0, result = runner(by_name[name])
        except KeyboardInterrupt:  # a stage installs its outputs whole or not at all: the finished ones stay
            left = " ".join(run[run.index(name) :])
            raise KeyboardInterrupt(f"stage {name} did not finish; continue with --stages {left}") from None
        summary["stages"][name] = {"seconds": time.time() - t0, "result": result}
        write_json(summary_path, summary)
        if out:  # after every stage: a run cut short still returns what it measured
            write_results(summary, stages, paths, out)
    summary["total_seconds"] = time.time() - started
    write_json(summary_path, summary)
    logger.info(f"[pipeline] done in {summary['total_seconds']:.0f} s")
    print(write_results(summary, stages, paths, out))
    return summary


def results_markdown(summary: dict, stages=STAGES) -> str:
    blocks = summary.get("stages", {})
    seconds = sum(block.get("seconds", 0.0) for block in blocks.values())
    lines = [
        f"# humor-r1 pipeline results ({summary.get('device')})",
        "",
        f"recipe: `{summary.get('recipe')}`; stages {seconds:.0f} s in all (the last invocation "
        f"{summary.get('total_seconds', 0):.0f} s)",
        "",
        "| stage | seconds |",
        "|---|---|",
    ]
    lines += [f"| {name} | {block['seconds']:.1f} |" for name, block in blocks.items()]
    for stage in stages:
        result = (blocks.get(stage.NAME) or {}).get("result")
        if result and hasattr(stage, "markdown"):
            lines += stage.markdown(result)
    return "\n".join(lines) + "\n"


def write_results(summary: dict, stages, paths: config.Paths, out: str | None) -> str:
    """``results.md``, and with `out` the small result files copied there (flat, at most 7)."""
    markdown = results_markdown(summary, stages)
    write_text(os.path.join(paths.results, "results.md"), markdown)  # (makes the folder)
    if out:
        os.makedirs(out, exist_ok=True)
        splits = sorted(d for d in os.listdir(paths.results) if d.startswith("eval_"))
        files = ["pipeline.json", "results.md", *(f"{s}/bon_eval.json" for s in splits)]
        files += [f"{s}/bon_curve.png" for s in splits[:2]]
        for name in [f for f in files if os.path.isfile(os.path.join(paths.results, f))][:7]:
            shutil.copy(os.path.join(paths.results, name), os.path.join(out, name.replace("/", "_")))  # eval_x_...
    return markdown


def recipe_help(stages, run_config: type = config.RunConfig) -> str:
    """Every recipe key: the top level's, then each section's, with its default and help (the dataclass fields)."""
    lines = []
    for where, cls in (
        ("", run_config),
        ("models.", config.Models),
        *((f"{s.NAME}.", getattr(s, "Config", getattr(s, "Settings", None))) for s in stages),
    ):
        for field in dataclasses.fields(cls):
            if field.init:
                default = field.default_factory() if callable(field.default_factory) else field.default
                lines.append(f"{where}{field.name} (default: {default!r}): {field.metadata.get('help', '')}")
    return "\n".join(lines) + "\ngrpo.*: any open_r1.grpo recipe key (open-r1-grpo --help-all)"


def main(argv=None, stages=STAGES, prog: str = "open-r1-caption", run=run_pipeline, run_config=config.RunConfig) -> int:
    """The CLI over `stages`; `run` (a runner) and `run_config` (the top-level keys): the stand-in's."""
    setup_logging()
    parser = cli_parser(prog, __doc__)
    parser.add_argument("--config", help="the recipe (configs/captioning/*.yaml); required but for --help-recipe")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a recipe key (repeatable), e.g. --set rm.max_seconds=60",
    )
    parser.add_argument(
        "--stages", nargs="+", choices=[stage.NAME for stage in stages], help="a subset, in order (none given: all)"
    )
    parser.add_argument("--help-recipe", action="store_true", help="list every recipe key with its default and help")
    parser.add_argument("--out", help="copy the small result files here")
    args = parser.parse_args(argv)
    if args.help_recipe:
        print(recipe_help(stages, run_config))
        return 0
    if not args.config:
        parser.error("the following arguments are required: --config")
    try:
        recipe = config.parse_recipe(args.config, args.set, stages, run_config)
        run(recipe, stages, args.stages, args.out)
    except OpenR1Error as exc:
        return error_exit(exc)
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, the status of a SIGINT
        print(f"error: interrupted; {exc or 'no stage had started'}", file=sys.stderr)
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
