"""Time budget (`TimeBudgetCallback`): training stops early enough that the submission is in place by the deadline.

`time_budget` is "55m", "1h30m", "3600" (seconds from `$TRAIN_START_TIME`, which train.sh sets once for every rank
and the export, else from this process's start) or an ISO datetime. After every optimizer step training goes on
only if  now + pending(this step) + next_step + reserve <= deadline, where
    next_step = moving max of the last `window` step durations (GRPO steps vary with completion lengths);
    pending   = the evaluation and/or checkpoint save still due at this step;
    reserve   = safety (1.25) x (2 S + X + E): S the measured save (the stop step's checkpoint, then the final
                save_model), X export + verify (measured by a previous export of this run dir, else 2 x startup +
                `export_factor` x S: the export repeats the imports and model load and writes the weights twice),
                E the final in-training evaluation when evaluation is on.
Nothing is a constant guess: until a save is measured the callback forces a checkpoint after step 1 and decides
after it. Measurements persist in `<output_dir>/budget_timings.json` for a resumed round. At least one step always
runs; when the final evaluation no longer fits, it is skipped (keep-best chooses among evaluated checkpoints).
"""

import contextlib
import datetime as _dt
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field

from transformers import TrainerCallback

from open_r1.checks import is_number
from open_r1.errors import BudgetError
from open_r1.jsonio import read_json, write_json
from open_r1.run.common import _is_rank0, _reduce_max

logger = logging.getLogger(__name__)
TIMINGS_FILE = "budget_timings.json"


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
    """The deadline (Unix time) for a `time_budget` value, or None for no budget: a duration counts from `start`
    (default `budget_start_time()`), an ISO datetime is absolute (naive = local time)."""
    if value is None:
        return None
    if is_number(value):
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
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{sign}{h}h{m:02d}m{s:02d}s" if h else f"{sign}{m}m{s:02d}s"


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
        return max(values[-self.window :]) if values else None

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
        return (
            f"save {_fmt(self.save_estimate())}, export+verify {_fmt(self.export_estimate())}"
            f"{' (measured)' if self.export_seconds is not None else ''}, final eval {_fmt(self.eval_estimate())}"
            f", step {_fmt(self.step_estimate())}, x{self.safety} safety"
        )

    def load(self, path: str) -> bool:
        data = read_json(path, None)
        if data is None:
            return False
        for key in ("step_seconds", "save_seconds", "eval_seconds"):
            if isinstance(data.get(key), list):
                setattr(self, key, [float(v) for v in data[key]])
        if data.get("export_seconds") is not None:
            self.export_seconds = float(data["export_seconds"])
        return True

    def dump(self, path: str) -> None:
        data = read_json(path, None) or {}
        persisted = ("step_seconds", "save_seconds", "eval_seconds", "export_seconds", "startup_seconds")
        data.update({key: getattr(self, key) for key in persisted})
        if self.export_seconds is None:
            data.pop("export_seconds", None)
        write_json(path, data)


def record_export_seconds(run_dir: str, seconds: float) -> None:
    """Called by open_r1.submission.export (open-r1-export): the measured export (+verify) time, for the next round's
    budget."""
    path = os.path.join(run_dir, TIMINGS_FILE)
    data = read_json(path, None) or {}
    previous = data.get("export_seconds")
    data["export_seconds"] = max(float(seconds), float(previous or 0.0))  # a max: the slow case matters
    write_json(path, data)


class TimeBudgetCallback(TrainerCallback):
    """Stop early enough that save + export + verify finish before `deadline_ts` (see the module docstring).

    With `max_seconds` instead, the one plain wall-clock cap of any Trainer (SFT, the reward model, the captioning
    GRPO runs): the deadline is `max_seconds` after the first step ends (its compile/warm-up not counted), nothing is
    reserved or persisted, and training stops when another step would end after it."""

    def __init__(
        self,
        deadline_ts: float | None = None,
        reserve_estimator: ReserveEstimator | None = None,
        eval_every_n_steps: int | None = None,
        clock=time.time,
        eval_saves: bool = True,
        max_seconds: float | None = None,
    ):  # eval_saves: each evaluation saves a checkpoint (keep-best's)
        self.max_seconds = float(max_seconds) if max_seconds else None
        self.capped = deadline_ts is None  # a plain cap: no reserve, nothing written
        self.deadline, self.eval_saves = math.inf if self.capped else float(deadline_ts), eval_saves
        self.estimator = reserve_estimator or ReserveEstimator(safety=0.0 if self.capped else 1.25)
        self.eval_every = eval_every_n_steps if eval_every_n_steps and eval_every_n_steps > 0 else None
        self.clock = clock
        self.estimator.clock = clock
        self.stopped_at_step: int | None = None
        self.stop_reason: str | None = None
        self.t0: float | None = None  # the end of the first step (the cap's origin)
        self._step_start: float | None = None
        self._mark: float = clock()
        self._decide_after_save = False

    @property
    def stopped(self) -> bool:
        return self.stopped_at_step is not None

    def elapsed(self) -> float:
        """Seconds since the first step ended (what the cap counts)."""
        return 0.0 if self.t0 is None else self.clock() - self.t0

    def _saves_at(self, args, state, step: int) -> bool:
        strategy = str(args.save_strategy).split(".")[-1].lower()
        save_steps = state.save_steps or args.save_steps or 0  # state: a ratio resolved to steps
        every = int(save_steps) if save_steps >= 1 else 0
        return bool(strategy == "steps" and every and step % every == 0) or (self.eval_saves and self._evals_at(step))

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
            step = f"another step (~{_fmt(self.estimator.step_estimate())})"
            self.stop_reason = (
                f"{step} would end after the {self.max_seconds:g} s cap"
                if self.capped
                else f"{step} plus the reserve (~{_fmt(self.estimator.reserve())}: {self.estimator.describe()}) "
                f"would end after the deadline, {_fmt(self.deadline - now)} from now"
            )
            logger.info(f"[budget] stopping after step {state.global_step}/{state.max_steps}: {self.stop_reason}")

    def on_train_begin(self, args, state, control, **kwargs):
        now = self.clock()
        if self.capped:
            return control
        path = os.path.join(args.output_dir, TIMINGS_FILE)
        loaded = self.estimator.load(path)
        if self.clock is time.time:  # imports + model/data loading + trainer set-up, which the export repeats
            self.estimator.startup_seconds = max(now - process_start_time(), 0.0)
        self._mark = now
        logger.info(
            f"[budget] deadline {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.deadline))} "
            f"({_fmt(self.deadline - now)} from now); "
            + (
                f"timings from a previous round: {self.estimator.describe()}"
                if loaded
                else "save time is measured with a checkpoint after the first step"
            )
        )
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = self.clock()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        now = self.clock()
        if self._step_start is not None:
            self.estimator.observe_step(now - self._step_start)
        self._mark = now
        if self.t0 is None:
            self.t0 = now
            if self.capped and self.max_seconds:
                self.deadline = now + self.max_seconds
                return control
        if self.capped and not self.max_seconds:
            return control
        if self.estimator.save_estimate() is None and not self.capped:
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
        if _is_rank0(state) and not self.capped:
            self.estimator.dump(os.path.join(args.output_dir, TIMINGS_FILE))
        if self._decide_after_save or not control.should_training_stop:
            self._decide_after_save = False
            self._decide(args, state, control, now, pending=False)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if _is_rank0(state) and not self.capped:
            with contextlib.suppress(OSError):
                self.estimator.dump(os.path.join(args.output_dir, TIMINGS_FILE))
        return control
