"""Promote only improvements: replace the submission with a candidate only when its selfcheck score is higher.

    python scripts/promote.py --candidate runs/r2/submission --report runs/r2/selfcheck.json \
        --submission /app/submission

Rules:
  * the current submission's score is the report recorded with it, `<submission>/selfcheck.json` (selfcheck.py writes
    it there by default; promote copies the candidate's report there when it promotes);
  * the candidate replaces it only when `mean_accuracy_pct` is strictly higher; `force=True` overrides every refusal;
  * both reports must cover the same sets (names, paths, rows on disk) with the same number of examples each, under
    the same protocol, else the comparison is meaningless and promote refuses (with the differences in the message);
  * an unreadable current report refuses without --force and is overridden by it;
  * no current submission -> the candidate is promoted (nothing to lose);
  * the candidate is copied into a temp dir beside the submission, verified there the way the grader loads it
    (`export.verify_submission`: files, architecture, weights, load, one greedy generation), its modes set to
    0755/0644, and only then swapped in by `export.install` (atomic; see docs/GUARANTEES.md); the replaced
    submission is kept as `<submission>.replaced-YYYYmmdd-HHMMSS` until the user
    deletes it. A failure at any point leaves the current submission untouched.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from open_r1.checks import is_number, writable_problem
from open_r1.errors import CliHelp, OpenR1Error, PromoteError  # noqa: F401  (re-exported)
from open_r1.export import (
    STAGING_PREFIX,
    clean_stale_staging,
    discard_staging,
    fix_modes,
    inode_of,
    install,
    interrupted,
    recover_interrupted_swap,
    unique_path,
    verify_submission,
)

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
    if not is_number(score) or math.isnan(score):
        raise PromoteError(f"report {path} has no numeric mean_accuracy_pct: is it a selfcheck.py report?")
    if not isinstance(report.get("sets"), dict) or not report["sets"]:
        raise PromoteError(f"report {path} lists no sets")
    return report


def _set_paths(report: dict) -> dict:
    """{set name: real path} from a selfcheck report's sets_paths (a list in the order of its sets)."""
    paths = report.get("sets_paths")
    if isinstance(paths, dict):
        return {name: os.path.realpath(p) for name, p in paths.items()}
    if isinstance(paths, list) and len(paths) == len(report["sets"]):
        return {name: os.path.realpath(p) for name, p in zip(report["sets"], paths)}
    return {}


def report_mismatch(new: dict, current: dict) -> list[str]:
    """Why two reports are not comparable (empty list = comparable): the same sets (names, paths, rows on disk and
    examples scored) under the same protocol."""
    problems = []
    new_sets, cur_sets = set(new["sets"]), set(current["sets"])
    if new_sets != cur_sets:
        problems.append(f"different sets: new {sorted(new_sets)} vs current {sorted(cur_sets)}")
    new_paths, cur_paths = _set_paths(new), _set_paths(current)
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


def _same_dir(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def promote(candidate: str, report_path: str, submission: str, force: bool = False, verify_generate: bool = True,
            log=print) -> PromoteResult:
    """Compare, verify, swap (see the module docstring). Raises PromoteError when it cannot proceed; returns a
    result with promoted=False when the candidate is not better (a refusal, not an error)."""
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
    current = None
    recover_interrupted_swap(submission, log=log)
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
            try:
                current = load_report(current_path)
            except PromoteError as exc:
                if not force:
                    raise PromoteError(f"{exc}. Re-score the current submission (python selfcheck.py --model "
                                       f"{submission} --sets <the candidate's sets>), or pass --force") from None
                log(f"[promote] warning: {exc}; replacing it anyway (--force)")
                current = None
        if current is not None:
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

    static = verify_submission(candidate, generate=False)  # named as the user's dir, not the temp copy's
    if not static.ok:
        raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(static.problems))
    parent = os.path.dirname(submission)
    problem = writable_problem(submission)
    if problem:
        raise PromoteError(f"cannot write the submission: {problem} (--submission / SUBMISSION)")
    os.makedirs(parent, exist_ok=True)
    clean_stale_staging(submission, log=log)
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX.format(name=os.path.basename(submission))}{os.getpid()}-",
                               dir=parent)
    aside, new_inode = unique_path(f"{submission}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"), None
    try:
        shutil.copytree(candidate, staging, dirs_exist_ok=True)
        shutil.copyfile(report_path, os.path.join(staging, REPORT_FILE))
        fix_modes(staging)
        verdict = verify_submission(staging, generate=verify_generate)
        if not verdict.ok:
            raise PromoteError(f"the candidate {candidate} fails verification: " + "; ".join(verdict.problems))
        new_inode = os.stat(staging).st_ino
        replaced = install(staging, submission, "replaced", log=log, aside=aside)
        interrupted = ""
    except KeyboardInterrupt as exc:
        if new_inode is None or inode_of(submission) != new_inode:  # before the swap: nothing changed
            discard_staging(staging, submission, log=log)
            exc.where = f"the submission at {submission} is unchanged"
            raise
        # delivered as the held signal was released: the swap is done, so the promotion is finished
        replaced, interrupted = (aside if os.path.isdir(aside) else None), f" ({str(exc) or 'SIGINT'} came after "\
            "the swap: the promotion is complete)"
    except BaseException as exc:
        where = discard_staging(staging, submission, log=log)  # a copy: the candidate itself stays where it is
        if isinstance(exc, OSError):  # e.g. a full disk while copying
            raise PromoteError(f"copying the candidate failed: {exc.strerror or exc} ({exc.filename}); {where}, "
                               f"the candidate is still at {candidate}") from None
        raise
    before = "none" if current_score is None else f"{current_score:.2f}%"
    message = f"promoted {candidate} -> {submission}: {new_score:.2f}% mean accuracy (was {before})" + (
        f"; the previous submission is kept at {replaced} (delete it when you no longer need it)" if replaced else "")
    message += interrupted
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
    parser = argparse.ArgumentParser(description=CLI_DOC, formatter_class=CliHelp)
    parser.add_argument("--candidate", required=True, help="model dir to promote (an exported submission)")
    parser.add_argument("--report", default=None, help=f"its selfcheck JSON (without it: <candidate>/{REPORT_FILE})")
    parser.add_argument("--submission", default=os.environ.get("SUBMISSION", "/app/submission"),
                        help="the submission dir ($SUBMISSION when set)")
    parser.add_argument("--force", action="store_true", help="promote even if not better / not comparable")
    parser.add_argument("--no-verify-generate", action="store_true", help="skip the one-example generation check")
    args = parser.parse_args(argv)
    from open_r1.export import _raise_interrupt  # export loads torch: deferred past --help and bad arguments

    report = args.report or os.path.join(args.candidate, REPORT_FILE)
    previous = None
    if threading.current_thread() is threading.main_thread():  # SIGTERM unwinds like Ctrl-C: nothing half-done
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        result = promote(args.candidate, report, args.submission, force=args.force,
                         verify_generate=not args.no_verify_generate)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return interrupted(exc, "promote", args.submission)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"[promote] {result.message}", file=sys.stdout if result.promoted else sys.stderr)
    return 0 if result.promoted else 1


if __name__ == "__main__":
    raise SystemExit(main())
