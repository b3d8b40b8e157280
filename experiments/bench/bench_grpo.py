#!/usr/bin/env python
"""GRPO throughput bench: plain TRL 1.16 defaults vs our recipe's speed levers, in one process
(experiments/bench/bench.py).

    # one GPU; then a CPU check; then the presets
    python -m experiments.bench.bench_grpo --variants plain_trl,ours_fast --memory-cap-gib 40 --out bench.json
    python -m experiments.bench.bench_grpo --tiny --variants plain_trl,ours --steps 2 --out /tmp/bench.json
    python -m experiments.bench.bench_grpo --list

Prints a markdown table (rollouts/s, ratio vs plain_trl, gen / logp / prep / train / other seconds, tokens/s, peak
GPU memory) and writes the JSON to --out after every variant. docs/PERFORMANCE.md says how to read it.
"""

import sys

from experiments.bench.bench import cli  # sets the offline environment before any HF import

if __name__ == "__main__":
    sys.exit(cli())
