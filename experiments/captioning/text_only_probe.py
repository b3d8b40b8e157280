"""How much of the stand-in's preference labels can be read from the caption text alone (no image)?

A text-only ceiling for the image-blind RM control: a bag-of-words (unigrams, bigrams and a length bucket) pairwise
logistic model, s(chosen) - s(rejected), trained on the RM's k-sigma training pairs (`data.preference_pairs`, the
recipe's k, se_from and per-contest cap) and scored on the held-out test and OOD pairs (the RM stage's eval cap).
It never sees the image or the oracle. A stand-in whose text alone ranks held-out pairs well lets a blind RM match an
image RM, so this number is what "the image-blind RM clearly less" has to beat.

    python -m open_r1.tasks.captioning.pipeline --config configs/captioning/standin_h200.yaml \
        --set work_dir=/tmp/hdata --stages data
    python -m experiments.captioning.text_only_probe --config configs/captioning/standin_h200.yaml \
        --set work_dir=/tmp/hdata --out text_only_probe.json
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys

GRAM = re.compile(r"[a-z]+")


def grams(text: str) -> set[str]:
    words = GRAM.findall(text.lower())
    return set(words) | {f"{a}_{b}" for a, b in zip(words, words[1:])} | {f"len{min(len(words) // 4, 8)}"}


def split_pairs(recipe: dict, split: str, cap: int, seed_offset: int = 0) -> list[dict]:
    from open_r1.tasks.captioning import data as cdata

    cfg = recipe.section("rm")
    dataset = cdata.load_captions(recipe.paths.split(split), check_images="none", keep_oracle=True)
    pairs = cdata.preference_pairs(dataset, k=cfg.k, se_from=cfg.se_from,
                                   cap_per_contest=cap, seed=recipe.seed + seed_offset, keep_oracle=True)
    return pairs.remove_columns(["image"]).to_list()


def fit_and_score(train: list[dict], held: dict[str, list[dict]], steps: int = 300, min_count: int = 3) -> dict:
    import torch

    counts = collections.Counter(g for p in train for c in (p["chosen"], p["rejected"]) for g in grams(c))
    vocab = {g: i for i, g in enumerate(g for g, n in counts.items() if n >= min_count)}

    def vec(text):
        v = torch.zeros(len(vocab))
        v[[vocab[g] for g in grams(text) if g in vocab]] = 1.0
        return v

    def diffs(pairs):
        return torch.stack([vec(p["chosen"]) - vec(p["rejected"]) for p in pairs])

    x = diffs(train)
    w = torch.zeros(len(vocab), requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(x @ w)).mean() + 1e-4 * (w ** 2).sum()
        loss.backward()
        opt.step()
    w = w.detach()

    def accuracy(pairs):
        s = diffs(pairs) @ w
        return float(((s > 0).float() + 0.5 * (s == 0).float()).mean())

    top = sorted(vocab, key=lambda g: -abs(float(w[vocab[g]])))[:12]
    return {"train": {"pairs": len(train), "accuracy": accuracy(train)},
            **{name: {"pairs": len(p), "accuracy": accuracy(p)} for name, p in held.items()},
            "vocab": len(vocab), "top_weights": {g: round(float(w[vocab[g]]), 3) for g in top}}


def main(argv=None) -> int:
    from open_r1.errors import OpenR1Error
    from open_r1.jsonio import write_json
    from standin.captioning import demo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--splits", nargs="+", default=["test", "ood"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        cfg = recipe.section("rm")
        train = split_pairs(recipe, "train", int(cfg.cap_per_contest))
        # the RM stage's held-out pairs (stage_rm.held_out_pairs draws them with seed + 7)
        held = {s: split_pairs(recipe, s, cfg.eval_cap_per_contest, 7) for s in args.splits}
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {"config": args.config, "overrides": args.set, **fit_and_score(train, held)}
    print(json.dumps(result, indent=1))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
