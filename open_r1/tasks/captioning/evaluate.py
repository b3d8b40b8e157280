"""Best-of-N evaluation of captioning policies: metrics over sample records, a paired comparison, a driver.

A record is one sample: contest, sample_index, completion, caption (None when it does not parse), rm_raw (the RM's
raw BT score), truncated, parse_reason. Per policy, each mean taken per cartoon first: ``format_rate``,
``truncated_rate``, ``emitted_sigmoid``, ``fail_as_zero`` (sigma(RM), a failure counting 0: raw BT scores have no
fixed zero), ``bon@n`` (the exact expected max of sigma(RM) over n of the N samples). ``paired_bootstrap``: the
per-cartoon difference to a baseline with a CI resampling cartoons. From saved records (JSONL), without sampling
again (e.g. another baseline or more bootstrap resamples)::

    python -m open_r1.tasks.captioning.evaluate --records base=base.jsonl sft=sft.jsonl --baseline sft --out DIR
    python -m open_r1.tasks.captioning.evaluate --records WORK_DIR/results/eval_test/samples.jsonl --out DIR
"""

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from open_r1 import generation
from open_r1.checks import first_rows
from open_r1.errors import DataError, OpenR1Error, cli_parser, error_exit, setup_logging
from open_r1.jsonio import write_json, write_text
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import protocol
from open_r1.tasks.captioning.rewards import sigmoid

BON_NS = (1, 2, 4, 8)


def _group(records: Iterable[dict]) -> dict[Any, list[dict]]:
    groups = {}
    for record in records:
        groups.setdefault(record["contest"], []).append(record)
    for contest, rows in groups.items():
        indices = [r.get("sample_index") for r in rows]
        if None not in indices and len(set(indices)) != len(indices):
            raise ValueError(f"contest {contest!r} has duplicate sample_index values {sorted(indices)}")
    return groups


def expected_max_of_subset(values: Sequence[float], n: int) -> float:
    """E[max of n of ``values`` drawn without replacement], exactly: sum_i v_(i) C(i-1, n-1) / C(N, n)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    big_n = len(v)
    if not 1 <= n <= big_n:
        raise ValueError(f"n must be in [1, {big_n}], got {n}")
    weights = np.array([math.comb(i, n - 1) for i in range(big_n)], dtype=np.float64) / math.comb(big_n, n)
    return float((v * weights).sum())


def per_cartoon(records: Iterable[dict], bon_ns: Sequence[int] = BON_NS) -> dict[Any, dict]:
    """Per cartoon: n, format, truncated, fail_as_zero, emitted_sigmoid/raw (None if nothing emitted), bon@n."""
    out = {}
    for contest, rows in _group(records).items():
        raw = [None if r.get("caption") is None or r.get("rm_raw") is None else float(r["rm_raw"]) for r in rows]
        values = [0.0 if x is None else sigmoid(x) for x in raw]  # sigma(RM), a failed sample 0
        emitted = [x for x in raw if x is not None]
        entry = {
            "n": len(rows),
            "format": sum(r.get("caption") is not None for r in rows) / len(rows),
            "truncated": sum(bool(r.get("truncated")) for r in rows) / len(rows),
            "fail_as_zero": float(np.mean(values)),
            "emitted_sigmoid": float(np.mean([sigmoid(x) for x in emitted])) if emitted else None,
            "emitted_raw": float(np.mean(emitted)) if emitted else None,
        }
        for n in bon_ns:
            entry[f"bon@{n}"] = expected_max_of_subset(values, n) if n <= len(rows) else None
        out[contest] = entry
    if not out:
        raise ValueError("no records to evaluate")
    return out


def _mean_of(cartoons: dict[Any, dict], key: str) -> float | None:
    values = [c[key] for c in cartoons.values() if c.get(key) is not None]
    return float(np.mean(values)) if values else None


def policy_metrics(records: Iterable[dict], bon_ns: Sequence[int] = BON_NS) -> dict:
    """The summary metrics of one policy's records (see the module docstring), plus its per-cartoon values."""
    records = list(records)
    cartoons = per_cartoon(records, bon_ns)
    n_samples = {c["n"] for c in cartoons.values()}
    means = ["emitted_sigmoid", "emitted_raw", "fail_as_zero", *(f"bon@{n}" for n in bon_ns)]
    return {
        "cartoons": len(cartoons),
        "samples": len(records),
        "samples_per_cartoon": min(n_samples) if len(n_samples) == 1 else sorted(n_samples),
        "format_rate": _mean_of(cartoons, "format"),
        "truncated_rate": _mean_of(cartoons, "truncated"),
        **{key: _mean_of(cartoons, key) for key in means},
        **format_failures(records),
        "per_cartoon": {str(k): v for k, v in cartoons.items()},
    }


def format_failures(records: Sequence[dict], examples: int = 2, max_chars: int = 400) -> dict:
    """``format_failures`` ({parser reason: count}), ``top_failure`` (the commonest or None) and a few
    ``example_completions`` ({"failed": [...], "parsed": [...]}, cut to ``max_chars``)."""
    counts = Counter()
    shown = {"failed": [], "parsed": []}
    for r in records:
        text = r.get("completion")
        kind = "parsed" if r.get("caption") is not None else "failed"
        if kind == "failed":
            reason = r.get("parse_reason") or (protocol.parse_details(text).reason if text is not None else "unknown")
            counts[reason] += 1
        if text is not None and len(shown[kind]) < examples:
            shown[kind].append(str(protocol.completion_text(text))[:max_chars])
    ranked = dict(counts.most_common())  # commonest first, ties in order of appearance
    return {"format_failures": ranked, "top_failure": next(iter(ranked), None), "example_completions": shown}


def paired_bootstrap(
    policy: dict[Any, float | None],
    baseline: dict[Any, float | None],
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict | None:
    """Mean per-cartoon difference (policy - baseline) over shared cartoons with a percentile bootstrap CI
    resampling cartoons; None when no cartoon has both."""
    keys = [k for k in policy if k in baseline and policy[k] is not None and baseline[k] is not None]
    if not keys:
        return None
    diffs = np.array([policy[k] - baseline[k] for k in keys], dtype=np.float64)
    rng = np.random.default_rng(seed)
    boot = diffs[rng.integers(0, len(diffs), size=(n_boot, len(diffs)))].mean(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return {
        "diff": float(diffs.mean()),
        "lo": float(lo),
        "hi": float(hi),
        "cartoons": len(keys),
        "n_boot": n_boot,
        "confidence": 1 - alpha,
    }


def _column(metrics: dict, key: str) -> dict[str, float | None]:
    return {k: v.get(key) for k, v in metrics["per_cartoon"].items()}


def compare(policy: dict, baseline: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """Paired differences of ``policy_metrics`` outputs (policy - baseline)."""
    keys = ["fail_as_zero", "emitted_sigmoid"]
    keys += [f"bon@{n}" for n in BON_NS if policy.get(f"bon@{n}") is not None and baseline.get(f"bon@{n}") is not None]
    return {key: paired_bootstrap(_column(policy, key), _column(baseline, key), n_boot, seed) for key in keys}


def evaluate_records(
    records_by_policy: dict[str, list[dict]],
    baseline: str | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    metrics=policy_metrics,
    comparison=compare,
) -> dict:
    """The full report: `metrics` per policy and, with a baseline, the `comparison` of every other policy."""
    if baseline is not None and baseline not in records_by_policy:
        raise ValueError(f"baseline {baseline!r} is not one of the policies {sorted(records_by_policy)}")
    policies = {name: metrics(records) for name, records in records_by_policy.items()}
    comparisons = {
        name: comparison(values, policies[baseline], n_boot, seed)
        for name, values in policies.items()
        if baseline is not None and name != baseline
    }
    return {"baseline": baseline, "policies": policies, "comparisons": comparisons}


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if pct else f"{value:.3f}"


def _fmt_ci(entry: dict | None) -> str:
    return "–" if entry is None else f"{entry['diff']:+.3f} [{entry['lo']:+.3f}, {entry['hi']:+.3f}]"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return [f"| {' | '.join(head)} |", "|" + "---|" * len(head), *(f"| {' | '.join(row)} |" for row in rows)]


def markdown_table(report: dict) -> str:
    """The policies' metrics and the paired differences to the baseline, as markdown."""
    policies = report["policies"]
    bon = [f"bon@{n}" for n in BON_NS if any(m.get(f"bon@{n}") is not None for m in policies.values())]
    head = [
        "policy",
        "cartoons",
        "N",
        "format %",
        "truncated %",
        "σ(RM) emitted",
        "fail-as-0 σ(RM)",
        *bon,
        "commonest format failure",
    ]
    rows = []
    for name, m in policies.items():
        top = m.get("top_failure")
        rows.append(
            [
                name,
                str(m["cartoons"]),
                str(m["samples_per_cartoon"]),
                _fmt(m["format_rate"], True),
                _fmt(m["truncated_rate"], True),
                _fmt(m["emitted_sigmoid"]),
                _fmt(m["fail_as_zero"]),
                *[_fmt(m[k]) for k in bon],
                f"{top} ({m['format_failures'][top]}/{m['samples']})" if top else "–",
            ]
        )
    lines = _table(head, rows)
    if report.get("comparisons"):
        conf = next(iter(report["comparisons"].values()))["fail_as_zero"]
        level = f"{100 * conf['confidence']:.0f} %" if conf else "95 %"
        title = (
            f"Paired differences to **{report['baseline']}** (policy − baseline, mean over shared cartoons, "
            f"{level} bootstrap CI resampling cartoons):"
        )
        head = ["policy", "fail-as-0 σ(RM)", bon[-1] if bon else "bon", "σ(RM) emitted"]
        rows = [
            [name, _fmt_ci(c["fail_as_zero"]), _fmt_ci(c.get(bon[-1]) if bon else None), _fmt_ci(c["emitted_sigmoid"])]
            for name, c in report["comparisons"].items()
        ]
        lines += ["", title, "", *_table(head, rows)]
    return "\n".join(lines) + "\n"


def plot_bon(report: dict, path: str) -> str:
    """BoN curve (expected max sigma(RM), failures 0, against n) of each policy, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, m in report["policies"].items():
        ns = [n for n in BON_NS if m.get(f"bon@{n}") is not None]
        ax.plot(ns, [m[f"bon@{n}"] for n in ns], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(BON_NS), [str(n) for n in BON_NS])
    ax.set_xlabel("n (samples per cartoon)")
    ax.set_ylabel("best-of-n σ(RM), failures = 0")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    report: dict, out_dir: str, records_by_policy: dict[str, list[dict]] | None = None, table: str | None = None
) -> dict[str, str]:
    """``bon_eval.md`` (`table` or `markdown_table`), ``bon_eval.json``, ``bon_curve.png``, ``samples.jsonl``."""
    names = {"markdown": "bon_eval.md", "json": "bon_eval.json", "plot": "bon_curve.png"}
    paths = {kind: os.path.join(out_dir, name) for kind, name in names.items()}
    write_text(paths["markdown"], markdown_table(report) if table is None else table)  # (makes out_dir)
    write_json(paths["json"], report)
    plot_bon(report, paths["plot"])
    if records_by_policy is not None:
        paths["samples"] = os.path.join(out_dir, "samples.jsonl")
        write_text(
            paths["samples"],
            "".join(
                json.dumps({"policy": name, **r}, default=str) + "\n"
                for name, records in records_by_policy.items()
                for r in records
            ),
        )
    return paths


def score_records(records: list[dict], images_by_contest: dict, descs_by_contest: dict, reward_model) -> list[dict]:
    """Fill ``rm_raw`` of records with a caption, in place (``reward_model=None``: every ``rm_raw`` None)."""
    todo = [r for r in records if r.get("caption") is not None] if reward_model is not None else []
    if todo:
        scores = reward_model.score(
            [images_by_contest[r["contest"]] for r in todo],
            [protocol.rm_messages(descs_by_contest[r["contest"]], r["caption"]) for r in todo],
        )
        for r, s in zip(todo, scores):
            r["rm_raw"] = float(s)
    for r in records:
        r.setdefault("rm_raw", None)
    return records


def evaluate_policy(
    model,
    processor,
    dataset,
    reward_model,
    n: int = 8,
    *,
    max_new_tokens: int = protocol.MAX_NEW_TOKENS,
    temperature: float = 1.0,
    top_p: float | None = None,
    top_k: int | None = None,
    batch_size: int = 8,
    seed: int = 0,
    max_cartoons: int | None = None,
    use_stop: bool = False,
    do_sample: bool = True,
    decoder: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """N sampled completions per cartoon of ``dataset`` (caption rows or ``data.prompt_rows``), parsed and scored:
    records (module docstring) with ``index``, the cartoon's prompt row. ``use_stop``: stop at ``protocol.STOP``;
    ``decoder``: ``generation.generate_texts``'; ``top_p`` / ``top_k`` None: the policy's generation config's."""
    import torch  # deferred: heavy

    rows = first_rows(cdata.prompt_rows(dataset) if "caption" in dataset.column_names else dataset, max_cartoons)
    contests = list(rows["contest"])
    images, descs = dict(zip(contests, rows["image"])), dict(zip(contests, cdata.descriptions(rows)))
    prompts = [
        processor.apply_chat_template(protocol.build_messages(descs[c]), tokenize=False, add_generation_prompt=True)
        for c in contests
    ]
    jobs = [(i, k) for i in range(len(contests)) for k in range(n)]  # (the cartoon's prompt row, the sample)
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k} if do_sample else {}
    gen_kwargs = {k: v for k, v in sampling.items() if v is not None}
    if use_stop:
        gen_kwargs.update(stop_strings=list(protocol.STOP), tokenizer=processor.tokenizer)
    torch.manual_seed(seed)
    records = []
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        texts, lengths, truncated = generation.generate_texts(
            model,
            processor,
            [prompts[i] for i, _ in batch],
            [images[contests[i]] for i, _ in batch],
            max_new_tokens,
            do_sample=do_sample,
            decoder=decoder,
            **gen_kwargs,
        )
        for (i, k), text, length, trunc in zip(batch, texts, lengths, truncated):
            parsed = protocol.parse_details(text)
            records.append(
                {
                    "contest": contests[i],
                    "index": i,
                    "sample_index": k,
                    "completion": text,
                    "caption": parsed.caption,
                    "parse_reason": parsed.reason,
                    "completion_tokens": int(length),
                    "truncated": bool(trunc),
                }
            )
        if progress is not None:
            progress(len(records), len(jobs))
    return score_records(records, images, descs, reward_model)


def read_records(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise DataError(f"{path} is not a file: pass NAME=PATH per policy, or the eval stage's samples.jsonl")
    records = []
    with open(path) as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{line_no}: not JSON ({exc})") from None
            missing = [k for k in ("contest", "caption", "rm_raw") if k not in record]
            if missing:
                raise DataError(f"{path}:{line_no}: record lacks {missing}; records need contest, caption, rm_raw")
            records.append(record)
    if not records:
        raise DataError(f"{path} holds no records")
    return records


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    parser = cli_parser(
        "python -m open_r1.tasks.captioning.evaluate", "Best-of-N report from per-sample records of several policies."
    )
    parser.add_argument(
        "--records",
        nargs="+",
        required=True,
        metavar="NAME=PATH|PATH",
        help="a policy name and its records (JSONL), e.g. base=runs/base.jsonl grpo=runs/grpo.jsonl, or the eval "
        "stage's <work_dir>/results/eval_<split>/samples.jsonl (every policy's records, each naming its policy)",
    )
    parser.add_argument("--baseline", help="policy the others are compared to (paired by cartoon)")
    parser.add_argument("--out", required=True, help="directory for bon_eval.md, bon_eval.json, bon_curve.png")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of the CIs")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        by_policy = {}
        for item in args.records:
            name, sep, path = item.partition("=")
            if sep and not (name and path):
                raise ValueError(f"--records {item!r} is not NAME=PATH")
            if sep:
                by_policy[name] = read_records(path)
                continue
            for line_no, record in enumerate(read_records(item), 1):  # samples.jsonl: each record names its policy
                if "policy" not in record:
                    raise DataError(f"{item}: record {line_no} names no policy; pass NAME=PATH per policy")
                by_policy.setdefault(record["policy"], []).append(record)
        report = evaluate_records(by_policy, args.baseline, args.n_boot, args.seed)
        paths = write_report(report, args.out)
    except (OpenR1Error, ValueError) as exc:
        return error_exit(exc)
    print(markdown_table(report))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
