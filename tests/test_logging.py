"""`report_to: tensorboard` works offline: a tiny GRPO run writes an event file with the reward curve in it.

tensorboard is in the `dev` extra (and the `tensorboard` one), so CI runs this; nothing here reaches a network."""

import os

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
