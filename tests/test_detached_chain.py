"""experiments/captioning/detached_chain.sh: a command detached in a copy of the tree, its end and files collected by
the same call's wait (the H200's commands end after 10 minutes; the chain runs on between them)."""
from __future__ import annotations

import os
import subprocess

SCRIPT = "experiments/captioning/detached_chain.sh"


def _call(tmp_path, *args):
    env = {**os.environ, "CHAIN_DIR": str(tmp_path / "chain"), "OUT": str(tmp_path / "out"), "WAIT": "120"}
    done = subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout, tmp_path / "out"


def test_exec_runs_in_a_copy_of_the_tree_and_collects_out_and_the_exit_status(tmp_path):
    stdout, out = _call(tmp_path, "exec", "test -f selfcheck.py && echo hi > out/x.txt && exit 3")
    assert stdout.splitlines()[0] == "rc=3"  # the command's own status, not the script's
    assert (out / "x.txt").read_text() == "hi\n" and (out / "chain_log.txt").is_file()
    assert (tmp_path / "chain" / "selfcheck.py").is_file()  # it ran in the copy, not in the checkout


def test_start_passes_pipeline_arguments_through_quoted(tmp_path):
    """A recipe error comes back as the pipeline's exit status and one line in the log; `[0, 1]` survives quoting."""
    stdout, out = _call(tmp_path, "start", "--config", "configs/captioning/standin_demo.yaml", "--set",
                        "rm.seeds=[0, 1]", "--set", "rm.max_second=1", "--stages", "data")
    assert stdout.splitlines()[0] == "rc=2"
    log = (out / "chain_log.txt").read_text()
    assert "unknown key(s) rm.max_second (did you mean rm.max_seconds?)" in log and "Traceback" not in log
