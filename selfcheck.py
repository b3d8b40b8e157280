#!/usr/bin/env python
"""Self-check: the grader's protocol on a model dir, over any number of counting sets.

    python selfcheck.py                                    # /app/submission on /app/data/val and /app/data/ood_val
    python selfcheck.py --model submission --sets data/val data/ood_val data/compositional --limit 200
    python selfcheck.py --verify --model /app/submission   # load check only, says exactly what is wrong

Protocol (open_r1/tasks/counting/protocol.py): "{question} First output the thinking process in <think> </think> and final answer
(number) in <answer> </answer> tags." after the image, greedy, max_new_tokens=256, the model's own saved processor
and generation config, first <answer>N</answer> match, integer equality. Prints a table per set (accuracy, format
rate, mean completion tokens, truncated %) and the mean over sets; writes JSON with per-example predictions.
"""
import argparse
import os
import sys

from open_r1.export import verify_submission  # noqa: E402
from open_r1.modeling import ModelError, load_model, load_processor  # noqa: E402
from open_r1.tasks.counting.data import (  # noqa: E402
    DataError,
    load_counting_dataset,
    validate_counting_dataset,
)

DEFAULT_MODEL = "/app/submission"
DEFAULT_SETS = ["/app/data/val", "/app/data/ood_val"]


def set_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def run_verify(model_dir: str, strict: bool) -> int:
    report = verify_submission(model_dir, strict_answer=strict)
    for warning in report.warnings:
        print(f"warning: {warning}")
    if not report.ok:
        for problem in report.problems:
            print(f"problem: {problem}", file=sys.stderr)
        print(f"FAIL: {model_dir} would not load or run as the grader loads it", file=sys.stderr)
        return 1
    print(f"OK: {model_dir} loads as Qwen2VLForConditionalGeneration and generates: {report.sample_completion!r}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("SUBMISSION", DEFAULT_MODEL))
    parser.add_argument("--sets", nargs="+", default=None, help="save_to_disk dirs (default: val and ood_val)")
    parser.add_argument("--val", default=None, help="in-distribution val dir (default /app/data/val)")
    parser.add_argument("--ood-val", default=None, help="OOD val dir (default /app/data/ood_val)")
    parser.add_argument("--limit", type=int, default=None, help="first N examples of each set")
    parser.add_argument("--batch-size", type=int, default=512,
                        help="fastest measured on one H200 (docs/PERFORMANCE.md); halved automatically on out-of-memory")
    parser.add_argument("--out", default=None, help="JSON report path (default <model>/selfcheck.json)")
    parser.add_argument("--verify", action="store_true", help="only check that the dir loads and generates")
    parser.add_argument("--strict", action="store_true", help="with --verify: an unparseable sample answer fails")
    parser.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    parser.add_argument("--compile", action="store_true",
                        help="static KV cache + compiled decoding on GPU (same answers; see docs/PERFORMANCE.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    if args.verify:
        return run_verify(args.model, args.strict)
    sets = args.sets or [args.val or DEFAULT_SETS[0], args.ood_val or DEFAULT_SETS[1]]
    try:
        import torch

        from open_r1.tasks.counting.evaluate import (
            evaluate_dataset,
            format_table,
            write_report,
        )

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        datasets_ = []
        for path in sets:
            dataset = load_counting_dataset(path)
            validate_counting_dataset(dataset, path)
            datasets_.append((set_name(path), dataset))
        model = load_model(args.model, dtype="auto").to(device).eval()
        processor = load_processor(args.model)
    except (DataError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reports = [
        evaluate_dataset(model, processor, dataset, name=name, batch_size=args.batch_size, limit=args.limit,
                         progress=not args.quiet, compile_generation=args.compile)
        for name, dataset in datasets_
    ]
    print(format_table(reports))
    out = args.out or os.path.join(args.model, "selfcheck.json")
    try:
        write_report(out, reports, args.model, {"sets_paths": sets, "limit": args.limit})
    except OSError:
        out = os.path.abspath("selfcheck.json")
        write_report(out, reports, args.model, {"sets_paths": sets, "limit": args.limit})
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
