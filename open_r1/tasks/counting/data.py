"""Counting-VQA data: load, validate up front (every gold count parsed, so a bad row fails in seconds with its index),
and turn rows (columns `image`, `problem`, `solution` = `<answer> N </answer>`) into TRL conversational prompts.
Sets in other layouts are mapped to those columns by name (`counting_columns`): R1-V's train and CoGenT sets have
them already; R1-V's eval jsonl has `image_path`, `question` and an integer `ground_truth`; `--columns` maps others.
`prompt_templates: ["train:0.5", "eval:0.5"]` draws one template per row from a seeded generator, so the policy
also sees the grader's wording, not only the inherited R1-V one.
"""

import logging
import os
from dataclasses import dataclass

import numpy as np

from open_r1.checks import load_split
from open_r1.errors import DataError  # noqa: F401  (re-exported)
from open_r1.tasks.counting import protocol

logger = logging.getLogger(__name__)
REQUIRED_COLUMNS = ("image", "problem", "solution")
# role -> (this layout's column, then the other names recognised: R1-V's eval jsonl's)
COLUMN_NAMES = {
    "image": ("image", "image_path"),
    "question": ("problem", "question"),
    "answer": ("solution", "ground_truth"),
}
COLUMNS_FIX = "--columns image=COLUMN,question=COLUMN,answer=COLUMN (recipe key columns)"

GENERATE_HINT = "python -m open_r1.tasks.counting.scenes --out data"


def load_counting_dataset(path_or_name: str, split: str = "train"):
    """Load a split in any form `checks.load_split` reads, with the counting columns (`counting_columns`)."""
    return counting_columns(load_split(path_or_name, split, GENERATE_HINT), path_or_name)


def parse_columns(text: str | None) -> dict[str, str]:
    """`image=img,question=q,answer=a` -> {role: column}."""
    mapping = {}
    for entry in filter(None, (part.strip() for part in (text or "").split(","))):
        role, _, column = entry.partition("=")
        if role.strip() not in COLUMN_NAMES or not column.strip():
            raise DataError(f"--columns entry {entry!r}: use {COLUMNS_FIX}, roles {sorted(COLUMN_NAMES)}")
        mapping[role.strip()] = column.strip()
    return mapping


def counting_columns(dataset, name: str, columns: str | None = None, image_root: str | None = None):
    """`dataset` with its image, question and answer columns named `image` (a datasets.Image), `problem` and
    `solution`, found by name (COLUMN_NAMES) or `columns` (`parse_columns`). Image paths (R1-V's `./images/x.png`)
    are joined to `image_root` (default: the current directory, where R1-V's eval runs) unless absolute; a missing
    image is a DataError naming it."""
    import datasets

    mapping = parse_columns(columns)
    chosen = {
        role: mapping.get(role) or next((c for c in names if c in dataset.column_names), None)
        for role, names in COLUMN_NAMES.items()
    }
    unknown = [
        f"{role} ({chosen[role] or ' / '.join(COLUMN_NAMES[role])})"
        for role in chosen
        if chosen[role] not in dataset.column_names
    ]
    if unknown:
        raise DataError(
            f"{name} has no {', no '.join(unknown)} column; it has {dataset.column_names}. Map its columns with "
            f"{COLUMNS_FIX}"
        )
    renames = {chosen[role]: names[0] for role, names in COLUMN_NAMES.items() if chosen[role] != names[0]}
    dataset = dataset.remove_columns([c for c in renames.values() if c in dataset.column_names and c not in renames])
    dataset = dataset.rename_columns(renames)
    if dataset.features["image"] == datasets.Value("string"):
        root = image_root or os.getcwd()
        paths = [os.path.normpath(os.path.join(root, p)) for p in dataset["image"]]
        missing = next((row for row, p in enumerate(paths) if not os.path.isfile(p)), None)
        if missing is not None:
            raise DataError(
                f"{name} row {missing}: image {paths[missing]} does not exist ({dataset['image'][missing]!r} "
                f"joined to {root}); pass --image-root DIR, the folder its relative image paths start from"
            )
        dataset = replace_columns(dataset, image=paths).cast_column("image", datasets.Image())
    return dataset


def drop_non_counts(dataset, name: str):
    """An evaluation set without its rows whose gold is not a count (CoGenT-B's yes/no questions), left out with a
    one-line notice; returns (dataset, number left out). A training set refuses them instead (validate)."""
    keep, first = [], None
    for row, solution in enumerate(dataset["solution"]):
        try:
            protocol.parse_gold(solution)
            keep.append(row)
        except ValueError:
            first = first or (row, solution)
    skipped = len(dataset) - len(keep)
    if skipped:
        logger.info(
            f"[data] {name}: {skipped} of {len(dataset)} rows left out, their gold is not a count (row {first[0]}: "
            f"{first[1]!r})"
        )
        dataset = dataset.select(keep)
    return dataset, skipped


def validate_counting_dataset(dataset, name: str = "dataset", image_check_rows: int = 8) -> list[int]:
    """Check columns and types, parse every gold count, fully decode the first `image_check_rows` images (-1: all;
    all 68k would cost minutes). Returns the gold counts; raises DataError naming the first bad row."""
    import datasets

    if len(dataset) == 0:
        raise DataError(f"{name} is empty")
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{name} lacks column(s) {missing}; it has {dataset.column_names}. Counting data needs "
            f"{list(REQUIRED_COLUMNS)}: image (PIL), problem (the question), "
            "solution ('<answer> N </answer>')"
        )
    if not isinstance(dataset.features["image"], datasets.Image):
        raise DataError(
            f"{name}: column 'image' has type {dataset.features['image']}, expected datasets.Image. "
            "Cast it: dataset.cast_column('image', datasets.Image())"
        )
    golds = []
    for row, solution in enumerate(dataset["solution"]):
        try:
            golds.append(protocol.parse_gold(solution))
        except ValueError:
            raise DataError(
                f"{name} row {row}: cannot parse a gold count from solution {solution!r}; "
                "expected '<answer> N </answer>' or an integer N >= 0: fix or drop that row, or map the answer "
                f"column with {COLUMNS_FIX}"
            ) from None
    for row, problem in enumerate(dataset["problem"]):
        if not isinstance(problem, str) or not problem.strip():
            raise DataError(f"{name} row {row}: problem is {problem!r}; every row needs a question")
    rows = range(len(dataset)) if image_check_rows < 0 else range(min(image_check_rows, len(dataset)))
    for row in rows:
        try:
            image = dataset[row]["image"]
            image.load()
        except Exception as exc:  # noqa: BLE001 - PIL raises many types
            raise DataError(
                f"{name} row {row}: unreadable image ({type(exc).__name__}: {exc}); fix or drop that row"
            ) from None
        if min(image.size) < 1:
            raise DataError(f"{name} row {row}: empty image")
    return golds


@dataclass(frozen=True)
class TemplateMix:
    """Named templates with sampling weights, parsed from recipe entries like "eval:0.5"."""

    names: tuple[str, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, entries: list[str] | None) -> "TemplateMix":
        entries = entries or ["train:1.0"]
        names, weights = [], []
        for entry in entries:
            name, _, weight = str(entry).partition(":")
            if name not in protocol.TEMPLATES:
                raise DataError(
                    f"unknown prompt template {name!r} in prompt_templates; valid: "
                    f"{sorted(protocol.TEMPLATES)} (entries look like 'eval:0.5')"
                )
            try:
                value = float(weight) if weight else 1.0
            except ValueError:
                raise DataError(f"prompt_templates entry {entry!r}: weight must be a number, e.g. 'eval:0.5'") from None
            if value < 0:
                raise DataError(f"prompt_templates entry {entry!r}: weight must be >= 0")
            names.append(name)
            weights.append(value)
        if sum(weights) <= 0:
            raise DataError("prompt_templates: weights sum to 0; give at least one template a positive weight")
        return cls(tuple(names), tuple(weights))

    def assign(self, n: int, seed: int) -> list[str]:
        """One template name per row, reproducible from the seed."""
        probabilities = np.asarray(self.weights) / sum(self.weights)
        choice = np.random.default_rng(seed).choice(len(self.names), size=n, p=probabilities)
        return [self.names[i] for i in choice]


def replace_columns(dataset, **columns):
    """`dataset` with `columns` ({name: values}) added, replacing any of the same name (`add_column` refuses
    duplicates; it also avoids rewriting the image bytes that `map` would)."""
    stale = [name for name in columns if name in dataset.column_names]
    if stale:
        dataset = dataset.remove_columns(stale)
    for name, values in columns.items():
        dataset = dataset.add_column(name, values)
    return dataset


def to_grpo_dataset(dataset, templates: TemplateMix, seed: int = 0):
    """Add the TRL conversational `prompt` and its `template`; images stay in `image`. The user turn is plain text:
    TRL puts the image placeholder before it, the grader's layout (image first, then the text)."""
    names = templates.assign(len(dataset), seed)
    prompts = [
        [{"role": "user", "content": protocol.format_prompt(problem, protocol.TEMPLATES[name])}]
        for problem, name in zip(dataset["problem"], names)
    ]
    return replace_columns(dataset, prompt=prompts, template=names)
