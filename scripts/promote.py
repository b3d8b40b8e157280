#!/usr/bin/env python
"""Replace the submission with a candidate only when its selfcheck report scores higher.

    python selfcheck.py --model runs/r2/submission --out runs/r2/selfcheck.json
    python scripts/promote.py --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

Compares the report's mean_accuracy_pct with the one recorded for the current submission (<submission>/selfcheck.json)
over the same sets; promotes only a strictly higher score (--force overrides). The candidate is verified in a temp dir
beside the submission before the swap; the replaced submission is kept as <submission>.replaced-<timestamp>.
Exit status: 0 promoted, 1 refused (not better / not comparable), 2 error.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from open_r1.promote import REPORT_FILE, PromoteError, promote  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", required=True, help="model dir to promote (an exported submission)")
    parser.add_argument("--report", default=None, help=f"its selfcheck JSON (default <candidate>/{REPORT_FILE})")
    parser.add_argument("--submission", default=os.environ.get("SUBMISSION", "/app/submission"))
    parser.add_argument("--force", action="store_true", help="promote even if not better / not comparable")
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    args = parser.parse_args(argv)
    report = args.report or os.path.join(args.candidate, REPORT_FILE)
    try:
        result = promote(args.candidate, report, args.submission, force=args.force,
                         verify_generate=not args.no_verify_generate)
    except PromoteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[promote] {result.message}", file=sys.stdout if result.promoted else sys.stderr)
    return 0 if result.promoted else 1


if __name__ == "__main__":
    sys.exit(main())
