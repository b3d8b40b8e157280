"""Supervised fine-tuning of a Qwen-VL model on prompt-completion rows, with TRL's `SFTTrainer`, then merge.

Task-neutral: rows are TRL's conversational prompt-completion VLM format (`prompt`, `completion`, `images`); TRL's
collator renders, pads and puts the loss on the completion only. LoRA (`lora_r` > 0): the adapter is saved with
`training_meta.json` and merged into a full model dir by `open_r1.submission.export`'s loader; full fine-tuning
(`lora_r` = 0, the stand-in's base models) writes the model dir directly. Stops at `max_steps` / `epochs` or the
wall-clock cap `max_seconds`; with `schedule="cosine"` the LR follows max(step fraction, time fraction), so a capped
run anneals.
"""

import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field

from open_r1 import modeling
from open_r1.errors import RecipeError
from open_r1.families import family_of
from open_r1.jsonio import write_json
from open_r1.run.budget import TimeBudgetCallback
from open_r1.submission.export import TRAINING_META_FILE, load_for_export

logger = logging.getLogger(__name__)
SFT_REPORT_FILE = "sft_report.json"
SCHEDULES = ("constant", "cosine")  # SFTSettings.schedule (see the module docstring)


@dataclass
class SFTSettings:
    learning_rate: float = 2e-4
    schedule: str = "constant"  # constant | cosine (time- and step-aware, see module docstring)
    warmup: float = 0.0  # fraction of the run (cosine only)
    min_lr_ratio: float = 0.05  # cosine floor
    epochs: float | None = 2.0
    max_steps: int | None = None
    max_seconds: float | None = None
    per_device_batch_size: int = 2
    gradient_accumulation_steps: int = 16
    weight_decay: float = 0.0
    lora_r: int = 32  # 0 = full fine-tuning
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_vision: bool = False
    gradient_checkpointing: bool = False
    bf16: bool | None = None  # mixed precision (autocast), default: on CUDA
    model_dtype: str | None = None  # weights as loaded; default float32 for full fine-tuning, bf16 on CUDA for LoRA
    min_pixels: int | None = None
    max_pixels: int | None = None
    seed: int = 0
    logging_steps: int = 10
    dataloader_workers: int = 0
    extra: dict = field(default_factory=dict)  # more SFTConfig fields

    def check(self) -> None:
        if self.schedule not in SCHEDULES:
            raise RecipeError(f"sft schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not (self.epochs or self.max_steps or self.max_seconds):
            raise RecipeError("sft needs a stop: set epochs, max_steps or max_seconds")
        if self.lora_r < 0 or self.learning_rate <= 0:
            raise RecipeError(
                f"sft lora_r must be >= 0 and learning_rate > 0 (got {self.lora_r}, {self.learning_rate})"
            )


def lr_multiplier(cap: TimeBudgetCallback, max_steps: int | None, settings: SFTSettings):
    """The schedule's LR factor at `step`: progress = max(step / max_steps, the cap's elapsed / max_seconds)."""

    def multiplier(step: int) -> float:
        if settings.schedule == "constant":
            return 1.0
        fractions = [step / max_steps] if max_steps else []
        if cap.max_seconds:
            fractions.append(cap.elapsed() / cap.max_seconds)
        p = min(1.0, max(fractions, default=0.0))
        if settings.warmup > 0 and p < settings.warmup:
            return max(p / settings.warmup, 1e-3)
        span = max(1e-9, 1.0 - settings.warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, (p - settings.warmup) / span)))
        return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine

    return multiplier


def capped_trainer_class():
    from torch.optim.lr_scheduler import LambdaLR
    from trl import SFTTrainer

    class CappedSFTTrainer(SFTTrainer):
        """TRL's SFTTrainer with a step/time-aware LR multiplier (the wall-clock stop is `TimeBudgetCallback`)."""

        multiplier = None

        def create_scheduler(self, num_training_steps, optimizer=None):
            if self.lr_scheduler is None:
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, self.multiplier)
                self._created_lr_scheduler = True
            return self.lr_scheduler

    return CappedSFTTrainer


def lora_config(model, settings: SFTSettings):
    from peft import LoraConfig

    targets = family_of(model).lora_targets(settings.lora_vision)
    return LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=settings.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def train_sft(
    dataset,
    out_dir: str,
    settings: SFTSettings,
    model_path: str | None = None,
    model=None,
    processor=None,
) -> dict:
    """SFT on prompt-completion rows; writes a full model dir at `out_dir` and returns a report (also saved there).
    Give `model_path` or an in-memory `model` + `processor` (full fine-tuning of a fresh model). With LoRA the adapter
    run dir is `<out_dir>.adapter`."""
    import torch
    from transformers import set_seed
    from trl import SFTConfig

    settings.check()
    if model is None:
        if model_path is None:
            raise RecipeError("train_sft needs model_path or a model")
        dtype = settings.model_dtype or ("float32" if settings.lora_r == 0 or not torch.cuda.is_available() else None)
        model = modeling.load_model(model_path, dtype=dtype)
    if processor is None:
        processor = modeling.load_processor(model_path, settings.min_pixels, settings.max_pixels)
    elif settings.min_pixels or settings.max_pixels:
        modeling.set_pixel_budget(processor, settings.min_pixels, settings.max_pixels)
    use_lora = settings.lora_r > 0
    if use_lora and model_path is None:
        raise RecipeError("LoRA SFT merges into a saved base: pass model_path (save a fresh model first)")
    set_seed(settings.seed)
    cuda = torch.cuda.is_available() and not settings.extra.get("use_cpu")  # extra's use_cpu keeps a GPU idle
    bf16 = cuda if settings.bf16 is None else settings.bf16
    batch = settings.per_device_batch_size * settings.gradient_accumulation_steps
    steps_per_epoch = max(1, math.ceil(len(dataset) / batch))
    max_steps = settings.max_steps
    if settings.epochs:
        by_epochs = max(1, math.ceil(settings.epochs * steps_per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)
    stop = TimeBudgetCallback(
        max_seconds=settings.max_seconds
    )  # the first step (compilation, first batch) is not charged
    trainer_class = capped_trainer_class()
    trainer_class.multiplier = staticmethod(lr_multiplier(stop, max_steps, settings))
    run_dir = out_dir.rstrip("/") + ".adapter" if use_lora else tempfile.mkdtemp(prefix="sft-")
    os.makedirs(run_dir, exist_ok=True)
    config = SFTConfig(
        output_dir=run_dir,
        per_device_train_batch_size=settings.per_device_batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps,
        learning_rate=settings.learning_rate,
        weight_decay=settings.weight_decay,
        max_grad_norm=1.0,
        max_steps=max_steps if max_steps is not None else 10**7,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to="none",
        bf16=bf16,
        gradient_checkpointing=settings.gradient_checkpointing,
        dataloader_num_workers=settings.dataloader_workers,
        seed=settings.seed,
        data_seed=settings.seed,
        max_length=None,  # never cut image tokens
        completion_only_loss=True,  # TRL's default for prompt-completion rows, made explicit
        packing=False,
        disable_tqdm=True,
        **{"use_cpu": not cuda, **settings.extra},
    )
    peft_config = lora_config(model, settings) if use_lora else None
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=[stop],
    )
    started = time.time()
    trainer.train()
    seconds = time.time() - started
    losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    if not losses:  # fewer steps than logging_steps: the run's mean loss is all there is
        losses = [(e["step"], e["train_loss"]) for e in trainer.state.log_history if "train_loss" in e]
    steps = int(trainer.state.global_step)
    logger.info(
        f"[sft] {steps} steps ({steps / steps_per_epoch:.2f} epochs of {len(dataset)} rows) in {seconds:.1f} s; "
        f"loss {losses[0][1] if losses else float('nan'):.3f} -> {losses[-1][1] if losses else float('nan'):.3f}"
        f"{' (time cap)' if stop.stopped else ''}"
    )
    min_pixels, max_pixels = modeling.pixel_budget(processor)
    report = {
        "rows": len(dataset),
        "steps": steps,
        "epochs": steps / steps_per_epoch,
        "train_seconds": seconds,
        "stopped_by_time": stop.stopped,
        "loss_first": losses[0][1] if losses else None,
        "loss_last": losses[-1][1] if losses else None,
        "loss_curve": losses[:: max(1, len(losses) // 100)],
        "settings": asdict(settings),
        "lora": use_lora,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "base_model": os.path.abspath(model_path) if model_path else None,
    }
    if use_lora:
        trainer.save_model(run_dir)
        processor.save_pretrained(run_dir)
        write_json(
            os.path.join(run_dir, TRAINING_META_FILE),
            {
                "base_model": os.path.abspath(model_path),
                "use_peft": True,
                "min_pixels": min_pixels,
                "max_pixels": max_pixels,
                "stage": "sft",
            },
        )
        del trainer, model
        # the export's merge; the counting submission's verification does not apply to other tasks: saved here
        merged, _ = load_for_export(run_dir)
        modeling.save_model_dir(merged, processor, out_dir)
        report["merged_from"] = run_dir
    else:
        model = trainer.accelerator.unwrap_model(trainer.model).eval()
        modeling.save_model_dir(model, processor, out_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
    write_json(os.path.join(out_dir, SFT_REPORT_FILE), report)
    return report
