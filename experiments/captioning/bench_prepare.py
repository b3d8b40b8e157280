"""Benchmark (not a test): open-r1-caption-prepare and the RM's 3-sigma pairing at the public data's full scale.

Generates a ratings-repository fixture (``summaries/<contest>_<algorithm>.csv`` up to 659, ``<contest>.csv`` after;
one contest in ten with a second algorithm file; 5 % without a cartoon; ~1 % duplicate captions), sized like the
real set: ``--contests`` contests of lognormal size (median 5,000 captions, clipped to 500..20,000: a few 10k+),
votes per caption lognormal (median ~90), ratings drawn 1/2/3 from a latent quality, so that most pairs of a large
contest pass the 3-sigma rule. Then times, in this process, ``prepare.main`` and, on every split it writes,
``data.load_captions`` + ``data.pair_indices`` (k=3, cap 1000 per contest, what the RM stage uses), and prints
one JSON line: wall seconds per phase, peak RSS (``resource.getrusage``), sizes and the largest contest's pass rate.

    python -m experiments.captioning.bench_prepare --work /tmp/bench_prepare          # full scale (minutes)
    python -m experiments.captioning.bench_prepare --work /tmp/bench_prepare --small  # a quick check
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import time

import numpy as np

from open_r1.jsonio import read_json, write_json

OLD = ["rank", "caption", "mean", "precision", "votes", "not_funny", "somewhat_funny", "funny"]
WORDS = "cat dog boss lawyer fish bar desk moon taxes robot therapist knight bus meeting coffee wife".split()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def contest_rows(rng, contest: int, n: int) -> list[list]:
    quality = rng.normal(size=n)
    votes = np.clip(rng.lognormal(np.log(90), 0.8, size=n), 2, 5000).astype(np.int64)
    logits = np.stack([1.0 - 1.2 * quality, np.zeros(n), -1.0 + 1.2 * quality], axis=1)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    counts = rng.multinomial(votes, probs)
    mean = (counts * [1, 2, 3]).sum(axis=1) / votes
    squares = (counts * (np.array([1, 2, 3])[None, :] - mean[:, None]) ** 2).sum(axis=1)
    floor = 1 / np.sqrt(votes * (votes - 1))
    se = np.maximum(np.sqrt(squares / (votes * (votes - 1))), floor)  # the publisher's convention and floor
    words = rng.integers(len(WORDS), size=(n, 3))
    captions = [
        f"The {WORDS[a]} and the {WORDS[b]} ate my {WORDS[c]}, {contest}-{i}."
        for i, (a, b, c) in enumerate(words.tolist())
    ]
    for i in rng.integers(n, size=max(1, n // 100)).tolist():  # ~1 % duplicates of another caption
        captions[i] = captions[(i + 1) % n]
    order = np.argsort(-mean, kind="stable")
    return [
        [rank, captions[i], round(mean[i], 6), round(se[i], 6), int(votes[i]), *counts[i].tolist()]
        for rank, i in enumerate(order.tolist())
    ]


def generate(root: str, contests: int, median: int, seed: int) -> dict:
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "summaries"))
    os.makedirs(os.path.join(root, "cartoons"))
    sizes = np.clip(rng.lognormal(np.log(median), 0.5, size=contests), median // 10, median * 4).astype(int)
    first = 660 - contests // 2  # half in each header era
    for index, size in enumerate(sizes.tolist()):
        contest = first + index
        files = [("LilUCB", size)] + ([("RoundRobin", size)] if index % 10 == 0 else [])
        for algo, n in files:
            rows = contest_rows(rng, contest, n)
            name = (
                f"{contest}_{algo}.csv"
                if contest < 660
                else (f"{contest}.csv" if algo == "LilUCB" else f"{contest}_{algo}.csv")
            )
            with open(os.path.join(root, "summaries", name), "w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(OLD if contest < 660 else OLD[1:])
                writer.writerows(rows if contest < 660 else [r[1:] for r in rows])
        if index % 20 != 7:  # 5 % without a cartoon
            Image.new("RGB", (64, 48), (index % 255, 90, 160)).save(os.path.join(root, "cartoons", f"{contest}.jpg"))
    return {
        "contests": contests,
        "captions": int(sizes.sum()),
        "largest": int(sizes.max()),
        "over_10k": int((sizes > 10_000).sum()),
    }


def largest_pass_rate(dataset) -> float:
    """Share of the largest contest's caption pairs that pass the 3-sigma rule (before the cap)."""
    from open_r1.tasks.captioning import data

    contests = np.asarray(dataset.data.column("contest"))
    biggest = np.bincount(contests - contests.min()).argmax() + contests.min()
    rows = np.flatnonzero(contests == biggest)
    mean = np.asarray(dataset.data.column("mean"))[rows]
    se = np.asarray(dataset.data.column("precision"))[rows]
    n, block, passing = len(rows), max(1, (1 << 20) // len(rows)), 0
    for start in range(0, n, block):
        passing += int(data._pair_mask(mean, se, 3.0, start, min(start + block, n)).sum())
    return passing / (n * (n - 1) / 2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--work", required=True, help="scratch folder (replaced)")
    parser.add_argument("--contests", type=int, default=400, help="contests to generate")
    parser.add_argument("--median", type=int, default=5000, help="median captions per contest")
    parser.add_argument("--small", action="store_true", help="quick check: 12 contests, median 400 captions")
    parser.add_argument("--seed", type=int, default=0, help="fixture seed")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    if args.small:
        args.contests, args.median = 12, 400
    from open_r1.tasks.captioning import data, prepare

    shutil.rmtree(args.work, ignore_errors=True)
    result = {"settings": vars(args), "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
    t0 = time.perf_counter()
    result["fixture"] = generate(os.path.join(args.work, "ratings"), args.contests, args.median, args.seed)
    result["generate_s"], result["rss_after_generate_mb"] = round(time.perf_counter() - t0, 1), round(_peak_mb())
    out = os.path.join(args.work, "prepared")
    t0 = time.perf_counter()
    assert prepare.main(["--ratings", os.path.join(args.work, "ratings"), "--out", out]) == 0
    result["prepare_s"] = round(time.perf_counter() - t0, 1)
    t0, pairs, rows = time.perf_counter(), 0, 0
    for split in ("train", "val", "test"):
        dataset = data.load_captions(os.path.join(out, split))
        pairs += len(data.pair_indices(dataset, k=3.0, cap_per_contest=1000, seed=0))
        rows += len(dataset)
        if split == "train":
            result["pass_rate_largest_train_contest"] = round(largest_pass_rate(dataset), 3)
    result["load_and_pair_s"] = round(time.perf_counter() - t0, 1)
    report = read_json(os.path.join(out, prepare.REPORT))
    result.update(
        prepared_captions=rows,
        pairs=pairs,
        peak_rss_mb=round(_peak_mb()),
        load_avg_end=os.getloadavg(),
        report={
            k: report[k]
            for k in (
                "caption_rows_read",
                "duplicate_rows_merged",
                "contests_with_several_files",
                "contests_without_cartoon",
            )
        },
    )
    print(json.dumps(result))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
