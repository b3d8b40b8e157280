"""The rm stage as the stand-in runs it: the real one (``open_r1.tasks.captioning.stage_rm``), its seeds and blind
control as parallel sub-jobs where ``rm.parallel`` (``standin/captioning/parallel.py``: ``rm.only`` / ``rm.seed`` are
one sub-job's share), then on each held-out split the share of its pairs whose label (the higher mean) the hidden
rule agrees with: how much of the held-out accuracy the simulated readers' noise leaves to learn."""

import dataclasses

import numpy as np

from open_r1.tasks.captioning import stage_rm
from open_r1.tasks.captioning.config import help_field, require
from open_r1.tasks.captioning.stage_rm import NAME, finish, inputs, outputs  # noqa: F401


@dataclasses.dataclass
class Config(stage_rm.Config):
    parallel: bool = help_field(False, "run the seeds and the blind control as parallel processes")
    only: str | None = help_field(None, "a parallel job: rm | rm_blind")
    seed: int | None = help_field(None, "a parallel job: one of seeds")

    def __post_init__(self):
        super().__post_init__()
        require(self.only in (None, "rm", "rm_blind"), f"rm.only must be rm, rm_blind or null, got {self.only!r}")
        require(
            self.seed is None or self.seed in (self.seeds or [self.seed]),
            f"rm.seed={self.seed!r} is not one of rm.seeds {self.seeds}",
        )


def jobs(cfg, paths, seed) -> list[list[str]] | None:
    """With ``rm.parallel``: the ``--set`` overrides of the sub-jobs (each seed's RM, the blind control); the
    runner then calls `finish` on their merged results."""
    if not cfg.parallel:
        return None
    seeds = stage_rm.rm_seeds(cfg, seed)
    return [["rm.only=rm"] + ([f"rm.seed={seed}"] if len(seeds) > 1 else []) for seed in seeds] + (
        [["rm.only=rm_blind"]] if cfg.blind else []
    )


def label_agreement(cfg, paths, seed, split: str) -> float | None:
    """The share of `split`'s held-out pairs whose chosen caption also has the higher hidden score."""
    dataset, index = stage_rm.held_out_index(cfg, paths, seed, split)
    if not len(index):
        return None
    hidden = np.asarray(dataset["oracle"], dtype=np.float64)
    return float(np.mean(hidden[index[:, 0]] > hidden[index[:, 1]]))


def run(cfg: Config, paths, seed) -> dict:
    """The real stage's RMs, or one parallel sub-job's share of them, with the labels' agreement added."""
    seeds = [cfg.seed] if cfg.seed is not None else stage_rm.rm_seeds(cfg, seed)
    report = stage_rm.train(cfg, paths, seed, seeds if cfg.only != "rm_blind" else [], cfg.blind and cfg.only != "rm")
    if cfg.only in (None, "rm") and cfg.seed is None:  # every seed trained here: keep the best (a job: the runner)
        report = stage_rm.finish(cfg, paths, seed, report)
    agreement = {}  # by split, each computed once
    for entry in report.values():
        for split, result in (entry.get("held_out") or {}).items():
            if split not in agreement:
                agreement[split] = label_agreement(cfg, paths, seed, split)
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
