"""Stage 2: SFT of the policy on the thinking traces, with LoRA, then merged into a full model dir.

Algorithm (the seed's stage 2): ``data.sft_rows`` turns the top-k captions of every training contest and their traces
(stage 1) into TRL prompt-completion VLM rows: prompt = ``protocol.build_messages(description)`` (the same system
prompt and user turn as GRPO, the RM and evaluation), completion = ``format_target(thinking, caption)`` after the
Thinking template's ``<think>\\n``. ``open_r1.sft.train_sft`` trains them with TRL's ``SFTTrainer`` (loss on the
completion only), LoRA r = alpha = 32 on the language model, lr 2e-4 constant, no warm-up, effective batch 32,
2 epochs in the real recipe; the adapter is merged by ``open_r1.export.load_for_export`` (base recorded in
``training_meta.json``) and saved as a full model dir.

Deviations from the seed: LoRA stays off the vision tower (``lora_vision: false``; the seed puts it on the ViT too);
the seed's own collator is replaced by TRL's. Rendering by the real Qwen3 template puts a newline before
``</think>`` (``{thinking}\\n</think>\\n\\n<caption>…``); the parser accepts both. The stand-in recipe uses a higher
learning rate and fewer steps (tiny model, minutes).

    python -m open_r1.tasks.captioning.stage_sft --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os

from open_r1.tasks.captioning import stage_common as common

# the sft section's keys: `run`'s, `inputs`' (model, traces), ``out`` (stage_common.Paths) and ``top_k`` (which the
# synthesize stage reads too)
SECTION_KEYS = {  # the kinds of value `run` reads (open_r1.sft.SFTSettings; lora_r 0: full fine-tuning; schedule:
    # `check_recipe`, from open_r1.sft.SCHEDULES)
    "model": common.optional(common.TEXT), "traces": common.optional(common.TEXT), "out": common.optional(common.TEXT),
    "top_k": common.whole(1), "learning_rate": common.number(0, above=True),
    "schedule": common.ANY, "warmup": common.number(0, 1),
    "epochs": common.optional(common.number(0, above=True)), "max_steps": common.optional(common.whole(1)),
    "max_seconds": common.optional(common.number(0, above=True)), "per_device_batch_size": common.whole(1),
    "gradient_accumulation_steps": common.whole(1), "lora_r": common.whole(0), "lora_alpha": common.whole(1),
    "lora_vision": common.BOOL, "gradient_checkpointing": common.BOOL, "min_pixels": common.PIXELS,
    "max_pixels": common.PIXELS, "logging_steps": common.whole(1)}


def check_recipe(recipe: dict) -> None:
    """Before any stage runs (the pipeline's preflight): the sft section's keys and values."""
    from open_r1.errors import RecipeError
    from open_r1.sft import SCHEDULES

    cfg = common.section(recipe, "sft")
    common.check_section("sft", cfg, SECTION_KEYS)
    common.check_values("sft", cfg, {"schedule": common.choice(*SCHEDULES)})
    if not (cfg.get("epochs", 2) or cfg.get("max_steps") or cfg.get("max_seconds")):
        raise RecipeError("the sft section needs a stop: set sft.epochs, sft.max_steps or sft.max_seconds")


def inputs(recipe: dict) -> dict[str, common.Input]:
    cfg = common.section(recipe, "sft")
    paths = common.Paths(recipe)
    return {"model": common.Input(cfg.get("model") or paths.policy_base, "the base policy", "pretrain", "sft.model"),
            "traces": common.Input(cfg.get("traces") or os.path.join(paths.traces, "train_top_k"), "the SFT traces",
                                   "synthesize", "sft.traces", common.DATASET_MARKER)}


def run(recipe: dict) -> dict:
    import datasets

    from open_r1 import sft
    from open_r1.tasks.captioning import data as cdata

    cfg = common.section(recipe, "sft")
    paths = common.Paths(recipe)
    found = common.check_inputs(inputs(recipe))
    model_path, traces = found["model"], found["traces"]
    top = datasets.load_from_disk(traces)
    rows = cdata.sft_rows(top, int(cfg.get("top_k", 3)))
    settings = sft.SFTSettings(
        learning_rate=float(cfg.get("learning_rate", 2e-4)), schedule=cfg.get("schedule", "constant"),
        warmup=float(cfg.get("warmup", 0.0)), epochs=cfg.get("epochs", 2), max_steps=cfg.get("max_steps"),
        max_seconds=cfg.get("max_seconds"), per_device_batch_size=int(cfg.get("per_device_batch_size", 2)),
        gradient_accumulation_steps=int(cfg.get("gradient_accumulation_steps", 16)),
        lora_r=int(cfg.get("lora_r", 32)), lora_alpha=int(cfg.get("lora_alpha", 32)),
        lora_vision=bool(cfg.get("lora_vision", False)), gradient_checkpointing=bool(cfg.get("gradient_checkpointing", False)),
        min_pixels=cfg.get("min_pixels"), max_pixels=cfg.get("max_pixels"), seed=int(recipe["seed"]),
        logging_steps=int(cfg.get("logging_steps", 5)),
    )
    common.log(f"[sft] {len(rows)} rows from {traces}; base {model_path}")
    report = sft.train_sft(rows, paths.policy_sft, settings, model_path=model_path, log=common.log)
    report["out"] = paths.policy_sft
    return report


def main(argv=None) -> int:
    return common.stage_cli("sft", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
