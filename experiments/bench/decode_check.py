"""GPU correctness check of the graph decoder (open_r1/decoding.py) on the full-size Qwen2-VL-2B architecture.

    python -m experiments.bench.decode_check --out decode_check.json

1. float32, random weights (transformers' init), 480x320 images through the ViT, left-padded prompts of mixed
   lengths: greedy tokens of the compiled (CUDA-graph) decoder against HF `generate` (float32 so that bf16
   rounding cannot flip an argmax; the CPU tests prove exactness on tiny models of every family);
2. sampling inside a CUDA graph: the Gumbel-max sampler (`choose_tokens` after `process_logits`, top-k) compiled with
   mode="reduce-overhead" and replayed: every replay draws fresh noise, frequencies follow the processed softmax,
   nothing outside the top-k is drawn.
"""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    import torch

    from experiments.bench import bench
    from open_r1 import modeling
    from open_r1.decoding import GraphDecoder, SamplingSettings, choose_tokens, process_logits, resolve_settings
    from open_r1.tasks.counting import protocol

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default="decode_check.json")
    args = parser.parse_args(argv)
    result: dict = {"rows": args.rows, "tokens": args.tokens}
    started = time.perf_counter()

    # ---- 1. greedy tokens, float32 --------------------------------------------------------------------------------
    import tempfile

    work = tempfile.mkdtemp(prefix="decode-check-")
    model_dir = bench.build_tiny_checkpoint(work)
    processor = modeling.load_processor(model_dir)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"  # CPU: a dry run of this script on the tiny model (uncompiled)
    if cuda:
        model = bench.build_full_size_model(dtype="float32")
    else:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    dataset, source = bench.counting_dataset(args.rows, 0, "auto", cache_dir=f"{work}/data", workers=4)
    questions = [q + " Be brief." * (i % 4) for i, q in enumerate(dataset["problem"][: args.rows])]
    texts = [processor.apply_chat_template(protocol.build_messages(q, protocol.EVAL_TEMPLATE), tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    images = [image.convert("RGB") for image in dataset["image"][: args.rows]]
    inputs = processor(text=texts, images=images, padding=True, padding_side="left", return_tensors="pt").to(device)
    lengths = inputs["attention_mask"].sum(1).tolist()
    result.update(data=source, prompt_lengths=[min(lengths), max(lengths)])
    kwargs = dict(max_new_tokens=args.tokens, do_sample=False)
    with torch.no_grad():
        t = time.perf_counter()
        hf = model.generate(**inputs, **kwargs)[:, inputs["input_ids"].shape[1]:]
        cuda and torch.cuda.synchronize()
        result["hf_s"] = time.perf_counter() - t
    decoder = GraphDecoder(model, compile=cuda)
    settings = resolve_settings(model.generation_config, **kwargs)
    t = time.perf_counter()
    ours = decoder.generate(**inputs, settings=settings)
    cuda and torch.cuda.synchronize()
    result["graph_first_call_s"] = time.perf_counter() - t  # includes the compilation
    ours2 = decoder.generate(**inputs, settings=settings)
    width = min(hf.shape[1], ours.shape[1])
    same = (hf[:, :width] == ours[:, :width])
    result.update(
        fp32_greedy_identical=bool(torch.equal(hf, ours)),
        fp32_token_agreement=float(same.float().mean()),
        fp32_rows_identical=int(same.all(1).sum()),
        repeat_call_identical=bool(torch.equal(ours, ours2)),
        cache_allocations=decoder.allocations,
        decode_ms_per_step=1000 * decoder.timings[-1]["decode_s"] / max(decoder.timings[-1]["steps"] - 1, 1),
        distinct_tokens=len(set(hf.flatten().tolist())),
    )
    print(json.dumps(result), flush=True)
    del model, decoder
    if not cuda:
        return 0
    torch.cuda.empty_cache()

    # ---- 2. sampling inside a CUDA graph -------------------------------------------------------------------------
    vocab, n = 12, 20000
    logits = torch.linspace(2.0, -2.0, vocab, device="cuda")[torch.randperm(vocab, device="cuda")].expand(n, -1)
    logits = logits.contiguous()
    settings = SamplingSettings(max_new_tokens=1, do_sample=True, top_k=5, temperature=0.7)
    off = torch.zeros(vocab, dtype=torch.bool, device="cuda")
    step = torch.zeros((), dtype=torch.long, device="cuda")

    def sample(x):
        return choose_tokens(process_logits(x, settings, off, off, step), settings)

    compiled = torch.compile(sample, mode="reduce-overhead", fullgraph=True)
    draws = []
    for _ in range(5):
        torch.compiler.cudagraph_mark_step_begin()
        draws.append(compiled(logits).clone())
    expected = torch.full((vocab,), float("-inf"), device="cuda")
    top = torch.topk(logits[0], 5).indices
    expected[top] = logits[0, top] / 0.7
    probs = expected.softmax(-1).double()
    freq = torch.bincount(draws[-1], minlength=vocab).double() / n
    sigma = (probs * (1 - probs) / n).sqrt()
    result.update(
        graph_sampling_replays_differ=bool(not torch.equal(draws[-1], draws[-2])),
        graph_sampling_outside_top_k=int((~torch.isin(torch.cat(draws), top)).sum()),
        graph_sampling_max_z=float(((freq - probs).abs() / sigma.clamp_min(1e-12))[top].max()),
    )
    result["elapsed_s"] = time.perf_counter() - started
    print(json.dumps(result), flush=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
