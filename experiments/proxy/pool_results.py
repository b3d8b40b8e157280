#!/usr/bin/env python
"""Pool several proxy-experiment runs (their results.json) into one comparison of ours vs weak_baseline.

    python -m experiments.proxy.pool_results experiments/proxy/reports/results/proxy_format_ood.json
    experiments/proxy/reports/results/proxy_format_ood_replication.json \
        --labels run7 run8 --md experiments/proxy/reports/RESULTS_POOLED.md

One run has 3 seeds per recipe, so its exact permutation test cannot go below p = 0.05, and its spread rule
(Δ mean > max - min over seeds) is at the mercy of one outlying seed. Pooling runs, each as its own stratum (runs
differ in warm start), gives the test its power back: per split, each run's Δ and spread, how many runs beat their
spread, the share of within-run seed pairs ours wins, and the stratified exact permutation p-value
(`experiments.proxy.proxy.pool_runs`). Prints the table; writes it with --md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from experiments.proxy import proxy  # noqa: E402
from open_r1.errors import error_exit  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.json files from experiments/proxy/proxy_experiment.py")
    parser.add_argument("--labels", nargs="+", default=None, help="one name per results file (default: file names)")
    parser.add_argument("--md", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    labels = args.labels or [os.path.splitext(os.path.basename(path))[0] for path in args.results]
    if len(labels) != len(args.results):
        parser.error(f"--labels names {len(labels)} runs but {len(args.results)} results files were given")
    command = "python -m experiments.proxy.pool_results " + proxy.shell_join(
        sys.argv[1:] if argv is None else list(argv)
    )
    try:
        results_list = [proxy.load_results(path) for path in args.results]
        text = proxy.render_pooled_markdown(results_list, labels, command=command)
    except ValueError as exc:
        return error_exit(exc)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
