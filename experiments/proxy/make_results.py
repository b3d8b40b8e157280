#!/usr/bin/env python
"""Rebuild the proxy experiment's markdown report and accuracy-by-gold-count plot from its results.json.

    python -m experiments.proxy.make_results runs/proxy-results/results.json        # -> RESULTS.md + PNG beside it
    python -m experiments.proxy.make_results runs/proxy-results/results.json --md experiments/proxy/reports/RESULTS.md
    --png experiments/proxy/reports/figures/acc_by_count.png

The tables (split x recipe x seed, mean ± spread per recipe, the verdict ours vs weak_baseline, the ablations with
their commands) and the plot are a pure function of results.json (written by experiments/proxy/proxy_experiment.py), so
the
published experiments/proxy/reports/RESULTS.md is reproducible from the JSON alone. Prints the verdict; exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.proxy import proxy  # noqa: E402
from open_r1.errors import error_exit  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="results.json from experiments/proxy/proxy_experiment.py")
    parser.add_argument("--md", default=None, help="markdown to write (default: RESULTS.md beside the JSON)")
    parser.add_argument("--png", default=None, help="plot to write (default: acc_by_count.png beside the markdown)")
    parser.add_argument(
        "--title",
        default=None,
        help="the report's title (each run's report has its own; experiments/LOG.md lists them)",
    )
    parser.add_argument(
        "--note",
        default=None,
        help="a paragraph put under the title (e.g. what changed since the run), kept in the command",
    )
    args = parser.parse_args(argv)
    try:
        results = proxy.load_results(args.results)
    except ValueError as exc:
        return error_exit(exc)
    md = Path(args.md) if args.md else Path(args.results).resolve().parent / "RESULTS.md"
    # the report names the command that rebuilds it, with this invocation's paths
    results["meta"]["rebuild_command"] = "python -m experiments.proxy.make_results " + proxy.shell_join(
        sys.argv[1:] if argv is None else list(argv)
    )
    if args.note:
        results["meta"]["note"] = args.note
    if args.title:
        results["meta"]["title"] = args.title
    md_path, png_path = proxy.write_report(results, md, args.png)
    print(f"wrote {md_path} and {png_path}")
    for split, verdict in proxy.summarize(results)["verdict"].items():
        print(
            f"{split}: ours - weak_baseline = {verdict['delta']:+.1f} points, seed spread {verdict['spread']:.1f}: "
            f"{'beats' if verdict['beats'] else 'does not beat'} it by more than the spread"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
