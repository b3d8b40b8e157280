"""Never lose a run: time budget, graceful stop on SIGTERM/SIGINT, in-training protocol evaluation with keep-best,
and auto-resume. Everything hooks into the trainer through `TrainerCallback` events; nothing patches the trainer.

Time budget (`TimeBudgetCallback`)
    The deadline is the moment the submission must be in place: `time_budget` ("55m", "1h30m", "3600" seconds, or
    an ISO datetime such as "2025-06-01T17:30" / "...+02:00"). A duration counts from `$TRAIN_START_TIME` (Unix
    seconds; train.sh sets it once, so every rank and the export share one origin), else from this process's start.
    After every optimizer step the callback keeps training only if

        now + pending(this step) + next_step + reserve  <=  deadline

    * next_step: moving max of the last `window` step durations (GRPO steps vary with completion lengths);
    * pending: the evaluation and/or checkpoint save still due at this step (both are measured, see below);
    * reserve = safety x (S + S + X + E):
        S  checkpoint save at the stop step, then `trainer.save_model(output_dir)` in main (counted as a second S);
           S = moving max of measured save durations (`on_save` minus the end of the step's other work);
        X  export + verify. Measured when `scripts/export_submission.py` ran on this run dir before (a previous
           round; recorded in budget_timings.json), else 2 x startup + `export_factor` x S: the export process repeats
           the imports and the model load (startup = measured time from this process's start to the first step,
           which also covers data loading, so it is an over-estimate), saves the merged weights and loads them again to
           verify; a checkpoint save writes weights plus optimizer states, so `export_factor` (3) x S covers the
           weight I/O with room to spare;
        E  the final in-training evaluation (moving max of measured evaluations), only when evaluation is on;
        safety = 1.25 (disk and generation times vary).
    Nothing is a constant guess: until a save has been measured, the callback forces a checkpoint after step 1 (the
    probe; it is also the run's first safety checkpoint) and decides right after it. Measurements persist in
    `<output_dir>/budget_timings.json`, so a resumed round starts with them. At least one step always runs; a
    budget too short for that still ends with a checkpoint, the final model, best_checkpoint.json and an export.
    When the final evaluation no longer fits, it is skipped (keep-best chooses among evaluated checkpoints).

Graceful stop (`GracefulStopCallback`)
    SIGTERM/SIGINT set a flag; at the end of the current optimizer step the trainer saves a full checkpoint
    (weights, optimizer, scheduler, RNG, trainer state) and stops; `open_r1.grpo` then exits with 128+signal
    (143 for SIGTERM, 130 for SIGINT) so that train.sh stops before exporting. A second signal exits at once.
    The step in flight is finished first: a GRPO step can take minutes, so give the process that long.

In-training evaluation (`InTrainingEvalCallback`)
    Every `every_n_steps` steps (also at step 1 with `eval_first_step`, and at the last step) it runs the selfcheck
    protocol engine, `open_r1.evaluate.evaluate_dataset` (EVAL template, greedy, 256 new tokens, batched,
    left-padded), on the first `limit` rows of each eval set, with the training processor (the pixel budget that is
    saved with the model). The model is TRL's own generation view (`trl.models.unwrap_model_for_generation`: the
    accelerator's unwrapped module; under DeepSpeed ZeRO-3 the parameters are gathered), switched to eval mode
    under `torch.no_grad()` and switched back to train mode afterwards. Multi-process: every rank must take part
    (under ZeRO-3 `generate` synchronises the ranks at every token), so each rank evaluates an equal-sized shard of
    the subset (padded with repeats, dropped again) and the records are all-gathered; every rank then holds the
    same scores (they feed the trainer state, which must agree across ranks) and rank 0 writes the files.
    Accuracies are logged as `eval/<set>_accuracy` in the same log row as the GRPO rewards of that step; a
    checkpoint is saved at that step; `<output_dir>/eval_history.json` gets {step, checkpoint, scores, reward (mean
    of the logged rewards since the previous evaluation), ...} and `eval_history.png` is redrawn.
    Keep-best (`open_r1.keep_best.select_best`): highest primary (OOD) accuracy, ties -> secondary (ID), then the
    later step. The best checkpoint is recorded in the trainer state (`best_model_checkpoint`, `best_global_step`,
    `best_metric`), which is what the trainer's `save_total_limit` rotation protects from deletion.

Resume (`resolve_resume`)
    With `auto_resume` (default) and no explicit `resume_from_checkpoint`, a run dir holding complete
    `checkpoint-N` dirs resumes from the newest complete one (optimizer, scheduler, RNG, trainer state and
    callback state restored by the trainer); a checkpoint without trainer_state.json was cut short by a kill and
    is skipped.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from transformers import TrainerCallback

from open_r1 import keep_best as keep_best_lib

TIMINGS_FILE = "budget_timings.json"


class BudgetError(ValueError):
    """A time_budget value that cannot be parsed."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- time budget parsing ----------------------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|min|s|sec)", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "min": 60, "s": 1, "sec": 1}


def parse_duration(text: str) -> float | None:
    """'55m' / '1h30m' / '90s' / '1d2h' / '3600' (seconds) -> seconds; None when it is not a duration."""
    text = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if text and _DURATION_PART.sub("", text) == "":
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))
    return None


def process_start_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or restricted: fall back to the import of this module
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def budget_start_time() -> float:
    """Origin of a duration budget: $TRAIN_START_TIME (set once by train.sh), else this process's start time."""
    env = os.environ.get("TRAIN_START_TIME")
    if env:
        try:
            return float(env)
        except ValueError:
            raise BudgetError(f"TRAIN_START_TIME={env!r} is not a Unix time in seconds") from None
    return process_start_time()


def parse_time_budget(value, start: float | None = None) -> float | None:
    """The deadline (Unix time) for a `time_budget` recipe value, or None for no budget.

    Durations ('55m', '1h30m', '2h', '90s', '3600') count from `start` (default `budget_start_time()`); an ISO
    datetime ('2025-06-01T17:30', '2025-06-01 17:30:00+02:00', '...Z') is absolute (naive = local time).
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        if text.lower() in ("", "none", "off", "null", "false", "0"):
            return None
        seconds = parse_duration(text)
        if seconds is None:
            try:
                moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise BudgetError(
                    f"time_budget {value!r} is neither a duration ('55m', '1h30m', '3600' seconds) nor an ISO "
                    "datetime ('2025-06-01T17:30', optionally with +HH:MM)"
                ) from None
            return moment.timestamp()  # naive -> local time
    if seconds <= 0:
        raise BudgetError(f"time_budget {value!r} must be positive")
    return (budget_start_time() if start is None else start) + seconds


def _fmt(seconds: float | None) -> str:
    if seconds is None or math.isinf(seconds) or math.isnan(seconds):
        return "?"
    seconds = int(round(seconds))
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{sign}{h}h{m:02d}m{s:02d}s" if h else f"{sign}{m}m{s:02d}s"


# ---- cross-rank agreement -----------------------------------------------------------------------------------------


def _world_size() -> int:
    try:
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    except Exception:  # noqa: BLE001
        return 1


def _reduce_max(values: list[float], args=None) -> list[float]:
    """Element-wise max over ranks (any rank that wants to stop stops every rank). Single process: identity.
    Called at the same hook on every rank, so the collective always matches up."""
    if _world_size() == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def _is_rank0(state) -> bool:
    return bool(getattr(state, "is_world_process_zero", True))


# ---- reserve estimation -------------------------------------------------------------------------------------------


@dataclass
class ReserveEstimator:
    """Measured durations and the time that must remain after training stops (see the module docstring)."""

    window: int = 5
    export_factor: float = 3.0
    safety: float = 1.25
    step_seconds: list = field(default_factory=list)
    save_seconds: list = field(default_factory=list)
    eval_seconds: list = field(default_factory=list)
    export_seconds: float | None = None
    startup_seconds: float | None = None
    eval_enabled: bool = False
    # set by TimeBudgetCallback each step; read by InTrainingEvalCallback
    final_eval_allowed: bool = True
    last_eval_end: float = 0.0
    clock: object = time.time  # the budget callback's clock; the eval callback stamps last_eval_end with it

    def _push(self, values: list, seconds: float) -> None:
        values.append(float(seconds))
        del values[: -self.window * 4]  # keep a little history in the file, use the last `window`

    def observe_step(self, seconds: float) -> None:
        self._push(self.step_seconds, seconds)

    def observe_save(self, seconds: float) -> None:
        self._push(self.save_seconds, seconds)

    def observe_eval(self, seconds: float) -> None:
        self._push(self.eval_seconds, seconds)

    def _window_max(self, values: list) -> float | None:
        return max(values[-self.window:]) if values else None

    def step_estimate(self) -> float:
        return self._window_max(self.step_seconds) or 0.0

    def save_estimate(self) -> float | None:
        return self._window_max(self.save_seconds)

    def eval_estimate(self) -> float:
        return (self._window_max(self.eval_seconds) or 0.0) if self.eval_enabled else 0.0

    def export_estimate(self) -> float:
        if self.export_seconds is not None:
            return self.export_seconds
        return 2.0 * (self.startup_seconds or 0.0) + self.export_factor * (self.save_estimate() or 0.0)

    def reserve(self, final_eval: bool = True) -> float:
        """Seconds needed after the last step: checkpoint save + final save_model + export/verify (+ final eval)."""
        save = self.save_estimate() or 0.0
        return self.safety * (2.0 * save + self.export_estimate() + (self.eval_estimate() if final_eval else 0.0))

    def describe(self) -> str:
        return (f"save {_fmt(self.save_estimate())}, export+verify {_fmt(self.export_estimate())}"
                f"{' (measured)' if self.export_seconds is not None else ''}, final eval {_fmt(self.eval_estimate())}"
                f", step {_fmt(self.step_estimate())}, x{self.safety} safety")

    # persistence -----------------------------------------------------------------------------------------------
    _PERSISTED = ("step_seconds", "save_seconds", "eval_seconds", "export_seconds", "startup_seconds")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._PERSISTED}

    def load(self, path: str) -> bool:
        try:
            with open(path) as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return False
        for key in ("step_seconds", "save_seconds", "eval_seconds"):
            if isinstance(data.get(key), list):
                setattr(self, key, [float(v) for v in data[key]])
        if data.get("export_seconds") is not None:
            self.export_seconds = float(data["export_seconds"])
        return True

    def dump(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        data = keep_best_lib.read_json(path) or {}
        data.update(self.to_dict())
        if self.export_seconds is None:
            data.pop("export_seconds", None)
        keep_best_lib.write_json_atomic(path, data)


def record_export_seconds(run_dir: str, seconds: float) -> None:
    """Called by scripts/export_submission.py: the measured export (+verify) time, for the next round's budget."""
    path = os.path.join(run_dir, TIMINGS_FILE)
    data = keep_best_lib.read_json(path) or {}
    previous = data.get("export_seconds")
    data["export_seconds"] = max(float(seconds), float(previous or 0.0))  # a max: the slow case matters
    keep_best_lib.write_json_atomic(path, data)


# ---- time budget --------------------------------------------------------------------------------------------------


class TimeBudgetCallback(TrainerCallback):
    """Stop early enough that save + export + verify finish before `deadline_ts` (see the module docstring)."""

    def __init__(self, deadline_ts: float, reserve_estimator: ReserveEstimator | None = None,
                 eval_every_n_steps: int | None = None, clock=time.time, probe_save: bool = True, log=_log):
        self.deadline = float(deadline_ts)
        self.estimator = reserve_estimator or ReserveEstimator()
        self.eval_every = eval_every_n_steps if eval_every_n_steps and eval_every_n_steps > 0 else None
        self.clock = clock
        self.estimator.clock = clock
        self.probe_save = probe_save
        self.log = log
        self.stopped_at_step: int | None = None
        self.stop_reason: str | None = None
        self._step_start: float | None = None
        self._mark: float = clock()
        self._decide_after_save = False

    # what the next steps cost ----------------------------------------------------------------------------------
    def _saves_at(self, args, state, step: int) -> bool:
        strategy = str(getattr(args, "save_strategy", "no")).split(".")[-1].lower()
        save_steps = getattr(state, "save_steps", 0) or getattr(args, "save_steps", 0) or 0  # state: ratio resolved
        every = int(save_steps) if save_steps >= 1 else 0
        return bool(strategy == "steps" and every and step % every == 0) or self._evals_at(step)

    def _evals_at(self, step: int) -> bool:
        return bool(self.eval_every and self.estimator.eval_enabled and step % self.eval_every == 0)

    def time_needed(self, args, state, step: int, pending: bool = True) -> float:
        """Seconds from now to a submission in place if training continues for one more step."""
        est = self.estimator
        needed = est.step_estimate() + est.reserve(final_eval=True)
        if pending:
            if self._evals_at(step):
                needed += est.eval_estimate()
            if self._saves_at(args, state, step):
                needed += est.save_estimate() or 0.0
        return needed

    def _decide(self, args, state, control, now: float, pending: bool) -> None:
        """pending=True: called at step end (a save is still to come at this step, request one on stop);
        pending=False: called right after a save (stop only; asking for another save would save twice)."""
        local_stop = now + self.time_needed(args, state, state.global_step, pending) > self.deadline
        # the final evaluation only runs if it fits together with the rest of the reserve
        local_no_eval = now + self.estimator.reserve(final_eval=True) > self.deadline
        stop, no_eval = _reduce_max([local_stop, local_no_eval], args)
        self.estimator.final_eval_allowed = not no_eval
        if stop and not control.should_training_stop:
            control.should_training_stop = True
            if pending:
                control.should_save = True
            self.stopped_at_step = state.global_step
            self.stop_reason = (
                f"another step (~{_fmt(self.estimator.step_estimate())}) plus the reserve "
                f"(~{_fmt(self.estimator.reserve())}: {self.estimator.describe()}) would end after the deadline, "
                f"{_fmt(self.deadline - now)} from now"
            )
            if _is_rank0(state):
                self.log(f"[budget] stopping after step {state.global_step}/{state.max_steps}: {self.stop_reason}")

    # hooks -----------------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        now = self.clock()
        path = os.path.join(args.output_dir, TIMINGS_FILE)
        loaded = self.estimator.load(path)
        if self.clock is time.time:  # imports + model/data loading + trainer set-up, which the export repeats
            self.estimator.startup_seconds = max(now - process_start_time(), 0.0)
        self._mark = now
        if _is_rank0(state):
            self.log(f"[budget] deadline {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.deadline))} "
                     f"({_fmt(self.deadline - now)} from now); "
                     + (f"timings from a previous round: {self.estimator.describe()}" if loaded
                        else "save time is measured with a checkpoint after the first step"))
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = self.clock()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        if self._step_start is not None:
            self.estimator.observe_step(now - self._step_start)
        self._mark = now
        if self.estimator.save_estimate() is None and self.probe_save:
            # No save measured yet: save now (a first safety checkpoint) and decide right after it, in on_save.
            control.should_save = True
            self._decide_after_save = True
            self.estimator.final_eval_allowed = now < self.deadline
            return control
        self._decide(args, state, control, now, pending=True)
        return control

    def on_save(self, args, state, control, **kwargs):
        now = self.clock()
        started = max(self._mark, self.estimator.last_eval_end)
        self.estimator.observe_save(max(now - started, 0.0))
        if _is_rank0(state):
            self.estimator.dump(os.path.join(args.output_dir, TIMINGS_FILE))
        if self._decide_after_save or not control.should_training_stop:
            self._decide_after_save = False
            self._decide(args, state, control, now, pending=False)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if _is_rank0(state):
            try:
                self.estimator.dump(os.path.join(args.output_dir, TIMINGS_FILE))
            except OSError:
                pass
        return control


# ---- graceful stop ------------------------------------------------------------------------------------------------


class GracefulStopCallback(TrainerCallback):
    """SIGTERM/SIGINT -> checkpoint at the end of the current step, then stop (see the module docstring)."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), log=_log):
        self.signals = tuple(signals)
        self.log = log
        self.received: int | None = None
        self.stop_signal: int | None = None
        self.stopped_at_step: int | None = None
        self._previous: dict = {}

    @property
    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    @property
    def exit_code(self) -> int | None:
        return 128 + self.stop_signal if self.stop_signal else None

    def _handler(self, signum, frame):
        if self.received is not None:  # second signal: leave now
            self.restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        self.log(f"[stop] {signal.Signals(signum).name} received: saving a checkpoint at the end of this step, "
                 "then exiting (send it again to exit immediately)")

    def install(self) -> None:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.install()
        if _is_rank0(state):
            self.log(f"[run] training in {args.output_dir} (pid {os.getpid()}): SIGTERM/SIGINT saves a checkpoint "
                     "and stops; re-running the same command resumes")
        return control

    def on_step_end(self, args, state, control, **kwargs):
        (signum,) = _reduce_max([self.received or 0], args)
        if signum:
            self.stop_signal = int(signum)
            if self.stopped_at_step is None:
                self.stopped_at_step = state.global_step
                if _is_rank0(state):
                    self.log(f"[stop] saving checkpoint-{state.global_step} and stopping "
                             f"({signal.Signals(self.stop_signal).name})")
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.restore()
        return control


# ---- in-training evaluation + keep-best -------------------------------------------------------------------------


def _report_from_records(name: str, records: list[dict], seconds: float):
    from open_r1.evaluate import SetReport

    n = len(records)

    def pct(flag):
        return 100.0 * sum(bool(flag(r)) for r in records) / max(n, 1)

    return SetReport(
        name=name, n=n, accuracy_pct=pct(lambda r: r["correct"]),
        format_pct=pct(lambda r: r["prediction"] is not None),
        mean_completion_tokens=sum(r["completion_tokens"] for r in records) / max(n, 1),
        truncated_pct=pct(lambda r: r["truncated"]), seconds=seconds, records=records,
    )


class InTrainingEvalCallback(TrainerCallback):
    """Selfcheck protocol on held-out sets every N steps, keep-best bookkeeping (see the module docstring)."""

    def __init__(self, eval_sets: dict, every_n_steps: int, limit: int | None = None, batch_size: int = 32,
                 primary: str = "ood_val", secondary: str | None = "val", keep_best: bool = True,
                 eval_first_step: bool = True, estimator: ReserveEstimator | None = None,
                 skip=None, evaluate_fn=None, plot: bool = True, log=_log):
        if not eval_sets:
            raise ValueError("InTrainingEvalCallback needs at least one eval set")
        if every_n_steps is None or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.eval_sets = dict(eval_sets)
        self.every_n_steps = int(every_n_steps)
        self.limit = limit
        self.batch_size = batch_size
        self.primary = primary if primary in self.eval_sets else next(iter(self.eval_sets))
        self.secondary = secondary if secondary in self.eval_sets and secondary != self.primary else None
        self.keep_best = keep_best
        self.eval_first_step = eval_first_step
        self.estimator = estimator or ReserveEstimator()
        self.estimator.eval_enabled = True
        self.skip = skip or (lambda: False)
        self.evaluate_fn = evaluate_fn
        self.plot = plot
        self.log = log
        self.trainer = None
        self.history: dict = {"entries": []}
        self._pending: dict | None = None
        self._evaluated_steps: set[int] = set()
        self._gone: set[int] = set()

    def bind(self, trainer) -> None:
        """The trainer gives the accelerator (unwrap / ZeRO-3 gather) and the metrics that share the reward row."""
        self.trainer = trainer

    # files -------------------------------------------------------------------------------------------------------
    def _history_payload(self) -> dict:
        best = self._best()
        return {
            "primary": self.primary,
            "secondary": self.secondary,
            "limit": self.limit,
            "selection": keep_best_lib.SELECTION_RULE.format(primary=self.primary, secondary=self.secondary or "-"),
            "best": best,
            "entries": self.history["entries"],
        }

    def _write_files(self, args, state) -> None:
        if not _is_rank0(state):
            return
        os.makedirs(args.output_dir, exist_ok=True)
        payload = self._history_payload()
        keep_best_lib.write_json_atomic(os.path.join(args.output_dir, keep_best_lib.HISTORY_FILE), payload)
        if self.plot:
            try:
                keep_best_lib.plot_history(payload, state.log_history,
                                           os.path.join(args.output_dir, keep_best_lib.HISTORY_PLOT))
            except Exception as exc:  # noqa: BLE001 - a plot must never stop training
                self.log(f"[eval] warning: plot failed: {type(exc).__name__}: {exc}")

    # evaluation --------------------------------------------------------------------------------------------------
    def _generation_model(self, args, model):
        trainer = self.trainer
        if trainer is None or not hasattr(trainer, "accelerator"):
            return nullcontext(model)
        from trl.models import unwrap_model_for_generation

        return unwrap_model_for_generation(
            getattr(trainer, "model_wrapped", None) or trainer.model,
            trainer.accelerator,
            gather_deepspeed3_params=getattr(args, "ds3_gather_for_generation", True),
            gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
        )

    def _evaluate_set(self, model, processor, name, dataset):
        from open_r1 import evaluate as evaluate_lib

        evaluate_fn = self.evaluate_fn or evaluate_lib.evaluate_dataset
        n = len(dataset) if self.limit is None else min(self.limit, len(dataset))
        world = _world_size()
        if world == 1:
            return evaluate_fn(model, processor, dataset, name=name, batch_size=self.batch_size, limit=n,
                               progress=False)
        import torch.distributed as dist

        rank = dist.get_rank()
        mine = list(range(rank, n, world))
        per_rank = -(-n // world)
        real = len(mine)
        padded = mine + [mine[-1] if mine else 0] * (per_rank - real)  # same number of batches on every rank
        start = time.perf_counter()
        report = evaluate_fn(model, processor, dataset.select(padded), name=name, batch_size=self.batch_size,
                             limit=None, progress=False)
        records = []
        for record in report.records:
            if record["index"] < real:
                records.append({**record, "index": padded[record["index"]]})
        per_rank_records: list = [None] * world
        dist.all_gather_object(per_rank_records, records)
        gathered = sorted((r for part in per_rank_records for r in part), key=lambda r: r["index"])
        return _report_from_records(name, gathered, time.perf_counter() - start)

    def evaluate(self, args, model=None, processor=None) -> dict:
        """{set name: SetReport} for the current weights; identical on every rank."""
        import torch

        trainer = self.trainer
        if trainer is not None and getattr(trainer, "processing_class", None) is not None:
            processor = trainer.processing_class
        with self._generation_model(args, model) as generation_model:
            generation_model = generation_model if generation_model is not None else model
            was_training = generation_model.training
            generation_model.eval()
            try:
                with torch.no_grad():
                    return {name: self._evaluate_set(generation_model, processor, name, dataset)
                            for name, dataset in self.eval_sets.items()}
            finally:
                if was_training:
                    generation_model.train()

    def _log_metrics(self, control, metrics: dict) -> None:
        """Into the trainer's metrics for this step, so they land in the same log row as the rewards."""
        trainer = self.trainer
        store = getattr(trainer, "_metrics", None)
        if isinstance(store, dict) and "train" in store:
            for key, value in metrics.items():
                store["train"][key].append(value)
            control.should_log = True
        elif trainer is not None and hasattr(trainer, "log"):
            from transformers import Trainer

            Trainer.log(trainer, dict(metrics))

    # hooks -------------------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        history = keep_best_lib.load_history(args.output_dir)
        # entries past the resumed step belong to a trajectory that is being redone (or to an older run)
        self.history = {"entries": [e for e in history["entries"] if e.get("step", 0) <= state.global_step]}
        self._evaluated_steps = {e["step"] for e in self.history["entries"]}
        # Checkpoints already gone (rotated away) cannot be exported. Checked once here, where every rank sees the
        # same files; later choices use only what every rank knows (rotation never deletes the best checkpoint).
        self._gone = {e["step"] for e in self.history["entries"]
                      if not e.get("checkpoint")
                      or not keep_best_lib.has_weights(os.path.join(args.output_dir, e["checkpoint"]))}
        best = self._best()
        if best is not None and self.keep_best:
            self._set_trainer_best(args, state, best)
        return control

    def _best(self):
        candidates = [e for e in self.history["entries"] if e.get("checkpoint") and e["step"] not in self._gone]
        return keep_best_lib.select_best(candidates, self.primary, self.secondary)

    def _due(self, state, control) -> bool:
        step = state.global_step
        if step in self._evaluated_steps or self.skip():
            return False
        final = control.should_training_stop or step >= state.max_steps
        if final and not self.estimator.final_eval_allowed:
            if _is_rank0(state):
                self.log(f"[eval] skipping the evaluation at step {step}: it does not fit in the time budget")
            return False
        return final or step % self.every_n_steps == 0 or (self.eval_first_step and step == 1)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not self._due(state, control):
            return control
        step = state.global_step
        start = time.perf_counter()
        reports = self.evaluate(args, model, processing_class)
        seconds = time.perf_counter() - start
        self.estimator.observe_eval(seconds)
        self._evaluated_steps.add(step)
        scores = {name: report.accuracy_pct for name, report in reports.items()}
        self._pending = {
            "step": step,
            "checkpoint": None,
            "scores": scores,
            "format_pct": {name: r.format_pct for name, r in reports.items()},
            "mean_completion_tokens": {name: r.mean_completion_tokens for name, r in reports.items()},
            "truncated_pct": {name: r.truncated_pct for name, r in reports.items()},
            "n": {name: r.n for name, r in reports.items()},
            "reward": None,
            "eval_seconds": round(seconds, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        self._log_metrics(control, {f"eval/{name}_accuracy": value for name, value in scores.items()})
        control.should_save = True  # the evaluated weights become checkpoint-<step>
        if _is_rank0(state):
            self.log(f"[eval] step {step}: " + ", ".join(f"{k} {v:.2f}%" for k, v in scores.items())
                     + f" ({seconds:.1f}s)")
        self.estimator.last_eval_end = self.estimator.clock()
        return control

    def _reward_since_previous_eval(self, state, step: int) -> float | None:
        previous = max((e["step"] for e in self.history["entries"] if e["step"] < step), default=0)
        values = [e["reward"] for e in state.log_history
                  if e.get("reward") is not None and previous < e.get("step", 0) <= step]
        return sum(values) / len(values) if values else None

    def _finalize(self, args, state, saved: bool) -> None:
        entry, self._pending = self._pending, None
        name = f"checkpoint-{entry['step']}"
        entry["checkpoint"] = name if saved else None
        entry["reward"] = self._reward_since_previous_eval(state, entry["step"])
        self.history["entries"] = [e for e in self.history["entries"] if e["step"] != entry["step"]] + [entry]
        self.history["entries"].sort(key=lambda e: e["step"])
        self._gone.discard(entry["step"])
        if self.keep_best and entry["checkpoint"]:
            best = self._best()
            if best is not None:
                if best["step"] == entry["step"] and _is_rank0(state):
                    self.log(f"[keep-best] new best: {name} ({self.primary} {entry['scores'][self.primary]:.2f}%)")
                self._set_trainer_best(args, state, best)
        self._write_files(args, state)

    def _set_trainer_best(self, args, state, best: dict) -> None:
        """Record the best in the trainer state: its save_total_limit rotation never deletes best_model_checkpoint."""
        state.best_model_checkpoint = os.path.join(args.output_dir, best["checkpoint"])
        state.best_global_step = best["step"]
        state.best_metric = best["scores"].get(self.primary)

    def on_save(self, args, state, control, **kwargs):
        if self._pending is not None and self._pending["step"] == state.global_step:
            self._finalize(args, state, saved=True)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if self._pending is not None:  # evaluated but not saved (should not happen): record it without a checkpoint
            self._finalize(args, state, saved=False)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:
            self._finalize(args, state, saved=False)
        elif self.history["entries"]:
            self._write_files(args, state)  # final redraw with the complete reward curve
        return control


# ---- resume -------------------------------------------------------------------------------------------------------


def find_resume_checkpoint(output_dir: str, log=None) -> str | None:
    """Newest complete checkpoint-N in output_dir (trainer_state.json present), or None."""
    if not os.path.isdir(output_dir):
        return None
    complete = keep_best_lib.complete_checkpoints(output_dir)
    newest = complete[-1] if complete else None
    if log:
        newest_step = keep_best_lib.checkpoint_step(newest) if newest else -1
        for name in sorted(os.listdir(output_dir)):
            step = keep_best_lib.checkpoint_step(name)
            if step is not None and step > newest_step:
                log(f"[resume] skipping {name}: incomplete (no trainer_state.json; the run was killed while saving)")
    return newest


def resolve_resume(training_args, auto_resume: bool = True, log=_log) -> str | None:
    """The checkpoint to pass to trainer.train(resume_from_checkpoint=...).

    An explicit `resume_from_checkpoint` path wins ('true'/'latest' = newest complete checkpoint, 'false'/'none' =
    start fresh); otherwise, with auto_resume, the newest complete checkpoint in output_dir."""
    main_process = getattr(training_args, "process_index", 0) == 0
    say = log if main_process else None
    explicit = training_args.resume_from_checkpoint
    if isinstance(explicit, str) and explicit.strip().lower() in ("false", "none", "no", ""):
        return None
    if explicit and not (isinstance(explicit, str) and explicit.strip().lower() in ("true", "latest", "last")):
        if say:
            say(f"[resume] resuming from {explicit} (resume_from_checkpoint)")
        return explicit
    if not (auto_resume or explicit):
        return None
    checkpoint = find_resume_checkpoint(training_args.output_dir, log=say)
    if checkpoint is None:
        if explicit and say:
            say(f"[resume] no complete checkpoint in {training_args.output_dir}: starting from scratch")
        return None
    if say:
        state = {}
        try:
            with open(os.path.join(checkpoint, "trainer_state.json")) as handle:
                state = json.load(handle)
        except (OSError, ValueError):
            pass
        say(f"[resume] resuming from {checkpoint} (step {state.get('global_step', '?')} of "
            f"{state.get('max_steps', '?')}): weights, optimizer, scheduler, RNG and trainer state are restored. "
            "Start fresh with --auto_resume false or another --output_dir")
    return checkpoint


class ResumeWeightsCallback(TrainerCallback):
    """Load a full-weights checkpoint's weights the way `from_pretrained` does, after the trainer's own resume.

    Why: transformers 5 saves Qwen2-VL in the original checkpoint layout (`visual.*`, `model.layers.*`) and renames the
    keys on `from_pretrained`, but `Trainer._load_from_checkpoint` calls `model.load_state_dict(strict=False)` on the
    raw file, so every key mismatches and training silently continues from the *base* weights with the resumed
    optimizer state (transformers issue #43701). This hook runs at `on_train_begin`, after that load and after the
    optimizer/scheduler/RNG restore, and copies the checkpoint's weights in place (the optimizer keeps its
    references). Not needed and skipped: DeepSpeed (its engine checkpoint is loaded by name) and LoRA adapters
    (peft's `load_adapter` maps the keys itself). Every rank loads the same file, so DDP replicas stay identical.
    """

    def __init__(self, checkpoint: str, log=_log):
        self.checkpoint = checkpoint
        self.log = log
        self.loaded = False

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None or getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
            return control
        if os.path.isfile(os.path.join(self.checkpoint, "adapter_config.json")) or hasattr(model, "peft_config"):
            return control
        import torch

        dtype = next(model.parameters()).dtype
        fresh = type(model).from_pretrained(self.checkpoint, dtype=dtype)
        with torch.no_grad():
            result = model.load_state_dict(fresh.state_dict(), strict=False)
        del fresh
        if result.missing_keys or result.unexpected_keys:
            raise RuntimeError(
                f"resuming from {self.checkpoint}: its weights do not match the model (missing "
                f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]})")
        self.loaded = True
        if _is_rank0(state):
            self.log(f"[resume] weights of {os.path.basename(self.checkpoint)} loaded through from_pretrained's key "
                     "mapping (the trainer's own resume warns about missing/unexpected keys for Qwen2-VL and loads "
                     "none of them: transformers#43701)")
        return control


# ---- wiring for open_r1.grpo ------------------------------------------------------------------------------------


@dataclass
class RunSafety:
    """The callbacks of one training run and what main() needs afterwards."""

    callbacks: list
    graceful: GracefulStopCallback
    budget: TimeBudgetCallback | None = None
    evaluator: InTrainingEvalCallback | None = None
    keep_best: bool = False
    resume_from: str | None = None  # for trainer.train(resume_from_checkpoint=...)

    def bind(self, trainer) -> None:
        if self.evaluator is not None:
            self.evaluator.bind(trainer)


    @property
    def stopped_by_signal(self) -> bool:
        return self.graceful.stop_requested

    @property
    def exit_code(self) -> int:
        return self.graceful.exit_code or 0

    def finish(self, trainer, output_dir: str, final_model_saved: bool) -> dict:
        """Main process, after training: best_checkpoint.json names what export must take."""
        return keep_best_lib.write_best_checkpoint(
            output_dir, keep_best=self.keep_best, final_step=trainer.state.global_step,
            final_model_saved=final_model_saved, log=_log,
        )


def load_eval_sets(paths: list[str], limit: int | None = None) -> dict:
    """{basename: dataset (first `limit` rows)} from save_to_disk dirs, validated like the training data."""
    from open_r1 import data as data_lib

    sets = {}
    for path in paths:
        name = os.path.basename(os.path.normpath(path))
        if name in sets:
            raise data_lib.DataError(f"two eval sets are named {name!r} ({path}); eval set names are dir basenames")
        dataset = data_lib.load_counting_dataset(path)
        if limit is not None:
            dataset = dataset.select(range(min(limit, len(dataset))))
        data_lib.validate_counting_dataset(dataset, path)
        sets[name] = dataset
    return sets


def build_run_callbacks(script_args, training_args) -> RunSafety:
    """Callbacks from the recipe keys (auto_resume, time_budget, eval_sets, eval_steps_protocol, eval_limit,
    eval_batch_size, eval_primary, eval_secondary, eval_first_step, keep_best). Order matters: resume weights first,
    then budget, then signal, then eval, so that the evaluation at a stop step knows why training stops."""
    from open_r1.grpo import RecipeError

    estimator = ReserveEstimator()
    callbacks: list = []
    resume_from = resolve_resume(training_args, getattr(script_args, "auto_resume", True))
    if resume_from is not None:
        callbacks.append(ResumeWeightsCallback(resume_from))  # first: the weights are right before anything else
    budget = None
    time_budget = getattr(script_args, "time_budget", None)
    eval_paths = list(getattr(script_args, "eval_sets", None) or [])
    every = getattr(script_args, "eval_steps_protocol", None)
    if time_budget:
        try:
            deadline = parse_time_budget(time_budget)
        except BudgetError as exc:
            raise RecipeError(str(exc)) from None
        budget = TimeBudgetCallback(deadline, estimator, eval_every_n_steps=every if eval_paths else None)
        callbacks.append(budget)
    graceful = GracefulStopCallback()
    callbacks.append(graceful)
    evaluator = None
    keep_best = getattr(script_args, "keep_best", None)
    keep_best = bool(eval_paths) if keep_best is None else bool(keep_best)
    if eval_paths:
        if not every or every < 1:
            raise RecipeError(f"eval_steps_protocol must be >= 1 when eval_sets is set, got {every}")
        eval_sets = load_eval_sets(eval_paths, getattr(script_args, "eval_limit", None))
        evaluator = InTrainingEvalCallback(
            eval_sets, every, limit=getattr(script_args, "eval_limit", None),
            batch_size=getattr(script_args, "eval_batch_size", 32),
            primary=getattr(script_args, "eval_primary", "ood_val"),
            secondary=getattr(script_args, "eval_secondary", "val"),
            keep_best=keep_best, eval_first_step=getattr(script_args, "eval_first_step", True),
            estimator=estimator, skip=lambda: graceful.stop_requested,
        )
        callbacks.append(evaluator)
        wanted = getattr(script_args, "eval_primary", "ood_val")
        if wanted != evaluator.primary and getattr(training_args, "process_index", 0) == 0:
            _log(f"[eval] eval_primary {wanted!r} is not one of the eval sets {sorted(eval_sets)}: keep-best ranks "
                 f"by {evaluator.primary!r} (ties -> {evaluator.secondary!r}); set eval_primary to the OOD set's name")
    elif keep_best:
        raise RecipeError("keep_best needs eval_sets (held-out sets to score checkpoints on)")
    return RunSafety(callbacks=callbacks, graceful=graceful, budget=budget, evaluator=evaluator, keep_best=keep_best,
                     resume_from=resume_from)
