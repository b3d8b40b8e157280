"""The rm stage as the stand-in runs it: the real one (``open_r1.tasks.captioning.stage_rm``), then on each
held-out split the share of its pairs whose label (the higher mean) the hidden rule agrees with: how much of the
held-out accuracy the simulated readers' noise leaves to learn."""

from __future__ import annotations

import numpy as np

from open_r1.tasks.captioning import stage_rm
from open_r1.tasks.captioning.stage_rm import NAME, Config, inputs, outputs  # noqa: F401


def label_agreement(recipe, split: str) -> float | None:
    """The share of `split`'s held-out pairs whose chosen caption also has the higher hidden score."""
    dataset, index = stage_rm.held_out_index(recipe, split)
    if not len(index):
        return None
    hidden = np.asarray(dataset["oracle"], dtype=np.float64)
    return float(np.mean(hidden[index[:, 0]] > hidden[index[:, 1]]))


def run(recipe) -> dict:
    report = stage_rm.run(recipe)
    splits = {split for entry in report.values() for split in entry.get("held_out") or {}}
    agreement = {split: label_agreement(recipe, split) for split in sorted(splits)}
    for entry in report.values():
        for split, result in (entry.get("held_out") or {}).items():
            result["oracle_agreement_of_labels"] = agreement[split]
    return report


def markdown(rm: dict) -> list[str]:
    """The real table, then the labels' agreement with the hidden rule by split."""
    agreement = {
        split: result.get("oracle_agreement_of_labels")
        for entry in rm.values()
        if isinstance(entry, dict)
        for split, result in (entry.get("held_out") or {}).items()
    }
    lines = stage_rm.markdown(rm)
    if agreement:
        shown = ", ".join(f"{split} {value:.3f}" for split, value in agreement.items() if value is not None)
        lines += ["", f"Held-out labels the stand-in's hidden rule agrees with (label/oracle agreement): {shown}"]
    return lines
