#!/usr/bin/env python
"""Generate the counting splits: a thin wrapper around ``python -m open_r1.scenes`` (same arguments).

Example:
    python scripts/generate_data.py --out data --train 2000 --val 200 --compositional 200 --ood-val 200 --seed 0
"""
import os
import sys

# Run from a checkout without installing: make the repository root importable.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from open_r1.scenes.cli import main  # noqa: E402  (after the path tweak)

if __name__ == "__main__":
    raise SystemExit(main())
