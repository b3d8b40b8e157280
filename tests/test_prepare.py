"""open-r1-caption-prepare on a fixture in the real layouts, written here: the prepared splits load, and their top-k
rows and 3-sigma pairs equal a plain-Python computation over the fixture's rows; every planted case is counted."""

from __future__ import annotations

import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
import unicodedata

import pytest

from open_r1.tasks.captioning import data, prepare

OLD = ["rank", "caption", "mean", "precision", "votes", "not_funny", "somewhat_funny", "funny"]
NEW = OLD[1:]
MIN_CAPTIONS = 20
CURLY = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}
# the text rules' planted cases: raw -> prepared (mojibake, zero width, control characters, signatures, a joke kept)
CLEANED = {
    "It isn\u00e2\u20ac\u2122t mine \u00e2\u20ac\u201d Pok\u00c3\u00a9mon.": "It isn't mine \u2014 Pok\u00e9mon.",
    "Zero\u200b width": "Zero width",
    "Bell\x10 joke\x7f\x9d": "Bell joke",
    "Best joke ever.\nJohn Smith, Springfield, IL": "Best joke ever.",
    "Another one.\njane.doe@example.com": "Another one.",
    "Third.\n\u2014 Mary Ann Evans": "Third.",
    "Mom and Dad.\nAlaska, July 2042.": "Mom and Dad. Alaska, July 2042.",
}


def _row(caption, mean, se, votes, mismatch=False):
    funny = votes // 3
    return {
        "caption": caption,
        "mean": mean,
        "precision": se,
        "votes": votes,
        "not_funny": votes - 2 * funny,
        "somewhat_funny": funny,
        "funny": funny + (1 if mismatch else 0),
    }


def _random_rows(rng, prefix, n, means):
    return [
        _row(f"{prefix} joke {i}", means.pop(), round(rng.uniform(0.01, 0.15), 4), rng.randint(10, 300))
        for i in range(n)
    ]


def fixture_contests(seed=0):
    """{contest: [(algorithm or '', header, rows)]} plus the planted counts."""
    rng = random.Random(seed)
    means = [
        round(1 + (i + 0.5) / 1000, 4) for i in range(600)
    ]  # below the planted tops, never equal to a planted mean
    rng.shuffle(means)  # distinct means: the only ties are the planted ones
    planted = {
        "multi_line_captions": 5,
        "mojibake_repaired": 1,
        "zero_width_removed": 1,
        "control_chars_removed": 1,
        "signatures_removed": 3,
        "bad_rows": 5,
        "nfc_changed": 1,
        "curly_quotes": 3,
        "empty_captions": 1,
        "duplicate_groups": 2,
        "duplicate_rows_merged": 3,
        "max_copies": 3,
        "vote_count_mismatches": 2,
        "contests_with_several_files": 2,
        "captions_in_several_files": 12 + 22,
        "tied_captions": 3,
        "top_k_cut_in_tie": 1,
        "contests_without_cartoon": 1,
        "captions_below_min_votes": 2 + 12 + 40,
        "non_finite_rows": 1,
        "contests_below_min_captions": 1,
        "contests_without_description": 3,
    }
    odd = [
        _row("Line one\nline two", 1.25, 0.05, 40),
        _row("Cafe\u0301 au lait", 1.35, 0.05, 40),
        _row("\u201cWho\u2019s there?\u201d", 1.45, 0.04, 50),
        _row("Same joke.", 1.6, 0.05, 40),
        _row("Same joke.", 1.4, 0.03, 60, mismatch=True),
        _row("Same joke.", 1.5, 0.02, 100),
        _row("Quote \u2018me\u2019.", 1.2, 0.06, 30),
        _row("Quote 'me'.", 1.3, 0.04, 70, mismatch=True),
        _row("   ", 1.1, 0.1, 20),
        *(_row(raw, 1.5 + i / 1000, 0.05, 40) for i, raw in enumerate(CLEANED)),
    ]
    ties = [
        _row("Tie X", 1.7, 0.03, 50),
        _row("Tie Y", 1.7, 0.03, 80),
        _row("Tie Z", 1.7, 0.03, 80),
        _row("Top one", 1.9, 0.02, 200),
        _row("Top two", 1.8, 0.02, 200),
    ]
    low_votes = [_row("Few votes a", 1.95, 0.2, 4), _row("Few votes b", 1.05, 0.2, 3), _row("No stats", 1.5, "nan", 1)]
    bad = [  # rule 0: dropped, listed with file and line (issue 54: the first two were tracebacks)
        dict(_row("Infinite votes", 1.5, 0.05, 20), votes="inf"),
        dict(_row("702 joke 0", 1.5, 0.05, 20), votes=-30),  # a negative-vote duplicate of a caption
        _row("Mean too high", 4.5, 0.05, 20),
        dict(_row("Not a number", 1.5, 0.05, 20), mean="abc"),
        dict(_row("Negative category", 1.5, 0.05, 20), funny=-1),
    ]
    shared = _random_rows(rng, "511", 22, means)
    contests = {
        500: [
            ("LilUCB", OLD, _random_rows(rng, "500L", 24, means)),
            (
                "RoundRobin",
                OLD,
                [
                    dict(r, votes=5, not_funny=5, somewhat_funny=0, funny=0)
                    for r in _random_rows(rng, "500L", 12, means) + _random_rows(rng, "500R", 12, means)
                ],
            ),
        ],
        # contest 511 as on the public data: RoundRobin holds more votes, spread below the 10-vote minimum
        511: [
            ("LilUCB", OLD, shared),
            ("RoundRobin", OLD, [_row(r["caption"], means.pop(), 0.2, 6) for r in shared] + _rr(rng, means)),
        ],
        510: [("LilUCB", OLD, _random_rows(rng, "510", 22, means) + odd)],
        700: [("", NEW, _random_rows(rng, "700", 20, means) + ties)],
        701: [("", NEW, _random_rows(rng, "701", 25, means))],  # no cartoon
        702: [("", NEW, _random_rows(rng, "702", 21, means) + low_votes + bad)],
        703: [("", NEW, _random_rows(rng, "703", 8, means))],  # too few captions
    }
    for rows in contests[500][0][2]:
        rows["votes"] += 20  # the LilUCB file has more votes: it is kept
        rows["not_funny"] += 20
    return contests, planted


def _rr(rng, means):
    return [_row(f"511R joke {i}", means.pop(), 0.2, 6) for i in range(40)]


def write_ratings(root, contests, no_cartoon=(701,)):
    from PIL import Image

    os.makedirs(os.path.join(root, "summaries"))
    os.makedirs(os.path.join(root, "cartoons"))
    for contest, files in contests.items():
        for algo, header, rows in files:
            name = f"{contest}_{algo}.csv" if algo else f"{contest}.csv"
            with open(os.path.join(root, "summaries", name), "w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(header)
                for rank, row in enumerate(rows):
                    writer.writerow([rank if h == "rank" else row[h] for h in header])
        if contest not in no_cartoon:
            Image.new("RGB", (16, 12), (contest % 255, 40, 90)).save(
                os.path.join(root, "cartoons", f"{contest}.{'png' if contest == 702 else 'jpg'}")
            )
    return root


def expected(contests, no_cartoon=(701,), min_votes=10, min_captions=MIN_CAPTIONS):
    """Plain Python over the fixture: {contest: [(caption, mean, se, votes)]} in source order."""
    out = {}
    for contest, files in contests.items():
        rows = [row for _, _, rows in files for row in rows]  # several files: merged by caption
        groups = {}
        for row in rows:
            numbers = [row[k] for k in ("mean", "votes", "not_funny", "somewhat_funny", "funny")]
            if not all(isinstance(n, (int, float)) and 0 <= n < math.inf for n in numbers) or row["mean"] > 3:
                continue
            if not math.isfinite(float(row["precision"])):
                continue
            text = unicodedata.normalize("NFC", " ".join(CLEANED.get(row["caption"], row["caption"]).split()))
            for curly, straight in CURLY.items():
                text = text.replace(curly, straight)
            if text:
                groups.setdefault(text, []).append(row)
        merged = []
        for text, copies in groups.items():
            n = sum(c["votes"] for c in copies)
            mean = sum(c["votes"] * c["mean"] for c in copies) / n
            sum_sq = sum(
                c["precision"] ** 2 * c["votes"] * (c["votes"] - 1) + c["votes"] * c["mean"] ** 2 for c in copies
            )
            se = max(math.sqrt(max(sum_sq - n * mean**2, 0) / (n * (n - 1))), 1 / math.sqrt(n * (n - 1)))
            if len(copies) == 1:  # a single copy keeps its published statistics
                mean, se = copies[0]["mean"], copies[0]["precision"]
            if n >= min_votes:
                merged.append((text, mean, se, n))
        if contest not in no_cartoon and len(merged) >= min_captions:
            out[contest] = merged
    return out


DESCRIPTIONS = {
    500: {
        "contest_number": 500,
        "canny": "A dog at a desk.",
        "uncanny": "The dog is the boss.",
        "location": "office",
        "entities": ["dog", "desk"],
    },
    510: {
        "contest": 510,
        "scene": "Two fish\nin a bar.",
        "twist": "They are dry.",
        "location": "bar",
        "entities": "fish",
    },
    700: {"contest": 700, "scene": "A knight on a bus.", "twist": "", "location": "bus", "entities": "knight"},
}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    contests, planted = fixture_contests()
    write_ratings(str(root / "ratings"), contests)
    with open(root / "desc.jsonl", "w") as handle:
        handle.writelines(json.dumps(d) + "\n" for d in DESCRIPTIONS.values())
    out = str(root / "out")
    rc = prepare.main(
        [
            "--ratings",
            str(root / "ratings"),
            "--out",
            out,
            "--descriptions",
            str(root / "desc.jsonl"),
            "--val-frac",
            "0.25",
            "--test-frac",
            "0.25",
            "--seed",
            "3",
        ]
    )
    assert rc == 0
    splits = {
        name: data.load_captions(os.path.join(out, name))
        for name in ("train", "val", "test")  # each cartoon decoded
    }
    return out, contests, planted, splits


def test_prepared_splits_hold_the_expected_captions_by_contest(prepared):
    out, contests, _, splits = prepared
    want = expected(contests)
    seen = {}
    for split in splits.values():
        for row in split.remove_columns("image"):
            seen.setdefault(row["contest"], []).append((row["caption"], row["mean"], row["precision"], row["votes"]))
    assert sorted(seen) == sorted(want) == [500, 510, 511, 700, 702]
    for contest, rows in want.items():
        assert [r[0] for r in seen[contest]] == [r[0] for r in rows]  # source order kept
        for got, ref in zip(seen[contest], rows):
            assert got[1:] == pytest.approx(ref[1:], rel=1e-9)
    contest_sets = [set(s["contest"]) for s in splits.values()]
    assert all(not a & b for i, a in enumerate(contest_sets) for b in contest_sets[i + 1 :])
    captions = [r[0] for r in seen[510]]
    assert {"Caf\u00e9 au lait", "Line one line two", '"Who\'s there?"', "Quote 'me'."} <= set(captions)
    assert captions.count("Same joke.") == 1
    assert set(CLEANED.values()) <= set(captions)
    every = [c for rows in seen.values() for c, *_ in rows]
    assert not [
        c for c in every if "\u200b" in c or "\u00e2\u20ac" in c or any(ord(x) < 32 or 127 <= ord(x) < 160 for x in c)
    ]
    assert not [c for c in every if "@" in c or "Springfield" in c or "Mary Ann" in c]


def test_several_summary_files_are_merged_so_no_contest_is_lost(prepared):
    """Contest 511 as on the public data: the RoundRobin file has more votes, all below the minimum; the old rule
    kept it and dropped the contest. Merged, every LilUCB caption is kept with both files' votes."""
    out, contests, _, splits = prepared
    rows = {r["caption"]: r for s in splits.values() for r in s.remove_columns("image") if r["contest"] == 511}
    lil, rr = contests[511][0][2], contests[511][1][2]
    assert sorted(rows) == sorted(r["caption"] for r in lil)
    for a, b in zip(lil, rr):
        assert rows[a["caption"]]["votes"] == a["votes"] + b["votes"]
        want = (a["mean"] * a["votes"] + b["mean"] * b["votes"]) / (a["votes"] + b["votes"])
        assert rows[a["caption"]]["mean"] == pytest.approx(want)
    with open(os.path.join(out, "prepare_report.json")) as handle:
        files = json.load(handle)["contest_files"]
    assert files["511"] == {"files": ["511_LilUCB.csv", "511_RoundRobin.csv"], "how": "merged"}
    assert files["700"] == {"files": ["700.csv"], "how": "single"}


def test_top_k_rows_and_three_sigma_pairs_equal_a_plain_computation(prepared):
    _, contests, _, splits = prepared
    want = expected(contests)
    want_top = {
        c: {rows[i][0] for i in sorted(range(len(rows)), key=lambda i: (-rows[i][1], -rows[i][3], i))[:3]}
        for c, rows in want.items()
    }
    want_pairs = {
        (c, a[0], b[0]) if a[1] > b[1] else (c, b[0], a[0])
        for c, rows in want.items()
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if abs(a[1] - b[1]) > 3 * math.sqrt(a[2] ** 2 + b[2] ** 2)
    }
    got_top, got_pairs = {}, set()
    for split in splits.values():
        for row in data.top_k_rows(split, 3).remove_columns("image"):
            got_top.setdefault(row["contest"], set()).add(row["caption"])
        contests, captions = split["contest"], split["caption"]
        pairs = data.pair_indices(split, k=3.0, cap_per_contest=None).tolist()
        got_pairs |= {(contests[a], captions[a], captions[b]) for a, b in pairs}
    assert got_top == want_top
    assert want_top[700] == {"Top one", "Top two", "Tie Y"}  # tie at the cut: more votes, then file order
    assert got_pairs == want_pairs and len(want_pairs) > 100
    capped = data.pair_indices(splits["train"], k=3.0, cap_per_contest=5, seed=1)
    assert len(capped) == 5 * len(set(splits["train"]["contest"]))


def test_sft_rows_and_descriptions_from_prepared_data(prepared, tiny_model_dirs):
    from open_r1 import modeling

    processor = modeling.load_processor(str(tiny_model_dirs["qwen3_vl"]))
    _, _, _, splits = prepared
    whole = [s for s in splits.values()]
    for split in whole:
        rows = data.sft_rows(split.add_column("thinking", ["why"] * len(split)), top_k=3, processor=processor)
        assert len(rows) == 3 * len(set(split["contest"]))
        assert rows[0]["images"][0].size == (16, 12)
    by_contest = {r["contest"]: r for s in whole for r in s.remove_columns("image")}
    assert by_contest[500]["scene"] == "A dog at a desk." and by_contest[500]["entities"] == "dog, desk"
    assert by_contest[510]["scene"] == "Two fish in a bar." and by_contest[702]["scene"] == ""


def test_report_counts_every_planted_case(prepared):
    out, _, planted, splits = prepared
    with open(os.path.join(out, "prepare_report.json")) as handle:
        report = json.load(handle)
    assert {k: report[k] for k in planted} == planted
    assert report["unreadable_cartoons"] == 0 and set(prepare.COUNTS) < set(report)
    assert report["contests_without_cartoon_ids"] == [701] and report["contests_read"] == 7
    where = [(os.path.basename(b["file"]), b["line"]) for b in report["bad_rows_where"]]
    assert where == [("702.csv", 2 + 21 + 3 + i) for i in range(5)]
    assert "outside 1..3" in report["bad_rows_where"][2]["problem"]
    assert report["text_fix_examples"]["signatures_removed"][0] == [
        "Best joke ever.\nJohn Smith, Springfield, IL",
        "Best joke ever.",
    ]
    assert report["splits"] == {n: {"contests": len(set(s["contest"])), "captions": len(s)} for n, s in splits.items()}
    assert sorted(os.listdir(os.path.join(out, "images"))) == [
        "500.jpg",
        "510.jpg",
        "511.jpg",
        "700.jpg",
        "702.png",
        "703.jpg",
    ]


def test_existing_out_is_refused_and_overwrite_swaps_it_whole(prepared, tmp_path, capsys):
    out, contests, _, _ = prepared
    src = write_ratings(str(tmp_path / "ratings"), {c: contests[c] for c in (500, 510, 700)})
    target = str(tmp_path / "out")
    os.makedirs(target)
    assert prepare.main(["--ratings", src, "--out", target]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already exists" in err and "--overwrite" in err
    assert (
        prepare.main(["--ratings", src, "--out", target, "--overwrite", "--val-frac", "0.34", "--test-frac", "0.34"])
        == 0
    )
    assert sorted(os.listdir(tmp_path)) == ["out", "ratings"]  # no temp or old folder left beside it
    assert os.path.isfile(os.path.join(target, "prepare_report.json"))


def test_keep_raw_leaves_the_text_as_published(tmp_path):
    contests, _ = fixture_contests()
    src = write_ratings(str(tmp_path / "ratings"), {c: contests[c] for c in (500, 510, 700)})
    out = str(tmp_path / "out")
    assert (
        prepare.main(["--ratings", src, "--out", out, "--keep-raw", "--val-frac", "0.34", "--test-frac", "0.34"]) == 0
    )
    captions = {r["caption"] for s in ("train", "val", "test") for r in data.load_captions(os.path.join(out, s))}
    assert {" ".join(raw.split()) for raw in CLEANED} <= captions and "\u201cWho\u2019s there?\u201d" in captions
    with open(os.path.join(out, "prepare_report.json")) as handle:
        report = json.load(handle)
    assert report["mojibake_repaired"] == report["signatures_removed"] == report["curly_quotes"] == 0


def _bad(tmp_path, case):
    root = tmp_path / "ratings"
    if case == "missing":
        return str(tmp_path / "nowhere"), "summaries does not exist"
    os.makedirs(root / "summaries")
    path = root / "summaries" / "600_LilUCB.csv"
    if case == "header":
        path.write_text("caption,score\nfoo,1\n")
        return str(root), "600_LilUCB.csv: header"
    if case == "encoding":
        path.write_bytes(b"\xff\xfe\x00bad\x81\x82")
        return str(root), "600_LilUCB.csv is not a readable UTF-8 csv"


def test_bad_settings_are_refused_before_reading(tmp_path, capsys):
    for flag, value in (("--val-frac", "1.5"), ("--min-votes", "-1"), ("--top-k", "0")):
        assert prepare.main(["--ratings", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), flag, value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag} ({value})" in err and "summaries" not in err


@pytest.mark.parametrize("case", ["missing", "header", "encoding"])
def test_bad_input_gives_one_line_and_leaves_nothing(tmp_path, capsys, case):
    source, message = _bad(tmp_path, case)
    before = sorted(os.listdir(tmp_path))
    assert prepare.main(["--ratings", source, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.strip().count("\n") == 0 and "Traceback" not in captured.err
    assert sorted(os.listdir(tmp_path)) == before  # no out dir, no temp dir


def write_hub(root, contests, splits, positional=()):
    """The Hub dataset as `hf download` leaves it (ranking/<split>.jsonl: config 1_rating; cartoons/<split>-00000-
    of-00001.parquet), the descriptions as `save_to_disk` of config 2_gpt4o_description; the cartoons in `positional`
    carry no id or numeric name (humor-r1 then takes the description row at the same index of the same split)."""
    import io

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    for part in ("ranking", "cartoons"):
        os.makedirs(os.path.join(root, part))
    described = {s: [dict(DESCRIPTIONS[500], contest_number=c) for c in ids] for s, ids in splits.items()}
    datasets.DatasetDict({s: datasets.Dataset.from_list(rows) for s, rows in described.items()}).save_to_disk(
        os.path.join(root, "2_gpt4o_description")  # as humor-r1's config, saved with save_to_disk
    )
    for split, ids in splits.items():
        with open(os.path.join(root, "ranking", f"{split}.jsonl"), "w") as handle:
            for contest in ids:
                for row in contests[contest][0][2]:
                    good = isinstance(row["mean"], float) and isinstance(row["votes"], int) and row["funny"] >= 0
                    if good and row["mean"] <= 3:  # the jsonl holds numbers
                        numbers = {k: float(row[k]) if k == "precision" else row[k] for k in NEW[1:]}
                        handle.write(
                            json.dumps({"contest_number": contest, "caption": row["caption"], **numbers}) + "\n"
                        )
        blobs = []
        for contest in ids:
            buffer = io.BytesIO()
            Image.new("RGB", (10, 10), (contest % 255, 0, 0)).save(buffer, format="PNG")
            blobs.append(
                {"bytes": buffer.getvalue(), "path": "image.png" if contest in positional else f"{contest}.png"}
            )
        pq.write_table(pa.table({"image": blobs}), os.path.join(root, "cartoons", f"{split}-00000-of-00001.parquet"))
    return root


def test_hub_layout_keeps_the_hubs_splits_and_finds_cartoons_as_humor_r1(tmp_path):
    contests, _ = fixture_contests(seed=1)
    hub = write_hub(str(tmp_path / "hub"), contests, {"train": [700, 500], "validation": [702], "test": [510]}, [702])
    out = str(tmp_path / "out")
    assert prepare.main(["--hub", hub, "--out", out]) == 0
    got = {s: data.load_captions(os.path.join(out, s)) for s in ("train", "val", "test")}
    assert {s: sorted(set(d["contest"])) for s, d in got.items()} == {"train": [500, 700], "val": [702], "test": [510]}
    want = expected({c: contests[c][:1] for c in (500, 510, 700, 702)}, no_cartoon=())
    rows = {r["contest"]: r for d in got.values() for r in d.remove_columns("image")}
    assert sum(len(d) for d in got.values()) == sum(len(v) for v in want.values())
    assert rows[700]["scene"] == "A dog at a desk." and rows[700]["twist"] == "The dog is the boss."
    with open(os.path.join(out, "prepare_report.json")) as handle:
        report = json.load(handle)
    assert report["cartoons_matched_by_position"] == 1 and report["split_rule"] == "the Hub's train/validation/test"
    again = str(tmp_path / "again")
    assert (
        prepare.main(["--hub", hub, "--out", again, "--resplit", "2", "--val-frac", "0.25", "--test-frac", "0.25"]) == 0
    )
    with open(os.path.join(again, "prepare_report.json")) as handle:
        assert json.load(handle)["split_rule"] == "by contest, seed 2"


def test_hub_hints_name_the_real_configs_and_files(tmp_path, capsys):
    contests, _ = fixture_contests(seed=1)
    hub = write_hub(str(tmp_path / "hub"), contests, {"train": [700]})
    shutil.rmtree(os.path.join(hub, "cartoons"))
    assert prepare.main(["--hub", hub, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "cartoons/{train,validation,test}-00000-of-00001.parquet" in err and "'cartoons')" not in err
    shutil.rmtree(os.path.join(hub, "ranking"))
    assert prepare.main(["--hub", hub, "--out", str(tmp_path / "out")]) == 2
    assert "load_dataset('yguooo/newyorker_caption_ranking', '1_rating')" in capsys.readouterr().err


def test_unwritable_out_and_interrupt_give_one_line(tmp_path, capsys, monkeypatch):
    """Issue 54: an --out under a file (no folder can be made there) and Ctrl-C were tracebacks."""
    contests, _ = fixture_contests()
    src = write_ratings(str(tmp_path / "ratings"), {c: contests[c] for c in (500, 510, 700)})
    (tmp_path / "file").write_text("x")
    assert prepare.main(["--ratings", src, "--out", str(tmp_path / "file" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a directory (--out)" in err

    def denied(*args):  # as a non-root user writing into a folder made read-only mid-run meets it
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(prepare, "place_cartoon", denied)
    assert prepare.main(["--ratings", src, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Permission denied" in err and not os.path.exists(tmp_path / "out")

    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "place_cartoon", interrupt)
    before = sorted(os.listdir(tmp_path))
    assert prepare.main(["--ratings", src, "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and sorted(os.listdir(tmp_path)) == before


def test_too_few_contests_names_the_ones_without_cartoon_and_writes_the_report(tmp_path, capsys):
    contests, _ = fixture_contests()
    src = write_ratings(str(tmp_path / "ratings"), {c: contests[c] for c in (500, 510, 700)}, no_cartoon=(500, 510))
    out = str(tmp_path / "out")
    assert prepare.main(["--ratings", src, "--out", out]) == 2
    err = capsys.readouterr().err
    assert "cannot fill val" in err and "2 contests were dropped for a missing or unreadable cartoon" in err
    with open(out + ".prepare_report.json") as handle:
        assert json.load(handle)["contests_without_cartoon_ids"] == [500, 510]
    assert not os.path.exists(out)


def test_a_missing_data_dir_points_to_prepare(tmp_path):
    from types import SimpleNamespace

    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import config

    paths = SimpleNamespace(split=lambda split: str(tmp_path / "data" / split))
    with pytest.raises(RecipeError, match="prepare the data with open-r1-caption-prepare and set data_dir"):
        config.check_inputs({"train": config.split_input(paths, "train")})


def test_help_shows_the_defaults():
    text = prepare.build_parser().format_help()
    assert "(default: 10)" in text and "(default: 20)" in text and "(default: 0.1)" in text


def test_capped_pairs_of_contests_larger_than_a_block_equal_drawing_from_every_pair():
    """The bounded pairing (blockwise counts, draws located by row) gives exactly what drawing ``cap`` of the whole
    row-major list of qualifying pairs gives, then shuffling all contests' pairs, chosen side first."""
    import datasets
    import numpy as np

    rng = np.random.default_rng(5)
    sizes, cap, seed = (1500, 40, 2100), 300, 7
    contest = np.repeat(np.arange(len(sizes)), sizes)
    mean, se = rng.uniform(1, 2, len(contest)).round(3), rng.uniform(0.005, 0.1, len(contest))
    table = datasets.Dataset.from_dict(
        {
            "contest": contest,
            "mean": mean,
            "precision": se,
            "votes": np.full(len(contest), 20),
            "caption": [f"c{i}" for i in contest],
        }
    )
    draw, found, offset = np.random.default_rng(seed), [], 0
    for n in sizes:
        m, s = mean[offset : offset + n], se[offset : offset + n]
        i, j = np.triu_indices(n, k=1)  # row-major i < j
        ok = np.abs(m[i] - m[j]) > 3.0 * np.sqrt(s[i] ** 2 + s[j] ** 2)
        every = np.stack([i[ok], j[ok]], axis=1) + offset
        found.append(every[draw.choice(len(every), size=cap, replace=False)] if len(every) > cap else every)
        offset += n
    pairs = np.concatenate(found)
    pairs = pairs[draw.permutation(len(pairs))]
    hi = mean[pairs[:, 0]] >= mean[pairs[:, 1]]
    want = np.where(hi[:, None], pairs, pairs[:, ::-1])
    assert np.array_equal(data.pair_indices(table, k=3.0, cap_per_contest=cap, seed=seed), want)


def test_the_prepared_dir_passes_the_real_recipes_preflight(prepared, tiny_model_dirs, tmp_path):
    """The real recipe (models replaced by tiny ones) on a prepared dir: every stage's settings and inputs check out
    before anything runs; without the data it points to prepare."""
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import pipeline
    from open_r1.tasks.captioning.config import parse_recipe

    out = prepared[0]
    models = [f"models.policy={tiny_model_dirs['qwen3_vl']}", f"models.reward_backbone={tiny_model_dirs['qwen2_5_vl']}"]
    models.append("grpo.reward_kwargs.caption_rm.device=cpu")  # the recipe's cuda:1 is checked before anything runs
    stages = [stage.NAME for stage in pipeline.STAGES]
    recipe = parse_recipe(
        "configs/captioning/real_qwen3vl2b.yaml", [f"work_dir={tmp_path}", f"data_dir={out}", *models], pipeline.STAGES
    )
    pipeline.preflight(recipe, pipeline.STAGES, stages)
    missing = parse_recipe(
        "configs/captioning/real_qwen3vl2b.yaml",
        [f"work_dir={tmp_path}", f"data_dir={tmp_path}/none", *models],
        pipeline.STAGES,
    )
    with pytest.raises(RecipeError, match="open-r1-caption-prepare"):
        pipeline.preflight(missing, pipeline.STAGES, stages)


@pytest.mark.slow
def test_the_real_chain_runs_on_cpu_from_the_public_layout(tmp_path):
    """The documented CPU check (``make humor-real-cpu``): a few contests in the public ratings layout through
    prepare, synthesis (the tiny policy's traces closed at the budget), SFT + merge, RM + blind RM, GRPO and best-of-N
    with the real recipe's settings on tiny models; its first run stopped at SFT (every trace dropped)."""
    contests, _ = fixture_contests()
    src = write_ratings(str(tmp_path / "ratings"), {c: contests[c] for c in (500, 510, 511, 700, 702)}, no_cartoon=())
    work = tmp_path / "run"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = ["make", "-s", "humor-real-cpu", f"PY={sys.executable}", f"SOURCE=--ratings {src}"]
    command += [f"HUMOR_REAL_CPU_DIR={work}", "PREPARE=--val-frac 0.2 --test-frac 0.2"]
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(work / "results" / "pipeline.json") as handle:
        stages = json.load(handle)["stages"]
    assert list(stages) == ["synthesize", "sft", "rm", "grpo", "eval"]
    assert stages["synthesize"]["result"]["kept"] == stages["synthesize"]["result"]["closed"] > 0
    assert os.path.isfile(work / "models" / "policy-grpo-seed42" / "config.json") and "| grpo_s42 |" in done.stdout
