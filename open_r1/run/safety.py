"""Wires the run callbacks from the recipe keys (`build_run_callbacks`); order and roles below."""

import logging
from dataclasses import dataclass

from open_r1.run import keep_best as keep_best_lib
from open_r1.run.budget import ReserveEstimator, TimeBudgetCallback, parse_time_budget
from open_r1.run.disk import DiskSpaceCallback
from open_r1.run.evaluation import InTrainingEvalCallback
from open_r1.run.resume import ResumeWeightsCallback, resolve_resume
from open_r1.run.signals import GracefulStopCallback

logger = logging.getLogger(__name__)


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
            output_dir,
            keep_best=self.keep_best,
            final_step=trainer.state.global_step,
            final_model_saved=final_model_saved,
        )


def build_run_callbacks(script_args, training_args, task) -> RunSafety:
    """Callbacks from the recipe keys, checked by `open_r1.validate`; `task` scores the eval sets. Order matters:
    resume weights first, then budget, then signal, then eval, so that the evaluation at a stop step knows why
    training stops."""
    estimator = ReserveEstimator()
    callbacks: list = []
    resume_from = resolve_resume(training_args, script_args.auto_resume)
    if resume_from is not None:
        callbacks.append(ResumeWeightsCallback(resume_from))  # first: the weights are right before anything else
    budget = None
    time_budget = script_args.time_budget
    eval_paths = list(script_args.eval_sets or [])
    every = script_args.eval_steps_protocol
    keep_best = bool(eval_paths) if script_args.keep_best is None else bool(script_args.keep_best)
    deadline = parse_time_budget(time_budget) if time_budget else None  # '0' / 'off' / 'none': no budget
    if deadline is not None:
        budget = TimeBudgetCallback(
            deadline, estimator, eval_every_n_steps=every if eval_paths else None, eval_saves=keep_best
        )
        callbacks.append(budget)
    graceful = GracefulStopCallback()
    callbacks += [graceful, DiskSpaceCallback()]
    evaluator = None
    if eval_paths:
        eval_sets = task.load_eval_sets(eval_paths, script_args.eval_limit)
        wanted = script_args.eval_primary or task.default_primary
        evaluator = InTrainingEvalCallback(
            eval_sets,
            every,
            limit=script_args.eval_limit,
            batch_size=script_args.eval_batch_size,
            primary=wanted,
            secondary=script_args.eval_secondary or task.default_secondary,
            keep_best=keep_best,
            eval_first_step=script_args.eval_first_step,
            estimator=estimator,
            skip=lambda: graceful.stop_requested,
            task=task,
        )
        callbacks.append(evaluator)
        if wanted != evaluator.primary and training_args.process_index == 0:  # a warning: every rank shows those
            logger.warning(
                f"[eval] eval_primary {wanted!r} is not one of the eval sets {sorted(eval_sets)}: keep-best ranks "
                f"by {evaluator.primary!r} (ties -> {evaluator.secondary!r}); set eval_primary to the OOD set's name"
            )
    return RunSafety(
        callbacks=callbacks,
        graceful=graceful,
        budget=budget,
        evaluator=evaluator,
        keep_best=keep_best,
        resume_from=resume_from,
    )
