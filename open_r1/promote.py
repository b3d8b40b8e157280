r"""Promote only improvements: replace the submission with a candidate only when its selfcheck report scores higher.

    python selfcheck.py --model runs/r2/submission --out runs/r2/selfcheck.json
    python scripts/promote.py --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

The current score is the report recorded with the submission, <submission>/selfcheck.json (selfcheck.py writes it
there; promote copies the candidate's report there). Only a strictly higher mean_accuracy_pct over the same sets (names,
paths, rows on disk, examples) under the same protocol replaces it; --force overrides every refusal. The candidate is
copied beside the submission, verified there as the grader loads it, and swapped in atomically (docs/GUARANTEES.md);
the replaced one is kept as <submission>.replaced-<timestamp>. A failure leaves the submission untouched.
Exit status: 0 promoted, 1 refused (not better / not comparable), 2 error.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys

from open_r1 import export
from open_r1.checks import is_number, writable_problem
from open_r1.errors import CliHelp, PromoteError
from open_r1.export import REPORT_FILE, exit_cli, recover_interrupted_swap, run_cli, swap_in, verify_submission
from open_r1.jsonio import read_json


def load_report(path: str) -> dict:
    try:
        report = read_json(path)
    except FileNotFoundError:
        raise PromoteError(
            f"report {path} does not exist; run: python selfcheck.py --model <candidate> --out {path}"
        ) from None
    except (OSError, ValueError) as exc:
        raise PromoteError(f"report {path} is not readable JSON: {exc}") from None
    score = report.get("mean_accuracy_pct") if isinstance(report, dict) else None
    if not is_number(score) or math.isnan(score):
        raise PromoteError(f"report {path} has no numeric mean_accuracy_pct: is it a selfcheck.py report?")
    if not isinstance(report.get("sets"), dict) or not report["sets"]:
        raise PromoteError(f"report {path} lists no sets")
    return report


def report_mismatch(new: dict, current: dict) -> list[str]:
    """Why two reports are not comparable (empty list = comparable): the same sets (names, paths, rows on disk and
    examples scored) under the same protocol."""
    problems = []
    new_sets, cur_sets = set(new["sets"]), set(current["sets"])
    if new_sets != cur_sets:
        problems.append(f"different sets: new {sorted(new_sets)} vs current {sorted(cur_sets)}")
    new_paths, cur_paths = export.report_set_paths(new), export.report_set_paths(current)
    new_rows, cur_rows = new.get("sets_rows") or {}, current.get("sets_rows") or {}
    for name in sorted(new_sets & cur_sets):
        n_new, n_cur = new["sets"][name].get("n"), current["sets"][name].get("n")
        if n_new != n_cur:
            problems.append(f"set {name}: {n_new} examples in the new report vs {n_cur} in the current one")
        if name in new_paths and name in cur_paths and new_paths[name] != cur_paths[name]:
            problems.append(f"set {name}: measured on {new_paths[name]} (new) vs {cur_paths[name]} (current)")
        if name in new_rows and name in cur_rows and new_rows[name] != cur_rows[name]:
            problems.append(f"set {name}: {new_rows[name]} rows on disk (new) vs {cur_rows[name]} (current)")
    if (new.get("protocol") or None) != (current.get("protocol") or None):
        problems.append(f"different protocol: new {new.get('protocol')} vs current {current.get('protocol')}")
    return problems


def promote(
    candidate: str, report_path: str, submission: str, force: bool = False, verify_generate: bool = True, log=print
) -> tuple[bool, str]:
    """Compare, verify, swap (see the module docstring): (promoted, what happened). A candidate that is not better
    is a refusal (promoted False); PromoteError when it cannot proceed."""
    candidate, submission = os.path.abspath(candidate), os.path.abspath(submission.rstrip("/"))
    if not os.path.isdir(candidate):
        raise PromoteError(f"candidate {candidate} does not exist")
    if os.path.realpath(candidate) == os.path.realpath(submission):
        raise PromoteError(f"candidate and submission are the same dir ({submission})")
    new = load_report(report_path)
    new_score = float(new["mean_accuracy_pct"])
    measured = new.get("model")
    if measured and os.path.isdir(measured) and os.path.realpath(measured) != os.path.realpath(candidate):
        message = f"the report {report_path} was measured on {measured}, not on the candidate {candidate}"
        if not force:
            return False, f"refused: {message} (--force to promote anyway)"
        log(f"[promote] warning: {message}; promoting anyway (--force)")

    recover_interrupted_swap(submission, log=log)
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
            log(f"[promote] warning: {exc}; replacing it anyway (--force)")
    elif os.path.exists(submission):
        if not force:
            return False, (
                f"refused: the current submission {submission} has no recorded report ({REPORT_FILE}); "
                f"score it first: python selfcheck.py --model {submission} (with the same --sets and "
                "--limit), or pass --force"
            )
        log(f"[promote] warning: {submission} has no recorded report; replacing it anyway (--force)")
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
            log(f"[promote] warning: {problem} (--force)")

    static = verify_submission(candidate, generate=False)  # named as the user's dir, not the temp copy's
    if not static.ok:
        raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(static.problems))
    problem = writable_problem(submission)
    if problem:
        raise PromoteError(f"cannot write the submission: {problem} (--submission / SUBMISSION)")

    def fill(staging: str) -> None:
        shutil.copytree(candidate, staging, dirs_exist_ok=True)
        shutil.copyfile(report_path, os.path.join(staging, REPORT_FILE))
        verdict = verify_submission(staging, generate=verify_generate)
        if not verdict.ok:
            raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(verdict.problems))

    replaced = swap_in(submission, fill, "replaced", PromoteError, "copying the candidate", log=log, source=candidate)[
        1
    ]
    before = "none" if current_score is None else f"{current_score:.2f}%"
    message = f"promoted {candidate} -> {submission}: {new_score:.2f}% mean accuracy (was {before})" + (
        f"; the previous submission is kept at {replaced} (delete it when you no longer need it)" if replaced else ""
    )
    return True, message


def main(argv=None) -> int:
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
