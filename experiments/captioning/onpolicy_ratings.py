"""A round of ratings on a policy's own captions, for the RM (stand-in: simulated readers). Probe, not a stage.

Why: in runs 7 and 8 (docs/CAPTIONING.md) the RM reached 0.72-0.75 pairwise accuracy on the contests' candidate
pairs, yet the caption it picked out of a policy's 16 samples had a *lower* oracle score than the samples' mean, for
every policy on test: among the policy's own captions it does not rank with the oracle, so GRPO cannot raise the
oracle through it. The textbook remedy (iterated RLHF) is to rate the policy's samples and train the RM on them too.

What it does: samples ``--n`` completions for each training contest from ``--policy`` (default: the SFT policy) with
the eval stage's sampling settings (``stage_eval.sampling_kwargs``, no RM), keeps the parsed captions, has them rated
(``standin.rate_captions``: simulated votes on the hidden oracle, the same simulation as the contests' candidates;
on real data this is where human ratings would come in), and saves the training contests plus the rated rows as the
split ``--split`` (default ``train_rated``). Then train the RM on it: ``--stages rm --set rm.train_split=train_rated``.
Logs its progress; prints and writes (``--out``) the counts, the oracle of the rated captions against the
candidates', and how many of the RM's training pairs (its k-sigma rule and cap) involve a rated caption.

    python -m experiments.captioning.onpolicy_ratings --config configs/captioning/standin_h200.yaml --n 8 --out rated.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
    import datasets
    import numpy as np
    import torch

    from open_r1 import modeling
    from open_r1.errors import OpenR1Error
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate as ev
    from open_r1.tasks.captioning import stage_common as common
    from open_r1.tasks.captioning import stage_eval, standin

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.onpolicy_ratings", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--policy", default=None, help="model dir to sample (default: the recipe's SFT policy)")
    parser.add_argument("--n", type=int, default=8, help="samples per training contest")
    parser.add_argument("--contests", type=int, default=None, help="only the first N training contests")
    parser.add_argument("--split", default="train_rated", help="name of the split to write under the data dir")
    parser.add_argument("--out", default=None, help="write the summary JSON here")
    args = parser.parse_args(argv)
    try:
        recipe = common.load_recipe(args.config, args.set)
        paths = common.Paths(recipe)
        policy = args.policy or paths.policy_sft
        if not os.path.isfile(os.path.join(policy, "config.json")):
            raise OpenR1Error(f"no policy at {policy}; run --stages data pretrain synthesize sft first (or --policy)")
        if args.n < 1 or args.split == "train":
            raise OpenR1Error("--n must be >= 1 and --split must not be 'train' (the data stage's split stays as it is)")
        train = cdata.load_captions(paths.split("train"), check_images="none", keep_oracle=True)
        if "scene_meta" not in train.column_names:
            raise OpenR1Error("the simulated readers need the stand-in's scene_meta; real data needs real ratings")
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    device = common.device()
    model = modeling.load_model(policy, dtype=None if device == "cuda" else "float32").to(device).eval()
    processor = modeling.load_processor(policy)
    sampling = {**stage_eval.sampling_kwargs(recipe), "n": args.n, "max_cartoons": args.contests}
    total_contests = len(set(train["contest"])) if args.contests is None else args.contests
    common.log(f"[ratings] sampling {args.n} per contest on {total_contests} training contests from {policy}")
    marks = {}

    def progress(done: int, total: int) -> None:  # about every tenth of the way, and at the end
        mark = done * 10 // total
        if mark not in marks:
            marks[mark] = done
            common.log(f"[ratings] {done}/{total} samples in {time.time() - started:.0f} s")

    with torch.no_grad():
        records = ev.evaluate_policy(model, processor, train, None, oracle=False, progress=progress, **sampling)
    del model
    sampled = time.time() - started
    parsed = [r for r in records if r["caption"] is not None]
    rated, counts = standin.rate_captions(train, parsed, seed=int(recipe["seed"]))
    common.log(f"[ratings] {len(parsed)} of {len(records)} samples parsed, {counts['rated']} new captions rated")
    out = paths.split(args.split)
    with modeling.staged_dir(out) as staging:  # a cut run leaves the old split (or none), never half of one
        datasets.concatenate_datasets([train, rated]).save_to_disk(staging)
    cfg = common.section(recipe, "rm")
    merged = cdata.load_captions(out, check_images="none")
    # the pairs the RM will train on (its rule, cap and seed, as stage_rm.training_pairs), as row indices: building
    # the pair dataset would copy an image per pair (an uncapped count did that here and outlasted its call)
    index = cdata.pair_indices(merged, k=float(cfg.get("k", 3.0)), se_from=cfg.get("se_from", "precision"),
                               cap_per_contest=cfg.get("cap_per_contest", 1000), seed=int(recipe["seed"]))
    new = set(zip(rated["contest"], rated["caption"])) if len(rated) else set()
    is_new = np.array([key in new for key in zip(merged["contest"], merged["caption"])], dtype=bool)
    with_new = int(is_new[index].any(axis=1).sum())
    both_new = int(is_new[index].all(axis=1).sum())
    summary = {
        "policy": policy, "samples": len(records), "format_rate": len(parsed) / len(records), "counts": counts,
        "sample_seconds": round(sampled, 1), "split": out, "rows": len(merged),
        "oracle_rated_mean": float(np.mean(rated["oracle"])) if len(rated) else None,
        "oracle_candidates_mean": float(np.mean(train["oracle"])),
        "pairs": len(index), "pairs_with_a_rated_caption": with_new, "pairs_of_two_rated_captions": both_new,
        "next": f"--stages rm --set rm.train_split={args.split}",
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        common.write_json(args.out, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
