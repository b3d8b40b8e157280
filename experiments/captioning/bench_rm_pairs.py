"""Time the RM stage's training rows built two ways, on one recipe's training split, alternating, in one process:
through the pair dataset (`pair_rows(training_pairs(recipe))` below, the reference the stage's rows are tested against, a row with its image per pair)
and from the pairs' row indices (`stage_rm.training_pair_rows`, what the stage trains on). Checks that both give
the same pairs in the same order.

    python -m standin.captioning.demo --config configs/captioning/standin_h200.yaml --stages data \
        --set work_dir=/tmp/hprof --set data.contests=320 --set data.ood_contests=4 \
        --set data.pretrain_ood_contests=0 --set data.pretrain_main_contests=0 --set data.workers=2
    python -m experiments.captioning.bench_rm_pairs --config configs/captioning/standin_h200.yaml \
        --set work_dir=/tmp/hprof --set rm.train_split=train --repeats 3
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from open_r1.tasks.captioning import config, protocol, stage_rm
from open_r1.tasks.captioning import data as cdata


def pair_rows(pairs, blind: bool = False, keep_oracle: bool = False) -> list[dict]:
    """RM pair rows ({image, chosen, rejected, group}) from ``data.preference_pairs`` output."""
    rows = []
    # one Arrow -> Python conversion; row-by-row access cost ~40 % of this function
    records = pairs.remove_columns(["image"]).to_list()
    first: dict = {}
    for i, record in enumerate(records):
        first.setdefault(record["contest"], i)
    images = stage_rm.contest_images(pairs, first, blind)
    for record in records:
        desc = protocol.description_from_row(record)
        image = images[record["contest"]]
        row = {"image": image, "chosen": protocol.rm_messages(desc, record["chosen"]),
               "rejected": protocol.rm_messages(desc, record["rejected"]), "group": record["contest"]}
        if keep_oracle:
            row["oracle_order"] = record["chosen_oracle"] > record["rejected_oracle"]
        rows.append(row)
    return rows


def training_pairs(recipe):
    """The k-sigma preference pairs the RM trains on, from the split ``rm.train_split`` (default ``train``; e.g.
    ``train_rated``: the training contests with a round of ratings on a policy's samples added,
    ``stage_ratings``), capped per contest and shuffled with the recipe's seed (a pair dataset; the RM itself
    trains on `training_pair_rows`, the same pairs)."""
    max_pairs = recipe.section("rm").max_pairs
    path = config.check_inputs({"train": stage_rm.inputs(recipe)["train"]})["train"]
    pairs = cdata.preference_pairs(cdata.load_captions(path, check_images="none"), **stage_rm.pair_rule(recipe))
    if max_pairs:
        pairs = pairs.select(range(min(max_pairs, len(pairs))))
    return pairs


def main(argv=None) -> int:
    from open_r1.errors import OpenR1Error
    from standin.captioning import demo

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.bench_rm_pairs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        results = {"pair_dataset_s": [], "index_rows_s": []}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            plain = pair_rows(training_pairs(recipe))
            t1 = time.perf_counter()
            fast = stage_rm.training_pair_rows(recipe)
            t2 = time.perf_counter()
            if [(r["group"], r["chosen"], r["rejected"]) for r in plain] != [
                    (r["group"], r["chosen"], r["rejected"]) for r in fast]:
                raise OpenR1Error("the two paths gave different pairs")
            results["pair_dataset_s"].append(round(t1 - t0, 2))
            results["index_rows_s"].append(round(t2 - t1, 2))
            print(f"{len(fast)} pairs: pair dataset {t1 - t0:.2f} s, from indices {t2 - t1:.2f} s "
                  f"({(t1 - t0) / (t2 - t1):.1f}x)", flush=True)
        results["pairs"] = len(fast)
        print(json.dumps(results))
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
