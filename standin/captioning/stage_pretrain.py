"""Stand-in stage ``pretrain``: pre-train the stand-in's small base models from random init on the generated scenes.

Each base (``pretrain.policy``: qwen3_vl with the Thinking template; ``pretrain.rm_backbone``: qwen2_5_vl) is built
with random weights (``open_r1.tiny_models.build_tiny``) and fully fine-tuned with ``open_r1.sft.train_sft`` on
``cartoons.pretrain_rows`` (plus the exposure scenes' rows), then probed: the share of held-out scenes on which it
names the odd object's odd value. ``pretrain.policy.start`` copies a shipped start policy instead
(``standin/captioning/build_start.py``). On real data this stage does not exist: the recipe names the checkpoints.
"""

import dataclasses
import logging
import os
import shutil

from open_r1 import generation, modeling, sft, tiny_models
from open_r1.families import SUPPORTED
from open_r1.submission.install import installing
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning.config import help_field, require
from standin.captioning import cartoons

logger = logging.getLogger(__name__)

NAME = "pretrain"
MODELS = ("policy", "rm_backbone")
# ModelConfig's keys that are open_r1.sft.SFTSettings fields of the same name and meaning
SFT_KEYS = (
    "learning_rate",
    "warmup",
    "weight_decay",
    "epochs",
    "max_steps",
    "max_seconds",
    "min_pixels",
    "max_pixels",
    "logging_steps",
    "dataloader_workers",
)


@dataclasses.dataclass
class ModelConfig:
    """One base model's pre-training (``pretrain.policy`` / ``pretrain.rm_backbone``)."""

    start: str | None = help_field(None, "a start model dir copied instead of pre-training (the shipped start policy)")
    family: str | None = help_field(None, "tiny model family (null: qwen3_vl for the policy, qwen2_5_vl for the RM)")
    overrides: dict | None = help_field(None, "build_tiny size overrides (hidden_size, num_hidden_layers, ...)")
    seed: int | None = help_field(None, "the random init's seed (null: the recipe's)")
    learning_rate: float = help_field(1e-3, "peak learning rate (cosine)")
    warmup: float = help_field(0.05, "warm-up share")
    weight_decay: float = help_field(0.01, "AdamW weight decay")
    epochs: float | None = help_field(None, "passes over the rows")
    max_steps: int | None = help_field(None, "stop after N steps")
    max_seconds: float | None = help_field(None, "wall-clock cap")
    batch_size: int = help_field(8, "rows per step")
    min_pixels: int | None = help_field(None, "image budget, saved with the base for every later stage")
    max_pixels: int | None = help_field(None, "image budget, saved with the base for every later stage")
    logging_steps: int = help_field(10, "log every N steps")
    dataloader_workers: int = help_field(0, "DataLoader worker processes")
    probe_limit: int | None = help_field(48, "held-out scenes of the perception probe (0 or null: no probe)")
    per_contest: int = help_field(4, "pre-training rows per train contest")
    exposure_per_contest: int | None = help_field(None, "rows per exposure scene (null: per_contest)")
    kinds: list[str] = help_field(list(cartoons.PRETRAIN_KINDS), "row kinds on the train contests")
    exposure_kinds: list[str] | None = help_field(None, "row kinds on the exposure scenes (null: kinds but fluency)")
    exposure: bool = help_field(True, "add the exposure scenes' rows where the data stage made them")
    think_prefix: bool | None = help_field(None, "open completions with <think> (null: for the policy)")
    suppress_unused_tokens: bool | None = help_field(
        None, "never generate ids no text encodes to (null: for the policy, which samples)"
    )

    def __post_init__(self):
        require(
            self.family in (None, *SUPPORTED),
            f"pretrain family must be one of {', '.join(SUPPORTED)}, got {self.family!r}",
        )
        for kinds in (self.kinds, self.exposure_kinds or []):
            require(
                all(k in cartoons.PRETRAIN_KINDS for k in kinds),
                f"pretrain kinds must be a list of {', '.join(cartoons.PRETRAIN_KINDS)}, got {kinds!r}",
            )
        require(
            self.learning_rate > 0 and min(self.batch_size, self.per_contest) >= 1,
            "pretrain learning_rate must be > 0, batch_size and per_contest >= 1",
        )


@dataclasses.dataclass
class Config:
    policy: dict | None = help_field(None, "the policy's pre-training (ModelConfig)")
    rm_backbone: dict | None = help_field(None, "the RM backbone's pre-training (ModelConfig)")
    parallel: bool = help_field(False, "pre-train the two as parallel processes")
    only: str | None = help_field(None, "a parallel job: policy | rm_backbone")

    def __post_init__(self):
        require(self.only in (None, *MODELS), f"pretrain.only must be one of {', '.join(MODELS)} or null")
        for which in MODELS:
            setattr(self, which, config.parse_section(f"pretrain.{which}", ModelConfig, getattr(self, which)))


def pretrain_dataset(section, paths, seed, which: str):
    import datasets  # deferred: heavy

    cfg = getattr(section, which)
    think_prefix = which == "policy" if cfg.think_prefix is None else cfg.think_prefix
    kinds = tuple(cfg.kinds)
    train = cdata.load_captions(paths.split("train"), check_images="none")
    parts = [
        cartoons.pretrain_rows(train, kinds=kinds, per_contest=cfg.per_contest, think_prefix=think_prefix, seed=seed)
    ]
    for offset, split in enumerate(("ood_pretrain", "main_pretrain"), start=1):
        if os.path.isdir(paths.split(split)) and cfg.exposure:
            scenes = cdata.load_captions(paths.split(split), check_images="none")
            # by default no fluency rows: the exposure scenes show the images, not the task
            exposure_kinds = tuple(cfg.exposure_kinds or [k for k in kinds if k != "fluency"] or ["describe"])
            parts.append(
                cartoons.pretrain_rows(
                    scenes,
                    kinds=exposure_kinds,
                    per_contest=cfg.exposure_per_contest or cfg.per_contest,
                    think_prefix=think_prefix,
                    seed=seed + offset,
                )
            )
    rows = datasets.concatenate_datasets([parts[0], *(p.cast(parts[0].features) for p in parts[1:])])
    return rows.shuffle(seed=seed)


def suppress_unused(section, which: str) -> bool:
    value = getattr(section, which).suppress_unused_tokens
    return which == "policy" if value is None else value


def pretrain_one(section, paths, seed, which: str, init: str | None = None) -> dict:
    """One base: ``start`` copied, else pre-trained from random init (``init``: from that model dir instead, as
    ``build_start`` does); then the perception probe."""
    cfg = getattr(section, which)
    out = paths.policy_base if which == "policy" else paths.rm_base
    if cfg.start:  # a shipped start model instead of pre-training from random init
        with installing(out) as staging:
            shutil.copytree(cfg.start, staging, dirs_exist_ok=True)
        logger.info(f"[pretrain] {which}: copied the start model {cfg.start} to {out}")
        report = {"start": os.path.abspath(cfg.start), "out": out}
    else:
        report = train_one(section, paths, seed, which, out, init)
    if cfg.probe_limit:  # a shipped start is probed as a pre-trained base is
        report["perception"] = perception(paths, out, cfg)
        logger.info(
            f"[pretrain] {which}: names the odd object's odd value on held-out scenes: "
            + ", ".join(f"{k} {v['accuracy']:.2f} ({v['n']})" for k, v in report["perception"].items())
        )
    return report


def train_one(section, paths, seed, which: str, out: str, init: str | None) -> dict:
    cfg = getattr(section, which)
    family = cfg.family or ("qwen3_vl" if which == "policy" else "qwen2_5_vl")
    overrides, built = {}, init is None
    if built:
        init = out + ".init"
        overrides = dict(cfg.overrides or {})
        overrides.setdefault("suppress_unused", suppress_unused(section, which))
        tiny_models.build_tiny(family, init, seed=seed if cfg.seed is None else cfg.seed, overwrite=True, **overrides)
    rows = pretrain_dataset(section, paths, seed, which)
    settings = sft.SFTSettings(
        **{key: getattr(cfg, key) for key in SFT_KEYS},
        schedule="cosine",
        per_device_batch_size=cfg.batch_size,
        gradient_accumulation_steps=1,
        lora_r=0,
        seed=seed,
        extra={"adam_beta2": 0.98},
    )
    logger.info(f"[pretrain] {which}: family {family} {overrides}, {len(rows)} rows")
    report = sft.train_sft(rows, out, settings, model_path=init)
    if built:
        shutil.rmtree(init, ignore_errors=True)
    report.update({"family": family, "overrides": overrides, "out": out})
    return report


def perception(paths, model_dir: str, cfg: ModelConfig) -> dict:
    """Greedy answers of a pre-trained base to ``cartoons.PROBE_QUESTION`` on held-out contests (val and the OOD
    renderer): the share that names the odd object's odd value (``cartoons.perceives_odd``), what an RM on this
    backbone, and a policy, must see to read the hidden rule."""
    model = modeling.load_model(model_dir).to(config.device()).eval()
    processor = modeling.load_processor(model_dir, cfg.min_pixels, cfg.max_pixels)
    out = {}
    for split in ("val", "ood"):
        if not os.path.isdir(paths.split(split)):
            continue
        rows = cartoons.perception_probe_rows(
            cdata.load_captions(paths.split(split), check_images="none"), cfg.probe_limit
        )
        prompts = [
            processor.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in rows
        ]
        texts, _, _ = generation.generate_texts(model, processor, prompts, [r["image"] for r in rows], 24, decoder="hf")
        hits = [cartoons.perceives_odd(t, r["scene_meta"]) for t, r in zip(texts, rows)]
        out[split] = {"accuracy": sum(hits) / len(hits), "n": len(hits), "examples": texts[:3]}
    return out


def inputs(cfg, paths, *_) -> dict[str, config.Input]:
    found = {"train": config.split_input(paths, "train")}
    for which in MODELS:  # a shipped start, made by no stage: a missing one fails in the preflight
        start = getattr(cfg, which).start
        if start:
            found[f"{which}_start"] = config.Input(
                start,
                f"the {which} start",
                f"set pretrain.{which}.start to an existing one (make humor-demo-start builds the shipped one)",
            )
    return found


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.policy_base, paths.rm_base]


def jobs(cfg, *_) -> list[list[str]] | None:
    return [[f"pretrain.only={which}"] for which in MODELS] if cfg.parallel else None


def run(cfg: Config, paths, seed) -> dict:
    config.check_inputs(inputs(cfg, paths))
    return {name: pretrain_one(cfg, paths, seed, name) for name in MODELS if cfg.only in (None, name)}
