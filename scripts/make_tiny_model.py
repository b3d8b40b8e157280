#!/usr/bin/env python
"""Write a Qwen2-VL checkpoint shaped like Qwen/Qwen2-VL-2B-Instruct (tiny by default; --full-size for the real
2B dimensions with random bf16 weights). See open_r1/tiny_model.py for what is built and why.

    python scripts/make_tiny_model.py --out /tmp/tiny-qwen2vl
    python scripts/make_tiny_model.py --out /data/qwen2vl-2b-random --full-size --seed 0
"""
import sys
from pathlib import Path

try:
    from open_r1.tiny_model import main
except ImportError:  # run from a checkout that is not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from open_r1.tiny_model import main

if __name__ == "__main__":
    main()
