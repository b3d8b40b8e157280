"""Never lose a run, on the tiny Qwen2-VL on CPU: signal stop, kill + resume, too-short budget, keep-best export,
promote-only-improvements."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from open_r1 import grpo
from open_r1.errors import setup_logging
from open_r1.run import keep_best
from open_r1.tasks.counting.evaluate import SetReport, write_report
from tests.test_bad_input import FAST, assert_clean_error, fake_checkpoint, grpo_args, py, tree_digest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recipe(tiny_model_dir, scene_data_dir, run_dir, *extra):
    return [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_name",
        os.path.join(scene_data_dir, "train"),
        "--output_dir",
        str(run_dir),
        *FAST,
        *extra,
    ]


class StepCounter(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def train_in_process(argv, *callbacks):
    """`python -m open_r1.grpo` in this process: its log set up as the CLI does, onto the captured stderr."""
    setup_logging()
    script_args, training_args, model_args, task = grpo.parse_args(argv)
    return grpo.main(script_args, training_args, model_args, task, callbacks=list(callbacks))


class WeightsAtStart(TrainerCallback):
    """The model's weights when training (re)starts, after every resume hook has run."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_resumed_weights(probe, checkpoint, base_model_dir):
    from open_r1.modeling import load_model

    saved = load_model(str(checkpoint), dtype="float32").state_dict()
    base = load_model(str(base_model_dir), dtype="float32").state_dict()
    assert any(not torch.equal(saved[k], base[k]) for k in saved), "the checkpoint must differ from the base model"
    stale = [k for k in saved if not torch.equal(saved[k], probe.state_dict[k])]
    assert not stale, f"resumed weights differ from {checkpoint}: {stale[:3]}"


# The child trains with a reward that varies within each group (as tests/test_grpo.py does), so every step changes
# the weights and a resume that loses them is caught.
VARIED_REWARD_CLI = """
import sys
from open_r1 import grpo
from open_r1.errors import setup_logging
from open_r1 import rewards
from open_r1.tasks.counting.protocol import completion_text
def varied(completions, **kwargs):
    return [float(len(completion_text(c)) % 3) for c in completions]
varied.__name__ = "varied"
rewards.get_reward_funcs = lambda names, kwargs=None: [varied]
sys.exit(grpo.cli(sys.argv[1:]))
"""


class Child:
    """`python -m open_r1.grpo ...` (or a script) in a subprocess, its output collected line by line."""

    def __init__(self, argv, script=None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = ["-m", "open_r1.grpo"] if script is None else ["-c", script]
        self.proc = subprocess.Popen(
            [sys.executable, *command, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until(self, predicate, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                pytest.fail(f"child exited ({self.proc.returncode}) before the condition:\n{self.output[-4000:]}")
            time.sleep(0.05)
        self.proc.kill()
        pytest.fail(f"timed out waiting:\n{self.output[-4000:]}")

    def wait(self, timeout=180) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"child did not exit:\n{self.output[-4000:]}")
        self._reader.join(timeout=10)
        return code


def trainer_state(checkpoint) -> dict:
    return json.loads(open(os.path.join(checkpoint, "trainer_state.json")).read())


def readable_state(checkpoint) -> bool:
    try:
        trainer_state(checkpoint)
        return True
    except (OSError, ValueError):
        return False


# ---- SIGTERM, kill, resume --------------------------------------------------------------------------------------


def test_sigterm_saves_a_checkpoint_and_rerun_resumes_to_the_same_total_steps(
    tiny_model_dir, scene_data_dir, tmp_path, capfd
):
    run = tmp_path / "run"
    argv = recipe(tiny_model_dir, scene_data_dir, run, "--max_steps", "3", "--save_strategy", "no")
    child = Child(argv)
    child.wait_until(lambda: "[run] training in" in child.output)  # handlers are installed
    child.proc.send_signal(signal.SIGTERM)
    code = child.wait()
    out = child.output
    assert code == 128 + signal.SIGTERM, out[-4000:]
    assert "SIGTERM received" in out and "Traceback" not in out
    checkpoints = keep_best.complete_checkpoints(str(run))
    assert len(checkpoints) == 1, "save_strategy is 'no': the only checkpoint must come from the signal"
    stopped = trainer_state(checkpoints[0])["global_step"]
    assert 1 <= stopped < 3 and f"saving checkpoint-{stopped} and stopping" in out
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        assert os.path.isfile(os.path.join(checkpoints[0], name)), name
    assert json.loads((run / keep_best.BEST_FILE).read_text())["checkpoint"] == f"checkpoint-{stopped}"

    counter = StepCounter()
    trainer = train_in_process(argv, counter)
    err = capfd.readouterr().err
    assert f"[resume] resuming from {checkpoints[0]} (step {stopped} of 3)" in err
    assert trainer.state.global_step == 3
    assert counter.steps == list(range(stopped + 1, 4)), "the resumed run must continue, not restart"
    logged = [e["step"] for e in trainer.state.log_history if "reward" in e]
    assert logged == [1, 2, 3]  # the log of the first session travels along in the checkpoint


def test_hard_kill_mid_training_then_rerun_finishes_the_same_total_steps(
    tiny_model_dir, scene_data_dir, tmp_path, capfd, monkeypatch
):
    run = tmp_path / "run"
    argv = recipe(
        tiny_model_dir, scene_data_dir, run, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1"
    )
    child = Child(argv, script=VARIED_REWARD_CLI)
    child.wait_until(lambda: readable_state(run / "checkpoint-1"))
    child.proc.kill()  # SIGKILL: no handler, no clean-up, possibly in the middle of the next save
    assert child.wait() == -signal.SIGKILL
    resume_from = keep_best.complete_checkpoints(str(run))[-1]
    done = trainer_state(resume_from)["global_step"]
    assert done < 3, "the child was not killed mid-training"

    use_varied_reward(monkeypatch)
    counter, weights = StepCounter(), WeightsAtStart()
    trainer = train_in_process(argv, counter, weights)
    assert f"[resume] resuming from {resume_from}" in capfd.readouterr().err
    assert_resumed_weights(weights, resume_from, tiny_model_dir)  # not the base weights (transformers#43701)
    assert trainer.state.global_step == 3
    assert counter.steps == list(range(done + 1, 4))


# ---- resume never goes back silently ------------------------------------------------------------------------


def finished_run_dir(tiny_model_dir, run):
    """A run dir as a finished run leaves it: its final model at the top (what export takes)."""
    os.makedirs(run)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tiny_model_dir, name), run)
    return run


def nan_checkpoint(tiny_model_dir, path, step):
    from safetensors.torch import save_file

    fake_checkpoint(tiny_model_dir, path, step)
    weights = load_file(os.path.join(path, "model.safetensors"))
    first = sorted(weights)[0]
    weights[first] = torch.full_like(weights[first], float("nan"))
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return first


@pytest.mark.parametrize("case", ["every checkpoint unreadable", "start over on a final model", "nan weights"])
def test_a_run_that_would_go_back_is_one_error_and_leaves_the_run_dir(tiny_model_dir, scene_data_dir, tmp_path, case):
    """Unreadable checkpoints used to restart from the base model without a word and overwrite the final model at
    the end; a checkpoint of nan weights was resumed. Each is one error before the model loads, the run dir intact."""
    run = finished_run_dir(tiny_model_dir, tmp_path / "run")
    extra, needles = [], []
    if case == "nan weights":
        key = nan_checkpoint(tiny_model_dir, run / "checkpoint-2", 2)
        needles = [f"checkpoint {run / 'checkpoint-2'} cannot be resumed: model.safetensors: {key} holds nan or inf"]
    else:
        (fake_checkpoint(tiny_model_dir, run / "checkpoint-2", 2) / "trainer_state.json").write_text("{trunc")
        weights = fake_checkpoint(tiny_model_dir, run / "checkpoint-4", 4) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
        needles = [f"no checkpoint in {run} loads", "checkpoint-4: weights file model.safetensors is truncated"]
        needles += ["checkpoint-2: trainer_state.json is unreadable", "--resume_from_checkpoint none"]
    if case == "start over on a final model":
        extra = ["--resume_from_checkpoint", "none"]
        needles = [f"{run} holds the final model of a finished run", "Use another --output_dir"]
    before = tree_digest(run)
    fast = ["--max_steps", "1", "--max_completion_length", "8", "--max_pixels", "12544", "--num_generations", "2"]
    rc, out, err = py(*grpo_args(tiny_model_dir, os.path.join(scene_data_dir, "train"), run, *fast, *extra))
    assert_clean_error(rc, err, *needles)
    assert "[grpo] rank" not in out and tree_digest(run) == before  # stopped before the model loaded


def test_starting_over_on_purpose_past_unreadable_checkpoints(tiny_model_dir, tmp_path):
    from open_r1.errors import RecipeError
    from open_r1.run.resume import resolve_resume

    (fake_checkpoint(tiny_model_dir, tmp_path / "checkpoint-2", 2) / "trainer_state.json").write_text("{trunc")
    args = types.SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="none", process_index=0)
    assert resolve_resume(args, True) is None  # no final model to overwrite: the user's call
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-2")
    with pytest.raises(RecipeError, match="checkpoint-2 cannot be resumed: trainer_state.json is unreadable"):
        resolve_resume(args, True)


# ---- time budget -----------------------------------------------------------------------------------------------


def test_too_short_budget_still_leaves_a_loadable_verified_submission(
    tiny_model_dir, scene_data_dir, tmp_path, capfd, monkeypatch
):
    from open_r1.modeling import load_model
    from open_r1.submission import export as export_submission
    from open_r1.submission.verify import verify_submission

    run, submission = tmp_path / "run", tmp_path / "submission"
    monkeypatch.setenv("TRAIN_START_TIME", str(time.time()))
    trainer = train_in_process(
        recipe(tiny_model_dir, scene_data_dir, run, "--max_steps", "3", "--save_strategy", "no", "--time_budget", "2s")
    )
    err = capfd.readouterr().err
    assert trainer.state.global_step == 1, "a budget of 2 s must stop after the first step"
    assert "[budget] stopping after step 1/3" in err
    assert keep_best.complete_checkpoints(str(run)) == [str(run / "checkpoint-1")]  # the probe / stop checkpoint
    timings = json.loads((run / "budget_timings.json").read_text())
    assert len(timings["save_seconds"]) == 1 and timings["startup_seconds"] > 0

    assert export_submission.main(["--checkpoint", str(run), "--out", str(submission)]) == 0
    report = verify_submission(str(submission))
    assert report.ok, report.problems
    assert load_model(str(submission), dtype="float32") is not None
    assert json.loads((run / "budget_timings.json").read_text())["export_seconds"] > 0  # measured for next round


# ---- keep-best ---------------------------------------------------------------------------------------------------


def use_varied_reward(monkeypatch):
    """Rewards that differ within a group, so every step changes the weights (checkpoints are distinguishable)."""
    from open_r1 import rewards
    from open_r1.tasks.counting.protocol import completion_text

    def varied(completions, **kwargs):
        return [float(len(completion_text(c)) % 3) for c in completions]

    varied.__name__ = "varied"
    monkeypatch.setattr(rewards, "get_reward_funcs", lambda names, kwargs=None: [varied])


def test_keep_best_exports_the_better_of_two_checkpoints(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch):
    """Real protocol engine (short generations) with the accuracies replaced by scores we control:
    OOD 50 % at step 1, 25 % at step 2 -> checkpoint-1 is exported although checkpoint-2 is the last."""
    from open_r1.submission import export as export_submission
    from open_r1.tasks.counting import evaluate as evaluate_lib

    use_varied_reward(monkeypatch)
    real_evaluate = evaluate_lib.evaluate_dataset
    controlled = [{"val": 10.0, "ood_val": 50.0}, {"val": 90.0, "ood_val": 25.0}]
    calls = []

    def evaluate(model, processor, dataset, name="eval", batch_size=32, limit=None, progress=True, **kw):
        assert not model.training and not torch.is_grad_enabled()
        result = real_evaluate(
            model, processor, dataset, name=name, batch_size=batch_size, limit=limit, progress=False, max_new_tokens=4
        )
        calls.append((name, result.n))
        result.accuracy_pct = controlled[(len(calls) - 1) // 2][name]
        return result

    monkeypatch.setattr(evaluate_lib, "evaluate_dataset", evaluate)
    run = tmp_path / "run"
    trainer = train_in_process(
        recipe(
            tiny_model_dir,
            scene_data_dir,
            run,
            "--max_steps",
            "2",
            "--save_strategy",
            "no",
            "--save_total_limit",
            "1",
            "--eval_sets",
            os.path.join(scene_data_dir, "val"),
            os.path.join(scene_data_dir, "ood_val"),
            "--eval_steps_protocol",
            "1",
            "--eval_limit",
            "2",
            "--eval_batch_size",
            "2",
            "--eval_first_step",
            "false",
        )
    )
    assert calls == [("val", 2), ("ood_val", 2)] * 2
    assert trainer.model.training
    rows = [e for e in trainer.state.log_history if "eval/ood_val_accuracy" in e]
    assert [(r["step"], r["eval/ood_val_accuracy"]) for r in rows] == [(1, 50.0), (2, 25.0)]
    assert all("reward" in r for r in rows), "accuracies are logged next to the rewards"
    history = json.loads((run / keep_best.HISTORY_FILE).read_text())
    assert [(e["step"], e["scores"]["ood_val"], e["checkpoint"]) for e in history["entries"]] == [
        (1, 50.0, "checkpoint-1"),
        (2, 25.0, "checkpoint-2"),
    ]
    assert all(e["reward"] is not None for e in history["entries"])
    assert (run / keep_best.HISTORY_PLOT).stat().st_size > 0
    assert json.loads((run / keep_best.BEST_FILE).read_text())["checkpoint"] == "checkpoint-1"
    assert (run / "checkpoint-1").is_dir(), "save_total_limit=1 must not delete the best checkpoint"

    submission = tmp_path / "submission"
    assert export_submission.main(["--checkpoint", str(run), "--out", str(submission), "--no-verify-generate"]) == 0
    exported = load_file(str(submission / "model.safetensors"))
    best = load_file(str(run / "checkpoint-1" / "model.safetensors"))
    final = load_file(str(run / "model.safetensors"))
    name = next(k for k in best if "q_proj.weight" in k and k in exported)
    assert torch.equal(exported[name], best[name])
    assert not torch.equal(exported[name], final[name]), "the final weights must differ (the test needs it)"


# ---- promote -----------------------------------------------------------------------------------------------------


def fake_report(path, model_dir, accuracies: dict, n=4):
    reports = [
        SetReport(
            name=k, n=n, accuracy_pct=v, format_pct=100.0, mean_completion_tokens=20.0, truncated_pct=0.0, seconds=1.0
        )
        for k, v in accuracies.items()
    ]
    write_report(str(path), reports, str(model_dir))
    return str(path)


@pytest.fixture(scope="module")
def exported_model(tiny_model_dir, tmp_path_factory):
    from open_r1.submission.export import export_submission

    out = tmp_path_factory.mktemp("promote") / "model"
    export_submission(str(tiny_model_dir), str(out), verify=False)
    return out


@pytest.fixture
def current_and_candidate(exported_model, tmp_path):
    submission, candidate = tmp_path / "app" / "submission", tmp_path / "candidate"
    shutil.copytree(exported_model, submission)
    shutil.copytree(exported_model, candidate)
    fake_report(submission / "selfcheck.json", submission, {"val": 60.0, "ood_val": 40.0})  # mean 50
    return submission, candidate


def promote_cli(*argv):
    from open_r1.submission import promote

    return promote.main([*argv, "--no-verify-generate"])


def test_promote_refuses_a_worse_or_equal_report_and_force_overrides(current_and_candidate, tmp_path, capsys):
    submission, candidate = current_and_candidate
    for accuracies in ({"val": 50.0, "ood_val": 30.0}, {"val": 40.0, "ood_val": 60.0}):  # mean 40, then equal 50
        worse = fake_report(tmp_path / "new.json", candidate, accuracies)
        assert promote_cli("--candidate", str(candidate), "--report", worse, "--submission", str(submission)) == 1
        assert "only a strictly higher score replaces it" in capsys.readouterr().err
        assert json.loads((submission / "selfcheck.json").read_text())["mean_accuracy_pct"] == 50.0
        assert sorted(p.name for p in submission.parent.iterdir()) == ["submission"]

    assert (
        promote_cli("--candidate", str(candidate), "--report", worse, "--submission", str(submission), "--force") == 0
    )
    kept = [p for p in submission.parent.iterdir() if p.name.startswith("submission.replaced-")]
    assert len(kept) == 1 and json.loads((kept[0] / "selfcheck.json").read_text())["mean_accuracy_pct"] == 50.0
    assert json.loads((submission / "selfcheck.json").read_text())["sets"]["ood_val"]["accuracy_pct"] == 60.0


def test_promote_replaces_on_a_higher_score_after_verifying(current_and_candidate, tmp_path):
    from open_r1.submission import promote

    submission, candidate = current_and_candidate
    better = fake_report(tmp_path / "new.json", candidate, {"val": 70.0, "ood_val": 50.0})
    assert promote.main(["--candidate", str(candidate), "--report", better, "--submission", str(submission)]) == 0
    assert json.loads((submission / "selfcheck.json").read_text())["mean_accuracy_pct"] == 60.0
    names = sorted(p.name for p in submission.parent.iterdir())
    assert names[0] == "submission" and names[1].startswith("submission.replaced-") and len(names) == 2


def test_promote_refuses_reports_over_different_sets(current_and_candidate, tmp_path, capsys):
    submission, candidate = current_and_candidate
    other = fake_report(tmp_path / "new.json", candidate, {"val": 90.0, "compositional": 90.0})
    assert promote_cli("--candidate", str(candidate), "--report", other, "--submission", str(submission)) == 1
    assert "not comparable: different sets" in capsys.readouterr().err
    fewer = fake_report(tmp_path / "new.json", candidate, {"val": 90.0, "ood_val": 90.0}, n=2)
    assert promote_cli("--candidate", str(candidate), "--report", fewer, "--submission", str(submission)) == 1
    assert "2 examples in the new report vs 4" in capsys.readouterr().err


def test_promote_never_installs_a_broken_candidate(current_and_candidate, tmp_path, capsys):
    submission, candidate = current_and_candidate
    os.remove(candidate / "preprocessor_config.json")
    better = fake_report(tmp_path / "new.json", candidate, {"val": 99.0, "ood_val": 99.0})
    before = sorted(os.listdir(submission))
    assert promote_cli("--candidate", str(candidate), "--report", better, "--submission", str(submission)) == 2
    err = capsys.readouterr().err
    assert "fails verification" in err and "preprocessor_config.json" in err
    assert sorted(os.listdir(submission)) == before
    assert sorted(p.name for p in submission.parent.iterdir()) == ["submission"]  # no temp dir left behind


def test_promote_into_an_empty_place(exported_model, tmp_path):
    candidate = tmp_path / "candidate"
    shutil.copytree(exported_model, candidate)
    report = fake_report(tmp_path / "new.json", candidate, {"val": 1.0, "ood_val": 1.0})
    assert (
        promote_cli(
            "--candidate", str(candidate), "--report", report, "--submission", str(tmp_path / "app" / "submission")
        )
        == 0
    )
    assert (tmp_path / "app" / "submission" / "selfcheck.json").is_file()
