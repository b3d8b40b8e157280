"""Stage 2b (optional): a round of ratings on the SFT policy's own captions, for the RM to train on.

Why: in runs 7 and 8 (docs/CAPTIONING.md) the RM reached 0.72-0.75 pairwise accuracy on the contests' candidate
pairs, yet the caption it picked out of a policy's 16 samples had a *lower* oracle score than the samples' mean, for
every policy on test: among the policy's own captions it did not rank with the oracle, so GRPO could not raise the
oracle through it. The textbook remedy (iterated RLHF) is to rate the policy's samples and train the RM on them too.

Algorithm: sample ``ratings.n`` completions for each training contest (``ratings.contests``: only the first N) from
``ratings.policy`` (default: the SFT policy) with the eval stage's sampling settings (``stage_eval.sampling_kwargs``;
no RM), keep the captions that parse (``protocol.parse_details``), have each new one rated
(``standin.rate_captions``: simulated readers voting on the hidden oracle, the same simulation as the contests'
candidates), and save the training contests plus the rated rows as the split ``ratings.split`` (default
``train_rated``; the data stage's ``train`` is never touched). The RM trains on it with ``rm.train_split:
train_rated``. The summary holds the counts, the oracle of the rated captions against the candidates', and how many of
the RM's training pairs (its k-sigma rule, cap and seed: ``data.pair_indices``) involve a rated caption.

Deviations: the raters are simulated (the stand-in's oracle through its vote model), not people. On real data this
stage cannot run: collect human ratings of the policy's captions into a split with the same columns and point
``rm.train_split`` at it. One round only (iterated RLHF repeats sample -> rate -> retrain as the policy moves). The
RM then needs the SFT policy, so it cannot start early beside synthesis and SFT (``start_early``).

    python -m open_r1.tasks.captioning.stage_ratings --config configs/captioning/standin_h200.yaml
"""
from __future__ import annotations

import os
import time

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import stage_common as common
from open_r1.validate import is_int

DEFAULT_SPLIT = "train_rated"
# the ratings section's keys (`settings` checks n, contests and split itself)
SECTION_KEYS = {"n": common.ANY, "contests": common.ANY, "split": common.ANY, "policy": common.optional(common.TEXT)}


def settings(recipe: dict) -> dict:
    """The stage's section with its defaults, checked (before any model loads)."""
    cfg = common.section(recipe, "ratings")
    common.check_section("ratings", cfg, SECTION_KEYS)
    out = {"n": cfg.get("n", 8), "contests": cfg.get("contests"), "split": str(cfg.get("split", DEFAULT_SPLIT)),
           "policy": cfg.get("policy")}
    if not is_int(out["n"]) or out["n"] < 1:
        raise RecipeError(f"ratings.n must be a positive integer (samples per training contest), got {out['n']!r}")
    if out["contests"] is not None and (not is_int(out["contests"]) or out["contests"] < 1):
        raise RecipeError(f"ratings.contests must be a positive integer or null (all), got {out['contests']!r}")
    if out["split"] in ("train", "val", "test", "ood") or not out["split"] or os.sep in out["split"]:
        raise RecipeError(f"ratings.split={out['split']!r}: name a new split (e.g. {DEFAULT_SPLIT}); the data stage's "
                          f"splits stay as they are")
    from open_r1.tasks.captioning import stage_eval

    stage_eval.check_recipe(recipe)  # this stage samples with the eval section's settings
    return out


def check_recipe(recipe: dict) -> None:
    """Before any stage runs (the pipeline's preflight): the section's keys and values (`settings`)."""
    settings(recipe)


def inputs(recipe: dict) -> dict[str, common.Input]:
    paths = common.Paths(recipe)
    return {"policy": common.Input(settings(recipe)["policy"] or paths.policy_sft, "the SFT policy", "sft",
                                   "ratings.policy"),
            "train": common.split_input(paths, "train")}


def run(recipe: dict) -> dict:
    import datasets
    import numpy as np
    import torch

    from open_r1 import modeling
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate as ev
    from open_r1.tasks.captioning import stage_eval, stage_rm, standin

    cfg = settings(recipe)
    paths = common.Paths(recipe)
    policy = common.check_inputs(inputs(recipe))["policy"]
    train = cdata.load_captions(paths.split("train"), check_images="none", keep_oracle=True)
    if "scene_meta" not in train.column_names:
        raise RecipeError("ratings: the simulated readers need the stand-in's scene_meta; on real data collect human "
                          "ratings of the policy's captions into a split and set rm.train_split to it")
    started = time.time()
    device = common.device()
    model = modeling.load_model(policy, dtype=None if device == "cuda" else "float32").to(device).eval()
    processor = modeling.load_processor(policy)
    sampling = {**stage_eval.sampling_kwargs(recipe), "n": cfg["n"], "max_cartoons": cfg["contests"]}
    n_contests = len(set(train["contest"]))
    common.log(f"[ratings] sampling {cfg['n']} per contest on {min(n_contests, cfg['contests'] or n_contests)} "
               f"training contests from {policy}")
    marks: set[int] = set()

    def progress(done: int, total: int) -> None:  # about every tenth of the way, and at the end
        mark = done * 10 // total
        if mark not in marks:
            marks.add(mark)
            common.log(f"[ratings] {done}/{total} samples in {time.time() - started:.0f} s")

    with torch.no_grad():
        records = ev.evaluate_policy(model, processor, train, None, oracle=False, progress=progress, **sampling)
    del model
    sampled = time.time() - started
    parsed = [r for r in records if r["caption"] is not None]
    rated, counts = standin.rate_captions(train, parsed, seed=int(recipe["seed"]))
    common.log(f"[ratings] {len(parsed)} of {len(records)} samples parsed, {counts['rated']} new captions rated")
    out = paths.split(cfg["split"])
    merged = datasets.concatenate_datasets([train, rated])  # the rated rows last
    with modeling.staged_dir(out) as staging:  # a cut run leaves the old split (or none), never half of one
        merged.save_to_disk(staging)
    rm = common.section(recipe, "rm")
    # the pairs the RM will train on, as row indices: building the pair dataset would copy an image per pair (an
    # uncapped count did that once and outlasted its GPU call)
    index = stage_rm.training_index(recipe, merged)
    is_new = np.arange(len(merged)) >= len(train)
    summary = {
        "policy": policy, "samples": len(records), "format_rate": len(parsed) / max(1, len(records)),
        "counts": counts, "sample_seconds": round(sampled, 1), "split": out, "rows": len(merged),
        "oracle_rated_mean": float(np.mean(rated["oracle"])) if len(rated) else None,
        "oracle_candidates_mean": float(np.mean(train["oracle"])),
        "pairs": len(index), "pairs_with_a_rated_caption": int(is_new[index].any(axis=1).sum()),
        "pairs_of_two_rated_captions": int(is_new[index].all(axis=1).sum()),
    }
    if str(rm.get("train_split", "train")) != cfg["split"]:
        common.log(f"[ratings] note: rm.train_split is {rm.get('train_split', 'train')!r}; the RM trains on this "
                   f"round only with rm.train_split={cfg['split']}")
    return summary


def main(argv=None) -> int:
    return common.stage_cli("ratings", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
