r"""Promote only improvements: replace the submission with a candidate only when its selfcheck report scores higher.

    python selfcheck.py --model runs/r2/submission --out runs/r2/selfcheck.json
    python -m open_r1.submission.promote --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

The current score is the report recorded with the submission, <submission>/selfcheck.json (selfcheck.py writes it
there; promote copies the candidate's report there). Only a strictly higher mean_accuracy_pct over the same sets
(names, paths, rows on disk, examples) under the same protocol replaces it; --force overrides every refusal but a
report whose scores are not percentages and a --submission the path guard refuses. The candidate is copied beside
the submission, verified there as the grader loads it, and installed atomically (`open_r1.submission`); the replaced
one is kept as <submission>.replaced-<timestamp>. A failure leaves the submission untouched.
Exit status: 0 promoted, 1 refused (not better / not comparable), 2 error.
"""

import argparse
import logging
import os
import shutil
import sys

from open_r1.errors import CliHelp, PromoteError, setup_logging
from open_r1.submission.export import is_model_dir
from open_r1.submission.install import check_target, exit_cli, installing, kept_path, locked, run_cli
from open_r1.submission.report import REPORT_FILE, load_report, report_mismatch
from open_r1.submission.verify import verify_submission

logger = logging.getLogger(__name__)


def promote(
    candidate: str, report_path: str, submission: str, force: bool = False, verify_generate: bool = True
) -> tuple[bool, str]:
    """Compare, verify, swap (see the module docstring): (promoted, what happened). A candidate that is not better
    is a refusal (promoted False); PromoteError when it cannot proceed."""
    candidate, submission = os.path.abspath(candidate), os.path.abspath(submission.rstrip("/"))
    if not os.path.isdir(candidate):
        raise PromoteError(f"candidate {candidate} does not exist")
    check_target(
        submission, "--submission / SUBMISSION", "the submission", [candidate, report_path], None, is_model_dir, force
    )
    new = load_report(report_path)  # a bogus score is refused, --force or not
    new_score = float(new["mean_accuracy_pct"])
    measured = new.get("model")
    if measured and os.path.isdir(measured) and os.path.realpath(measured) != os.path.realpath(candidate):
        message = f"the report {report_path} was measured on {measured}, not on the candidate {candidate}"
        if not force:
            return False, f"refused: {message} (--force to promote anyway)"
        logger.warning(f"[promote] warning: {message}; promoting anyway (--force)")

    with locked(submission):  # the current report is read and replaced by one promote at a time
        current, current_path = None, os.path.join(submission, REPORT_FILE)
        if os.path.isfile(current_path):
            try:
                current = load_report(current_path)
            except PromoteError as exc:
                if not force:
                    raise PromoteError(
                        f"{exc}. Re-score the current submission (python selfcheck.py --model "
                        f"{submission} --sets <the candidate's sets>), or pass --force"
                    ) from None
                logger.warning(f"[promote] warning: {exc}; replacing it anyway (--force)")
        elif os.path.exists(submission):
            if not force:
                return False, (
                    f"refused: the current submission {submission} has no recorded report ({REPORT_FILE}); "
                    f"score it first: python selfcheck.py --model {submission} (with the same --sets and "
                    "--limit), or pass --force"
                )
            logger.warning(f"[promote] warning: {submission} has no recorded report; replacing it anyway (--force)")
        current_score = None if current is None else float(current["mean_accuracy_pct"])
        if current is not None:
            mismatch = report_mismatch(new, current)
            if mismatch and not force:
                return False, (
                    "refused: the reports are not comparable: "
                    + "; ".join(mismatch)
                    + ". Re-run selfcheck on both with the same --sets/--limit, or pass --force"
                )
            if new_score <= current_score and not force:
                return False, (
                    f"refused: the candidate scores {new_score:.2f}% mean accuracy, the current submission "
                    f"{current_score:.2f}%; only a strictly higher score replaces it (--force to override)"
                )
            for problem in mismatch:
                logger.warning(f"[promote] warning: {problem} (--force)")

        static = verify_submission(candidate, generate=False)  # named as the user's dir, not the temp copy's
        if not static.ok:
            raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(static.problems))
        replaced = kept_path(submission, "replaced") if os.path.exists(submission) else None
        with installing(
            submission, replaced, source=candidate, error=PromoteError, what="copying the candidate"
        ) as staging:
            shutil.copytree(candidate, staging, dirs_exist_ok=True)
            shutil.copyfile(report_path, os.path.join(staging, REPORT_FILE))
            verdict = verify_submission(staging, generate=verify_generate)
            if not verdict.ok:
                raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(verdict.problems))
        before = "none" if current_score is None else f"{current_score:.2f}%"
        message = f"promoted {candidate} -> {submission}: {new_score:.2f}% mean accuracy (was {before})" + (
            f"; the previous submission is kept at {replaced} (delete it when you no longer need it)"
            if replaced
            else ""
        )
        return True, message


def main(argv=None) -> int:
    setup_logging()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=CliHelp)
    parser.add_argument("--candidate", required=True, help="model dir to promote (an exported submission)")
    parser.add_argument("--report", default=None, help=f"its selfcheck JSON (without it: <candidate>/{REPORT_FILE})")
    default = os.environ.get("SUBMISSION") or ("/app/submission" if os.path.isdir("/app") else None)
    parser.add_argument(
        "--submission",
        default=default,
        required=default is None,
        help="the submission dir (default: $SUBMISSION, else /app/submission where /app exists)",
    )
    parser.add_argument("--force", action="store_true", help="promote even if not better / not comparable")
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    args = parser.parse_args(argv)

    def work() -> int:
        promoted, message = promote(
            args.candidate,
            args.report or os.path.join(args.candidate, REPORT_FILE),
            args.submission,
            force=args.force,
            verify_generate=not args.no_verify_generate,
        )
        print(f"[promote] {message}", file=sys.stdout if promoted else sys.stderr)
        return 0 if promoted else 1

    return run_cli("promote", args.submission, work)


def cli(argv=None) -> None:  # the console script open-r1-promote
    exit_cli(main, argv)


if __name__ == "__main__":
    cli()
