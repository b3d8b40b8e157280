"""Prepare the public caption-contest data in the layout ``data.load_captions`` reads (train/ val/ test/).

    open-r1-caption-prepare --ratings caption-contest-data --out data/captions [--descriptions desc.jsonl]
    open-r1-caption-prepare --hub hub_dir --out data/captions

Sources: ``--ratings DIR``, the public ratings repository: ``summaries/<contest>[_<algorithm>].csv`` (header
``[rank,]caption,mean,precision,votes,not_funny,somewhat_funny,funny``), ``cartoons/<contest>.jpg``; or ``--hub DIR``:
humor-r1's ``yguooo/newyorker_caption_ranking`` saved locally, a folder per part (``save_to_disk`` or parquet, splits
pooled): ``1_rating``, ``2_gpt4o_description`` (optional; canny/uncanny are our scene/twist), ``cartoons``.
``--descriptions FILE`` (csv/jsonl) joins descriptions by contest, over the Hub's.

Rules, each counted in ``prepare_report.json`` [under this name]:

1. Whitespace runs (newlines too) become one space [multi_line_captions]; then-empty captions are dropped
   [empty_captions], and so are rows whose mean or precision is not finite [non_finite_rows].
2. NFC [nfc_changed]; curly quotes become straight, so copies differing in quote style merge [curly_quotes].
3. Exact duplicates in a contest are merged: votes summed, vote-weighted mean, the pooled mean's SE from each copy's
   sum of squares (precision^2 * v * (v-1)) plus the spread between copies, floored at 1/sqrt(V(V-1)) as the
   publisher floors it [duplicate_groups, duplicate_rows_merged, max_copies].
4. Several algorithm files for a contest: the one with most votes is kept (ties: name order); pooling adaptive and
   uniform samplers would mix differently biased means [contests_with_several_files, algorithm_files_dropped].
5. ``votes`` that disagree with the category counts are kept as published [vote_count_mismatches].
6. Ties in mean keep source-file order (``data.top_k_rows``: mean, then votes, then row) [tied_captions;
   top_k_cut_in_tie: contests whose ``--top-k`` cut falls inside a tie].
7. Contests without a readable cartoon are dropped [contests_without_cartoon (+ _ids), unreadable_cartoons];
   contests without a description keep empty fields [contests_without_description].
8. ``data.filter_captions`` (``--min-votes``, ``--min-captions``) [captions_below_min_votes,
   contests_below_min_captions]; then ``data.split_by_contest``.

Each cartoon is copied once to ``OUT/images/`` (a row's ``image``: ``../images/<contest>.<ext>``). Rows stream to disk
contest by contest; the folder is written beside ``OUT`` and renamed into place only when complete.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import unicodedata
from collections import Counter, defaultdict

from open_r1.errors import DataError, OpenR1Error, cli_parser, error_exit
from open_r1.jsonio import write_json
from open_r1.tasks.captioning import data, protocol

HEADER_OLD = ("rank", "caption", "mean", "precision", "votes", "not_funny", "somewhat_funny", "funny")
HEADER_NEW = HEADER_OLD[1:]
CATEGORIES = ("not_funny", "somewhat_funny", "funny")
QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"'})
HUB_PARTS = ("1_rating", "2_gpt4o_description", "cartoons")
REPORT = "prepare_report.json"
COUNTS = (
    "contests_read",
    "caption_rows_read",
    "multi_line_captions",
    "empty_captions",
    "non_finite_rows",
    "nfc_changed",
    "curly_quotes",
    "duplicate_groups",
    "duplicate_rows_merged",
    "max_copies",
    "contests_with_several_files",
    "algorithm_files_dropped",
    "vote_count_mismatches",
    "tied_captions",
    "top_k_cut_in_tie",
    "unreadable_cartoons",
    "contests_without_description",
)  # every one, 0 included


# --- Sources: (contest, [(algorithm, rows)]), rows (caption, mean, precision, votes, category sum or None) ---
def ratings_source(root: str):
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
            files[int(match[1])].append((match[2] or "", os.path.join(summaries, name)))
    if not files:
        raise DataError(f"{summaries} holds no <contest>[_<algorithm>].csv file; point --ratings to the repository")
    for path in (path for group in files.values() for _, path in group):
        read_header(path)  # every header checked before anything is written
    cartoons = {}
    folder = os.path.join(root, "cartoons")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        stem, ext = os.path.splitext(name)
        if stem.isdigit() and ext.lower() in (".jpg", ".jpeg", ".png"):
            cartoons[int(stem)] = os.path.join(folder, name)
    contests = ((c, [(algo, read_summary(path)) for algo, path in sorted(files[c])]) for c in sorted(files))
    return contests, cartoons, {}


def read_header(path: str) -> tuple:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            header = tuple(h.strip() for h in next(csv.reader(handle), ()))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is not a readable UTF-8 csv ({exc}); re-download or remove the file") from None
    if header not in (HEADER_OLD, HEADER_NEW):
        raise DataError(
            f"{path}: header {','.join(header)!r} is neither {','.join(HEADER_OLD)!r} nor "
            f"{','.join(HEADER_NEW)!r}; fix the header or remove the file"
        )
    return header


def read_summary(path: str) -> list[tuple]:
    col = {name: i for i, name in enumerate(read_header(path))}
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            next(reader)
            rows = []
            for fields in filter(any, reader):  # blank lines skipped
                try:
                    cats = sum(int(float(fields[col[c]])) for c in CATEGORIES)
                    rows.append(
                        (
                            fields[col["caption"]],
                            float(fields[col["mean"]]),
                            float(fields[col["precision"]]),
                            int(float(fields[col["votes"]])),
                            cats,
                        )
                    )
                except (ValueError, IndexError) as exc:
                    raise DataError(f"{path} line {reader.line_num}: {exc}; fix or remove that row") from None
            return rows
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path} is not a readable UTF-8 csv ({exc}); re-download or remove the file") from None


def _load_part(path: str, needed: bool):
    """A Hub part saved with save_to_disk (Dataset or DatasetDict: splits pooled) or as parquet files."""
    import datasets  # deferred: heavy

    if not os.path.isdir(path):
        if needed:
            raise DataError(
                f"{path} does not exist; save it with datasets.load_dataset('yguooo/newyorker_caption_"
                f"ranking', '{os.path.basename(path)}').save_to_disk('{path}') (or copy its parquet files)"
            )
        return None
    if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json")):
        loaded = datasets.load_from_disk(path)
        parts = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
        return datasets.concatenate_datasets(parts)
    import pyarrow as pa  # deferred: heavy
    import pyarrow.parquet as pq

    files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names if f.endswith(".parquet"))
    if not files:
        raise DataError(f"{path} holds neither a save_to_disk dataset nor parquet files; save the Hub part there")
    try:
        return datasets.Dataset(pa.concat_tables([pq.read_table(f) for f in files], promote_options="default"))
    except Exception as exc:  # noqa: BLE001 - re-raised as one clear error
        raise DataError(f"{path}: unreadable parquet ({exc}); download the part again") from None


def _need(table, columns, path):
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{path} lacks column(s) {missing} (has {table.column_names}); expected humor-r1's names")


def hub_source(root: str):
    import datasets  # deferred: heavy
    import numpy as np

    path = os.path.join(root, HUB_PARTS[0])
    ratings = _load_part(path, True)
    if "contest_number" in ratings.column_names:
        ratings = ratings.rename_column("contest_number", "contest")
    _need(ratings, ["contest", "caption", "mean", "precision", "votes"], path)
    has_cats = all(c in ratings.column_names for c in CATEGORIES)
    ids = np.asarray(ratings.data.column("contest"), dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    bounds = np.flatnonzero(np.diff(ids[order])) + 1

    def contests():
        for rows in np.split(order, bounds):
            part = ratings.data.table.take(rows).to_pydict()
            cats = [sum(t) for t in zip(*(part[c] for c in CATEGORIES))] if has_cats else [None] * len(rows)
            stats = [
                (m if m is not None else math.nan, p if p is not None else math.nan, v or 0)  # nan: rule 1
                for m, p, v in zip(part["mean"], part["precision"], part["votes"])
            ]
            yield int(ids[rows[0]]), [("", [(c or "", *st, k) for c, st, k in zip(part["caption"], stats, cats)])]

    descriptions = {}
    desc = _load_part(os.path.join(root, HUB_PARTS[1]), False)
    for row in desc.remove_columns([c for c in desc.column_names if c == "image"]) if desc is not None else []:
        row = {data.HUMOR_R1_RENAME.get(k, k): v for k, v in row.items()}
        if row.get("contest") is not None:
            descriptions[int(row["contest"])] = row
    path = os.path.join(root, HUB_PARTS[2])
    table = _load_part(path, True)
    _need(table, ["image"], path)
    if isinstance(table.features["image"], datasets.Image):
        table = table.cast_column("image", datasets.Image(decode=False))
    cartoons = {}
    for row in table:
        cell, contest = row["image"] or {}, row.get("contest_number", row.get("contest"))
        stem = os.path.splitext(os.path.basename(cell.get("path") or ""))[0]
        contest = contest if contest is not None else (int(stem) if stem.isdigit() else None)
        if contest is not None and cell.get("bytes"):
            cartoons[int(contest)] = cell["bytes"]
    return contests(), cartoons, descriptions


def read_descriptions(path: str) -> dict[int, dict]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = (
                [json.loads(line) for line in handle if line.strip()]
                if path.endswith(".jsonl")
                else list(csv.DictReader(handle))
            )
        out = {}
        for row in rows:
            row = {data.HUMOR_R1_RENAME.get(k, k): v for k, v in row.items()}
            out[int(row["contest"])] = row
        return out
    except (OSError, ValueError, KeyError, TypeError, csv.Error) as exc:
        raise DataError(
            f"--descriptions {path}: unreadable ({exc!r}); give a csv or jsonl with a contest (or "
            f"contest_number) column and {', '.join(data.DESCRIPTION_FIELDS)}"
        ) from None


# --- Rules (module docstring) ---
def clean_caption(raw: str, report: Counter) -> str:
    text = " ".join(raw.split())
    report["multi_line_captions"] += "\n" in raw or "\r" in raw
    nfc = unicodedata.normalize("NFC", text)
    report["nfc_changed"] += nfc != text
    straight = nfc.translate(QUOTES)
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


def contest_rows(files: list[tuple], report: Counter, top_k: int) -> list[tuple]:
    """(caption, mean, precision, votes) of one contest after rules 1-6, in source-file order."""
    if len(files) > 1:
        report["contests_with_several_files"] += 1
        report["algorithm_files_dropped"] += len(files) - 1
    rows = max(files, key=lambda f: sum(r[3] for r in f[1]))[1]  # max keeps the first of equals: name order
    copies: dict[str, list] = {}
    for raw, mean, precision, votes, cats in rows:
        report["vote_count_mismatches"] += cats is not None and cats != votes
        if not (math.isfinite(mean) and math.isfinite(precision)):
            report["non_finite_rows"] += 1
            continue
        caption = clean_caption(raw, report)
        if not caption:
            report["empty_captions"] += 1
            continue
        copies.setdefault(caption, []).append((mean, precision, votes))
    out = []
    for caption, group in copies.items():
        if len(group) > 1:
            report["duplicate_groups"] += 1
            report["duplicate_rows_merged"] += len(group) - 1
            report["max_copies"] = max(report["max_copies"], len(group))
        out.append((caption, *(merge_copies(group) if len(group) > 1 else group[0])))
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
def prepare(args: argparse.Namespace) -> dict:
    import datasets  # deferred: heavy
    import numpy as np
    import pyarrow as pa

    from open_r1 import modeling  # deferred: it loads torch

    out = os.path.abspath(args.out)
    if os.path.exists(out) and not args.overwrite:
        raise DataError(f"{out} already exists; pass --overwrite to replace it, or choose another --out")
    contests, cartoons, descriptions = hub_source(args.hub) if args.hub else ratings_source(args.ratings)
    if args.descriptions:
        descriptions = {**descriptions, **read_descriptions(args.descriptions)}
    desc_cols = list(data.DESCRIPTION_FIELDS) if descriptions else []
    features = datasets.Features(
        {
            "contest": datasets.Value("int64"),
            "image": datasets.Value("string"),
            "caption": datasets.Value("string"),
            "mean": datasets.Value("float64"),
            "precision": datasets.Value("float64"),
            "votes": datasets.Value("int64"),
            **{c: datasets.Value("string") for c in desc_cols},
        }
    )
    report, no_cartoon = Counter(dict.fromkeys(COUNTS, 0)), []
    with modeling.staged_dir(out) as tmp:  # an old --out (--overwrite) is replaced only once the new one is complete
        os.makedirs(os.path.join(tmp, "images"))
        staging = os.path.join(tmp, ".staging", "rows.arrow")
        os.makedirs(os.path.dirname(staging))
        with pa.OSFile(staging, "wb") as sink, pa.ipc.new_stream(sink, features.arrow_schema) as writer:
            for contest, files in contests:
                report["contests_read"] += 1
                report["caption_rows_read"] += sum(len(rows) for _, rows in files)
                rows = contest_rows(files, report, args.top_k)
                cartoon = cartoons.get(contest)
                placed = cartoon is not None and place_cartoon(contest, cartoon, os.path.join(tmp, "images"), report)
                if not placed:
                    no_cartoon.append(contest)
                    continue
                if not rows:
                    continue
                desc = descriptions.get(contest)
                report["contests_without_description"] += bool(desc_cols) and desc is None
                image = f"../images/{os.path.basename(placed)}"  # relative to each split's folder (data.py)
                batch = {
                    "contest": [contest] * len(rows),
                    "image": [image] * len(rows),
                    **{name: [r[i] for r in rows] for i, name in enumerate(("caption", "mean", "precision", "votes"))},
                    **{c: [protocol.field_text((desc or {}).get(c))] * len(rows) for c in desc_cols},
                }
                writer.write_batch(pa.RecordBatch.from_pydict(batch, schema=features.arrow_schema))
        with pa.memory_map(staging) as source:
            table = pa.ipc.open_stream(source).read_all()  # memory-mapped, not read into memory
        if not table.num_rows:
            raise DataError("no contest has both captions and a readable cartoon; check the source's cartoons/")
        # filter and split decided on the (contest, votes) columns alone, then the rows taken in Arrow batches:
        # select() + save_to_disk would flatten the indices through Python dicts (~10^4 rows/s)
        contest, votes = np.asarray(table.column("contest")), np.asarray(table.column("votes"))
        light = datasets.Dataset.from_dict({"contest": contest, "votes": votes, "row": np.arange(len(votes))})
        kept = data.filter_captions(light, args.min_votes, args.min_captions)
        report["captions_below_min_votes"] = int((votes < args.min_votes).sum())
        splits, sizes = {}, {}
        for name, split in data.split_by_contest(kept, args.val_frac, args.test_frac, args.seed).items():
            rows = np.asarray(data._column(split, "row"), dtype=np.int64)
            if not len(rows):
                continue  # a fraction of 0
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
        summary = {
            "source": "hub" if args.hub else "ratings",
            "input": os.path.abspath(args.hub or args.ratings),
            "out": out,
            "settings": {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")},
            **report,
            "contests_without_cartoon": len(no_cartoon),
            "contests_without_cartoon_ids": no_cartoon,
            "splits": sizes,
        }
        write_json(os.path.join(tmp, REPORT), summary)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = cli_parser("open-r1-caption-prepare", __doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ratings", help="checkout of the public ratings repository (summaries/, cartoons/)")
    source.add_argument("--hub", help="folder with the Hub dataset's parts saved locally: " + ", ".join(HUB_PARTS))
    parser.add_argument("--descriptions", help="csv/jsonl of cartoon descriptions joined by contest")
    parser.add_argument("--out", required=True, help="output folder (train/ val/ test/, images/, prepare_report.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument("--min-votes", type=int, default=10, help="drop captions with fewer votes")
    parser.add_argument("--min-captions", type=int, default=20, help="drop contests with fewer kept captions")
    parser.add_argument("--val-frac", type=float, default=0.1, help="share of contests in val")
    parser.add_argument("--test-frac", type=float, default=0.1, help="share of contests in test")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split by contest")
    parser.add_argument("--top-k", type=int, default=3, help="the SFT top-k, for the report's tie count only")
    return parser


def main(argv: list[str] | None = None) -> int:
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
    print(json.dumps({k: summary[k] for k in ("out", "contests_read", "caption_rows_read", "splits")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
