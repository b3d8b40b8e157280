"""Prepare the public caption-contest data in the layout ``data.load_captions`` reads (train/ val/ test/).

    open-r1-caption-prepare --ratings caption-contest-data --out data/captions [--descriptions desc.jsonl]
    open-r1-caption-prepare --hub hub_dir --out data/captions

Sources: ``--ratings DIR``, the public ratings repository: ``summaries/<contest>[_<algorithm>].csv`` (header
``[rank,]caption,mean,precision,votes,not_funny,somewhat_funny,funny``), ``cartoons/<contest>.jpg``; or ``--hub DIR``:
humor-r1's ``yguooo/newyorker_caption_ranking`` saved locally, a folder per part, each a ``save_to_disk`` dataset or
the repository's own files (``hf download``: ``<split>.jsonl`` / ``<split>-00000-of-00001.parquet``): the configs
``1_rating`` (folder ``1_rating`` or ``ranking``) and ``2_gpt4o_description`` (optional; ``gpt4o_description``;
canny/uncanny are our scene/twist), and the files ``cartoons/{train,validation,test}-00000-of-00001.parquet``. A
cartoon is matched as humor-r1 matches it: its ``contest_number``, else a numeric file name, else the description row
at the same index of the same split. The Hub's train/validation/test are kept (``--resplit SEED``: split by seed).
``--descriptions FILE`` (csv/jsonl) joins descriptions by contest, over the Hub's.

Rules, each counted in ``prepare_report.json`` [under this name]:

0. A row whose numbers cannot be a rating (votes or a category count not a finite number >= 0, a voted mean outside
   1..3, an infinite or negative precision, a number that does not parse) is dropped [bad_rows; bad_rows_where: file,
   line (a Hub split's row + 1) and problem, the first 1000].
1. Text, unless ``--keep-raw`` (each change counted, with examples in text_fix_examples): mojibake repaired with ftfy
   first (later rules would break its byte patterns) [mojibake_repaired]; zero-width characters (U+200B-U+200D,
   U+2060, U+FEFF) [zero_width_removed] and control characters [control_chars_removed] removed; trailing signature
   lines removed while another line remains [signatures_removed]: a line "First Last, Town, ST" (two to four
   capitalised names, a town, a two-letter state), a line holding an e-mail address, or a dash and two to four
   capitalised names ("— Jane Doe[, ...]"); a joke that merely spans lines stays whole. Then whitespace runs (newlines
   too: captions are one line, also with --keep-raw) become one space [multi_line_captions: captions with a newline];
   then-empty captions are dropped [empty_captions], and so are rows whose mean or precision is missing (NaN)
   [non_finite_rows].
2. NFC [nfc_changed]; curly quotes become straight, so copies differing in quote style merge [curly_quotes].
3. Exact duplicates in a contest are merged: votes summed, vote-weighted mean, the pooled mean's SE from each copy's
   sum of squares (precision^2 * v * (v-1)) plus the spread between copies, floored at 1/sqrt(V(V-1)) as the
   publisher floors it [duplicate_groups, duplicate_rows_merged, max_copies: copies within one file].
4. Several summary files for a contest (``<n>_LilUCB.csv`` beside ``<n>_RoundRobin.csv``: the same captions voted on
   by two samplers) are merged by caption as in rule 3, so every vote counts and no contest is lost to a file whose
   votes are spread thin [contests_with_several_files, captions_in_several_files; contest_files: per contest the
   files used and how, ``single`` or ``merged``].
5. ``votes`` that disagree with the category counts are kept as published [vote_count_mismatches].
6. Ties in mean keep source-file order (``data.top_k_rows``: mean, then votes, then row) [tied_captions;
   top_k_cut_in_tie: contests whose ``--top-k`` cut falls inside a tie].
7. Contests without a readable cartoon are dropped [contests_without_cartoon (+ _ids), unreadable_cartoons,
   cartoons_matched_by_position]; contests without a description keep empty fields [contests_without_description].
8. ``data.filter_captions`` (``--min-votes``, ``--min-captions``) [captions_below_min_votes,
   contests_below_min_captions]; then the Hub's splits [split_rule] or ``data.split_by_contest``.

Each cartoon is copied once to ``OUT/images/`` (a row's ``image``: ``../images/<contest>.<ext>``). Rows stream to disk
contest by contest; the folder is written beside ``OUT`` and renamed into place only when complete. When the rows
cannot fill the splits, the report so far is written to ``OUT.prepare_report.json`` and named in the error.
"""

import argparse
import csv
import functools
import io
import itertools
import json
import logging
import math
import os
import re
import shutil
import sys
import unicodedata
from collections import Counter, defaultdict

import ftfy

from open_r1.errors import DataError, OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.jsonio import write_json
from open_r1.submission.install import check_target, installing
from open_r1.tasks.captioning import data, protocol

logger = logging.getLogger(__name__)

HEADER_OLD = ("rank", "caption", "mean", "precision", "votes", "not_funny", "somewhat_funny", "funny")
HEADER_NEW = HEADER_OLD[1:]
CATEGORIES = ("not_funny", "somewhat_funny", "funny")
QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"'})
ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff]")
CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")  # Cc but whitespace (which split joins)
# ftfy for mojibake alone: each other rule is its own, counted step
MOJIBAKE_ONLY = ftfy.TextFixerConfig(
    unescape_html=False,
    remove_terminal_escapes=False,
    fix_c1_controls=False,
    fix_latin_ligatures=False,
    fix_character_width=False,
    uncurl_quotes=False,
    fix_line_breaks=False,
    remove_control_chars=False,
    normalization=None,
    explain=False,
)
_NAMES = r"(?:[A-Z][\w'’-]+|[A-Z]\.)(?: (?:[A-Z][\w'’-]+|[A-Z]\.)){1,3}"  # two to four capitalised names
SIGNATURE = re.compile(
    rf"{_NAMES}, [A-Z][\w.'’-]*(?: [A-Z][\w.'’-]*){{0,2}}, (?:[A-Z]{{2}}|[A-Z]\.[A-Z]\.)"  # Name, Town, ST
    r"|.*\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b.*"  # an e-mail
    rf"|[—–-]{{1,2}} ?{_NAMES}(?:, .*)?"  # — Name
)
# the Hub's parts: humor-r1's config name (a save_to_disk folder), then the repository's folder
HUB_PARTS = {"1_rating": ("1_rating", "ranking"), "2_gpt4o_description": ("2_gpt4o_description", "gpt4o_description")}
HUB_SPLITS = {"train": "train", "validation": "val", "val": "val", "test": "test"}
SPLIT_NAME = re.compile(r"(train|validation|val|test)(?![a-z])")
REPORT = "prepare_report.json"
COUNTS = (
    "contests_read",
    "caption_rows_read",
    "bad_rows",
    "mojibake_repaired",
    "zero_width_removed",
    "control_chars_removed",
    "signatures_removed",
    "multi_line_captions",
    "empty_captions",
    "non_finite_rows",
    "nfc_changed",
    "curly_quotes",
    "duplicate_groups",
    "duplicate_rows_merged",
    "max_copies",
    "contests_with_several_files",
    "captions_in_several_files",
    "vote_count_mismatches",
    "tied_captions",
    "top_k_cut_in_tie",
    "unreadable_cartoons",
    "cartoons_matched_by_position",
    "contests_without_description",
)  # every one, 0 included
BAD_ROWS_LISTED = 1000


# --- Sources: (contest, [(file name, rows)]), rows (caption, mean, precision, votes, category sum or None) ---
def ratings_source(root: str, report: Counter):
    """(contests, cartoons, descriptions, Hub splits: none) of the ratings repository; bad rows go to `report`."""
    summaries = os.path.join(root, "summaries")
    if not os.path.isdir(summaries):
        raise DataError(
            f"{summaries} does not exist; --ratings must be a checkout of the caption-contest ratings "
            "repository (summaries/<contest>_<algorithm>.csv, cartoons/<contest>.jpg)"
        )
    files = defaultdict(list)
    for name in sorted(os.listdir(summaries)):
        match = re.fullmatch(r"(\d+)(?:_(.+))?\.csv", name)
        if match:
            files[int(match[1])].append(os.path.join(summaries, name))
    if not files:
        raise DataError(f"{summaries} holds no <contest>[_<algorithm>].csv file; point --ratings to the repository")
    for path in itertools.chain(*files.values()):
        read_summary(path)  # every header checked before anything is written
    cartoons = {}
    folder = os.path.join(root, "cartoons")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        stem, ext = os.path.splitext(name)
        if stem.isdigit() and ext.lower() in (".jpg", ".jpeg", ".png"):
            cartoons[int(stem)] = os.path.join(folder, name)
    contests = ((c, [(os.path.basename(p), read_summary(p, report)) for p in files[c]]) for c in sorted(files))
    return contests, cartoons, {}, {}


def rating_numbers(mean, precision, votes, cats=None) -> tuple:
    """(mean, precision, votes, category sum or None) of one row's values (rule 0: ValueError saying what is
    impossible). A missing mean or precision is NaN: rule 1 drops it."""
    mean, precision = (math.nan if v is None or v == "" else float(v) for v in (mean, precision))
    counts = [float(v) for v in (votes, *(cats or ()))]
    if not all(math.isfinite(c) and c >= 0 for c in counts):
        raise ValueError(f"votes and category counts must be finite numbers >= 0, got {', '.join(map(str, counts))}")
    if math.isinf(mean) or (counts[0] > 0 and not (math.isnan(mean) or 1 <= mean <= 3)):  # 0 votes: no mean
        raise ValueError(f"mean {mean} is outside 1..3")
    if math.isinf(precision) or precision < 0:
        raise ValueError(f"precision {precision} is not a finite number >= 0")
    return mean, precision, int(counts[0]), None if cats is None else int(sum(counts[1:]))


def bad_row(report: Counter, file: str, line: int, problem) -> None:
    """Rule 0: count a dropped row, and list where it is (the first `BAD_ROWS_LISTED`)."""
    report["bad_rows"] += 1
    if len(report["bad_rows_where"]) < BAD_ROWS_LISTED:
        report["bad_rows_where"].append({"file": file, "line": line, "problem": str(problem)})


def read_summary(path: str, report: Counter | None = None) -> list[tuple]:
    """A summary file's rows, the bad ones counted in `report` (rule 0); without `report` its header alone is read."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = tuple(h.strip() for h in next(reader, ()))
            if header not in (HEADER_OLD, HEADER_NEW):
                raise DataError(
                    f"{path}: header {','.join(header)!r} is neither {','.join(HEADER_OLD)!r} nor "
                    f"{','.join(HEADER_NEW)!r}; fix the header or remove the file"
                )
            col = {name: i for i, name in enumerate(header)}
            rows = []
            for fields in filter(any, reader) if report is not None else ():  # blank lines skipped
                try:
                    mean, precision, votes, *cats = (
                        fields[col[c]] for c in ("mean", "precision", "votes", *CATEGORIES)
                    )
                    rows.append((fields[col["caption"]], *rating_numbers(mean, precision, votes, cats)))
                except (ValueError, IndexError) as exc:
                    bad_row(report, path, reader.line_num, exc if isinstance(exc, ValueError) else "too few fields")
            return rows
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is not a readable UTF-8 csv ({exc}); re-download or remove the file") from None


def _load_part(root: str, part: str, needed: bool) -> dict:
    """{split: (dataset, its file or None)} of a Hub part: a save_to_disk Dataset ('' split) or DatasetDict, or the
    repository's files (jsonl or parquet, the split in the file name); {} if absent and not `needed`."""
    import datasets  # deferred: heavy
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    names = HUB_PARTS.get(part, (part,))
    path = next((os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))), None)
    repo = "yguooo/newyorker_caption_ranking"
    if path is None:
        if not needed:
            return {}
        where = " or ".join(os.path.join(root, n) for n in names)
        if part == "cartoons":
            raise DataError(
                f"{where} does not exist: the cartoons are the files cartoons/{{train,validation,test}}-00000-of-"
                f"00001.parquet of {repo} (not a config): hf download {repo} --repo-type dataset --include "
                f"'cartoons/*' --local-dir {root}"
            )
        raise DataError(
            f"{where} does not exist: hf download {repo} --repo-type dataset --local-dir {root}, or "
            f"datasets.load_dataset('{repo}', '{part}').save_to_disk('{os.path.join(root, part)}')"
        )
    if any(os.path.isfile(os.path.join(path, name)) for name in ("dataset_dict.json", "state.json")):
        loaded = datasets.load_from_disk(path)
        splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
        return {split: (table, None) for split, table in splits}
    files = defaultdict(list)
    for folder, _, found in sorted(os.walk(path)):
        for name in sorted(found):
            if name.endswith(
                (".parquet", ".jsonl")
            ):  # its split: ``train.jsonl``, ``validation-0...``, or its folder's
                split = next((m[1] for n in (name, os.path.basename(folder)) if (m := SPLIT_NAME.match(n))), "")
                files[split].append(os.path.join(folder, name))
    if not files:
        raise DataError(f"{path} holds no save_to_disk dataset, jsonl or parquet files; download the part again")
    out = {}
    for split, paths in files.items():
        try:
            tables = [pq.read_table(f) if f.endswith(".parquet") else pj.read_json(f) for f in paths]
            table = datasets.Dataset(pa.concat_tables(tables, promote_options="permissive"))
        except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
            raise DataError(f"{path}: unreadable {', '.join(paths)} ({exc}); download the part again") from None
        out[split] = (table, paths[0] if len(paths) == 1 else path)
    return out


def _need(table, columns, path):
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{path} lacks column(s) {missing} (has {table.column_names}); expected humor-r1's names")


def hub_source(root: str, report: Counter):
    """(contests, cartoons, descriptions, {contest: our split name} when every ratings split is named)."""
    import datasets  # deferred: heavy
    import numpy as np
    import pyarrow as pa

    parts = _load_part(root, "1_rating", True)
    order_of_splits = sorted(parts, key=lambda s: (list(HUB_SPLITS).index(s) if s in HUB_SPLITS else 9, s))
    tables, where = [], []
    for split in order_of_splits:
        table, source = parts[split]
        if "contest_number" in table.column_names:
            table = table.rename_column("contest_number", "contest")
        name = source or os.path.join(root, "1_rating")
        _need(table, ["contest", "caption", "mean", "precision", "votes"], name)
        tables.append(table.data.table.select([c for c in table.column_names if c != "image"]))
        where.append(name + (f" [{split}]" if split and not source else ""))
    try:  # permissive: one split's votes may be read as int, another's as double
        ratings = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"the 1_rating splits {', '.join(where)} do not share column types ({exc})") from None
    has_cats = all(c in ratings.column_names for c in CATEGORIES)
    split_of_row = np.repeat(np.arange(len(tables)), [t.num_rows for t in tables])
    row_in_split = np.concatenate([np.arange(t.num_rows) for t in tables])
    ids = np.asarray(ratings.column("contest").to_numpy(zero_copy_only=False), dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(ids[order])) + 1)  # the rows of each contest
    hub_splits = {}  # when every ratings split is named
    if all(s in HUB_SPLITS for s in order_of_splits):
        hub_splits = {int(ids[r[0]]): HUB_SPLITS[order_of_splits[split_of_row[r[0]]]] for r in groups}

    def contests():
        for rows in groups:
            part = ratings.take(rows).to_pydict()
            cats = zip(*(part[c] for c in CATEGORIES)) if has_cats else [None] * len(rows)
            kept = []
            for i, (caption, m, p, v, k) in enumerate(
                zip(part["caption"], part["mean"], part["precision"], part["votes"], cats)
            ):
                try:
                    kept.append((caption or "", *rating_numbers(m, p, v or 0, k)))
                except (ValueError, TypeError) as exc:
                    bad_row(report, where[split_of_row[rows[i]]], int(row_in_split[rows[i]]) + 1, exc)
            yield int(ids[rows[0]]), [("1_rating", kept)]

    descriptions, by_position = {}, {}
    for split, (desc, _) in _load_part(root, "2_gpt4o_description", False).items():
        desc = desc.remove_columns([c for c in desc.column_names if c == "image"])
        by_position[split] = []
        for row in desc:
            row = {data.HUMOR_R1_RENAME.get(k, k): v for k, v in row.items()}
            by_position[split].append(row.get("contest"))
            if row.get("contest") is not None:
                descriptions[int(row["contest"])] = row
    cartoons = {}
    for split, (table, source) in _load_part(root, "cartoons", True).items():
        column = next((c for c in ("image", "cartoon", "img", "picture") if c in table.column_names), "image")
        _need(table, [column], source or os.path.join(root, "cartoons"))  # humor-r1's candidate names
        if isinstance(table.features[column], datasets.Image):
            table = table.cast_column(column, datasets.Image(decode=False))
        for index, row in enumerate(table):  # humor-r1's order: the id, a numeric file name, the split's position
            cell, contest = row[column] or {}, row.get("contest_number", row.get("contest"))
            stem = os.path.splitext(os.path.basename(cell.get("path") or ""))[0]
            if contest is None and stem.isdigit():
                contest = int(stem)
            if contest is None and index < len(by_position.get(split, ())):
                contest = by_position[split][index]
                report["cartoons_matched_by_position"] += contest is not None
            if contest is not None and cell.get("bytes"):
                cartoons[int(contest)] = cell["bytes"]
    return contests(), cartoons, descriptions, hub_splits


def read_descriptions(path: str) -> dict[int, dict]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = (
                [json.loads(line) for line in handle if line.strip()]
                if path.endswith(".jsonl")
                else list(csv.DictReader(handle))
            )
        renamed = ({data.HUMOR_R1_RENAME.get(k, k): v for k, v in row.items()} for row in rows)
        return {int(row["contest"]): row for row in renamed}
    except (OSError, ValueError, KeyError, TypeError, csv.Error) as exc:
        raise DataError(
            f"--descriptions {path}: unreadable ({exc!r}); give a csv or jsonl with a contest (or "
            f"contest_number) column and {', '.join(data.DESCRIPTION_FIELDS)}"
        ) from None


# --- Rules (module docstring) ---
def strip_signature(text: str) -> str:
    """Rule 1: trailing signature lines removed while another line remains."""
    lines = text.strip().splitlines()
    while len(lines) > 1 and SIGNATURE.fullmatch(lines[-1].strip()):
        lines.pop()
        while len(lines) > 1 and not lines[-1].strip():
            lines.pop()
    return "\n".join(lines) if len(lines) < len(text.strip().splitlines()) else text


TEXT_RULES = (
    ("mojibake_repaired", lambda text: text if text.isascii() else ftfy.fix_text(text, MOJIBAKE_ONLY)),
    ("zero_width_removed", lambda text: text if text.isascii() else ZERO_WIDTH.sub("", text)),
    ("control_chars_removed", functools.partial(CONTROL.sub, "")),
    ("signatures_removed", strip_signature),
)


def clean_caption(raw: str, report: Counter, keep_raw: bool = False) -> str:
    """Rules 1-2 on one caption: the text fixes (repair first), counted with a few examples, then one line."""
    text = raw
    for kind, rule in () if keep_raw else TEXT_RULES:
        fixed = rule(text)
        if fixed != text:
            report[kind] += 1
            examples = report["text_fix_examples"].setdefault(kind, [])
            if len(examples) < 3:
                examples.append([text, fixed])
            text = fixed
    report["multi_line_captions"] += "\n" in raw or "\r" in raw
    text = " ".join(text.split())
    if keep_raw:
        return text
    nfc = unicodedata.normalize("NFC", text)
    report["nfc_changed"] += nfc != text
    straight = nfc if nfc.isascii() else nfc.translate(QUOTES)  # the ASCII fast path: most captions
    report["curly_quotes"] += straight != nfc
    return straight


def merge_copies(copies: list[tuple]) -> tuple[float, float, int]:
    """Pooled (mean, standard error, votes) of one caption's copies (rule 3)."""
    total = sum(v for _, _, v in copies)
    if total == 0:
        return sum(m for m, _, _ in copies) / len(copies), max(s for _, s, _ in copies), 0
    mean = sum(m * v for m, _, v in copies) / total
    if total < 2:
        return mean, max(s for _, s, _ in copies), total
    squares = sum(s * s * v * (v - 1) + v * (m - mean) ** 2 for m, s, v in copies)
    return mean, max(math.sqrt(squares / (total * (total - 1))), 1 / math.sqrt(total * (total - 1))), total


def contest_rows(files: list[tuple], report: Counter, top_k: int, keep_raw: bool = False) -> list[tuple]:
    """(caption, mean, precision, votes) of one contest after rules 1-6, in source-file order."""
    report["contests_with_several_files"] += len(files) > 1
    copies = {}
    for index, (_, rows) in enumerate(files):
        for raw, mean, precision, votes, cats in rows:
            report["vote_count_mismatches"] += cats is not None and cats != votes
            if not (math.isfinite(mean) and math.isfinite(precision)):
                report["non_finite_rows"] += 1
                continue
            caption = clean_caption(raw, report, keep_raw)
            if not caption:
                report["empty_captions"] += 1
                continue
            copies.setdefault(caption, []).append((mean, precision, votes, index))
    out = []
    for caption, group in copies.items():
        per_file = Counter(copy[3] for copy in group)
        report["captions_in_several_files"] += len(per_file) > 1
        for n in (n for n in per_file.values() if n > 1):
            report["duplicate_groups"] += 1
            report["duplicate_rows_merged"] += n - 1
            report["max_copies"] = max(report["max_copies"], n)
        stats = [copy[:3] for copy in group]
        out.append((caption, *(merge_copies(stats) if len(stats) > 1 else stats[0])))
    means = Counter(r[1] for r in out)
    report["tied_captions"] += sum(n for n in means.values() if n > 1)
    ranked = sorted(r[1] for r in out)[::-1]
    report["top_k_cut_in_tie"] += len(ranked) > top_k and ranked[top_k - 1] == ranked[top_k]
    return out


def place_cartoon(contest: int, source, folder: str, report: Counter) -> str | None:
    """Copy a cartoon (file path or bytes) to ``folder``; None when it cannot be read (rule 7)."""
    from PIL import Image  # deferred: only when cartoons are copied

    try:
        if not isinstance(source, bytes):
            with open(source, "rb") as handle:
                source = handle.read()
        with Image.open(io.BytesIO(source)) as image:
            image.load()
            ext = (image.format or "png").lower().replace("jpeg", "jpg")
    except Exception:  # noqa: BLE001 - counted: a broken cartoon drops its contest
        report["unreadable_cartoons"] += 1
        return None
    target = os.path.join(folder, f"{contest}.{ext}")
    with open(target, "wb") as handle:
        handle.write(source)
    return target


# --- Build ---
def split_rows(contest, votes, args, hub_splits: dict, seed: int) -> dict:
    """{split: row indices} after ``data.filter_captions``: the Hub's split of each contest (`hub_splits`), else
    ``data.split_by_contest`` with `seed`. Decided on the (contest, votes) columns alone, the rows then taken in
    Arrow batches: select() + save_to_disk would flatten the indices through Python dicts (~10^4 rows/s)."""
    import datasets  # deferred: heavy
    import numpy as np

    if not len(contest):
        raise DataError("no contest has both captions and a readable cartoon; check the source's cartoons/")
    light = datasets.Dataset.from_dict({"contest": contest, "votes": votes, "row": np.arange(len(votes))})
    kept = data.filter_captions(light, args.min_votes, args.min_captions)
    if hub_splits:
        ids, rows = (np.asarray(data._column(kept, c), dtype=np.int64) for c in ("contest", "row"))
        named = np.asarray([hub_splits[c] for c in ids.tolist()])
        return {name: rows[named == name] for name in ("train", "val", "test")}
    parts = data.split_by_contest(kept, args.val_frac, args.test_frac, seed)
    return {name: np.asarray(data._column(split, "row"), dtype=np.int64) for name, split in parts.items()}


def prepare(args: argparse.Namespace) -> dict:
    import datasets  # deferred: heavy
    import numpy as np
    import pyarrow as pa

    out = os.path.abspath(args.out)
    if os.path.exists(out) and not args.overwrite:
        raise DataError(f"{out} already exists; pass --overwrite to replace it, or choose another --out")
    inputs = [args.hub or args.ratings, args.descriptions]
    own = lambda path: os.path.isfile(os.path.join(path, REPORT))  # noqa: E731 - a prepared set has its report
    check_target(out, "--out", "a prepared data set", inputs, own=own, force=args.force)
    report = Counter({**dict.fromkeys(COUNTS, 0), "bad_rows_where": [], "text_fix_examples": {}, "contest_files": {}})
    contests, cartoons, descriptions, hub_splits = (
        hub_source(args.hub, report) if args.hub else ratings_source(args.ratings, report)
    )
    keep_hub = bool(hub_splits) and args.resplit is None
    seed = args.seed if args.resplit is None else args.resplit
    if args.descriptions:
        descriptions = {**descriptions, **read_descriptions(args.descriptions)}
    desc_cols = list(data.DESCRIPTION_FIELDS) if descriptions else []
    kinds = {
        "contest": "int64",
        "image": "string",
        "caption": "string",
        "mean": "float64",
        "precision": "float64",
        "votes": "int64",
        **dict.fromkeys(desc_cols, "string"),
    }
    features = datasets.Features({name: datasets.Value(kind) for name, kind in kinds.items()})
    no_cartoon = []

    def summary(sizes) -> dict:
        return {
            "source": "hub" if args.hub else "ratings",
            "input": os.path.abspath(args.hub or args.ratings),
            "out": out,
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "overwrite", "force")},
            "split_rule": "the Hub's train/validation/test" if keep_hub else f"by contest, seed {seed}",
            **report,
            "contests_without_cartoon": len(no_cartoon),
            "contests_without_cartoon_ids": no_cartoon,
            "splits": sizes,
        }

    with installing(out) as tmp:  # an old --out (--overwrite) is replaced only once the new one is complete
        os.makedirs(os.path.join(tmp, "images"))
        staging = os.path.join(tmp, ".staging", "rows.arrow")
        os.makedirs(os.path.dirname(staging))
        with pa.OSFile(staging, "wb") as sink, pa.ipc.new_stream(sink, features.arrow_schema) as writer:
            for contest, files in contests:
                report["contests_read"] += 1
                report["caption_rows_read"] += sum(len(rows) for _, rows in files)
                report["contest_files"][contest] = {
                    "files": [name for name, _ in files],
                    "how": "merged" if len(files) > 1 else "single",
                }
                rows = contest_rows(files, report, args.top_k, args.keep_raw)
                cartoon = cartoons.get(contest)
                placed = cartoon is not None and place_cartoon(contest, cartoon, os.path.join(tmp, "images"), report)
                if not placed:
                    no_cartoon.append(contest)
                    continue
                if not rows:
                    continue
                desc = descriptions.get(contest, {})
                report["contests_without_description"] += bool(desc_cols) and not desc
                image = f"../images/{os.path.basename(placed)}"  # relative to each split's folder (data.py)
                batch = {
                    "contest": [contest] * len(rows),
                    "image": [image] * len(rows),
                    **dict(zip(("caption", "mean", "precision", "votes"), map(list, zip(*rows)))),
                    **{c: [protocol.field_text(desc.get(c))] * len(rows) for c in desc_cols},
                }
                writer.write_batch(pa.RecordBatch.from_pydict(batch, schema=features.arrow_schema))
        with pa.memory_map(staging) as source:
            table = pa.ipc.open_stream(source).read_all()  # memory-mapped, not read into memory
        contest, votes = np.asarray(table.column("contest")), np.asarray(table.column("votes"))
        report["captions_below_min_votes"] = int((votes < args.min_votes).sum())
        try:
            parts = split_rows(contest, votes, args, keep_hub and hub_splits, seed)
        except DataError as exc:
            path = f"{out}.{REPORT}"
            write_json(path, summary({}))
            dropped = f"{len(no_cartoon)} contests were dropped for a missing or unreadable cartoon"
            raise DataError(f"{exc} ({dropped}: see contests_without_cartoon_ids in {path})") from None
        splits, sizes = {}, {}
        for name, rows in parts.items():
            if not len(rows):
                continue  # a fraction of 0, or a Hub split without a kept contest
            path = os.path.join(tmp, ".staging", f"{name}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                for start in range(0, len(rows), 65_536):
                    writer.write_table(table.take(rows[start : start + 65_536]))
            splits[name] = datasets.Dataset.from_file(path)
            sizes[name] = {"contests": len(np.unique(contest[rows])), "captions": len(rows)}
        report["contests_below_min_captions"] = len(np.unique(contest)) - sum(s["contests"] for s in sizes.values())
        datasets.DatasetDict(splits).save_to_disk(tmp)
        del table, splits
        shutil.rmtree(os.path.dirname(staging))
        result = summary(sizes)
        write_json(os.path.join(tmp, REPORT), result)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = cli_parser("open-r1-caption-prepare", __doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ratings", help="checkout of the public ratings repository (summaries/, cartoons/)")
    source.add_argument(
        "--hub", help="folder with yguooo/newyorker_caption_ranking's parts: 1_rating, 2_gpt4o_description, cartoons"
    )
    parser.add_argument("--descriptions", help="csv/jsonl of cartoon descriptions joined by contest")
    parser.add_argument("--out", required=True, help="output folder (train/ val/ test/, images/, prepare_report.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out (a prepared data set)")
    parser.add_argument("--force", action="store_true", help="with --overwrite: replace an --out of any other kind")
    parser.add_argument("--min-votes", type=int, default=10, help="drop captions with fewer votes")
    parser.add_argument("--min-captions", type=int, default=20, help="drop contests with fewer kept captions")
    parser.add_argument("--val-frac", type=float, default=0.1, help="share of contests in val")
    parser.add_argument("--test-frac", type=float, default=0.1, help="share of contests in test")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split by contest (--ratings)")
    parser.add_argument("--resplit", type=int, metavar="SEED", help="--hub: split by contest with SEED, not the Hub's")
    parser.add_argument(
        "--keep-raw", action="store_true", help="leave caption text as published (lines joined; rule 1 of the doc)"
    )
    parser.add_argument("--top-k", type=int, default=3, help="the SFT top-k, for the report's tie count only")
    return parser


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = build_parser().parse_args(argv)
    try:
        fracs_ok = 0 <= args.val_frac < 1 and 0 <= args.test_frac < 1
        if min(args.min_votes, args.min_captions) < 0 or args.top_k < 1 or not fracs_ok:
            raise DataError(
                f"--min-votes ({args.min_votes}) and --min-captions ({args.min_captions}) must be >= 0, "
                f"--top-k ({args.top_k}) >= 1, --val-frac ({args.val_frac}) and --test-frac "
                f"({args.test_frac}) in [0, 1)"
            )  # checked before minutes of reading
        summary = prepare(args)
    except OpenR1Error as exc:
        return error_exit(exc)
    except OSError as exc:  # a disk that fills or a folder made read-only mid-run
        return error_exit(DataError(f"writing {args.out} failed ({exc}); nothing was replaced: free space and retry"))
    except KeyboardInterrupt as exc:  # Ctrl-C: the installer removed the partial new set
        print(
            f"error: interrupted; {getattr(exc, 'where', f'{os.path.abspath(args.out)} is unchanged')}", file=sys.stderr
        )
        return 130
    if summary["bad_rows"]:
        first = summary["bad_rows_where"][0]
        logger.warning(
            f"note: {summary['bad_rows']} rows with impossible numbers dropped (first: {first['file']} line "
            f"{first['line']}: {first['problem']}); all in {REPORT}'s bad_rows_where"
        )
    print(json.dumps({k: summary[k] for k in ("out", "contests_read", "caption_rows_read", "splits")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
