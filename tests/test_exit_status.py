"""selfcheck ends through export's exit path (`exit_cli`): a SIGTERM in the interpreter's exit (~1 s with torch
loaded) must not turn a finished check's exit status into a kill (-15). atexit handlers run inside that exit, so one
sends the signal at the right moment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNAL_AT_EXIT = (
    "import atexit, os, signal, sys, time\n"
    "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))\n"
    "sys.argv = ['selfcheck', '--verify', '--model', sys.argv[1]]\n"
)


def console_script(name: str) -> str:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        module, function = tomllib.load(handle)["project"]["scripts"][name].split(":")
    return f"from {module} import {function}; {function}()"


@pytest.mark.parametrize(
    "start",
    [
        "open-r1-selfcheck",
        "import runpy; runpy.run_path('selfcheck.py', run_name='__main__')",
        "import runpy; runpy.run_module('open_r1.tasks.counting.selfcheck', run_name='__main__')",
    ],
)
def test_a_signal_during_selfchecks_exit_keeps_its_status(tmp_path, start):
    code = SIGNAL_AT_EXIT + (console_script(start) if start.startswith("open-r1-") else start)
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "none")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"FAIL: {tmp_path / 'none'} would not load" in result.stderr  # the status of a finished check
