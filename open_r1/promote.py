"""Promote only improvements: replace the submission with a candidate only when its selfcheck score is higher.

    python scripts/promote.py --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

Rules:
  * the current submission's score is the report recorded with it, `<submission>/selfcheck.json` (selfcheck.py writes
    it there by default; promote copies the candidate's report there when it promotes);
  * the candidate replaces it only when `mean_accuracy_pct` is strictly higher; `force=True` overrides every refusal;
  * both reports must cover the same sets with the same number of examples each, under the same protocol, else the
    comparison is meaningless and promote refuses (with the differences in the message);
  * no current submission -> the candidate is promoted (nothing to lose);
  * the candidate is copied into a temp dir beside the submission, verified there the way the grader loads it
    (`export.verify_submission`: files, architecture, weights, load, one greedy generation), and only then swapped
    in by two renames; the replaced submission is kept as `<submission>.replaced-YYYYmmdd-HHMMSS` until the user
    deletes it. A failure at any point leaves the current submission untouched.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

from open_r1.errors import PromoteError  # noqa: F401  (re-exported)

REPORT_FILE = "selfcheck.json"


@dataclass
class PromoteResult:
    promoted: bool
    message: str
    new_score: float | None = None
    current_score: float | None = None
    replaced_path: str | None = None


def load_report(path: str) -> dict:
    try:
        with open(path) as handle:
            report = json.load(handle)
    except FileNotFoundError:
        raise PromoteError(f"report {path} does not exist; run: python selfcheck.py --model <candidate> "
                           f"--out {path}") from None
    except (OSError, ValueError) as exc:
        raise PromoteError(f"report {path} is not readable JSON: {exc}") from None
    score = report.get("mean_accuracy_pct") if isinstance(report, dict) else None
    if not isinstance(score, (int, float)) or isinstance(score, bool) or math.isnan(score):
        raise PromoteError(f"report {path} has no numeric mean_accuracy_pct: is it a selfcheck.py report?")
    if not isinstance(report.get("sets"), dict) or not report["sets"]:
        raise PromoteError(f"report {path} lists no sets")
    return report


def report_mismatch(new: dict, current: dict) -> list[str]:
    """Why two reports are not comparable (empty list = comparable)."""
    problems = []
    new_sets, cur_sets = set(new["sets"]), set(current["sets"])
    if new_sets != cur_sets:
        problems.append(f"different sets: new {sorted(new_sets)} vs current {sorted(cur_sets)}")
    for name in sorted(new_sets & cur_sets):
        n_new, n_cur = new["sets"][name].get("n"), current["sets"][name].get("n")
        if n_new != n_cur:
            problems.append(f"set {name}: {n_new} examples in the new report vs {n_cur} in the current one")
    if new.get("protocol") and current.get("protocol") and new["protocol"] != current["protocol"]:
        problems.append(f"different protocol: new {new['protocol']} vs current {current['protocol']}")
    return problems


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def promote(candidate: str, report_path: str, submission: str, force: bool = False, verify_generate: bool = True,
            log=print) -> PromoteResult:
    """Compare, verify, swap (see the module docstring). Raises PromoteError when it cannot proceed; returns a
    result with promoted=False when the candidate is not better (a refusal, not an error)."""
    from open_r1.export import verify_submission

    candidate = os.path.abspath(candidate)
    submission = os.path.abspath(submission.rstrip("/"))
    if not os.path.isdir(candidate):
        raise PromoteError(f"candidate {candidate} does not exist")
    if _same_dir(candidate, submission):
        raise PromoteError(f"candidate and submission are the same dir ({submission})")
    new = load_report(report_path)
    new_score = float(new["mean_accuracy_pct"])
    reported_model = new.get("model")
    if reported_model and os.path.isdir(reported_model) and not _same_dir(reported_model, candidate):
        message = f"the report {report_path} was measured on {reported_model}, not on the candidate {candidate}"
        if not force:
            return PromoteResult(False, f"refused: {message} (--force to promote anyway)", new_score)
        log(f"[promote] warning: {message}; promoting anyway (--force)")

    current_score = None
    if os.path.exists(submission):
        current_path = os.path.join(submission, REPORT_FILE)
        if not os.path.isfile(current_path):
            if not force:
                return PromoteResult(
                    False, f"refused: the current submission {submission} has no recorded report ({REPORT_FILE}); "
                    f"score it first: python selfcheck.py --model {submission} (with the same --sets and --limit), "
                    "or pass --force", new_score)
            log(f"[promote] warning: {submission} has no recorded report; replacing it anyway (--force)")
        else:
            current = load_report(current_path)
            current_score = float(current["mean_accuracy_pct"])
            mismatch = report_mismatch(new, current)
            if mismatch and not force:
                return PromoteResult(
                    False, "refused: the reports are not comparable: " + "; ".join(mismatch)
                    + ". Re-run selfcheck on both with the same --sets/--limit, or pass --force",
                    new_score, current_score)
            if new_score <= current_score and not force:
                return PromoteResult(
                    False, f"refused: the candidate scores {new_score:.2f}% mean accuracy, the current submission "
                    f"{current_score:.2f}%; only a strictly higher score replaces it (--force to override)",
                    new_score, current_score)
            for problem in mismatch:
                log(f"[promote] warning: {problem} (--force)")

    parent = os.path.dirname(submission)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(submission)}.promote-", dir=parent)
    replaced = None
    try:
        shutil.copytree(candidate, staging, dirs_exist_ok=True)
        verdict = verify_submission(staging, generate=verify_generate)
        if not verdict.ok:
            raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(verdict.problems))
        shutil.copyfile(report_path, os.path.join(staging, REPORT_FILE))
        if os.path.exists(submission):
            replaced = f"{submission}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
            suffix = 1
            while os.path.exists(replaced):
                replaced = f"{submission}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{suffix}"
                suffix += 1
            os.rename(submission, replaced)
        try:
            os.rename(staging, submission)
        except BaseException:
            if replaced:
                os.rename(replaced, submission)  # put the old one back
                replaced = None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    before = "none" if current_score is None else f"{current_score:.2f}%"
    message = f"promoted {candidate} -> {submission}: {new_score:.2f}% mean accuracy (was {before})" + (
        f"; the previous submission is kept at {replaced} (delete it when you no longer need it)" if replaced else "")
    return PromoteResult(True, message, new_score, current_score, replaced)


# ---- command line --------------------------------------------------------------------------------------------------


CLI_DOC = """Replace the submission with a candidate only when its selfcheck report scores higher.

    python selfcheck.py --model runs/r2/submission --out runs/r2/selfcheck.json
    python scripts/promote.py --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

Compares the report's mean_accuracy_pct with the one recorded for the current submission (<submission>/selfcheck.json)
over the same sets; promotes only a strictly higher score (--force overrides). The candidate is verified in a temp dir
beside the submission before the swap; the replaced submission is kept as <submission>.replaced-<timestamp>.
Exit status: 0 promoted, 1 refused (not better / not comparable), 2 error.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=CLI_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    raise SystemExit(main())
