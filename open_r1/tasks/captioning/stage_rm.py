"""Stage 3: the Bradley-Terry VLM reward model, its held-out pairwise accuracy, and an image-blind control.

Training pairs by the k-sigma rule (``data.pair_indices``), each side ``protocol.rm_messages`` with the cartoon, trained
by ``open_r1.reward_model`` (loss -log sigmoid(s_chosen - s_rejected)). Held out: pairwise accuracy on
``eval_splits`` with a bootstrap CI over contests, and the image swap (0.5 when blind to the image). The blind
control: the same recipe on one blank grey image. ``seeds``: one RM each, the best on val kept as ``models/rm``.
"""

import dataclasses
import logging
import os
import shutil
import time

from open_r1 import reward_model as rm_lib
from open_r1.errors import OpenR1Error
from open_r1.jsonio import write_json
from open_r1.run.budget import TimeBudgetCallback
from open_r1.submission.install import installing
from open_r1.tasks.captioning import config, protocol
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning.config import help_field, require
from open_r1.tasks.captioning.evaluate import _fmt

logger = logging.getLogger(__name__)

NAME = "rm"


@dataclasses.dataclass
class Config:
    train_split: str = help_field("train", "the split the training pairs come from")
    k: float = help_field(3.0, "k-sigma rule: a pair when the mean gap exceeds k * sqrt(se1^2 + se2^2)")
    se_from: str = help_field("precision", f"the standard error of a mean: {' | '.join(cdata.SE_FROM)}")
    cap_per_contest: int | None = help_field(1000, "training pairs per contest, drawn at random (null: all)")
    max_pairs: int | None = help_field(None, "keep the first N of the shuffled pairs")
    image_negative_top_k: int = help_field(3, "the image swap's captions: each contest's top k")
    min_pixels: int | None = help_field(None, "image budget (null: the backbone processor's)")
    max_pixels: int | None = help_field(None, "image budget (null: the backbone processor's)")
    dtype: str | None = help_field(
        None, "float32 | bfloat16 | float16 | auto (null: float32 for full fine-tuning or on CPU)"
    )
    lora: dict | None = help_field(None, "null (full fine-tuning) or {r, alpha, dropout, vision, target_modules}")
    learning_rate: float = help_field(1e-5, "AdamW learning rate")
    lr_scheduler: str = help_field("cosine", "a transformers scheduler name")
    warmup_ratio: float = help_field(0.03, "warm-up as a fraction of the steps")
    epochs: float = help_field(1.0, "passes over the pairs")
    max_steps: int | None = help_field(None, "stop after N steps (null: the epochs)")
    max_seconds: float | None = help_field(None, "wall-clock cap of training (open_r1.run.budget.TimeBudgetCallback)")
    weight_decay: float = help_field(0.0, "AdamW weight decay")
    per_device_batch_size: int = help_field(8, "pairs per step")
    gradient_accumulation_steps: int = help_field(1, "steps per optimizer step")
    gradient_checkpointing: bool = help_field(False, "activation checkpointing")
    dataloader_workers: int = help_field(0, "DataLoader worker processes")
    logging_steps: int = help_field(10, "log the loss every N steps")
    center_rewards_coefficient: float | None = help_field(None, "TRL's reward-centring term")
    eval_splits: list[str] = help_field(["test"], "held-out splits scored (val first when several seeds compete)")
    eval_cap_per_contest: int = help_field(200, "held-out pairs per contest")
    eval_batch_size: int = help_field(32, "conversations per scoring batch")
    eval_image_swaps: int = help_field(480, "captions per held-out split for the image-swap diagnostic (0: none)")
    blind: bool = help_field(True, "also train and score the image-blind control")
    seeds: list[int] | None = help_field(None, "one RM per seed, the best on val kept (null: [the recipe's seed])")

    def __post_init__(self):
        from transformers import SchedulerType  # deferred: heavy

        schedulers = [kind.value for kind in SchedulerType]
        require(
            self.lr_scheduler in schedulers,
            f"rm.lr_scheduler must be one of {', '.join(schedulers)}, got {self.lr_scheduler!r}",
        )
        require(
            self.se_from in cdata.SE_FROM, f"rm.se_from must be one of {', '.join(cdata.SE_FROM)}, got {self.se_from!r}"
        )
        require(self.dtype in (None, "float32", "bfloat16", "float16", "auto"), f"rm.dtype: {self.dtype!r}?")
        require(
            self.learning_rate > 0 and self.epochs > 0 and 0 <= self.warmup_ratio <= 1,
            "rm.learning_rate and rm.epochs must be > 0, rm.warmup_ratio in [0, 1]",
        )
        config.at_least(NAME, self, 0, "k", "eval_image_swaps", "dataloader_workers", "max_pairs", "weight_decay")
        config.at_least(
            NAME,
            self,
            1,
            "per_device_batch_size",
            "gradient_accumulation_steps",
            "eval_batch_size",
            "eval_cap_per_contest",
            "image_negative_top_k",
            "logging_steps",
            "cap_per_contest",
            "max_steps",
        )
        require(
            self.max_seconds is None or self.max_seconds > 0,
            f"rm.max_seconds must be > 0 or null, got {self.max_seconds!r}",
        )
        if self.lora is not None:
            config.check_keys("rm.lora", self.lora, rm_lib.LORA_KEYS)
        if self.seeds is not None:
            config.seed_list("rm.seeds", self.seeds)


def contest_images(dataset, first_row: dict, blind: bool) -> dict:
    """{contest: its image (row `first_row[contest]`)}, decoded once for all its pairs; blind: a blank grey one."""
    from PIL import Image  # deferred: heavy

    decoded = [image.convert("RGB") for image in dataset.select(list(first_row.values()))["image"]]
    return {
        contest: Image.new("RGB", image.size, (128, 128, 128)) if blind else image
        for contest, image in zip(first_row, decoded)
    }


def index_pair_rows(dataset, index, blind: bool = False, swap: bool = False) -> list[dict]:
    """RM rows {image, chosen, rejected, group} of ``data.pair_indices``' (chosen, rejected) row pairs, without
    building the pair dataset (that copies a contest's image into each of its pairs). `swap`: pairs of
    ``data.image_negative_indices``, one conversation, chosen under its own cartoon, rejected under the other row's
    (``rejected_image``)."""
    columns = dataset.remove_columns("image").to_dict()
    contests, captions = columns["contest"], columns["caption"]
    first = {}
    for row in range(len(contests)) if swap else index[:, 0].tolist():  # swap: each contest's first row
        first.setdefault(contests[row], row)
    images = contest_images(dataset, first, blind)
    prompts = {}  # chosen row -> its prompt, built once
    rows = []
    for chosen, rejected in index.tolist():
        contest = contests[chosen]
        if swap and contests[rejected] == contest:
            raise ValueError(f"an image-negative pair of rows {chosen}, {rejected} has one contest ({contest!r})")
        if chosen not in prompts:
            prompts[chosen] = protocol.build_messages(
                protocol.description_from_row({k: v[chosen] for k, v in columns.items()})
            )
        messages = [*prompts[chosen], protocol.rm_turn(captions[chosen])]
        rows.append(
            {
                "image": images[contest],
                "chosen": messages,
                "rejected": messages if swap else [*prompts[chosen], protocol.rm_turn(captions[rejected])],
                **({"rejected_image": images[contests[rejected]]} if swap else {}),
                "group": contest,
            }
        )
    return rows


def held_out_index(cfg, paths, seed, split: str):
    """(the split's dataset, the row indices of its held-out pairs)."""
    dataset = cdata.load_captions(paths.split(split), check_images="none")
    return dataset, cdata.pair_indices(dataset, cfg.k, cfg.se_from, cfg.eval_cap_per_contest, seed + 7)


def rm_seeds(cfg, seed) -> list[int]:
    return cfg.seeds or [seed]


def scored_splits(cfg, seed) -> list[str]:
    """``eval_splits``, with val first when several seeds compete (the choice reads val)."""
    splits = list(cfg.eval_splits)
    if len(rm_seeds(cfg, seed)) > 1 and "val" not in splits:
        splits.insert(0, "val")
    return splits


def training_index(cfg, seed, dataset):
    """The row indices of the pairs the RM trains on (the k-sigma rule), then the ``rm.max_pairs`` prefix."""
    index = cdata.pair_indices(dataset, cfg.k, cfg.se_from, cfg.cap_per_contest, seed)
    return index[: cfg.max_pairs] if cfg.max_pairs else index


def training_pair_rows(cfg, paths, seed, blind: bool = False) -> list[dict]:
    """The RM rows of the training pairs (`train` checked the split first)."""
    train = cdata.load_captions(paths.split(cfg.train_split), check_images="none")
    return index_pair_rows(train, training_index(cfg, seed, train), blind=blind)


def train_one(cfg, paths, seed, blind: bool, rm_seed: int) -> dict:
    """The RM of `rm_seed` (one of ``rm.seeds``) or, `blind`, the blind control (trained with that seed)."""
    import torch  # deferred: heavy
    from transformers import TrainingArguments  # deferred: heavy

    backbone = paths.rm_base
    seeds = rm_seeds(cfg, seed)
    out = paths.rm_blind if blind else (paths.rm if len(seeds) == 1 else paths.rm_seed(rm_seed))
    tag = f"[rm{' blind' if blind else ''}{'' if len(seeds) == 1 else f' s{rm_seed}'}]"
    rows = training_pair_rows(cfg, paths, seed, blind=blind)
    cuda = torch.cuda.is_available()
    model = rm_lib.build_reward_model(
        backbone,
        min_pixels=cfg.min_pixels,
        max_pixels=cfg.max_pixels,
        dtype=cfg.dtype or ("float32" if not cfg.lora or not cuda else None),
        lora=cfg.lora,
        meta={"blind": blind, "train_pairs": len(rows), "k": cfg.k, "seed": rm_seed},
    )
    if not cuda:
        model = model.float()
    work = os.path.join(paths.root, "rm-trainer-blind" if blind else f"rm-trainer-s{rm_seed}")
    args = TrainingArguments(
        output_dir=work,
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        weight_decay=cfg.weight_decay,
        logging_steps=cfg.logging_steps,
        save_strategy="no",
        report_to="none",
        bf16=cuda,
        use_cpu=not cuda,
        seed=rm_seed,
        data_seed=rm_seed,
        dataloader_num_workers=cfg.dataloader_workers,
        disable_tqdm=True,
        gradient_checkpointing=cfg.gradient_checkpointing,
        remove_unused_columns=False,
    )
    contests = len({row["group"] for row in rows})
    logger.info(f"{tag} {len(rows)} train pairs from {contests} contests; backbone {backbone}")
    started = time.time()
    trainer = rm_lib.train_reward_model(
        model,
        rows,
        args,
        callbacks=[TimeBudgetCallback(max_seconds=cfg.max_seconds)],
        center_rewards_coefficient=cfg.center_rewards_coefficient,
    )
    seconds = time.time() - started
    losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    model.save(out, extra_meta={"train_seconds": seconds, "steps": trainer.state.global_step})
    del trainer
    logger.info(f"{tag} {model.meta['steps']} steps; saved {out}")
    report = {
        "out": out,
        "blind": blind,
        "seed": rm_seed,
        "train_pairs": len(rows),
        "steps": int(model.meta["steps"]),
        "train_seconds": seconds,
        "loss_first": losses[0][1] if losses else None,
        "loss_last": losses[-1][1] if losses else None,
        "loss_curve": losses[:: max(1, len(losses) // 50)],
        "held_out": score_held_out(cfg, paths, seed, model, blind, tag),
    }
    write_json(os.path.join(out, "rm_report.json"), report)
    return report


def score_held_out(cfg, paths, seed, model, blind: bool, tag: str = "[rm]", splits: list[str] | None = None) -> dict:
    """Pairwise accuracy (with the by-contest CI) of `model` on each existing held-out split (default:
    `scored_splits`); blind: every image the blank one."""
    results = {}
    for split in splits or scored_splits(cfg, seed):
        if not os.path.isdir(paths.split(split)):
            continue
        t0 = time.time()
        dataset, index = held_out_index(cfg, paths, seed, split)
        held = index_pair_rows(dataset, index, blind=blind)
        logger.info(f"{tag} {split}: scoring {len(held)} held-out pairs (built in {time.time() - t0:.1f} s)")
        result = rm_lib.evaluate_pairs(
            model,
            held,
            batch_size=cfg.eval_batch_size,
            seed=seed,
            progress=config.progress_bar(f"{tag} {split}", "conversation"),
        )
        swap = image_swap_accuracy(cfg, seed, model, dataset, blind)
        if swap is not None:
            result["image_swap"] = swap
            logger.info(
                f"{tag} {split}: image swap (own cartoon over another) {swap['accuracy']:.3f} "
                f"[{swap['ci_low']:.3f}, {swap['ci_high']:.3f}] over {swap['n_pairs']} captions"
            )
        results[split] = result
        logger.info(
            f"{tag} {split}: pairwise accuracy {result['accuracy']:.3f} "
            f"[{result['ci_low']:.3f}, {result['ci_high']:.3f}] over {result['n_pairs']} pairs of "
            f"{result['n_groups']} contests"
        )
    return results


def image_swap_accuracy(cfg, seed, model, dataset, blind: bool) -> dict | None:
    """Does the RM read the image? The share of ``rm.eval_image_swaps`` top captions it scores higher under their
    own cartoon than another's, with the by-contest CI (0.5 when blind); None for 0 swaps or under two contests."""
    n = cfg.eval_image_swaps
    if not n or len(set(dataset["contest"])) < 2:
        return None
    index = cdata.image_negative_indices(dataset, n, top_k=cfg.image_negative_top_k, seed=seed + 13)
    result = rm_lib.evaluate_pairs(
        model, index_pair_rows(dataset, index, blind=blind, swap=True), batch_size=cfg.eval_batch_size, seed=seed
    )
    return {k: result[k] for k in ("accuracy", "ci_low", "ci_high", "n_pairs", "n_groups")}


def inputs(cfg, paths, seed) -> dict[str, config.Input]:
    train = config.split_input(paths, cfg.train_split)
    if cfg.train_split != "train":
        train = train._replace(fix="set rm.train_split to an existing split")
    return {
        "backbone": config.Input(paths.rm_base, "the RM backbone", "set models.reward_backbone to a model dir"),
        "train": train,
        **{split: config.split_input(paths, split) for split in scored_splits(cfg, seed)},
    }


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.rm, paths.rm_blind]


def train(cfg, paths, seed, seeds: list[int], blind: bool) -> dict:
    """The RMs of `seeds` and, with `blind`, the blind control (on the first of ``rm.seeds``), by report key."""
    config.check_inputs(inputs(cfg, paths, seed))
    every = rm_seeds(cfg, seed)
    report = {seed_key(every, s): train_one(cfg, paths, seed, False, s) for s in seeds}
    if blind:
        report["rm_blind"] = train_one(cfg, paths, seed, True, every[0])
    return report


def run(cfg: Config, paths, seed) -> dict:
    """Train the RM(s) and the blind control; with several seeds keep the best on val (`finish`)."""
    return finish(cfg, paths, seed, train(cfg, paths, seed, rm_seeds(cfg, seed), cfg.blind))


def seed_key(seeds: list[int], seed: int) -> str:
    return "rm" if len(seeds) == 1 else f"rm_s{int(seed)}"


def choose_seed(reports: dict[int, dict], split: str = "val") -> int:
    """The seed whose RM has the best pairwise accuracy on `split` (ties: the lowest seed)."""
    missing = [seed for seed, r in reports.items() if split not in (r.get("held_out") or {})]
    if missing:
        raise OpenR1Error(f"RM seed(s) {missing} have no {split} accuracy to choose by; is the {split} split built?")
    return max(sorted(reports), key=lambda seed: reports[seed]["held_out"][split]["accuracy"])


def finish(cfg, paths, seed, report: dict) -> dict:
    """With several seeds: the best on val copied to ``models/rm`` and reported under ``rm`` with ``selected``."""
    seeds = rm_seeds(cfg, seed)
    if len(seeds) == 1:
        return report
    reports = {seed: report[seed_key(seeds, seed)] for seed in seeds}
    chosen = choose_seed(reports)
    with installing(paths.rm) as staging:
        shutil.copytree(reports[chosen]["out"], staging, dirs_exist_ok=True)
    val = {seed: reports[seed]["held_out"]["val"]["accuracy"] for seed in seeds}
    logger.info(
        f"[rm] kept seed {chosen} as {paths.rm} (val accuracy by seed: "
        + ", ".join(f"s{seed} {acc:.3f}" for seed, acc in val.items())
        + ")"
    )
    return {
        **report,
        "rm": {
            **reports[chosen],
            "out": paths.rm,
            "selected": {"seed": chosen, "by": "val accuracy", "val_accuracy": val},
        },
    }


def markdown(rm: dict) -> list[str]:
    """The results table: each RM's held-out accuracy with its CI and the image swap."""
    lines = [
        "",
        "## Reward model: held-out pairwise accuracy (95 % bootstrap CI over contests)",
        "",
        "| RM | split | accuracy | CI | pairs | contests | image swap (own cartoon wins) |",
        "|---|---|---|---|---|---|---|",
    ]
    kept = (rm.get("rm") or {}).get("selected")
    labels = {
        "rm": "with image" + (f" (kept: seed {kept['seed']}, best on val)" if kept else ""),
        **{key: f"with image, seed {key[4:]}" for key in sorted(rm) if key.startswith("rm_s")},
        "rm_blind": "image-blind",
    }
    for key, label in labels.items():
        for split, r in ((rm.get(key) or {}).get("held_out") or {}).items():
            swap = r.get("image_swap")
            swap = "–" if not swap else f"{swap['accuracy']:.3f} [{swap['ci_low']:.3f}, {swap['ci_high']:.3f}]"
            lines.append(
                f"| {label} | {split} | {_fmt(r['accuracy'])} | [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | "
                f"{r['n_pairs']} | {r['n_groups']} | {swap} |"
            )
    return lines
