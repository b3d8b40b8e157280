"""In-training evaluation (`InTrainingEvalCallback`): every `every_n_steps` steps (also at step 1 with
`eval_first_step`, and at the last step) the run's task scores the first `limit` rows of each held-out set
(`Task.evaluate`) on TRL's generation view of the model (ZeRO-3 gathers the parameters). Each rank evaluates an
equal-sized shard (padded with repeats, dropped again) and the records are all-gathered, so every rank holds the same
scores. Scores go to `eval/<set>_<metric>` in the step's log row, with keep_best a checkpoint is saved at that step, and
`eval_history.json` records each evaluation; the keep-best checkpoint (`keep_best.select_best`) goes into the trainer
state (`best_model_checkpoint`), which the `save_total_limit` rotation keeps.
"""

import logging
import os
import time
from contextlib import nullcontext

from transformers import TrainerCallback

import open_r1.run.keep_best as keep_best_lib
from open_r1 import compat
from open_r1.jsonio import write_json
from open_r1.run.budget import ReserveEstimator
from open_r1.run.common import _is_rank0, _world_size

logger = logging.getLogger(__name__)


class InTrainingEvalCallback(TrainerCallback):
    """Selfcheck protocol on held-out sets every N steps, keep-best bookkeeping (see the module docstring)."""

    def __init__(
        self,
        eval_sets: dict,
        every_n_steps: int,
        limit: int | None = None,
        batch_size: int = 32,
        primary: str | None = None,
        secondary: str | None = None,
        keep_best: bool = True,
        eval_first_step: bool = True,
        estimator: ReserveEstimator | None = None,
        skip=None,
        evaluate_fn=None,
        plot: bool = True,
        task=None,
    ):
        if not eval_sets:
            raise ValueError("InTrainingEvalCallback needs at least one eval set")
        if every_n_steps is None or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.eval_sets = dict(eval_sets)
        self.every_n_steps = int(every_n_steps)
        self.limit = limit
        self.batch_size = batch_size
        if task is None:
            raise ValueError("InTrainingEvalCallback needs the run's task (open_r1.tasks.get_task)")
        # keep-best ranks by the recipe's sets, else the task's (counting: ood_val, ties -> val), else the first set
        primary, secondary = primary or task.default_primary, secondary or task.default_secondary
        self.primary = primary if primary in self.eval_sets else next(iter(self.eval_sets))
        self.secondary = secondary if secondary in self.eval_sets and secondary != self.primary else None
        self.keep_best = keep_best
        self.eval_first_step = eval_first_step
        self.estimator = estimator or ReserveEstimator()
        self.estimator.eval_enabled = True
        self.skip = skip or (lambda: False)
        self.evaluate_fn = evaluate_fn
        self.task = task
        self.plot = plot
        self.trainer = None
        self.history: dict = {"entries": []}
        self._pending: dict | None = None
        self._evaluated_steps: set[int] = set()
        self._gone: set[int] = set()

    def bind(self, trainer) -> None:
        """The trainer gives the accelerator (unwrap / ZeRO-3 gather) and the metrics that share the reward row."""
        self.trainer = trainer

    def _write_files(self, args, state) -> None:
        if not _is_rank0(state):
            return
        payload = {
            "primary": self.primary,
            "secondary": self.secondary,
            "limit": self.limit,
            "selection": keep_best_lib.selection_rule(self.primary, self.secondary),
            "best": self._best(),
            "entries": self.history["entries"],
        }
        write_json(os.path.join(args.output_dir, keep_best_lib.HISTORY_FILE), payload)
        if self.plot:
            try:
                keep_best_lib.plot_history(
                    payload, state.log_history, os.path.join(args.output_dir, keep_best_lib.HISTORY_PLOT)
                )
            except Exception as exc:  # noqa: BLE001 - a plot must never stop training
                logger.warning(f"[eval] warning: plot failed: {type(exc).__name__}: {exc}")

    def _generation_model(self, args, model):
        trainer = self.trainer
        if not hasattr(trainer, "accelerator"):  # also no trainer
            return nullcontext(model)
        from trl.models import unwrap_model_for_generation

        return unwrap_model_for_generation(
            getattr(trainer, "model_wrapped", None) or trainer.model,
            trainer.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        )

    def _evaluate_set(self, model, processor, name, dataset):
        evaluate_fn = self.evaluate_fn or self.task.evaluate
        n = len(dataset) if self.limit is None else min(self.limit, len(dataset))
        world = _world_size()
        if world == 1:
            return evaluate_fn(
                model, processor, dataset, name=name, batch_size=self.batch_size, limit=n, progress=False
            )
        import torch.distributed as dist

        rank = dist.get_rank()
        mine = list(range(rank, n, world))
        per_rank = -(-n // world)
        real = len(mine)
        padded = mine + [mine[-1] if mine else 0] * (per_rank - real)  # same number of batches on every rank
        start = time.perf_counter()
        report = evaluate_fn(
            model, processor, dataset.select(padded), name=name, batch_size=self.batch_size, limit=None, progress=False
        )
        records = [{**record, "index": padded[record["index"]]} for record in report.records if record["index"] < real]
        per_rank_records: list = [None] * world
        dist.all_gather_object(per_rank_records, records)
        gathered = sorted((r for part in per_rank_records for r in part), key=lambda r: r["index"])
        return self.task.report_from_records(name, gathered, time.perf_counter() - start)

    def evaluate(self, args, model=None, processor=None) -> dict:
        """{set name: the task's report} for the current weights; identical on every rank."""
        import torch

        trainer = self.trainer
        if getattr(trainer, "processing_class", None) is not None:
            processor = trainer.processing_class
        with self._generation_model(args, model) as generation_model:
            was_training = generation_model.training
            generation_model.eval()
            try:
                with torch.no_grad():
                    return {
                        name: self._evaluate_set(generation_model, processor, name, dataset)
                        for name, dataset in self.eval_sets.items()
                    }
            finally:
                if was_training:
                    generation_model.train()

    def _log_metrics(self, control, metrics: dict) -> None:
        """Into the trainer's metrics for this step, so they land in the same log row as the rewards."""
        trainer = self.trainer
        if compat.log_step_metrics(trainer, metrics):
            control.should_log = True
        elif hasattr(trainer, "log"):
            from transformers import Trainer

            Trainer.log(trainer, dict(metrics))

    def on_train_begin(self, args, state, control, **kwargs):
        history = keep_best_lib.load_history(args.output_dir)
        # entries past the resumed step belong to a trajectory that is being redone (or to an older run)
        self.history = {"entries": [e for e in history["entries"] if e.get("step", 0) <= state.global_step]}
        self._evaluated_steps = {e["step"] for e in self.history["entries"]}
        # checkpoints rotated away cannot be exported: checked once here, where every rank sees the same files
        self._gone = {
            e["step"]
            for e in self.history["entries"]
            if not e.get("checkpoint") or not keep_best_lib.has_weights(os.path.join(args.output_dir, e["checkpoint"]))
        }
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
            logger.info(f"[eval] skipping the evaluation at step {step}: it does not fit in the time budget")
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
        scores = {name: report.score for name, report in reports.items()}
        self._pending = {"step": step, "checkpoint": None, "scores": scores, "metric": self.task.metric}
        for name, report in reports.items():  # every number of the task's report, per set
            for key, value in report.summary().items():
                if key not in ("name", "seconds") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._pending.setdefault(key, {})[name] = value
        self._pending.update(
            {"reward": None, "eval_seconds": round(seconds, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
        )
        self._log_metrics(control, {f"eval/{name}_{self.task.metric}": value for name, value in scores.items()})
        control.should_save |= self.keep_best  # keep-best picks among evaluated checkpoints; without it, no 30 GB save
        logger.info(
            f"[eval] step {step}: {self.task.metric} "
            + ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
            + f" ({seconds:.1f}s)"
        )
        self.estimator.last_eval_end = self.estimator.clock()
        return control

    def _reward_since_previous_eval(self, state, step: int) -> float | None:
        previous = max((e["step"] for e in self.history["entries"] if e["step"] < step), default=0)
        values = [
            e["reward"]
            for e in state.log_history
            if e.get("reward") is not None and previous < e.get("step", 0) <= step
        ]
        return sum(values) / len(values) if values else None

    def _finalize(self, args, state, saved: bool) -> None:
        entry, self._pending = self._pending, None
        name = f"checkpoint-{entry['step']}"
        entry["checkpoint"] = name if saved else None
        entry["reward"] = self._reward_since_previous_eval(state, entry["step"])
        others = [e for e in self.history["entries"] if e["step"] != entry["step"]]
        self.history["entries"] = sorted(others + [entry], key=lambda e: e["step"])
        self._gone.discard(entry["step"])
        if self.keep_best and entry["checkpoint"]:
            best = self._best()
            if best is not None:
                if best["step"] == entry["step"]:
                    logger.info(f"[keep-best] new best: {name} ({self.primary} {entry['scores'][self.primary]:.2f}%)")
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
        if self._pending is not None:  # evaluated but not saved (keep_best off): recorded without a checkpoint
            self._finalize(args, state, saved=False)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:
            self._finalize(args, state, saved=False)
        elif self.history["entries"]:
            self._write_files(args, state)  # final redraw with the complete reward curve
        return control
