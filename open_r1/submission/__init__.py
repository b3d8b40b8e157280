"""The submission: export a trained run (`export`, open-r1-export), verify a model dir the way the grader loads it
(`verify`), read and compare selfcheck reports (`report`), promote a better-scoring candidate (`promote`,
open-r1-promote), and the one installer every command that replaces a directory uses (`install`: export, promote,
the captioning data preparation and stages, model saving, the tiny models).

What the installer guarantees (each point has a CPU test in tests/test_install.py, tests/test_faults.py or
tests/test_bad_input.py):

- **A wrong path is refused before anything is written** (`check_target`): a target that is, contains or lies inside
  an input of the command, that is or contains the run dir (a submission inside it is fine), that is or contains the
  repo, / or $HOME, or that cannot be written, is one error naming both paths. An existing non-empty dir is replaced
  only when it is of the command's own kind (a saved model for export and promote, a prepared data set by its
  prepare_report.json), unless `--force`.
- **Complete at every instant.** The new dir is written into `.<name>.tmp-*` beside the target, given modes
  0755/0644 (a grader running as another user reads it), then swapped in by one atomic renameat2(RENAME_EXCHANGE),
  or two renames where the file system cannot, with SIGINT/SIGTERM held back. If the second rename fails, the old
  dir is put back and one line says so.
- **One installer per target at a time.** `.<name>.lock` beside the target is held (flock) from the moment a
  command reads what is there (promote: the current report) until its install ends; a second command on the same
  target is refused with one line naming the holder's pid. The kernel frees the lock of a killed process.
- **A kill is recovered.** The lock file journals the swap; the next command on that path (export, promote,
  selfcheck, or any installer) finishes the swap or undoes it and says which, and removes the staging dirs of
  installs that died. Nothing verified is lost: a model killed before its swap is kept as `<target>.candidate-*`.
- **A signal restores, never deletes.** Under `run_cli` SIGINT/SIGTERM unwind a command until its new dir is in
  place: the target is as it was, the partial staging dir removed, a verified model kept as a candidate. A signal
  after that has nothing left to stop: status 0 (`exit_cli` also ignores one during the interpreter's exit).
- **A full disk is one line**: `<what> failed: No space left on device (<file>); <target> is unchanged`.
- **Replaced models are kept** beside the target (export: `.prev-*`, promote: `.replaced-*`); other dirs (data,
  stage outputs, tiny models) are replaced only after the new one is complete.
"""
