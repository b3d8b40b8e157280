"""Stage 0b (stand-in only): pre-train the stand-in's small base models from random init on the generated scenes.

Algorithm: for each of the two base models (``pretrain.policy``: family qwen3_vl, the Thinking chat template, as
Qwen3-VL-2B-Thinking; ``pretrain.rm_backbone``: family qwen2_5_vl, as Qwen2.5-VL-3B) a checkpoint of the family is
built with random weights (``open_r1.tiny_models.build_tiny``, sizes from the recipe's ``overrides``), then fully
fine-tuned with TRL's ``SFTTrainer`` (``open_r1.sft.train_sft``, ``lora_r: 0``, cosine LR that follows max(step
fraction, time fraction)) on ``standin.pretrain_rows`` of the train contests: describe the picture, plain questions
about it (count, which object is odd, present / absent colours and shapes) and caption *fluency* (uniformly drawn
candidate captions under the task prompt and output format, so the base writes captions in the format but is not
selected for funniness), plus rows of the ``ood_pretrain`` / ``main_pretrain`` exposure scenes when the data stage
made them (``exposure_kinds``, default describe and question; ``fluency`` there too shows the base the task's prompt
and format on those renderers' images, with uniformly drawn captions: without it the stand-in policy answers the
task prompt on an OOD image the way it answered questions about such images, with an empty think block, and its
format fails there). Never reads ``oracle``, ``mean`` or ``votes``. Then a perception probe (``perception``): the
share of held-out scenes (val, OOD) on which the base, asked which object is different, names the odd value.

The policy's checkpoint suppresses in generation the ids that no text encodes to (``suppress_unused_tokens``,
default true for the policy, false for the RM backbone, which never generates): the tiny tokenizer pads its small
BPE with placeholder ids up to the real special ids, and a random-init model, unlike a real one, gives them
probability mass that sampling picks up (docs/CAPTIONING.md, "Run 15").

Deviation from the seed: the seed starts from the released Qwen3-VL-2B-Thinking and Qwen2.5-VL-3B-Instruct, which
cannot be downloaded here; on real data skip this stage and set ``sft.model`` / ``rm.backbone`` to those
checkpoints (configs/captioning/real_*.yaml). The stand-in bases see far less than a real base (minutes of
pre-training on one scene generator), so what the later stages measure is the pipeline's mechanics and relative
effects, not the real models' numbers.

    python -m open_r1.tasks.captioning.stage_pretrain --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import stage_common as common

MODELS = ("policy", "rm_backbone")


def pretrain_dataset(recipe: dict, which: str):
    import datasets

    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import standin

    cfg = common.section(common.section(recipe, "pretrain"), which)
    paths = common.Paths(recipe)
    per_contest = int(cfg.get("per_contest", 4))
    think_prefix = bool(cfg.get("think_prefix", which == "policy"))
    kinds = tuple(cfg.get("kinds", ("describe", "question", "fluency")))
    train = cdata.load_captions(paths.split("train"), check_images="none", keep_oracle=False)
    parts = [standin.pretrain_rows(train, kinds=kinds, per_contest=per_contest, think_prefix=think_prefix,
                                   seed=int(recipe["seed"]))]
    for offset, split in enumerate(("ood_pretrain", "main_pretrain"), start=1):
        exposure = paths.split(split)
        if os.path.isdir(exposure) and cfg.get("exposure", cfg.get("ood_exposure", True)):
            scenes = cdata.load_captions(exposure, check_images="none")
            # by default no fluency rows: the exposure scenes show the images, not the task (see the module docstring)
            exposure_kinds = tuple(cfg.get("exposure_kinds") or [k for k in kinds if k != "fluency"] or ["describe"])
            parts.append(standin.pretrain_rows(scenes, kinds=exposure_kinds,
                                               per_contest=int(cfg.get("exposure_per_contest", per_contest)),
                                               think_prefix=think_prefix, seed=int(recipe["seed"]) + offset))
    rows = datasets.concatenate_datasets([parts[0], *(p.cast(parts[0].features) for p in parts[1:])])
    return rows.shuffle(seed=int(recipe["seed"]))


def suppress_unused(recipe: dict, which: str) -> bool:
    """``pretrain.<which>.suppress_unused_tokens`` (default: true for the policy, which samples; like a real
    checkpoint it then never emits an id that no text encodes to, which run 15's GRPO rollouts did)."""
    value = common.section(common.section(recipe, "pretrain"), which).get("suppress_unused_tokens", which == "policy")
    if not isinstance(value, bool):
        raise RecipeError(f"pretrain.{which}.suppress_unused_tokens must be true or false, got {value!r}")
    return value


SECTION_KEYS = {"parallel": common.BOOL, "only": common.optional(common.choice(*MODELS)),
                "policy": common.optional(common.MAPPING), "rm_backbone": common.optional(common.MAPPING),
                "policy_out": common.optional(common.TEXT), "rm_out": common.optional(common.TEXT)}
# a model's keys, each with the kind of value read (family, kinds, exposure_kinds, suppress_unused_tokens: checked by
# `check_recipe`)
MODEL_KEYS = {
    "family": common.ANY, "overrides": common.optional(common.MAPPING), "seed": common.whole(),
    "learning_rate": common.number(0, above=True), "warmup": common.number(0, 1), "weight_decay": common.number(0),
    "epochs": common.optional(common.number(0, above=True)), "max_steps": common.optional(common.whole(1)),
    "max_seconds": common.optional(common.number(0, above=True)), "batch_size": common.whole(1),
    "min_pixels": common.PIXELS, "max_pixels": common.PIXELS, "logging_steps": common.whole(1),
    "dataloader_workers": common.whole(0), "probe_limit": common.optional(common.whole(0)),
    "per_contest": common.whole(1), "exposure_per_contest": common.whole(1), "exposure_kinds": common.ANY,
    "kinds": common.ANY, "exposure": common.BOOL, "ood_exposure": common.BOOL, "think_prefix": common.BOOL,
    "suppress_unused_tokens": common.ANY}


def check_recipe(recipe: dict) -> None:
    """Before any stage runs (the pipeline's preflight). Unknown keys are errors: the settings of a model live in
    its own subsection, and ``--set pretrain.max_steps=30`` was once silently ignored on the H200 (run 17's check)."""
    from open_r1.families import SUPPORTED
    from open_r1.tasks.captioning.standin import PRETRAIN_KINDS

    pretrain = common.section(recipe, "pretrain")
    common.check_section("pretrain", pretrain, SECTION_KEYS,
                         "a model's settings go under pretrain.policy.* or pretrain.rm_backbone.*")
    for which in MODELS:
        cfg = common.section(pretrain, which)
        common.check_section(f"pretrain.{which}", cfg, MODEL_KEYS)
        kinds = common.Kind(f"a list of {', '.join(PRETRAIN_KINDS)}", lambda value: isinstance(value, list)
                            and all(kind in PRETRAIN_KINDS for kind in value))
        common.check_values(f"pretrain.{which}", cfg, {"family": common.choice(*SUPPORTED), "kinds": kinds,
                                                       "exposure_kinds": common.optional(kinds)})
        suppress_unused(recipe, which)


def pretrain_one(recipe: dict, which: str) -> dict:
    from open_r1 import sft, tiny_models

    cfg = common.section(common.section(recipe, "pretrain"), which)
    paths = common.Paths(recipe)
    out = paths.policy_base if which == "policy" else paths.rm_base
    family = cfg.get("family", "qwen3_vl" if which == "policy" else "qwen2_5_vl")
    init = out + ".init"
    overrides = dict(cfg.get("overrides") or {})
    overrides.setdefault("suppress_unused", suppress_unused(recipe, which))
    tiny_models.build_tiny(family, init, seed=int(cfg.get("seed", recipe["seed"])), overwrite=True, **overrides)
    rows = pretrain_dataset(recipe, which)
    settings = sft.SFTSettings(
        learning_rate=float(cfg.get("learning_rate", 1e-3)), schedule="cosine", warmup=float(cfg.get("warmup", 0.05)),
        epochs=cfg.get("epochs"), max_steps=cfg.get("max_steps"), max_seconds=cfg.get("max_seconds"),
        per_device_batch_size=int(cfg.get("batch_size", 8)), gradient_accumulation_steps=1,
        weight_decay=float(cfg.get("weight_decay", 0.01)), lora_r=0, min_pixels=cfg.get("min_pixels"),
        max_pixels=cfg.get("max_pixels"), seed=int(recipe["seed"]), logging_steps=int(cfg.get("logging_steps", 10)),
        dataloader_workers=int(cfg.get("dataloader_workers", 0)),
        extra={"adam_beta2": 0.98},
    )
    common.log(f"[pretrain] {which}: family {family} {overrides}, {len(rows)} rows")
    report = sft.train_sft(rows, out, settings, model_path=init, log=common.log)
    import shutil

    shutil.rmtree(init, ignore_errors=True)
    report.update({"family": family, "overrides": overrides, "out": out})
    if cfg.get("probe_limit", 48):
        report["perception"] = perception(recipe, out, int(cfg.get("probe_limit", 48)), cfg)
        common.log(f"[pretrain] {which}: names the odd object's odd value on held-out scenes: "
                   + ", ".join(f"{k} {v['accuracy']:.2f} ({v['n']})" for k, v in report["perception"].items()))
    return report


def perception(recipe: dict, model_dir: str, limit: int, cfg: dict) -> dict:
    """Greedy answers of a pre-trained base to ``standin.PROBE_QUESTION`` on held-out contests (val and the OOD
    renderer: images pre-training never saw): the share that names the odd object's odd value
    (``standin.perceives_odd``). What an RM on this backbone, and a policy, must see to read the hidden rule."""
    import torch

    from open_r1 import modeling
    from open_r1.generation import generate_texts
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import standin

    paths = common.Paths(recipe)
    model = modeling.load_model(model_dir, dtype=None if torch.cuda.is_available() else "float32")
    model = model.to(common.device()).eval()
    processor = modeling.load_processor(model_dir, cfg.get("min_pixels"), cfg.get("max_pixels"))
    out = {}
    for split in ("val", "ood"):
        if not os.path.isdir(paths.split(split)):
            continue
        rows = standin.perception_probe_rows(cdata.load_captions(paths.split(split), check_images="none",
                                                                 keep_oracle=True), limit)
        prompts = [processor.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
                   for r in rows]
        texts, _, _ = generate_texts(model, processor, prompts, [r["image"] for r in rows], 24, decoder="hf")
        hits = [standin.perceives_odd(t, r["scene_meta"]) for t, r in zip(texts, rows)]
        out[split] = {"accuracy": sum(hits) / len(hits), "n": len(hits), "examples": texts[:3]}
    del model
    return out


def inputs(recipe: dict) -> dict[str, common.Input]:
    return {"train": common.split_input(common.Paths(recipe), "train")}


def run(recipe: dict) -> dict:
    common.check_inputs(inputs(recipe))
    which = common.section(recipe, "pretrain").get("only")
    return {name: pretrain_one(recipe, name) for name in MODELS if which in (None, name)}


def main(argv=None) -> int:
    return common.stage_cli("pretrain", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
