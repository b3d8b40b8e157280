"""Decode speed at the captioning shape (issue #43): full-size random Qwen3-VL-2B-Thinking, 448 px images, 256 rows,
384 forced tokens (min_new_tokens = max_new_tokens), top-p 0.95 at temperature 0.7.

    python -m experiments.bench.bench_decode --out $OUT/decode            # one GPU, ~6 min
    python -m experiments.bench.bench_decode --tiny --out /tmp/decode     # CPU dry run of the machinery (tiny model)

Each variant runs in its own process (a fresh CUDA context; failures and timeouts are recorded), with inductor's
on-disk caches in a directory of its own (--scratch), so "cold" is cold: `hf` (HF generate), `eager` (the graph
decoder uncompiled), `graph_once` / `graph_once_warm` (one nested compile region per decoder layer, cold then on the
warm cache; where the nested regions fail, the shipped compile is used, marked "(plain)") and `graph` (the shipped
compile, cold). A compiled variant records its first call's wall seconds and a second call's ms per step;
`graph_once_warm` then adds the other samplers of SAMPLING, last, so a run cut by --budget-s keeps what came before.
Rows go to <out>/results.jsonl as they finish; the end prints a table and writes <out>/summary.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from open_r1.errors import setup_logging
from open_r1.jsonio import write_json

VARIANTS = ("hf", "eager", "graph_once", "graph_once_warm", "graph")
CACHE_DIRS = {"graph_once": "inductor-once", "graph_once_warm": "inductor-once", "graph": "inductor-plain"}
SAMPLING = {
    "top-p 0.95": dict(top_p=0.95, top_k=0),
    "top-p 1.0": dict(top_p=1.0, top_k=0),
    "top-k 20 + top-p 0.95": dict(top_p=0.95, top_k=20),
}


def _record(out: Path, **row) -> None:
    with open(out / "results.jsonl", "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def _build(args, work: Path):
    """(model, processor inputs on the device) for the bench shape; --tiny: the tiny Qwen3-VL on CPU, fp32."""
    import numpy as np
    from PIL import Image

    from open_r1 import modeling, tiny_models

    path = str(tiny_models.build_tiny("qwen3_vl", work / "tiny-qwen3vl", overwrite=True))
    processor = modeling.load_processor(path)
    if args.tiny:
        model = modeling.load_model(path, dtype="float32", vision_attention="per_image").eval()
        device = "cpu"
    else:
        from experiments.bench import bench

        config = tiny_models.build_config(full_size=True, family="qwen3_vl")
        model = bench.build_full_size_model(config=config)
        model.generation_config = tiny_models.build_generation_config("qwen3_vl", thinking=True)
        device = "cuda"
    rng = np.random.default_rng(0)
    side = args.image_px
    images = [Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)) for _ in range(args.rows)]
    content = [{"type": "image"}, {"type": "text", "text": "Write a funny caption for this cartoon."}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    inputs = processor(
        text=[text] * args.rows, images=images, padding=True, padding_side="left", return_tensors="pt"
    ).to(device)
    return model, inputs


def worker(args) -> None:
    import torch

    out = Path(args.out)
    variant = args.worker
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    started = time.perf_counter()
    model, inputs = _build(args, Path(args.scratch))
    base = dict(
        variant=variant,
        rows=args.rows,
        tokens=args.tokens,
        image_px=args.image_px,
        prompt_len=int(inputs["input_ids"].shape[1]),
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    )
    _record(out, **base, event="built", build_s=round(time.perf_counter() - started, 1))
    if variant == "hf":
        kwargs = dict(do_sample=True, temperature=0.7, top_p=0.95, top_k=0)
        with torch.inference_mode():
            times = {}
            for tokens in (1, args.tokens):
                sync()
                t = time.perf_counter()
                model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
                sync()
                times[tokens] = time.perf_counter() - t
        step_ms = 1000 * (times[args.tokens] - times[1]) / max(args.tokens - 1, 1)
        _record(out, **base, sampling="top-p 0.95", ms_per_step=round(step_ms, 2), total_s=round(times[args.tokens], 1))
        return
    from open_r1.decoding import GraphDecoder, resolve_settings

    compiled = variant != "eager"
    # the must-show numbers first (a run that meets its budget keeps them); the warm process adds the other
    # samplers, each a cold compile of its own
    names = list(SAMPLING) if variant == "graph_once_warm" else ["top-p 0.95"]
    options = {"backend": "eager", "dynamic": False} if args.tiny else None
    decoder = GraphDecoder(
        model, compile=compiled, layers_once=variant.startswith("graph_once"), compile_options=options
    )
    for name in names:
        for _ in range(2):
            row = dict(base, sampling=name, layers_once=decoder.layers_once)
            try:
                settings = resolve_settings(
                    model.generation_config,
                    max_new_tokens=args.tokens,
                    min_new_tokens=args.tokens,
                    do_sample=True,
                    temperature=0.7,
                    **SAMPLING[name],
                )
                sync()
                t = time.perf_counter()
                decoder.generate(**inputs, settings=settings)
                sync()
                row["first_call_s"] = round(time.perf_counter() - t, 1)
                decoder.generate(**inputs, settings=settings)
                timing = decoder.timings[-1]
                row.update(
                    ms_per_step=round(1000 * timing["decode_s"] / max(timing["steps"] - 1, 1), 2), steps=timing["steps"]
                )
                if compiled:
                    from experiments.bench import compat

                    row["compile_times"] = compat.compile_time_report()[-2000:]
            except Exception as error:  # one measurement's failure is a result; the next one still runs
                row["error"] = f"{type(error).__name__}: {error}"[:2000]
                traceback.print_exc()
            _record(out, **row)
            if "error" not in row or not decoder.layers_once:
                break
            # the nested regions failed: unmark the layers, go on (and retry this one) with the shipped compile
            for layer in model.model.language_model.layers:
                layer.__dict__.pop("forward", None)
            decoder = GraphDecoder(model, compile=compiled, layers_once=False, compile_options=options)


def table(rows: list[dict]) -> str:
    lines = ["| variant | sampling | ms / token step | first call (s) | note |", "|---|---|---|---|---|"]
    for row in rows:
        if row.get("event") == "built":
            continue
        note = row.get("error", "")[:80]
        variant = row["variant"] + (" (plain)" if row.get("layers_once") is False and "once" in row["variant"] else "")
        lines.append(
            f"| {variant} | {row.get('sampling', '')} | {row.get('ms_per_step', '')} | "
            f"{row.get('first_call_s', '')} | {note} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    setup_logging()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="a directory: results.jsonl, summary.json, inductor caches")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--image-px", type=int, default=448)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--budget-s", type=float, default=560, help="the whole run's wall-clock budget")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny model, dynamo's eager backend")
    parser.add_argument("--scratch", help="models and inductor caches (default: a new temp dir)")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.tiny and args.rows == 256:
        args.rows, args.tokens, args.image_px = 2, 4, 56
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        worker(args)
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    deadline = time.monotonic() + args.budget_s
    scratch = args.scratch or tempfile.mkdtemp(prefix="bench-decode-")  # not under --out: caches are large
    for variant in variants:
        left = deadline - time.monotonic()
        if left < 20:
            _record(out, variant=variant, event="skipped", error=f"budget spent ({args.budget_s:.0f} s)")
            continue
        env = dict(os.environ)
        if variant in CACHE_DIRS:
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, CACHE_DIRS[variant])
        print(f"== {variant} (at most {left:.0f} s)", flush=True)  # heads the worker's rows on stdout
        try:
            proc = subprocess.run(
                # this run's own options (the last --scratch wins), one variant
                [
                    sys.executable,
                    "-m",
                    "experiments.bench.bench_decode",
                    *argv,
                    "--scratch",
                    scratch,
                    "--worker",
                    variant,
                ],
                env=env,
                timeout=left,
            )
            if proc.returncode:
                _record(out, variant=variant, event="exit", error=f"worker exited with {proc.returncode}")
        except subprocess.TimeoutExpired:
            _record(out, variant=variant, event="timeout", error=f"killed at the budget ({left:.0f} s left)")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    write_json(out / "summary.json", rows)
    print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
