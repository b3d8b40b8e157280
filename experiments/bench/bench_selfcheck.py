#!/usr/bin/env python
"""selfcheck speed bench: the grader's protocol (open_r1.tasks.counting.evaluate.evaluate_dataset, greedy) on the
full-size random
Qwen2-VL-2B with every completion forced to 256 new tokens (the worst case), at several batch sizes.

    python -m experiments.bench.bench_selfcheck --batch-sizes 64,128,256 --out selfcheck_bench.json  # 3000 each
    python -m experiments.bench.bench_selfcheck --batch-sizes 128,256,512 --measure-batches 2 --out s.json  # projected
    python -m experiments.bench.bench_selfcheck --tiny --n 16 --batch-sizes 4,8  # CPU check

Reports examples/s and the projected time for --n examples (default 3000) against the 35 s budget (issue #16).
"""

import sys

from experiments.bench.bench import cli, selfcheck_main  # sets the offline environment before any HF import

if __name__ == "__main__":
    sys.exit(cli(entry=selfcheck_main))
