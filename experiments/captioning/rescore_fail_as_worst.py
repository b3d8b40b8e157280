"""The oracle with a failure counted as the cartoon's worst candidate, from a saved BoN report (no model, no GPU).

Question: runs before the eval reported ``oracle_fail_as_worst`` (``open_r1.tasks.captioning.evaluate``) saved only
per-cartoon aggregates; what does that measure say about them? Per cartoon it is exactly ``format * oracle_emitted +
(1 - format) * floor`` (the mean over the N samples, a failure counting as ``floor``), where ``floor`` is the lowest
oracle among the cartoon's candidate captions. The candidates are rendered again from the recipe
(``standin.make_contest`` is deterministic in (seed, stream, index); contest ids from ``standin.OOD_CONTEST_OFFSET``
on are the OOD stream), so only the report JSON is needed. The paired bootstrap is the eval's
(``evaluate.paired_bootstrap``, the same seed and resamples).

    python -m experiments.captioning.rescore_fail_as_worst --config configs/captioning/standin_h200.yaml \\
        --reports test=docs/results/captioning_h200_run11_bon_test.json ood=docs/results/captioning_h200_run11_bon_ood.json
"""
from __future__ import annotations

import argparse
import json
import sys


def floors(config, contests) -> dict[str, float]:
    """The lowest candidate oracle of each contest id (as the report's string keys)."""
    from standin.captioning import cartoons as standin

    out = {}
    for key in contests:
        contest = int(key)
        offset = standin.OOD_CONTEST_OFFSET
        stream, index = ("ood", contest - offset) if contest >= offset else ("main", contest)
        out[key] = min(row["oracle"] for row in standin.make_contest(config, stream, index))
    return out


def rescore(report: dict, floor: dict[str, float], n_boot: int = 2000, seed: int = 0) -> dict:
    from open_r1.tasks.captioning import evaluate as ev

    values = {}
    for name, m in report["policies"].items():
        values[name] = {}
        for key, c in m["per_cartoon"].items():
            emitted = c["oracle_emitted"] if c["oracle_emitted"] is not None else 0.0
            values[name][key] = c["format"] * emitted + (1.0 - c["format"]) * floor[key]
    baseline = report.get("baseline")
    out = {"policies": {name: {"oracle_fail_as_worst": sum(v.values()) / len(v),
                               "oracle_emitted": report["policies"][name]["oracle_emitted"],
                               "format_rate": report["policies"][name]["format_rate"]} for name, v in values.items()},
           "mean_floor": sum(floor.values()) / len(floor), "baseline": baseline, "vs_baseline": {}}
    if baseline:
        for name, v in values.items():
            if name != baseline:
                out["vs_baseline"][name] = {
                    "oracle_fail_as_worst": ev.paired_bootstrap(v, values[baseline], n_boot, seed),
                    "fail_as_zero": (report["comparisons"].get(name) or {}).get("fail_as_zero"),
                    "oracle_emitted": (report["comparisons"].get(name) or {}).get("oracle_emitted")}
    return out


def _ci(entry) -> str:
    return "–" if not entry else f"{entry['diff']:+.3f} [{entry['lo']:+.3f}, {entry['hi']:+.3f}]"


def markdown(results: dict) -> str:
    lines = ["| split | policy | format % | oracle emitted | oracle, fail = worst | Δ fail-as-0 σ(RM) | "
             "Δ oracle emitted | Δ oracle, fail = worst |", "|---|---|---:|---:|---:|---|---|---|"]
    for split, r in results.items():
        for name, m in r["policies"].items():
            comp = r["vs_baseline"].get(name, {})
            emitted = "–" if m["oracle_emitted"] is None else f"{m['oracle_emitted']:+.3f}"
            lines.append(f"| {split} | {name} | {100 * m['format_rate']:.1f} | {emitted} | "
                         f"{m['oracle_fail_as_worst']:+.3f} | {_ci(comp.get('fail_as_zero'))} | "
                         f"{_ci(comp.get('oracle_emitted'))} | {_ci(comp.get('oracle_fail_as_worst'))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from open_r1.errors import OpenR1Error
    from standin.captioning import demo, stage_data

    parser = argparse.ArgumentParser(prog="python -m experiments.captioning.rescore_fail_as_worst", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the recipe the run used (its data section renders the contests)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--reports", nargs="+", required=True, metavar="SPLIT=BON_JSON")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    try:
        config = stage_data.standin_config(demo.load_recipe(args.config, args.set))
        results = {}
        for item in args.reports:
            split, sep, path = item.partition("=")
            if not sep or not split or not path:
                raise ValueError(f"--reports {item!r} is not SPLIT=PATH")
            with open(path) as f:
                report = json.load(f)
            contests = next(iter(report["policies"].values()))["per_cartoon"].keys()
            results[split] = rescore(report, floors(config, contests))
    except (OpenR1Error, ValueError, OSError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
