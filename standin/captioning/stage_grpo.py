"""The grpo stage as the stand-in runs it: the real one (``open_r1.tasks.captioning.stage_grpo``), its seeds as
parallel sub-jobs where ``grpo.parallel`` (``standin/captioning/parallel.py``)."""

import dataclasses
import functools

from open_r1.tasks.captioning import stage_grpo
from open_r1.tasks.captioning.config import help_field
from open_r1.tasks.captioning.stage_grpo import NAME, check, inputs, outputs, run  # noqa: F401


@dataclasses.dataclass
class Settings(stage_grpo.Settings):
    parallel: bool = help_field(False, "run the seeds as parallel processes")


parse = functools.partial(stage_grpo.parse, settings_class=Settings)


def jobs(section, *_) -> list[list[str]] | None:
    return [[f"grpo.seeds=[{s}]"] for s in section.settings.seeds] if section.settings.parallel else None


def merge(results: list[dict]) -> dict:
    """The parallel seeds' results as one."""
    return {"runs": [r for part in results for r in part.get("runs", [])]}
