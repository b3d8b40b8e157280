"""The tasks, one folder each: its protocol (prompts, parser, scoring), rewards, data and evaluation.

* `counting/` — CLEVR-style counting VQA that generalizes (GRPO on Qwen2-VL-2B-Instruct).
* `captioning/` — humor-r1: cartoon captions, thinking SFT, a Bradley-Terry VLM reward model, GRPO, best-of-N.

The engine (`open_r1/*.py`, `open_r1/run/`) knows no task; a task imports the engine, never the reverse except
through the registries (rewards by name, `open_r1.rewards.TASK_REWARD_MODULES`).
"""

import importlib
import os
import re

from open_r1.checks import load_split
from open_r1.errors import RecipeError

# name -> module holding `TASK`, a class built with the recipe's script arguments (see `Task` below).
TASK_MODULES = {"counting": "open_r1.tasks.counting.task", "captioning": "open_r1.tasks.captioning.task"}
# name -> "module:dataclass" of the task's own recipe keys (light modules: `open_r1.grpo` parses them with its own)
TASK_SETTINGS = {
    "counting": "open_r1.tasks.counting:CountingSettings",
    "captioning": "open_r1.tasks.captioning:CaptioningSettings",
}


def one_line(text: str | None, limit: int = 80) -> str:
    """A sample completion for a log line: whitespace collapsed, runs of one repeated token shortened, at most
    `limit` characters, quoted (a random model's ~150 reserved tokens would otherwise fill the screen)."""
    if text is None:
        return "None"

    def shorten(run):  # "a a a a a" -> "a ... x5"
        return f"{run.group(1)} ... x{len(re.findall(re.escape(run.group(1)), run.group(0)))}"

    flat = re.sub(r"(\S+?)(?:\s*\1){3,}", shorten, " ".join(text.split()))
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


class Task:
    """What the engine asks of a task; one subclass per task folder (`open_r1/tasks/<task>/task.py`).

    The engine's GRPO entry (`open_r1.grpo`) builds its training set with `train_dataset`; the in-training
    evaluation (`open_r1.run.evaluation`) scores held-out sets with `evaluate` and keeps the best checkpoint by the
    reports' `score` (higher is better), logged as `eval/<set>_<metric>`.

    A report is any object with `name`, `n`, `seconds`, `records` (dicts with an `index` into the evaluated set),
    `score` and `summary()` (a dict of its numbers); `report_from_records` rebuilds one from records gathered
    across ranks.
    """

    name = "task"
    metric = "score"
    default_primary = "val"
    default_secondary: str | None = None

    def __init__(self, script_args=None, settings=None):
        """`script_args`: the engine's recipe keys; `settings`: the task's own (its `TASK_SETTINGS` dataclass, as
        the recipe parser filled it; its defaults when not given)."""
        self.script_args = script_args
        default = settings_class(self.name)() if settings is None and self.name in TASK_SETTINGS else None
        self.settings = settings if settings is not None else default

    def train_dataset(self, script_args, training_args):
        """The validated GRPO training set: a `prompt` column (chat messages) plus the columns rewards read."""
        raise NotImplementedError

    def load_eval_sets(self, paths: list[str], limit: int | None = None) -> dict:
        """{name: dataset} of held-out sets, each named by its dir's basename (`load_eval_set`; two of one name are
        refused by checks.check_eval_settings)."""
        return {os.path.basename(os.path.normpath(path)): self.load_eval_set(path, limit) for path in paths}

    def load_eval_set(self, path: str, limit: int | None = None):
        """One held-out set, validated like the training data, its first `limit` rows."""
        raise NotImplementedError

    def evaluate(
        self, model, processor, dataset, name: str, batch_size: int, limit: int | None = None, progress: bool = False
    ):
        raise NotImplementedError

    def report_from_records(self, name: str, records: list[dict], seconds: float):
        raise NotImplementedError

    def training_meta(self) -> dict:
        """Task fields recorded in training_meta.json beside the weights (a resumed run must match the recipe's
        own settings among them)."""
        return {}

    # the command that writes the task's embedded default data, named in data errors (None: none)
    generate_hint: str | None = None

    def load_split(self, path_or_name: str, split: str = "train"):
        """A split of the task's data (any form `checks.load_split` reads), as the pre-load validation loads it;
        kept, so the validation and the training of one run load each set once."""
        loaded = self.__dict__.setdefault("_loaded", {})
        key = (os.path.abspath(path_or_name) if os.path.exists(path_or_name) else path_or_name, split)
        if key not in loaded:
            loaded[key] = load_split(path_or_name, split, self.generate_hint)
        return loaded[key]

    def probe(self, model, processor) -> tuple[str, str | None]:
        """One greedy completion of the task's prompt on `probe_image()`, and a one-line problem when it does not
        follow the task's output format (None when it does): the export's load-and-generate check."""
        raise NotImplementedError

    def probe_image(self):
        """A small deterministic image for that check (no dataset needed); a task may give one like its data."""
        import numpy as np  # deferred: the task registry stays light
        from PIL import Image

        grid = np.indices((96, 144)).sum(axis=0) % 32
        return Image.fromarray((np.stack([grid * 8, grid * 4, 255 - grid * 8], axis=-1)).astype("uint8"))


def get_task(name: str, script_args=None, settings=None) -> Task:
    """The task object for a recipe's `task` key (built once per run: `open_r1.grpo.parse_args`)."""
    if name not in TASK_MODULES:
        raise RecipeError(f"unknown task {name!r}; set task to one of {sorted(TASK_MODULES)}")
    module = importlib.import_module(TASK_MODULES[name])
    return module.TASK(script_args, settings)


def settings_class(name: str) -> type:
    """The dataclass of task `name`'s own recipe keys (`TASK_SETTINGS`)."""
    module, _, attribute = TASK_SETTINGS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def task_settings() -> list[type]:
    """The dataclasses of every task's own recipe keys, in `TASK_SETTINGS` order."""
    return [settings_class(name) for name in TASK_SETTINGS]
