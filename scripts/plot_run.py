#!/usr/bin/env python
"""Scores of every evaluated checkpoint of a run: a table, and the plot redrawn (accuracy vs step, reward vs step).

    python scripts/plot_run.py runs/qwen2vl_2b_counting                 # writes runs/.../eval_history.png
    python scripts/plot_run.py runs/qwen2vl_2b_counting --out plot.png

Reads <run>/eval_history.json (written during training by the in-training evaluation) and the reward log of the
newest checkpoint's trainer_state.json. The best checkpoint (keep-best rule: highest primary/OOD accuracy, ties ->
secondary/ID, then later step) among those still on disk is marked with '*' and is what export takes.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from open_r1 import keep_best  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help=f"PNG path (default <run_dir>/{keep_best.HISTORY_PLOT})")
    args = parser.parse_args(argv)
    history = keep_best.load_history(args.run_dir)
    if not history["entries"]:
        print(f"error: no evaluated checkpoints in {args.run_dir} ({keep_best.HISTORY_FILE} missing or empty); "
              "train with eval_sets set", file=sys.stderr)
        return 2
    best, _ = keep_best.history_best(args.run_dir)
    history["best"] = best
    names = sorted({n for e in history["entries"] for n in (e.get("scores") or {})},
                   key=lambda n: (n != history.get("primary"), n != history.get("secondary"), n))
    print("| step | " + " | ".join(f"{n} %" for n in names) + " | reward | checkpoint |")
    print("|---:|" + "---:|" * len(names) + "---:|---|")
    for entry in history["entries"]:
        path = os.path.join(args.run_dir, entry["checkpoint"]) if entry.get("checkpoint") else None
        where = entry.get("checkpoint") if path and keep_best.has_weights(path) else "(deleted)"
        mark = " *" if best is not None and entry["step"] == best["step"] else ""
        scores = " | ".join(f"{entry['scores'][n]:.2f}" if n in entry.get("scores", {}) else "-" for n in names)
        reward = f"{entry['reward']:.3f}" if entry.get("reward") is not None else "-"
        print(f"| {entry['step']}{mark} | {scores} | {reward} | {where} |")
    out = args.out or os.path.join(args.run_dir, keep_best.HISTORY_PLOT)
    if keep_best.plot_history(history, keep_best.latest_log_history(args.run_dir), out) is None:
        print("warning: matplotlib is not installed: no plot", file=sys.stderr)
    else:
        print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
