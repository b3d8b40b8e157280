"""Time one reward-model training step two ways, on the same batches, alternating, in one process:
``--compare attention`` (default): the vision tower's attention as transformers' per-image loop and as the engine's
grouped SDPA (`open_r1.vision_attention`), both without vision de-duplication (as first measured, run 7);
``--compare dedupe``: the vision tower encoding every image of the batch (a pair's shared cartoon twice) and each
distinct image once (`open_r1.vision_dedupe`, the RM's default), both on the grouped attention; two models of the
same weights, each with its own optimizer.

A step = forward of a batch of B pairs (2B conversations), the BT loss, backward, AdamW step, under bf16 autocast
on a GPU as the RM stage trains. The batches are collated before timing (the stage's collation runs in dataloader
workers); the first `--warmup` steps of each variant are not counted. Reports median and mean ms per step.

    python -m experiments.captioning.bench_rm_step --config configs/captioning/standin_h200.yaml --steps 20 \
        --out rm_step.json
    python -m experiments.captioning.bench_rm_step --config configs/captioning/standin_h200.yaml --compare dedupe
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time


def main(argv=None) -> int:
    import torch

    from experiments.captioning.bench_rm_pairs import pair_rows
    from open_r1 import reward_model as rm_lib
    from open_r1 import vision_attention
    from open_r1.errors import OpenR1Error
    from open_r1.jsonio import write_json
    from open_r1.tasks.captioning import data as cdata
    from standin.captioning import demo

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.bench_rm_step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="per_image, grouped, per_image, grouped, ...")
    parser.add_argument("--compare", choices=["attention", "dedupe"], default="attention")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        cfg, paths = recipe.section("rm"), recipe.paths
        train = cdata.load_captions(paths.split("train"), check_images="none")
        pairs = cdata.preference_pairs(train, k=cfg.k, se_from=cfg.se_from,
                                       cap_per_contest=cfg.cap_per_contest, seed=recipe.seed)
        batch_pairs = cfg.per_device_batch_size
        pairs = pairs.select(range(min(len(pairs), batch_pairs * (args.steps + args.warmup))))
        rows = pair_rows(pairs)
        cuda = torch.cuda.is_available()
        device = "cuda" if cuda else "cpu"

        def build(dedupe: bool):
            model = rm_lib.build_reward_model(paths.rm_base, min_pixels=cfg.min_pixels,
                                              max_pixels=cfg.max_pixels, dtype="float32", dedupe_vision=dedupe)
            model = model.to(device).train()
            return model, torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)

        if args.compare == "attention":  # one model, its attention switched before each variant's steps
            shared = build(False)
            variants = {"per_image": shared, "grouped": shared}
        else:
            variants = {"every_image": build(False), "distinct_images": build(True)}
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    collator = rm_lib.PairCollator(next(iter(variants.values()))[0].processor)
    random.Random(0).shuffle(rows)
    batches = [collator(rows[i:i + batch_pairs]) for i in range(0, len(rows) - batch_pairs + 1, batch_pairs)]
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step(model, optimizer, batch):
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast:
            scores = model(**batch)
        half = scores.shape[0] // 2
        rm_lib.bradley_terry_loss(scores[:half].float(), scores[half:].float()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for choice, (model, optimizer) in variants.items():
            vision_attention.use_grouped_vision_attention(model.backbone, choice if args.compare == "attention"
                                                          else "grouped")
            for i, batch in enumerate(batches):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step(model, optimizer, batch)
                if cuda:
                    torch.cuda.synchronize()
                if i >= args.warmup:
                    times[choice].append(time.perf_counter() - start)
    slow, fast = times
    result = {
        "compare": args.compare, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "pairs_per_step": batch_pairs,
        "conversations_per_step": 2 * batch_pairs, "steps_timed": {k: len(v) for k, v in times.items()},
        **{f"{k}_ms_median": 1000 * statistics.median(v) for k, v in times.items()},
        **{f"{k}_ms_mean": 1000 * statistics.fmean(v) for k, v in times.items()},
    }
    result["speedup_median"] = result[f"{slow}_ms_median"] / result[f"{fast}_ms_median"]
    print(json.dumps(result, indent=2))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
