"""Caption-contest data: load and validate the layout, then build SFT rows, preference pairs and splits.

Layout: a ``save_to_disk`` dir (or a DatasetDict: pick one with ``split=``), one row per caption: ``contest`` (int or
str: the cartoon id), ``image`` (``datasets.Image``, or a path relative to the dataset dir: prepare writes
``../images/<contest>.jpg``, each cartoon stored once), ``caption`` (str, one line), ``mean`` (finite float),
``precision`` (float >= 0: by default the standard error of the mean, see ``standard_errors``), ``votes`` (int >= 0);
optional description columns ``scene``, ``twist``, ``location``, ``entities`` (str; entities may be a list of str),
left out of the prompt when missing. Other columns ride along unread: every row builder here selects the columns it
names (the stand-in's analysis columns stay its own).
"""

import io
import logging
import math
import os
from collections import Counter
from typing import Any

import numpy as np

from open_r1.checks import is_int, is_number
from open_r1.errors import DataError
from open_r1.tasks.captioning import protocol

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("contest", "image", "caption", "mean", "precision", "votes")
DESCRIPTION_FIELDS = protocol.DESCRIPTION_FIELDS
THINKING_COLUMN = "thinking"  # written by trace synthesis (or the stand-in's templated traces) on top_k_rows(...)
SE_FROM = ("precision", "std_over_sqrt_votes")


def load_captions(path: str | os.PathLike, split: str | None = None, *, check_images: str = "first_per_contest"):
    """The validated caption dataset at `path` (module docstring). ``check_images``: ``"first_per_contest"`` (each
    cartoon decoded once: its contest's first row) or ``"none"``."""
    import datasets
    import pyarrow.compute as pc

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise DataError(
            f"caption dataset directory {path} does not exist; prepare the real data with "
            "open-r1-caption-prepare, or generate the offline stand-in: python -m "
            f"standin.captioning.cartoons --out {path} --contests 40"
        )
    try:
        loaded = datasets.load_from_disk(path)
    except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
        raise DataError(
            f"{path} is not a dataset saved with save_to_disk ({exc}); point to a split's directory"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            raise DataError(f"{path} holds splits {sorted(loaded)}; pass split= one of those (got {split!r})")
        loaded = loaded[split]
    if loaded.features.get("image") == datasets.Value("string"):  # relative paths: absolute ones, by an Arrow join
        absolute = pc.binary_join_element_wise(os.path.abspath(path) + os.sep, loaded.data.column("image"), "")
        loaded = loaded.remove_columns("image").add_column("image", absolute).cast_column("image", datasets.Image())
    validate_captions(loaded, name=path, check_images=check_images)
    return loaded


# The public humor-r1 data (yguooo/newyorker_caption_ranking) names the description fields canny / uncanny.
HUMOR_R1_RENAME = {"canny": "scene", "uncanny": "twist", "contest_number": "contest"}


def filter_captions(dataset, min_votes: int = 10, min_captions: int = 20):
    """Captions with >= ``min_votes`` votes, then contests with >= ``min_captions`` of them (humor-r1's filters)."""
    for name, value in (("min_votes", min_votes), ("min_captions", min_captions)):
        if not is_int(value) or value < 0:
            raise DataError(f"{name} must be an integer >= 0, got {value!r}")
    votes = _column(dataset, "votes")
    voted = [row for row, v in enumerate(votes) if v >= min_votes]
    contests = _column(dataset, "contest")
    counts = Counter(contests[row] for row in voted)
    keep = [row for row in voted if counts[contests[row]] >= min_captions]
    if not keep:
        raise DataError(f"no contest keeps {min_captions} captions with >= {min_votes} votes; lower the thresholds")
    return dataset.select(np.asarray(keep, dtype=np.int64))  # an array: datasets hashes a list item by item


def _column(dataset, name: str) -> list:
    """One column as a list, read in Arrow batches (row by row is 10-80x slower, and memory-hungry after select)."""
    out = []
    for batch in dataset.select_columns([name]).with_format("arrow").iter(batch_size=1 << 14):
        out.extend(batch.column(0).to_pylist())
    return out


def validate_captions(dataset, name: str = "caption dataset", check_images: str = "first_per_contest") -> None:
    """One DataError for the first problem found, naming the column, the row and the fix."""
    import datasets

    if check_images not in ("first_per_contest", "none"):
        raise DataError(f"check_images must be 'first_per_contest' or 'none', got {check_images!r}")
    if len(dataset) == 0:
        raise DataError(f"{name} is empty; it needs one row per caption")
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.column_names]
    if missing:
        raise DataError(
            f"{name} lacks column(s) {missing}; it has {dataset.column_names}. The caption layout needs "
            f"{list(REQUIRED_COLUMNS)} (one row per caption; see open_r1/tasks/captioning/data.py)"
        )
    if not isinstance(dataset.features["image"], datasets.Image):
        raise DataError(
            f"{name}: column 'image' has type {dataset.features['image']}, expected datasets.Image; "
            "cast it with dataset.cast_column('image', datasets.Image())"
        )
    rules = {
        "mean": (lambda v: is_number(v) and math.isfinite(v), "is not a finite number; fix or drop that caption"),
        "votes": (lambda v: is_int(v) and v >= 0, "must be an integer >= 0"),
        "precision": (lambda v: is_number(v) and math.isfinite(v) and v >= 0, "must be a finite number >= 0"),
    }
    for column, (ok, problem) in rules.items():
        for row, value in enumerate(_column(dataset, column)):
            if not ok(value):
                raise DataError(f"{name} row {row}: {column} {value!r} {problem}")
    for row, value in enumerate(_column(dataset, "caption")):
        if not isinstance(value, str) or not value.strip():
            raise DataError(f"{name} row {row}: empty caption {value!r}; drop rows without a caption")
        if "\n" in value.strip() or "\r" in value.strip():
            raise DataError(f"{name} row {row}: caption {value!r} spans several lines; captions are one line")
    for row, value in enumerate(_column(dataset, "contest")):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{name} row {row}: missing contest id; every caption needs the id of its cartoon")
    if check_images == "none":
        return
    from PIL import Image  # deferred: heavy

    raw = dataset.cast_column("image", datasets.Image(decode=False))
    for row in (group[0] for group in _contest_groups(dataset).values()):  # each contest's first row
        cell = raw[row]["image"]
        try:
            if not cell or not (cell.get("bytes") or cell.get("path")):
                raise ValueError("no image bytes or path")
            Image.open(io.BytesIO(cell["bytes"]) if cell.get("bytes") else cell["path"]).load()
        except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
            raise DataError(f"{name} row {row}: unreadable image ({exc}); re-encode or drop that cartoon") from None


def _contest_groups(dataset) -> dict[Any, list[int]]:
    groups = {}
    for row, contest in enumerate(_column(dataset, "contest")):
        groups.setdefault(contest, []).append(row)
    return groups


def _description_columns(dataset) -> list[str]:
    return [c for c in DESCRIPTION_FIELDS if c in dataset.column_names]


def descriptions(dataset) -> list[dict]:
    """Each row's description (``protocol.description_from_row``), read in Arrow batches."""
    columns = {c: _column(dataset, c) for c in _description_columns(dataset)}
    return [protocol.description_from_row({c: v[row] for c, v in columns.items()}) for row in range(len(dataset))]


def _top_k_by_contest(dataset, top_k: int, groups: list[list[int]] | None = None) -> list[list[int]]:
    """Per contest (`groups`: its rows, if already read), its ``top_k`` rows by mean, then votes, then row order."""
    if not is_int(top_k) or top_k < 1:
        raise DataError(f"top_k must be a positive integer, got {top_k!r}")
    means, votes = _column(dataset, "mean"), _column(dataset, "votes")
    groups = list(_contest_groups(dataset).values()) if groups is None else groups
    return [sorted(rows, key=lambda r: (-means[r], -votes[r], r))[:top_k] for rows in groups]


def top_k_rows(dataset, top_k: int = 3):
    """The ``top_k`` captions of every contest (`_top_k_by_contest`) in row order: what trace synthesis explains."""
    keep = [row for top in _top_k_by_contest(dataset, top_k) for row in sorted(top)]
    return dataset.select(keep)


def sft_rows(dataset, top_k: int = 3, *, processor):
    """TRL prompt-completion VLM rows (prompt, completion, images, contest) of the top-k captions with a trace, as
    text rendered by ``processor`` (generation prompt; ``format_target`` + end of turn): Qwen3 Thinking templates
    rewrite an assistant turn's think block, so conversational rows would not train on what is generated."""
    if THINKING_COLUMN not in dataset.column_names:
        raise DataError(
            f"sft_rows needs a {THINKING_COLUMN!r} column (the synthesized trace of each caption); it "
            f"has {dataset.column_names}. Run trace synthesis on data.top_k_rows(dataset) first (or, on "
            "the stand-in, standin.captioning.cartoons.add_templated_thinking)"
        )
    top = top_k_rows(dataset, top_k)
    desc_cols = _description_columns(top)
    table = top.select_columns(["contest", "caption", THINKING_COLUMN, *desc_cols])
    out = {"prompt": [], "completion": [], "contest": []}
    end_of_turn = _end_of_turn(processor)
    # a template whose generation prompt does not open the think block (an Instruct model): the completion opens it
    think_open = "" if generation_prompt_opens_think(processor) else protocol.THINK_OPEN + "\n"
    keep = []
    for row, record in enumerate(table):
        thinking = record[THINKING_COLUMN]
        if thinking is None or not str(thinking).strip():
            continue
        keep.append(row)
        messages = protocol.build_messages(protocol.description_from_row(record))
        out["prompt"].append(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        out["completion"].append(think_open + protocol.format_target(str(thinking), record["caption"]) + end_of_turn)
        out["contest"].append(record["contest"])
    if len(keep) < len(table):
        logger.warning(
            "sft_rows: skipped %d of %d top-%d rows without a thinking trace", len(table) - len(keep), len(table), top_k
        )
    if not keep:
        raise DataError("sft_rows: no row has a thinking trace; trace synthesis dropped every one")
    return with_images(out, top, keep)


def with_images(columns: dict, dataset, rows: list[int]):
    """``columns`` plus ``images`` = [the image of ``dataset`` row r] for r in ``rows``, the stored bytes passed
    through undecoded (re-encoding was ~80 % of the cost)."""
    import datasets

    stored = dataset.select(rows).cast_column("image", datasets.Image(decode=False))["image"]
    table = datasets.Dataset.from_dict({**columns, "images": [[image] for image in stored]})
    return table.cast_column("images", datasets.List(datasets.Image()))


def generation_prompt_opens_think(processor) -> bool:
    """Whether the processor's generation prompt already opens the think block (a Qwen3 *Thinking* template)."""
    probe = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
    text = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    return text.rstrip("\n").endswith(protocol.THINK_OPEN)


def _end_of_turn(processor) -> str:
    """The text that ends an assistant turn in the processor's chat template (``<|im_end|>\n`` for Qwen)."""
    probe = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ANSWER"}]},
    ]
    tail = processor.apply_chat_template(probe, tokenize=False).split("ANSWER")[-1]
    if not tail.strip():
        tokenizer = getattr(processor, "tokenizer", processor)
        tail = tokenizer.eos_token or ""
    return tail


def standard_errors(dataset, se_from: str = "precision") -> np.ndarray:
    """Each caption's standard error of the mean: ``"precision"`` (the column is the SE, the public data's
    convention) or ``"std_over_sqrt_votes"`` (it is the per-vote SD; 0 votes: infinite, never a pair)."""
    if se_from not in SE_FROM:
        raise DataError(f"se_from must be one of {SE_FROM}, got {se_from!r}")
    se = np.asarray(_column(dataset, "precision"), dtype=np.float64)
    if se_from == "std_over_sqrt_votes":
        votes = np.asarray(_column(dataset, "votes"), dtype=np.float64)
        se = np.where(votes > 0, se / np.sqrt(np.maximum(votes, 1.0)), np.inf)
    bad = np.flatnonzero(np.isnan(se) | (se < 0))
    if len(bad):
        raise DataError(f"standard error of row {int(bad[0])} is {se[bad[0]]!r}; it must be a number >= 0")
    return se


def _pair_mask(mean: np.ndarray, se: np.ndarray, k: float, start: int, stop: int) -> np.ndarray:
    """Rows start..stop-1 against columns start..n-1: |mean_i - mean_j| > k * sqrt(se_i^2 + se_j^2) and j > i."""
    i = np.arange(start, stop)
    gap = np.abs(mean[i, None] - mean[None, start:])
    threshold = k * np.sqrt(se[i, None] ** 2 + se[None, start:] ** 2)
    return (gap > threshold) & (np.arange(start, len(mean))[None, :] > i[:, None])


def _contest_pairs(mean: np.ndarray, se: np.ndarray, k: float, cap: int | None, rng) -> np.ndarray:
    """A contest's qualifying (i, j), i < j, row-major; with ``cap``, ``cap`` of them drawn without replacement.
    Bounded memory: a blockwise pass counts pairs per row; a drawn pair's row alone is then recomputed."""
    n = len(mean)
    block = max(1, (1 << 20) // max(n, 1))  # ~1M cells of the comparison at a time, whatever the contest's size
    per_row, found = [], []
    for start in range(0, n, block):
        mask = _pair_mask(mean, se, k, start, min(start + block, n))
        per_row.append(mask.sum(axis=1))
        if cap is None or sum(len(f) for f in found) + per_row[-1].sum() <= cap:
            found.append(np.argwhere(mask) + start)  # row-major: the (i, j) order of the upper triangle
    ends = np.cumsum(np.concatenate(per_row)) if n else np.zeros(0, dtype=np.int64)
    if cap is None or not n or ends[-1] <= cap:
        return np.concatenate(found) if found else np.empty((0, 2), dtype=np.int64)
    pick = rng.choice(int(ends[-1]), size=cap, replace=False)
    rows = np.searchsorted(ends, pick, side="right")  # the row holding the pick-th pair
    out = np.empty((cap, 2), dtype=np.int64)
    for row in np.unique(rows).tolist():
        here = np.flatnonzero(rows == row)
        columns = np.flatnonzero(_pair_mask(mean, se, k, row, row + 1)[0]) + row
        out[here] = np.stack([np.full(len(here), row), columns[pick[here] - (ends[row - 1] if row else 0)]], axis=1)
    return out


def pair_indices(
    dataset,
    k: float = 3.0,
    se_from: str = "precision",
    cap_per_contest: int | None = 1000,
    seed: int = 0,
) -> np.ndarray:
    """Bradley-Terry pairs as (chosen, rejected) row indices, an int array ``(n, 2)``: two captions of one contest
    whose mean gap exceeds ``k * sqrt(se_1^2 + se_2^2)`` (``se_from``: see ``standard_errors``), the higher mean
    first. At most ``cap_per_contest`` pairs a contest, drawn at random, then all shuffled with ``seed`` (any prefix
    spans the contests). Indices, not a pair dataset: that would copy each pair's image."""
    if not is_number(k) or not k >= 0:
        raise DataError(f"k must be a number >= 0, got {k!r}")
    if cap_per_contest is not None and (not is_int(cap_per_contest) or cap_per_contest < 1):
        raise DataError(f"cap_per_contest must be a positive integer or None, got {cap_per_contest!r}")
    rng = np.random.default_rng(seed)
    mean = np.asarray(_column(dataset, "mean"), dtype=np.float64)
    ses = standard_errors(dataset, se_from)
    pairs = []
    for rows in _contest_groups(dataset).values():
        rows = np.asarray(rows)
        pairs.append(rows[_contest_pairs(mean[rows], ses[rows], float(k), cap_per_contest, rng)])
    pairs = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    if not len(pairs):
        raise DataError(
            f"no caption pair passes the gap rule (k={k}, se_from={se_from!r}); lower k, or check that "
            "the standard errors are what se_from says"
        )
    pairs = pairs[rng.permutation(len(pairs))]
    return np.where((mean[pairs[:, 0]] >= mean[pairs[:, 1]])[:, None], pairs, pairs[:, ::-1])  # higher mean first


def image_negative_indices(dataset, n: int, top_k: int = 3, seed: int = 0) -> np.ndarray:
    """The RM's image swap: ``(n, 2)`` (caption row, other row): a top-k caption of a random contest, and the first
    row of another random contest, whose cartoon replaces its own (assumed worse, not rated)."""
    if not is_int(n) or n < 0:
        raise DataError(f"the number of image-negative pairs must be an integer >= 0, got {n!r}")
    groups = list(_contest_groups(dataset).values())
    tops = _top_k_by_contest(dataset, top_k, groups)
    if n and len(groups) < 2:
        raise DataError(f"image-negative pairs need at least 2 contests, the data has {len(groups)}")
    rng = np.random.default_rng(seed)
    own = rng.integers(len(groups), size=n)
    other = rng.integers(max(len(groups) - 1, 1), size=n)  # n = 0 with one contest: no draw
    other = other + (other >= own)  # uniform over the contests other than its own
    pick = rng.random(n)
    chosen = [tops[c][int(u * len(tops[c]))] for c, u in zip(own.tolist(), pick.tolist())]
    firsts = [groups[c][0] for c in other.tolist()]
    return np.asarray([chosen, firsts], dtype=np.int64).T  # (n, 2), also for n = 0


def split_by_contest(dataset, val_frac: float = 0.1, test_frac: float = 0.1, seed: int = 0):
    """A train / val / test ``DatasetDict`` with disjoint contests, shuffled with ``seed``: val and test get
    ``round(frac * n)`` contests (at least one when frac > 0), train at least one."""
    import datasets

    for name, frac in (("val_frac", val_frac), ("test_frac", test_frac)):
        if not is_number(frac) or not 0 <= frac < 1:
            raise DataError(f"{name} must be in [0, 1), got {frac!r}")
    groups = list(_contest_groups(dataset).values())
    n = len(groups)
    order = np.random.default_rng(seed).permutation(n)
    n_val, n_test = (max(1, round(frac * n)) if frac > 0 else 0 for frac in (val_frac, test_frac))
    if n - n_val - n_test < 1:
        raise DataError(f"{n} contests cannot fill val ({n_val}), test ({n_test}) and a train split; add contests")
    parts = {"train": order[n_val + n_test :], "val": order[:n_val], "test": order[n_val : n_val + n_test]}
    rows = {split: sorted(r for c in part for r in groups[c]) for split, part in parts.items()}
    return datasets.DatasetDict({split: dataset.select(np.asarray(r, dtype=np.int64)) for split, r in rows.items()})


def prompt_rows(dataset):
    """One row per contest for GRPO and evaluation: ``prompt``, ``image``, ``contest`` and the description columns
    (the ``caption_rm`` reward reads them back)."""
    first = [rows[0] for rows in _contest_groups(dataset).values()]
    base = dataset.select_columns(["contest", "image", *_description_columns(dataset)]).select(first)
    return base.add_column("prompt", [protocol.build_messages(d) for d in descriptions(base)])
