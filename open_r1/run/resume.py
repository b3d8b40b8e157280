"""Resume (`resolve_resume`): with `auto_resume` (default) a run dir resumes from its newest complete
`checkpoint-N` (one whose files load; newer broken ones are skipped with a log line), and the log says what was
restored and what started fresh. It never goes back silently: checkpoints none of which loads, nan/inf weights, or a
fresh start over a finished run's final model are one error."""

import logging
import os

from transformers import TrainerCallback

import open_r1.run.keep_best as keep_best_lib
from open_r1 import compat
from open_r1.checks import check_checkpoint, nonfinite_weights
from open_r1.errors import RecipeError
from open_r1.jsonio import read_json

logger = logging.getLogger(__name__)

RESTORABLE = {
    "optimizer": ("optimizer.pt",),
    "scheduler": ("scheduler.pt",),
    "RNG": ("rng_state.pth", "rng_state_0.pth"),
}


def _zip_problem(path: str) -> str | None:
    """torch.save files are zip archives: a truncated one has no readable central directory."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"{os.path.basename(path)} is unreadable ({exc})"
    return None


def checkpoint_problem(path: str) -> str | None:
    """Why checkpoint-N would not load (None = complete): trainer_state.json parses, the weights' headers and
    sizes are whole, and the optimizer/scheduler/RNG files present are readable archives."""
    state_path = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(state_path):
        return "no trainer_state.json (the run was killed while saving)"
    try:
        read_json(state_path)
    except (OSError, ValueError) as exc:
        return f"trainer_state.json is unreadable ({exc})"
    problem = check_checkpoint(path)
    if problem:
        return problem
    present = [
        os.path.join(path, name)
        for names in RESTORABLE.values()
        for name in names
        if os.path.isfile(os.path.join(path, name))
    ]
    return next(filter(None, map(_zip_problem, present)), None)


def find_resume_checkpoint(output_dir: str, verbose: bool = False) -> str | None:
    """Newest checkpoint-N in output_dir whose files load (see `checkpoint_problem`), or None. Newer ones that do
    not load are skipped, with a log line each."""
    for path in keep_best_lib.checkpoint_dirs(output_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        if verbose:
            logger.info(
                f"[resume] skipping {os.path.basename(path)}: incomplete ({problem}); falling back to the previous "
                "checkpoint"
            )
    return None


def restored_parts(checkpoint: str) -> tuple[list[str], list[str]]:
    """(restored, started fresh) as transformers will do it: the optimizer and scheduler are loaded only when BOTH
    files exist; the RNG state when its file exists; trainer state and weights always."""
    has = {part: any(os.path.isfile(os.path.join(checkpoint, n)) for n in names) for part, names in RESTORABLE.items()}
    restored, fresh = ["weights", "trainer state (step, logs)"], []
    if has["optimizer"] and has["scheduler"]:
        restored += ["optimizer", "scheduler"]
    else:
        missing = [f"{p}.pt" for p in ("optimizer", "scheduler") if not has[p]]
        fresh += [
            f"optimizer and scheduler ({' and '.join(missing)} missing; transformers loads both or neither; "
            "the learning rate is re-derived from the schedule at the resumed step)"
        ]
    (restored if has["RNG"] else fresh).append("RNG")
    return restored, fresh


def resolve_resume(training_args, auto_resume: bool = True) -> str | None:
    """The checkpoint for trainer.train(resume_from_checkpoint=...): an explicit path wins ('true'/'latest' = newest
    complete checkpoint, 'false'/'none' = start fresh); otherwise, with auto_resume, the newest complete one.
    Never goes back silently (one RecipeError, before the model loads): checkpoints of which none loads, a checkpoint
    whose weights hold nan/inf, or a fresh start in a dir holding a finished run's final model."""
    explicit = training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    checkpoint = None
    if isinstance(explicit, str) and explicit.strip().lower() in ("false", "none", "no", ""):
        pass
    elif explicit and not (isinstance(explicit, str) and explicit.strip().lower() in ("true", "latest", "last")):
        checkpoint = explicit
        problem = checkpoint_problem(explicit) if os.path.isdir(explicit) else "not a directory"
        if problem:
            raise RecipeError(
                f"resume_from_checkpoint {explicit} cannot be resumed: {problem} (--resume_from_checkpoint)"
            )
    elif auto_resume or explicit:
        checkpoint = find_resume_checkpoint(output_dir, verbose=True)
        if checkpoint is None and (broken := keep_best_lib.checkpoint_dirs(output_dir)):
            raise RecipeError(
                f"no checkpoint in {output_dir} loads, so this run would start over from the base model:\n  - "
                + "\n  - ".join(f"{os.path.basename(p)}: {checkpoint_problem(p)}" for p in broken)
                + "\nRepair or move them away, or start over on purpose with --resume_from_checkpoint none"
            )
    if checkpoint is None:
        if keep_best_lib.has_weights(output_dir):
            raise RecipeError(
                f"{output_dir} holds the final model of a finished run, which this run would overwrite after "
                "starting over from the base model. Use another --output_dir (OUTPUT_DIR), or move that model away"
            )
        return None
    problem = nonfinite_weights(checkpoint)
    if problem:
        raise RecipeError(
            f"checkpoint {checkpoint} cannot be resumed: {problem} (the run diverged before this save). Resume an "
            "earlier one with --resume_from_checkpoint <run dir>/checkpoint-N, or start over with another --output_dir"
        )
    if checkpoint == explicit:
        logger.info(f"[resume] resuming from {explicit} (resume_from_checkpoint)")
        return explicit
    state = read_json(os.path.join(checkpoint, "trainer_state.json"), {})
    restored, fresh = restored_parts(checkpoint)
    # a settings read with a default: resolve_resume also takes the plain argument objects the callback tests build
    now = getattr(training_args, "max_steps", None)
    longer = f"; this run's max_steps is {now}" if now not in (None, state.get("max_steps")) else ""
    logger.info(
        f"[resume] resuming from {checkpoint} (step {state.get('global_step', '?')} of "
        f"{state.get('max_steps', '?')}{longer}): restored {', '.join(restored)}"
        + (f"; started fresh: {'; '.join(fresh)}" if fresh else "")
        + ". Start over with another --output_dir"
    )
    return checkpoint


class ResumeWeightsCallback(TrainerCallback):
    """Make the resumed state the checkpoint's, at `on_train_begin` (after the trainer's own restore):

    * learning rate: the restored optimizer carries the old run's last lr (0 at the end of a linear decay) and a
      missing scheduler.pt restarts the warm-up; `align_schedule` sets the scheduler and every param group to THIS
      run's schedule at the resumed step;
    * weights: `Trainer._load_from_checkpoint` loads Qwen2-VL's saved layout with `strict=False` and no key renaming,
      so every key mismatches and training silently continues from the base weights (transformers#43701); the
      weights are copied in place through `from_pretrained`'s mapping. Skipped for DeepSpeed and LoRA adapters,
      which load by name."""

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        self.loaded = False

    def align_schedule(self, state, optimizer, scheduler) -> None:
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if optimizer is None or not lambdas or not hasattr(scheduler, "base_lrs"):
            return
        step = int(state.global_step or 0)
        was = scheduler.last_epoch
        if was != step:  # a fresh scheduler (its files were missing): fast-forward it to the resumed step
            scheduler.last_epoch = step
        values = [base * fn(step) for fn, base in zip(lambdas, scheduler.base_lrs)]
        before = [group["lr"] for group in optimizer.param_groups]
        for group, value in zip(optimizer.param_groups, values):
            group["lr"] = value
        compat.set_scheduler_last_lr(scheduler, values)  # what get_last_lr() (the logged lr) reports
        if before != values or was != step:
            logger.info(
                f"[resume] learning rate at step {step} set from this run's schedule (max_steps "
                f"{state.max_steps}): {before[0]:.3g} -> {values[0]:.3g}"
                + (f" (scheduler fast-forwarded from step {was})" if was != step else "")
            )

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.align_schedule(state, kwargs.get("optimizer"), kwargs.get("lr_scheduler"))
        # settings reads with a default, as in resolve_resume
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
                f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]})"
            )
        self.loaded = True
        logger.info(
            f"[resume] weights of {os.path.basename(self.checkpoint)} loaded through from_pretrained's key "
            "mapping (the trainer's own resume warns about missing/unexpected keys for Qwen2-VL and loads "
            "none of them: transformers#43701)"
        )
        return control
