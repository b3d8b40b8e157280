"""Resume (`resolve_resume`)
    With `auto_resume` (default) and no explicit `resume_from_checkpoint`, a run dir holding complete
    `checkpoint-N` dirs resumes from the newest complete one (optimizer, scheduler, RNG, trainer state and
    callback state restored by the trainer); a checkpoint without trainer_state.json was cut short by a kill and
    is skipped.
"""
from __future__ import annotations

import json
import os

from transformers import TrainerCallback

from open_r1.run import keep_best as keep_best_lib
from open_r1.run.common import _is_rank0, _log

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


