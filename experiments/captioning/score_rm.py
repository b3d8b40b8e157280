"""Score saved reward-model dirs on a recipe's held-out splits again: the RM stage's own scoring
(`stage_rm.score_held_out`: the k-sigma pairs of each split's contests, pairwise accuracy with the by-contest
bootstrap CI; a blind RM sees the blank image, as it was trained). For a run cut during its held-out scoring (the
models are saved before it), and for RMs trained outside the pipeline. One process, the models one after another.

    python -m experiments.captioning.score_rm --config configs/captioning/standin_h200.yaml \
        --model runs/humor-h200/models/rm-s1 runs/humor-h200/models/rm-blind --splits val test ood --out scores.json
"""
from __future__ import annotations

import argparse
import os
import sys


def rescore(recipe, model_dir: str, splits: list[str] | None = None) -> dict:
    """Score a saved RM dir on the recipe's held-out splits again; blind or not as its saved meta says."""
    from open_r1 import reward_model as rm_lib
    from open_r1.tasks.captioning import stage_rm

    model = rm_lib.load_reward_model(model_dir)
    blind = bool(model.meta.get("blind"))
    held_out = stage_rm.score_held_out(recipe, model, blind, f"[rescore {os.path.basename(model_dir)}]", splits)
    return {"out": os.path.abspath(model_dir), "blind": blind, "seed": model.meta.get("seed"),
            "steps": model.meta.get("steps"), "held_out": held_out}


def main(argv=None) -> int:
    from open_r1.errors import OpenR1Error
    from open_r1.jsonio import write_json
    from standin.captioning import demo

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.score_rm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--model", nargs="+", required=True, help="saved RM dirs (reward_model.json inside)")
    parser.add_argument("--splits", nargs="+", default=None, help="default: the recipe's RM scoring splits")
    parser.add_argument("--out", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    try:
        recipe = demo.load_recipe(args.config, args.set)
        results = {}
        for path in args.model:
            results[path] = rescore(recipe, path, args.splits)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path, result in results.items():
        for split, r in result["held_out"].items():
            print(f"{path} ({'blind' if result['blind'] else 'image'}) {split}: {r['accuracy']:.3f} "
                  f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] over {r['n_pairs']} pairs of {r['n_groups']} contests")
    if args.out:
        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
