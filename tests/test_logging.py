"""Logging: `report_to: tensorboard` works offline (a tiny GRPO run writes an event file with the reward curve in it);
the log records of every entry point (`open_r1.errors.setup_logging`) and one logger per module.

tensorboard is in the `dev` extra (and the `tensorboard` one), so CI runs this; nothing here reaches a network."""

import ast
import logging
import os
import re

import pytest

from open_r1 import grpo
from tests.test_grpo import recipe_args


def test_report_to_tensorboard_writes_the_reward_curve(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    argv = recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--max_steps", "2", "--report_to", "tensorboard")
    script_args, training_args, model_args, task = grpo.parse_args(argv)
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    trainer.train()

    run_dir = tmp_path / "run"
    events = [
        os.path.join(root, name)
        for root, _, names in os.walk(run_dir)
        for name in names
        if name.startswith("events.out.tfevents")
    ]
    assert events, f"no TensorBoard event file under {run_dir}"
    accumulator = EventAccumulator(os.path.dirname(events[0]))
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    assert "train/reward" in tags, tags
    assert [event.step for event in accumulator.Scalars("train/reward")] == [1, 2]


def test_sample_completions_are_one_short_line():
    from open_r1.tasks import one_line

    noisy = "\n\n" + "<|reserved_7|>" * 150 + "\n Toward Toward Toward Toward"
    line = one_line(noisy)
    assert "\n" not in line and len(line) <= 82, line
    assert "x150" in line and "Toward ... x4" in line
    assert one_line("<think>3</think> <answer>3</answer>") == repr("<think>3</think> <answer>3</answer>")
    assert one_line(None) == "None"


def test_verify_strict_on_an_unparseable_answer_says_it_loads_and_runs(tiny_model_dir, tmp_path, capsys):
    """The random tiny model loads and generates, but never a parseable answer: --strict fails, and says so, not
    'would not load or run'."""
    import selfcheck
    from open_r1.submission import export

    out = tmp_path / "submission"
    export.export_submission(str(tiny_model_dir), str(out))
    assert selfcheck.main(["--verify", "--strict", "--model", str(out)]) == 1
    err = capsys.readouterr().err
    assert "FAIL (--strict)" in err and "loads as Qwen2VLForConditionalGeneration and generates" in err, err
    assert "would not load or run" not in err
    assert all(len(line) < 400 for line in err.splitlines()), err
    assert selfcheck.main(["--verify", "--model", str(out)]) == 0  # without --strict: a warning, then OK
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("OK: ") and len(lines) == 2 and lines[0].startswith("warning: "), lines
    assert all(len(line) < 400 for line in lines), lines


@pytest.fixture
def restored_logging():
    """setup_logging configures the process: put the root's handlers and the project's levels back afterwards."""
    root, names = logging.getLogger(), ("open_r1", "standin", "experiments", "__main__")
    handlers, level, levels = root.handlers[:], root.level, {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, saved in levels.items():
        logging.getLogger(name).setLevel(saved)


def test_setup_logging_shows_the_projects_info_on_stderr_and_of_libraries_and_other_ranks_only_warnings(
    capsys, monkeypatch, restored_logging
):
    from open_r1.errors import setup_logging

    def emit():
        logging.getLogger("open_r1.run.resume").info("[resume] resuming")
        logging.getLogger("standin.captioning.stage_data").info("[data] reusing")
        logging.getLogger("a_library.module").info("library chatter")
        logging.getLogger("a_library.module").warning("library warning")
        logging.getLogger("open_r1.run.disk").warning("[disk] warning: short of space")
        return capsys.readouterr()

    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    setup_logging()
    out, err = emit()
    assert out == ""  # records never mix into a command's printed product
    lines = err.splitlines()
    assert all(re.fullmatch(r"\[\d\d:\d\d:\d\d\] .+", line) for line in lines), lines
    assert [line[11:] for line in lines] == [
        "[resume] resuming",
        "[data] reusing",
        "library warning",
        "[disk] warning: short of space",
    ]
    monkeypatch.setenv("LOCAL_RANK", "1")  # a second process of a multi-GPU run
    setup_logging()
    assert [line[11:] for line in emit().err.splitlines()] == ["library warning", "[disk] warning: short of space"]


def test_no_module_prints_its_own_log_lines():
    """One way to log: `logging.getLogger(__name__)`. No module defines a print-based logger (a `log` / `_log`
    function that prints, a module-level `log = ...`) or passes one around as a `log=` parameter."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for folder in ("open_r1", "standin", "experiments"):
        for directory, _, names in os.walk(os.path.join(root, folder)):
            for name in filter(lambda n: n.endswith(".py"), names):
                path = os.path.join(directory, name)
                tree = ast.parse(open(path).read())
                where = os.path.relpath(path, root)
                for node in tree.body:
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    if any(isinstance(t, ast.Name) and t.id in ("log", "_log") for t in targets):
                        found.append(f"{where}:{node.lineno} assigns a module-level log")
                    if isinstance(node, ast.FunctionDef) and "log" in node.name:
                        if any(
                            isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print" for n in ast.walk(node)
                        ):
                            found.append(f"{where}:{node.lineno} {node.name} prints")
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        params = node.args.args + node.args.kwonlyargs
                        if any(arg.arg == "log" for arg in params):
                            found.append(f"{where}:{node.lineno} {node.name} takes a log= parameter")
    assert not found, found
