"""Stand-in stage ``ratings`` (optional): a round of simulated ratings on the SFT policy's own captions, for the RM.

The remedy (iterated RLHF) for an RM that ranks the contests' candidates well but not the policy's own samples
(experiments/captioning/LOG.md, runs 7-8): ``n`` samples per training contest from the SFT policy (the eval section's
sampling), each new parsed caption rated by simulated readers (``cartoons.rate_captions``), saved with the training
contests as the split ``split`` (``rm.train_split: train_rated``). On real data: human ratings in a split of the same
columns.
"""

import dataclasses
import logging
import os
import time

import numpy as np

from open_r1 import modeling
from open_r1.errors import RecipeError
from open_r1.submission.install import installing
from open_r1.tasks.captioning import config, stage_eval, stage_rm
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import evaluate as ev
from open_r1.tasks.captioning.config import at_least, help_field, require
from standin.captioning import cartoons

logger = logging.getLogger(__name__)

NAME = "ratings"
TAKES = ("eval", "rm", "data")  # the eval section's sampling; the RM's split and pair rule; the readers


@dataclasses.dataclass
class Config:
    n: int = help_field(8, "samples per training contest")
    contests: int | None = help_field(None, "only the first N training contests (null: all)")
    split: str = help_field("train_rated", "the new split: the training contests plus the rated rows")

    def __post_init__(self):
        at_least("ratings", self, 1, "n", "contests")
        require(
            self.split not in ("train", "val", "test", "ood") and os.sep not in self.split,
            f"ratings.split="
            f"{self.split!r}: name a new split (e.g. train_rated); the data stage's splits stay as they are",
        )


def inputs(cfg, paths, *_) -> dict[str, config.Input]:
    return {
        "policy": config.Input(paths.policy_sft, "the SFT policy", "run the sft stage"),
        "train": config.split_input(paths, "train"),
    }


def outputs(cfg, paths, *_) -> list[str]:
    return [paths.split(cfg.split)]


def run(cfg: Config, paths, seed, eval_cfg, rm_cfg, data_cfg) -> dict:
    import datasets  # deferred: heavy
    import torch  # deferred: heavy

    policy = config.check_inputs(inputs(cfg, paths))["policy"]
    train = cdata.load_captions(paths.split("train"), check_images="none")
    if "scene_meta" not in train.column_names:
        raise RecipeError(
            "ratings: the simulated readers need the stand-in's scene_meta; on real data collect human "
            "ratings of the policy's captions into a split and set rm.train_split to it"
        )
    started = time.time()
    model = modeling.load_model(policy).to(config.device()).eval()
    processor = modeling.load_processor(policy)
    sampling = {**stage_eval.sampling_kwargs(eval_cfg, seed), "n": cfg.n, "max_cartoons": cfg.contests}
    n_contests = len(set(train["contest"]))
    logger.info(
        f"[ratings] sampling {cfg.n} per contest on {min(n_contests, cfg.contests or n_contests)} "
        f"training contests from {policy}"
    )
    with torch.no_grad():
        records = ev.evaluate_policy(
            model, processor, train, None, progress=config.progress_bar("[ratings] sampling", "sample"), **sampling
        )
    del model
    sampled = time.time() - started
    parsed = [r for r in records if r["caption"] is not None]
    rated, counts = cartoons.rate_captions(train, parsed, seed=seed, config=data_cfg)
    logger.info(f"[ratings] {len(parsed)} of {len(records)} samples parsed, {counts['rated']} new captions rated")
    out = paths.split(cfg.split)
    merged = datasets.concatenate_datasets([train, rated])  # the rated rows last
    with installing(out) as staging:  # a cut run leaves the old split (or none), never half of one
        merged.save_to_disk(staging)
    rm_split = rm_cfg.train_split
    # the pairs the RM will train on, as row indices: building the pair dataset would copy an image per pair (an
    # uncapped count did that once and outlasted its GPU call)
    index = stage_rm.training_index(rm_cfg, seed, merged)
    is_new = np.arange(len(merged)) >= len(train)
    summary = {
        "policy": policy,
        "samples": len(records),
        "format_rate": len(parsed) / max(1, len(records)),
        "counts": counts,
        "sample_seconds": round(sampled, 1),
        "split": out,
        "rows": len(merged),
        "oracle_rated_mean": float(np.mean(rated["oracle"])) if len(rated) else None,
        "oracle_candidates_mean": float(np.mean(train["oracle"])),
        "pairs": len(index),
        "pairs_with_a_rated_caption": int(is_new[index].any(axis=1).sum()),
        "pairs_of_two_rated_captions": int(is_new[index].all(axis=1).sum()),
    }
    if rm_split != cfg.split:
        logger.info(
            f"[ratings] note: rm.train_split is {rm_split!r}; the RM trains on this round only with "
            f"rm.train_split={cfg.split}"
        )
    return summary


def markdown(ratings: dict) -> list[str]:
    return [
        "",
        (
            f"Ratings round (simulated readers): {ratings['samples']} samples of the SFT policy, format "
            f"{100 * ratings['format_rate']:.1f} %, {ratings['counts']['rated']} new captions rated (oracle mean "
            f"{ratings['oracle_rated_mean'] or 0:.3f}, the candidates' {ratings['oracle_candidates_mean']:.3f}); "
            f"{ratings['pairs_with_a_rated_caption']} of the RM's {ratings['pairs']} training pairs "
            f"({ratings['pairs_of_two_rated_captions']} of two rated captions) in split "
            f"`{os.path.basename(ratings['split'])}`."
        ),
    ]
