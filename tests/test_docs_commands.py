"""Every command the README and the method pages name still runs: each `python -m`, script and console script
answers --help, each `make` target exists. Commands a page pins to an older commit (history) or that third-party
tools provide are listed below with the reason they are not run."""

from __future__ import annotations

import importlib
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"python3? -m ([A-Za-z0-9_.]+)|python3? ([A-Za-z0-9_/]+\.py)|(open-r1-[a-z-]+)|make ([a-z-]+)")
NOT_RUN = {
    "pip": "third party",
    "venv": "third party",
    "pytest": "third party",
    "experiments.proxy.sft_warmstart": "retired harness: the pages say which commit restores it",
    "experiments.proxy.proxy_experiment": "retired harness: the pages say which commit restores it",
    "experiments.proxy.pool_results": "retired harness: the pages say which commit restores it",
    "experiments.proxy.make_results": "retired harness: the pages say which commit restores it",
    "experiments.bench.profile_prefill": "a one-off run the page pins to commit 7454d52",
    "experiments.captioning.rescore_fail_as_worst": "a one-off run the page pins to commit 7454d52",
    "experiments.captioning.bench_prepare": "a one-off measurement the page pins to commit 5c62a8f426",
    "open-r1-vlm": "the project's name, not a command",
    "the": "prose ('make the ...')",
    "demo-gpu": "retired with the proxy harness: the page says which commit restores it",
}


def documented() -> dict[str, tuple[str, str]]:
    """{command: (kind, where)} of every command the pages name."""
    found = {}
    for page in PAGES:
        for match in COMMAND.finditer(page.read_text()):
            kind = ("module", "script", "console", "make")[[i for i, g in enumerate(match.groups()) if g][0]]
            found.setdefault(match.group(match.lastindex), (kind, page.name))
    return found


def test_the_pages_name_the_commands_and_the_exclusions_are_still_named():
    commands = documented()
    assert {"open_r1.grpo", "selfcheck.py", "open-r1-caption", "demo", "open_r1.tasks.counting.demo"} <= set(commands)
    assert not set(NOT_RUN) - set(commands), "an exclusion no page names any more: drop it"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: a module run again after an import of it
@pytest.mark.parametrize("command", sorted(c for c in documented() if c not in NOT_RUN))
def test_a_documented_command_answers_help(command, monkeypatch, capsys):
    kind, page = documented()[command]
    if kind == "make":
        assert re.search(rf"^{re.escape(command)}:", (ROOT / "Makefile").read_text(), re.M), (command, page)
        return
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit) as done:
        if kind == "console":
            import tomllib

            scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
            module, _, function = scripts[command].partition(":")
            raise SystemExit(getattr(importlib.import_module(module), function)(["--help"]))
        if kind == "script":
            runpy.run_path(str(ROOT / command), run_name="__main__")
        runpy.run_module(command, run_name="__main__", alter_sys=True)
    out = capsys.readouterr()
    assert done.value.code in (0, None), (command, page, out.err[-2000:])
    assert "usage" in (out.out + out.err).lower() or "--" in out.out, (command, page, out.out[-2000:])
