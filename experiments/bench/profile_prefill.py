#!/usr/bin/env python
"""Where one selfcheck prefill's time goes: the graph decoder's prefill (prompt through the full-size random
Qwen2-VL-2B into its static cache) of one batch, split into its parts, each timed alone with GPU syncs.

    python -m experiments.bench.profile_prefill --batch-size 512 --out prefill_profile.json
    python -m experiments.bench.profile_prefill --tiny --batch-size 8 --out p.json            # CPU check

Parts (median of --repeats): the batch's CPU build (processor), the M-RoPE positions (`get_rope_index`) on the GPU
tensors and on the CPU ones (`open_r1.decoding.rope_positions`), the vision tower (`get_image_features`) with
transformers' per-image attention and with `open_r1.vision_attention`'s grouped one, and the whole prefill
(`GraphDecoder`, one new token) in three settings: per-image attention + positions on the GPU (before issue #16's
prefill levers), grouped + GPU positions, grouped + CPU positions (the default). Then a torch.profiler table of one
default prefill (top operators by self device time and by self CPU time).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv=None) -> int:
    import torch

    from experiments.bench import bench
    from open_r1 import modeling
    from open_r1.decoding import GraphDecoder, _inner_model, resolve_settings, rope_positions
    from open_r1.tasks.counting import protocol
    from open_r1.tasks.counting.evaluate import _batch_inputs
    from open_r1.vision_attention import use_grouped_vision_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU mode: the tiny model")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--split", default="val")
    parser.add_argument("--top", type=int, default=25, help="profiler rows kept")
    parser.add_argument("--out", default="prefill_profile.json")
    args = parser.parse_args(argv)
    device = bench.check_device(args.tiny)
    started = time.perf_counter()
    with bench.scratch_checkpoint(None, "profile-prefill-") as (work_dir, model_dir):
        base, source = bench.counting_dataset(min(args.batch_size, 256), 0, "auto",
                                              cache_dir=os.path.join(work_dir, "data"),
                                              workers=1 if args.tiny else min(8, os.cpu_count() or 1),
                                              split=args.split)
        bench.setup_device(device, None)
        dataset = bench.repeat_rows(base, args.batch_size)
        processor = modeling.load_processor(model_dir)
        model = bench.load_bench_model(args.tiny, model_dir, "sdpa", device, 0).eval()
        inner = _inner_model(model)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        questions = list(dataset["problem"])
        index = list(range(args.batch_size))

        def timed(fn):
            values = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                values.append(time.perf_counter() - t0)
            return {"median_s": statistics.median(values), "all_s": values}

        def build():
            return _batch_inputs(dataset, index, questions, processor, protocol.EVAL_TEMPLATE,
                                 pin_memory=device == "cuda")

        cpu_inputs = build()
        gpu_inputs = build().to(device)  # BatchFeature.to moves in place: a batch of its own
        decoder = GraphDecoder(model, compile=False)
        settings = resolve_settings(model.generation_config, max_new_tokens=1, do_sample=False)
        parts: dict = {}
        parts["cpu_build"] = timed(build)
        parts["positions_cpu"] = timed(lambda: rope_positions(model, cpu_inputs))
        ids_keys = ("input_ids", "mm_token_type_ids", "image_grid_thw", "attention_mask")
        with torch.no_grad():
            parts["positions_gpu"] = timed(lambda: inner.get_rope_index(**{k: gpu_inputs[k] for k in ids_keys}))
            for choice in ("per_image", "grouped"):
                use_grouped_vision_attention(model, choice)
                parts[f"vision_{choice}"] = timed(lambda: inner.get_image_features(gpu_inputs["pixel_values"],
                                                                                    gpu_inputs["image_grid_thw"]))
        positions = rope_positions(model, cpu_inputs)

        def prefill(with_positions):
            extra = dict(positions) if with_positions else {}
            return lambda: decoder.generate(**gpu_inputs, **extra, settings=settings)

        for label, choice, with_positions in (("prefill_per_image_gpu_positions", "per_image", False),
                                              ("prefill_grouped_gpu_positions", "grouped", False),
                                              ("prefill_grouped_cpu_positions", "grouped", True)):
            use_grouped_vision_attention(model, choice)
            prefill(with_positions)()  # warm-up: the cache is allocated by the first call
            parts[label] = timed(prefill(with_positions))
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            prefill(True)()
            sync()
        events = prof.key_averages()
        device_key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"

        def top(key):
            rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:args.top]
            return [{"name": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1000,
                     "self_device_ms": getattr(e, "self_device_time_total", 0) / 1000} for e in rows]

        payload = {"bench": "profile_prefill", "environment": bench.environment_info(device, None),
                   "batch_size": args.batch_size, "data": source,
                   "image": "x".join(str(s) for s in dataset[0]["image"].size),
                   "prompt_tokens": int(cpu_inputs["input_ids"].shape[1]),
                   "vision_patches": int(cpu_inputs["pixel_values"].shape[0]),
                   "parts": parts, "top_by_device_time": top(device_key), "top_by_cpu_time": top("self_cpu_time_total"),
                   "elapsed_s": time.perf_counter() - started}
        bench.write_json(args.out, payload)
    print(format_table(payload))
    print(f"[profile-prefill] JSON: {os.path.abspath(args.out)}")
    return 0


def format_table(payload: dict) -> str:
    rows = [f"| part (batch {payload['batch_size']}, {payload['image']} images, {payload['prompt_tokens']} prompt "
            "tokens) | median s |", "|---|---:|"]
    rows += [f"| {name.replace('_', ' ')} | {part['median_s']:.3f} |" for name, part in payload["parts"].items()]
    rows += ["", "| operator (one default prefill) | calls | self device ms | self CPU ms |", "|---|---:|---:|---:|"]
    rows += [f"| {e['name'][:60]} | {e['calls']} | {e['self_device_ms']:.1f} | {e['self_cpu_ms']:.1f} |"
             for e in payload["top_by_device_time"][:15]]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
