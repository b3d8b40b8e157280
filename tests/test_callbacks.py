"""Run-safety callbacks on fake trainer state (fast, no model): budget math, signal stop, keep-best, resume choice."""

import datetime as dt
import json
import logging
import os
import signal
import types

import pytest
import torch
from safetensors.torch import save_file
from transformers import TrainerControl, TrainerState
from transformers.trainer_utils import rotate_checkpoints

from open_r1.errors import BudgetError
from open_r1.jsonio import write_json
from open_r1.run import budget as budget_lib
from open_r1.run import keep_best
from open_r1.run import safety as cb
from open_r1.tasks import get_task
from open_r1.tasks.counting.evaluate import SetReport


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def fake_args(tmp_path, **kw):
    defaults = dict(
        output_dir=str(tmp_path),
        save_strategy="no",
        save_steps=500,
        device="cpu",
        gradient_checkpointing_kwargs=None,
        resume_from_checkpoint=None,
        process_index=0,
    )
    return types.SimpleNamespace(**{**defaults, **kw})


def fresh_state(max_steps=100, step=0):
    state = TrainerState()
    state.max_steps = max_steps
    state.global_step = step
    return state


def run_step(callback, args, state, control, clock, seconds):
    """One optimizer step of `seconds` as the trainer drives the hooks (step_begin -> step_end)."""
    callback.on_step_begin(args, state, control)
    clock.now += seconds
    state.global_step += 1
    return callback.on_step_end(args, state, control)


def save(callback, args, state, control, clock, seconds):
    clock.now += seconds
    control.should_save = False  # the handler resets it before the callbacks run
    return callback.on_save(args, state, control)


# ---- parse_time_budget -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("55m", 3300),
        ("1h30m", 5400),
        ("2h", 7200),
        ("90s", 90),
        ("3600", 3600),
        ("1d", 86400),
        ("1h 5m 10s", 3910),
        (45, 45),
    ],
)
def test_parse_time_budget_durations_count_from_start(text, seconds):
    assert cb.parse_time_budget(text, start=1000.0) == 1000.0 + seconds


def test_parse_time_budget_absolute_datetimes():
    assert (
        cb.parse_time_budget("2030-01-02T03:04:05+00:00")
        == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc).timestamp()
    )
    assert cb.parse_time_budget("2030-01-02T03:04:05Z") == cb.parse_time_budget("2030-01-02T03:04:05+00:00")
    assert cb.parse_time_budget("2030-01-02 03:04") == dt.datetime(2030, 1, 2, 3, 4).timestamp()  # local time


def test_parse_time_budget_off_and_errors(monkeypatch):
    assert cb.parse_time_budget(None) is None and cb.parse_time_budget("") is None
    assert cb.parse_time_budget("off") is None
    with pytest.raises(BudgetError, match="neither a duration"):
        cb.parse_time_budget("soon")
    monkeypatch.setenv("TRAIN_START_TIME", "5000")
    assert cb.parse_time_budget("10m") == 5600  # train.sh's shared origin


# ---- time budget decisions --------------------------------------------------------------------------------------


def measured_estimator(save=10.0, startup=20.0, step=None):
    est = cb.ReserveEstimator()
    est.observe_save(save)
    est.startup_seconds = startup
    if step is not None:
        est.observe_step(step)
    return est


def test_reserve_is_built_from_measured_times():
    est = measured_estimator(save=10.0, startup=20.0)
    # export prior = 2 x startup + export_factor x save = 40 + 30 = 70; reserve = 1.25 x (2 x save + export)
    assert est.export_estimate() == 70.0
    assert est.reserve() == pytest.approx(1.25 * (20 + 70))
    est.observe_save(30.0)  # a slower save raises the moving max
    assert est.save_estimate() == 30.0 and est.reserve() == pytest.approx(1.25 * (60 + 40 + 90))
    est.export_seconds = 42.0  # a measured export replaces the prior
    assert est.reserve() == pytest.approx(1.25 * (60 + 42))
    est.eval_enabled = True
    est.observe_eval(8.0)
    assert est.reserve(final_eval=True) == pytest.approx(1.25 * (60 + 42 + 8))
    assert est.reserve(final_eval=False) == pytest.approx(1.25 * (60 + 42))


@pytest.mark.parametrize("slack, stops", [(-0.1, True), (0.1, False)])
def test_budget_stops_exactly_when_next_step_plus_reserve_passes_the_deadline(tmp_path, slack, stops):
    clock = Clock()
    est = measured_estimator(save=10.0, startup=20.0)
    # after the step below: now + step (5) + reserve (112.5) must be <= deadline to continue
    deadline = clock.now + 5.0 + 5.0 + 112.5 + slack
    budget = cb.TimeBudgetCallback(deadline, est, clock=clock)
    args, state, control = fake_args(tmp_path), fresh_state(), TrainerControl()
    run_step(budget, args, state, control, clock, 5.0)
    assert control.should_training_stop is stops
    assert control.should_save is stops  # a stop always leaves a checkpoint of the last step
    assert (budget.stopped_at_step == 1) is stops


def test_budget_counts_the_eval_and_save_still_due_at_this_step(tmp_path):
    clock = Clock()
    est = measured_estimator(save=10.0, startup=20.0)
    est.eval_enabled = True
    est.observe_eval(30.0)
    reserve = est.reserve(final_eval=True)  # 1.25 x (20 + 70 + 30)
    args = fake_args(tmp_path)
    # step 1 is not an eval step: continue needs step + reserve; step 2 is an eval step: + eval + its save
    deadline = clock.now + 5.0 + 5.0 + reserve + 5.0 + 5.0 + 1.0
    budget = cb.TimeBudgetCallback(deadline, est, eval_every_n_steps=2, clock=clock)
    state, control = fresh_state(), TrainerControl()
    run_step(budget, args, state, control, clock, 5.0)
    assert not control.should_training_stop
    control = TrainerControl()
    run_step(budget, args, state, control, clock, 5.0)  # at step 2: 30 s eval + 10 s save pending -> no longer fits
    assert control.should_training_stop and state.global_step == 2


@pytest.mark.parametrize("eval_saves", [True, False])
def test_budget_counts_an_evaluations_save_only_with_keep_best(tmp_path, eval_saves):
    """The evaluation saves a checkpoint for keep-best only: without it, the 10 s save is not reserved."""
    clock, est = Clock(), measured_estimator(save=10.0, startup=20.0)
    est.eval_enabled = True
    est.observe_eval(30.0)
    deadline = clock.now + 5.0 + 5.0 + est.reserve(final_eval=True) + 40.0  # step 2 + eval fit; + a save does not
    budget = cb.TimeBudgetCallback(deadline, est, eval_every_n_steps=2, clock=clock, eval_saves=eval_saves)
    args, state = fake_args(tmp_path), fresh_state()
    for _ in range(2):
        control = TrainerControl()
        run_step(budget, args, state, control, clock, 5.0)
    assert control.should_training_stop is eval_saves and state.global_step == 2


def test_budget_probe_save_measures_before_deciding(tmp_path):
    clock = Clock()
    budget = cb.TimeBudgetCallback(clock.now + 3600, cb.ReserveEstimator(), clock=clock)
    args, state, control = fake_args(tmp_path), fresh_state(), TrainerControl()
    budget.on_train_begin(args, state, control)
    run_step(budget, args, state, control, clock, 5.0)
    assert control.should_save and not control.should_training_stop  # nothing measured yet: save first
    save(budget, args, state, control, clock, 7.0)
    assert budget.estimator.save_estimate() == 7.0
    assert not control.should_save, "deciding after a save must not ask for a second save"
    assert json.loads((tmp_path / budget_lib.TIMINGS_FILE).read_text())["save_seconds"] == [7.0]  # persisted for resume


def test_budget_too_short_stops_after_the_first_step_with_a_checkpoint(tmp_path):
    clock = Clock()
    budget = cb.TimeBudgetCallback(clock.now + 1.0, cb.ReserveEstimator(), clock=clock)
    args, state, control = fake_args(tmp_path), fresh_state(), TrainerControl()
    budget.on_train_begin(args, state, control)
    run_step(budget, args, state, control, clock, 5.0)
    assert control.should_save
    save(budget, args, state, control, clock, 2.0)
    assert control.should_training_stop and state.global_step == 1
    assert budget.estimator.final_eval_allowed is False


def test_save_time_is_measured_from_the_end_of_the_evaluation(tmp_path):
    clock = Clock()
    est = measured_estimator(save=1.0, startup=0.0)
    budget = cb.TimeBudgetCallback(clock.now + 10_000, est, clock=clock)
    args, state, control = fake_args(tmp_path), fresh_state(), TrainerControl()
    run_step(budget, args, state, control, clock, 5.0)
    clock.now += 60.0  # an evaluation runs after the budget callback in the same on_step_end
    est.last_eval_end = clock.now
    save(budget, args, state, control, clock, 4.0)
    assert est.save_seconds[-1] == 4.0


def test_measured_export_time_from_a_previous_round_is_used(tmp_path):
    budget_lib.record_export_seconds(str(tmp_path), 42.0)
    budget_lib.record_export_seconds(str(tmp_path), 30.0)  # the slow case is kept
    est = cb.ReserveEstimator()
    assert est.load(str(tmp_path / budget_lib.TIMINGS_FILE))
    assert est.export_estimate() == 42.0


# ---- graceful stop ----------------------------------------------------------------------------------------------


def test_sigterm_requests_a_checkpoint_and_a_stop_at_step_end(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    graceful = cb.GracefulStopCallback()
    args, state, control = fake_args(tmp_path), fresh_state(step=3), TrainerControl()
    graceful.on_train_begin(args, state, control)
    try:
        graceful.on_step_end(args, state, control)
        assert not control.should_training_stop
        os.kill(os.getpid(), signal.SIGTERM)
        graceful.on_step_end(args, state, control)
        assert control.should_save and control.should_training_stop
        assert graceful.stopped_at_step == 3 and graceful.exit_code == 128 + signal.SIGTERM
    finally:
        graceful.on_train_end(args, state, control)
    assert signal.getsignal(signal.SIGTERM) == before


# ---- keep-best ---------------------------------------------------------------------------------------------------


def entry(step, ood, val, checkpoint=True):
    return {
        "step": step,
        "checkpoint": f"checkpoint-{step}" if checkpoint else None,
        "scores": {"ood_val": ood, "val": val},
    }


def test_select_best_max_ood_then_id_then_later_step():
    entries = [entry(1, 40.0, 90.0), entry(2, 50.0, 60.0), entry(3, 50.0, 70.0), entry(4, 45.0, 99.0)]
    assert keep_best.select_best(entries, "ood_val", "val")["step"] == 3
    entries.append(entry(5, 50.0, 70.0))
    assert keep_best.select_best(entries, "ood_val", "val")["step"] == 5  # full tie -> later step
    assert keep_best.select_best(entries, "val", None)["step"] == 4


def make_checkpoint(run_dir, step):
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file({"w": torch.zeros(1)}, str(path / "model.safetensors"))  # loads: resume checks the files load
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 10}))
    return path


def test_select_best_only_among_checkpoints_on_disk(tmp_path):
    make_checkpoint(tmp_path, 2)
    entries = [entry(1, 90.0, 90.0), entry(2, 50.0, 50.0)]
    assert keep_best.select_best(entries, "ood_val", "val", str(tmp_path))["step"] == 2


def report(name, acc):
    return SetReport(
        name=name,
        n=4,
        accuracy_pct=acc,
        format_pct=100.0,
        mean_completion_tokens=10.0,
        truncated_pct=0.0,
        seconds=0.1,
        records=[],
    )


class FakeModel:
    def __init__(self):
        self.training = True
        self.modes_seen = []

    def eval(self):
        self.training = False

    def train(self):
        self.training = True


def test_eval_callback_logs_saves_records_and_keeps_the_best(tmp_path):
    """Scores we control: 50 at step 2, 25 at step 4 (and a tie on OOD at step 6 broken by ID)."""
    scores = {2: {"ood_val": 50.0, "val": 10.0}, 4: {"ood_val": 25.0, "val": 90.0}, 6: {"ood_val": 50.0, "val": 5.0}}
    model = FakeModel()
    state = fresh_state(max_steps=6)

    def fake_evaluate(m, processor, dataset, name, batch_size, limit, progress):
        import torch

        model.modes_seen.append((m.training, torch.is_grad_enabled(), limit))
        return report(name, scores[state.global_step][name])

    metrics = {"train": __import__("collections").defaultdict(list)}
    trainer = types.SimpleNamespace(_metrics=metrics, processing_class="proc")
    evaluator = cb.InTrainingEvalCallback(
        {"val": [0] * 8, "ood_val": [0] * 8},
        every_n_steps=2,
        limit=4,
        eval_first_step=False,
        evaluate_fn=fake_evaluate,
        task=get_task("counting"),
    )
    evaluator.bind(trainer)
    args = fake_args(tmp_path)
    evaluator.on_train_begin(args, state, TrainerControl())
    for step in range(1, 7):
        control = TrainerControl()
        state.global_step = step
        state.log_history.append({"step": step, "reward": float(step)})
        evaluator.on_step_begin(args, state, control)
        evaluator.on_step_end(args, state, control, model=model)
        assert control.should_save == (step % 2 == 0) and control.should_log == (step % 2 == 0)
        if control.should_save:
            make_checkpoint(tmp_path, step)
            evaluator.on_save(args, state, control)
        if step == 2:
            assert state.best_model_checkpoint == os.path.join(str(tmp_path), "checkpoint-2")
        if step == 4:  # 25 < 50: the best stays at step 2
            assert state.best_global_step == 2 and state.best_metric == 50.0
    assert model.training and all(m == (False, False, 4) for m in model.modes_seen)  # eval mode, no grad, subset
    assert metrics["train"]["eval/ood_val_accuracy"] == [50.0, 25.0, 50.0]
    history = json.loads((tmp_path / keep_best.HISTORY_FILE).read_text())
    assert [e["step"] for e in history["entries"]] == [2, 4, 6]
    assert history["entries"][1]["scores"] == {"val": 90.0, "ood_val": 25.0}
    assert history["entries"][1]["reward"] == 3.5  # mean of the rewards logged at steps 3 and 4
    assert history["best"]["step"] == 2  # OOD tie with step 6, ID 10 > 5
    assert (tmp_path / keep_best.HISTORY_PLOT).stat().st_size > 0
    # the trainer's own checkpoint rotation keeps the best one
    rotate_checkpoints(str(tmp_path), save_total_limit=1, best_model_checkpoint=state.best_model_checkpoint)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-6"]


def test_eval_callback_skips_on_signal_and_when_the_final_eval_does_not_fit(tmp_path):
    calls = []
    stop = {"signal": False}
    est = cb.ReserveEstimator()
    evaluator = cb.InTrainingEvalCallback(
        {"ood_val": [0]},
        every_n_steps=2,
        estimator=est,
        skip=lambda: stop["signal"],
        eval_first_step=True,
        evaluate_fn=lambda *a, **k: calls.append(1) or report("ood_val", 1.0),
        task=get_task("counting"),
    )
    args, state = fake_args(tmp_path), fresh_state(max_steps=10)
    evaluator.on_train_begin(args, state, TrainerControl())
    state.global_step = 1
    evaluator.on_step_end(args, state, TrainerControl(), model=FakeModel())
    assert len(calls) == 1  # eval_first_step: baseline + a measured eval time
    stop["signal"] = True
    state.global_step = 2
    evaluator.on_step_end(args, state, TrainerControl(), model=FakeModel())
    assert len(calls) == 1
    stop["signal"] = False
    est.final_eval_allowed = False
    state.global_step = 3
    control = TrainerControl()
    control.should_training_stop = True
    evaluator.on_step_end(args, state, control, model=FakeModel())
    assert len(calls) == 1 and not control.should_save


def test_without_keep_best_an_evaluation_saves_no_checkpoint(tmp_path):
    """The evaluated weights are saved only for keep-best to choose among (a ZeRO-3 checkpoint of the 2B model is
    30.9 GB); without it the score is recorded with no checkpoint."""
    evaluator = cb.InTrainingEvalCallback(
        {"ood_val": [0]},
        every_n_steps=1,
        keep_best=False,
        evaluate_fn=lambda *a, **k: report("ood_val", 1.0),
        task=get_task("counting"),
    )
    args, state = fake_args(tmp_path), fresh_state(max_steps=10)
    evaluator.on_train_begin(args, state, TrainerControl())
    state.global_step = 1
    control = TrainerControl()
    evaluator.on_step_end(args, state, control, model=FakeModel())
    assert not control.should_save
    state.global_step = 2
    evaluator.on_step_begin(args, state, TrainerControl())
    entry = json.loads((tmp_path / keep_best.HISTORY_FILE).read_text())["entries"][0]
    assert (entry["step"], entry["checkpoint"], entry["scores"]) == (1, None, {"ood_val": 1.0})


def test_eval_history_is_truncated_to_the_resumed_step(tmp_path):
    make_checkpoint(tmp_path, 2)
    write_json(
        str(tmp_path / keep_best.HISTORY_FILE),
        {"primary": "ood_val", "secondary": "val", "entries": [entry(2, 10.0, 0.0), entry(4, 99.0, 0.0)]},
    )
    evaluator = cb.InTrainingEvalCallback(
        {"ood_val": [0], "val": [0]}, every_n_steps=2, evaluate_fn=None, task=get_task("counting")
    )
    state = fresh_state(max_steps=10, step=2)
    evaluator.on_train_begin(fake_args(tmp_path), state, TrainerControl())
    assert [e["step"] for e in evaluator.history["entries"]] == [2]
    assert state.best_global_step == 2


# ---- export resolution and resume -------------------------------------------------------------------------------


def write_history(run_dir, entries):
    write_json(str(run_dir / keep_best.HISTORY_FILE), {"primary": "ood_val", "secondary": "val", "entries": entries})


def test_resolve_export_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    make_checkpoint(run, 2)
    make_checkpoint(run, 4)
    (run / "config.json").write_text("{}")
    (run / "model.safetensors").write_bytes(b"final")
    assert keep_best.resolve_export_checkpoint(str(run)) == str(run)  # no records: the final model
    write_history(run, [entry(2, 60.0, 0.0), entry(4, 40.0, 0.0), entry(6, 99.0, 0.0)])  # checkpoint-6 is gone
    assert keep_best.resolve_export_checkpoint(str(run)) == str(run / "checkpoint-2")
    caplog.set_level(logging.INFO, logger="open_r1")
    caplog.clear()
    record = keep_best.write_best_checkpoint(str(run), keep_best=False, final_step=4)
    assert record["checkpoint"] == "." and keep_best.resolve_export_checkpoint(str(run)) == str(run)
    assert caplog.messages[0].startswith(f"[keep-best] export target: {run} (step 4): final model")  # the dir, not "."
    keep_best.write_best_checkpoint(str(run), keep_best=True, final_step=4)
    assert json.loads((run / keep_best.BEST_FILE).read_text())["checkpoint"] == "checkpoint-2"
    ckpt = str(run / "checkpoint-4")
    assert keep_best.resolve_export_checkpoint(ckpt) == ckpt  # a checkpoint dir is itself


def test_plot_run_script_tables_and_plots_a_run(tmp_path, capsys):
    from open_r1.run import keep_best as plot_run

    make_checkpoint(tmp_path, 2)
    write_history(tmp_path, [{**entry(2, 60.0, 10.0), "reward": 0.5}, entry(4, 40.0, 90.0)])  # checkpoint-4 gone
    assert plot_run.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 2 * | 60.00 | 10.00 | 0.500 | checkpoint-2 |" in out and "| 4 | 40.00 | 90.00 | - | (deleted) |" in out
    assert (tmp_path / keep_best.HISTORY_PLOT).stat().st_size > 0
    assert plot_run.main([str(tmp_path / "nothing")]) == 2


def test_resume_picks_the_newest_complete_checkpoint(tmp_path, caplog):
    make_checkpoint(tmp_path, 2)
    make_checkpoint(tmp_path, 10)
    (tmp_path / "checkpoint-12").mkdir()  # killed while saving: no trainer_state.json
    (tmp_path / "checkpoint-12" / "model.safetensors").write_bytes(b"partial")
    caplog.set_level(logging.INFO, logger="open_r1")
    args = fake_args(tmp_path)
    assert cb.resolve_resume(args, auto_resume=True) == str(tmp_path / "checkpoint-10")
    said = caplog.messages
    assert any("skipping checkpoint-12" in s for s in said) and any("resuming from" in s for s in said)
    assert cb.resolve_resume(args, auto_resume=False) is None
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-2")
    assert cb.resolve_resume(args, auto_resume=False) == str(tmp_path / "checkpoint-2")
    args.resume_from_checkpoint = "false"
    assert cb.resolve_resume(args, auto_resume=True) is None
    assert cb.resolve_resume(fake_args(tmp_path / "empty"), auto_resume=True) is None


# ---- multi-process: every rank takes part, all ranks agree ------------------------------------------------------

RANK_SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
from datasets import Dataset
from open_r1.run import safety as cb
from open_r1.run.common import _reduce_max
from open_r1.tasks import get_task
from open_r1.tasks.counting.evaluate import SetReport

dist.init_process_group("gloo")
rank = dist.get_rank()
rows = Dataset.from_dict({"problem": [f"q{i}" for i in range(7)], "solution": [str(i) for i in range(7)]})
calls = []

def fake_evaluate(model, processor, dataset, name, batch_size, limit, progress):
    calls.append(len(dataset))
    records = [{"index": i, "question": q, "gold": int(s), "prediction": int(s) if int(s) % 2 == 0 else None,
                "correct": int(s) % 2 == 0, "completion_tokens": 10 + int(s), "truncated": False, "completion": ""}
               for i, (q, s) in enumerate(zip(dataset["problem"], dataset["solution"]))]
    return SetReport(name, len(records), 0.0, 0.0, 0.0, 0.0, 0.0, records)

evaluator = cb.InTrainingEvalCallback({"ood_val": rows}, every_n_steps=1, limit=5, evaluate_fn=fake_evaluate,
                                      task=get_task("counting"))
report = evaluator._evaluate_set(None, None, "ood_val", rows)
stop = _reduce_max([rank == 1, 0.0])
print(json.dumps({"rank": rank, "calls": calls, "n": report.n, "acc": report.accuracy_pct,
                  "tokens": report.mean_completion_tokens, "golds": [r["gold"] for r in report.records],
                  "stop": stop}))
dist.destroy_process_group()
"""


def test_two_ranks_share_the_eval_and_agree_on_scores_and_stops(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                cwd=root,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for result in results:
        assert result["calls"] == [3]  # 5 rows over 2 ranks: 3 each (one padded repeat), same number of batches
        assert result["n"] == 5 and result["golds"] == [0, 1, 2, 3, 4]  # padding dropped, dataset order
        assert result["acc"] == 60.0 and result["tokens"] == 12.0  # golds 0, 2, 4 correct
        assert result["stop"] == [1.0, 0.0]  # rank 1 wants to stop -> every rank stops


def test_time_cap_starts_after_the_first_step_and_drives_the_sft_schedule():
    """One time cap (run.budget.TimeBudgetCallback with max_seconds): the SFT stop and its cosine schedule read its
    clock; nothing is reserved or written (no output_dir needed)."""
    from open_r1.run.budget import TimeBudgetCallback
    from open_r1.sft import SFTSettings, lr_multiplier

    now = [100.0]
    cap = TimeBudgetCallback(max_seconds=10, clock=lambda: now[0])
    multiplier = lr_multiplier(cap, None, SFTSettings(schedule="cosine", min_lr_ratio=0.0))
    state = TrainerState()
    args = types.SimpleNamespace(output_dir=None, save_strategy="no", save_steps=0)  # no dir: nothing read or written
    cap.on_train_begin(args, state, TrainerControl())
    assert cap.on_step_end(args, state, TrainerControl()).should_training_stop is False  # step 1 starts the clock
    now[0] += 5
    assert not cap.on_step_end(args, state, TrainerControl()).should_training_stop
    assert multiplier(2) == pytest.approx(0.5)  # half the time gone: half-way down the cosine
    now[0] += 6
    assert cap.on_step_end(args, state, TrainerControl()).should_training_stop and cap.stopped
    done = TrainerControl()
    done.should_training_stop = True  # max_steps ended the run at the same step: not the cap's doing
    late = TimeBudgetCallback(max_seconds=1, clock=lambda: now[0])
    late.on_step_end(args, state, TrainerControl())  # step 1 starts the clock
    now[0] += 5
    late.on_step_end(args, state, done)
    assert not late.stopped
    cap.on_train_end(args, state, TrainerControl())
    # with measured steps it stops when another step would end after the cap: 4 s steps, 10 s cap -> after 8 s
    timed = TimeBudgetCallback(max_seconds=10, clock=lambda: now[0])
    stops = []
    for _ in range(4):
        timed.on_step_begin(args, state, TrainerControl())
        now[0] += 4
        stops.append(timed.on_step_end(args, state, TrainerControl()).should_training_stop)
    assert stops == [False, False, True, True] and timed.elapsed() == 12


def test_keep_best_ranks_by_the_run_tasks_sets_by_default():
    """No counting fallback in the engine: the primary/secondary sets default to the run's task's."""
    task = types.SimpleNamespace(
        default_primary="dev",
        default_secondary="ood",
        metric="score",
        load_eval_sets=lambda paths, limit=None: {os.path.basename(p): [0] for p in paths},
    )
    from open_r1.grpo import GRPOScriptArguments

    script_args = GRPOScriptArguments(eval_sets=["/d/ood", "/d/dev", "/d/ood_val"], eval_steps_protocol=2)
    training_args = types.SimpleNamespace(resume_from_checkpoint=None, output_dir="/nonexistent", process_index=0)
    run_safety = cb.build_run_callbacks(script_args, training_args, task)
    assert (run_safety.evaluator.primary, run_safety.evaluator.secondary) == ("dev", "ood")
    with pytest.raises(ValueError, match="task"):
        cb.InTrainingEvalCallback({"val": [0]}, every_n_steps=1)


def test_eval_sets_are_named_by_their_dirs_and_two_of_one_name_are_refused():
    from open_r1.checks import check_eval_settings
    from open_r1.tasks import Task

    class Echo(Task):
        def load_eval_set(self, path, limit=None):
            return (path, limit)

    assert Echo().load_eval_sets(["data/val", "data/ood_val/"], 3) == {
        "val": ("data/val", 3),
        "ood_val": ("data/ood_val/", 3),
    }
    from open_r1.grpo import GRPOScriptArguments

    args = GRPOScriptArguments(eval_sets=["a/val", "b/val/", "c/ood"], eval_steps_protocol=1)
    assert check_eval_settings(args) == [
        "eval sets ['val'] appear twice by name (names are dir basenames; --eval_sets)"
    ]


def test_disk_check_warns_once_after_the_first_checkpoint_when_later_saves_and_the_export_do_not_fit(
    tmp_path, monkeypatch, caplog
):
    """A 1 MB checkpoint (0.5 MB of weights). save_total_limit 2: a later save holds 2 more (2 MB; the export, after
    rotation, 1 MB + 0.5 MB). Unlimited, save_steps 100 of 300: 3 more, then the export: 3.5 MB."""
    from open_r1.run import disk

    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-1").mkdir(parents=True)
    (run_dir / "checkpoint-1" / "model.safetensors").write_bytes(b"0" * 500_000)
    (run_dir / "checkpoint-1" / "optimizer.pt").write_bytes(b"0" * 500_000)
    free = {"bytes": 1_900_000}
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=free["bytes"]))
    args = fake_args(run_dir, save_steps=20, save_total_limit=2)

    def state_at(step, save_steps=20):
        state = fresh_state(max_steps=300, step=step)
        state.save_steps = save_steps
        return state

    def warned(callback, args, step=1, **kw):
        caplog.clear()
        callback.on_save(args, state_at(step, **kw), TrainerControl())
        return "a later save would fail" in caplog.text

    check = disk.DiskSpaceCallback(submission=str(tmp_path / "sub"))
    assert warned(check, args)
    (run_dir / "checkpoint-20").mkdir()
    assert not warned(check, args, step=20)  # said once, at the first checkpoint only
    assert disk.dir_bytes(str(run_dir / "checkpoint-1"), ".safetensors") == 500_000
    free["bytes"] = 2_100_000
    assert not warned(disk.DiskSpaceCallback(submission=str(tmp_path / "sub")), args)
    unlimited = fake_args(run_dir, save_steps=1 / 3, save_total_limit=None)  # HF resolves the ratio to 100 steps
    (run_dir / "checkpoint-20").rmdir()
    free["bytes"] = 3_200_000  # 3 checkpoints fit, with the export they do not
    assert warned(disk.DiskSpaceCallback(submission=str(tmp_path / "sub")), unlimited, save_steps=100)
    assert not warned(disk.DiskSpaceCallback(submission=""), unlimited, save_steps=100)  # no export counted
    free["bytes"] = 2_900_000
    assert warned(disk.DiskSpaceCallback(submission=""), unlimited, save_steps=100)
    free["bytes"] = 3_600_000
    assert not warned(disk.DiskSpaceCallback(submission=str(tmp_path / "sub")), unlimited, save_steps=100)
