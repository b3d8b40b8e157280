"""Reading selfcheck reports (selfcheck.py writes them): each is checked where it is read, its scores finite
percentages, and two are compared only when they measured the same sets under the same protocol."""

import math
import os

from open_r1.checks import is_number
from open_r1.errors import PromoteError
from open_r1.jsonio import read_json

REPORT_FILE = "selfcheck.json"  # a scored submission's selfcheck report


def percent(value) -> bool:
    return is_number(value) and math.isfinite(value) and 0 <= value <= 100


def load_report(path: str) -> dict:
    """A selfcheck report, refused (one PromoteError) unless it scores finite percentages over at least one set."""
    try:
        report = read_json(path)
    except FileNotFoundError:
        raise PromoteError(
            f"report {path} does not exist; run: python selfcheck.py --model <candidate> --out {path}"
        ) from None
    except (OSError, ValueError) as exc:
        raise PromoteError(f"report {path} is not readable JSON: {exc}") from None
    score = report.get("mean_accuracy_pct") if isinstance(report, dict) else None
    if not is_number(score):
        raise PromoteError(f"report {path} has no numeric mean_accuracy_pct: is it a selfcheck.py report?")
    if not isinstance(report.get("sets"), dict) or not report["sets"]:
        raise PromoteError(f"report {path} lists no sets")
    scores = {"mean_accuracy_pct": score}
    scores.update(
        {f"sets.{k}.accuracy_pct": v.get("accuracy_pct") for k, v in report["sets"].items() if isinstance(v, dict)}
    )
    bad = {key: value for key, value in scores.items() if value is not None and not percent(value)}
    if bad:
        raise PromoteError(
            f"report {path} scores {bad}, not percentages from 0 to 100: it was not written by selfcheck.py or was "
            "edited; re-score the model with python selfcheck.py"
        )
    return report


def report_mismatch(new: dict, current: dict) -> list[str]:
    """Why two reports are not comparable (empty list = comparable): the same sets (names, paths, rows on disk and
    examples scored) under the same protocol."""
    problems = []
    new_sets, cur_sets = set(new["sets"]), set(current["sets"])
    if new_sets != cur_sets:
        problems.append(f"different sets: new {sorted(new_sets)} vs current {sorted(cur_sets)}")
    new_paths, cur_paths = report_set_paths(new), report_set_paths(current)
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


def report_set_paths(report: dict) -> dict:
    """{set name: real path} from a selfcheck report's sets_paths (a list in the order of its sets)."""
    paths = report.get("sets_paths")
    if isinstance(paths, dict):
        return {name: os.path.realpath(p) for name, p in paths.items()}
    if isinstance(paths, list) and len(paths) == len(report.get("sets") or ()):
        return {name: os.path.realpath(p) for name, p in zip(report["sets"], paths)}
    return {}
