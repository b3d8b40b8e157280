#!/usr/bin/env python
"""The captioning shape of GRPO (issue 43): plain TRL vs ours in one process, and the reward model's throughput.

    python -m experiments.bench.bench_caption --memory-cap-gib 80 --out caption.json     # one H100/H200
    python -m experiments.bench.bench_caption --tiny --out /tmp/caption.json             # CPU, seconds: the machinery

The shape: a full-size random Qwen3-VL-2B Thinking policy with LoRA (r 16), the captioning task's prompts on
stand-in cartoons of `--image-size` px, G = 8, completions forced to `--completion-length` tokens, rewarded with
sigma(RM) of a full-size random Qwen2.5-VL-3B reward model on the same GPU. A random policy writes no parseable
caption (`caption_rm` would skip the RM) and its text is no caption in length either (1536 random ids decode to
~15k RM tokens), so the RM scores `caption_of` the completion: MAX_WORDS words picked by its last ids.
Variants: `plain_trl` (TRL's GRPOTrainer, HF generate), `ours` (`VLMGRPOTrainer`: graph decoder, image and ViT
de-duplication, lazy images, activation checkpointing) and `rm` (the RM's captions/s at `--rm-batch-size`); options,
timing and table are bench.py's.
"""

import argparse
import logging
import sys
import tempfile
import time

from experiments.bench import bench  # sets the offline environment before any HF import
from open_r1.errors import setup_logging

logger = logging.getLogger(__name__)

GENERATIONS = 8
LORA = {"r": 16, "alpha": 32}
VARIANTS = ("plain_trl", "ours", "rm")


def parse_cli(argv=None) -> argparse.Namespace:
    """bench.py's options, resolved here (`--tiny`: 2 prompts of 64 px, 12 tokens, 8 RM captions)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_common_arguments(parser, "bench_caption.json", lengths=(1536, 12))
    bench.add_round_arguments(parser, steps=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--prompts", type=int, help="prompts per round (default 8; --tiny 2)")
    parser.add_argument("--image-size", type=int, help="cartoon side in px (448; --tiny 64)")
    parser.add_argument("--rm-captions", type=int, help="captions the rm variant scores (256; --tiny 8)")
    parser.add_argument("--rm-batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.prompts = args.prompts or (2 if tiny else 8)
    args.image_size = args.image_size or (64 if tiny else 448)
    args.completion_length = args.completion_length or (12 if tiny else 1536)
    args.rm_captions = args.rm_captions or (8 if tiny else 256)
    return args


def build_models(args):
    """(policy, processor, reward model): Qwen3-VL-2B Thinking and a Qwen2.5-VL-3B RM, full size or tiny."""
    from open_r1 import modeling, tiny_models
    from open_r1 import reward_model as rm_lib

    dirs = {
        family: tiny_models.build_tiny(family, f"{args.work_dir}/{family}", seed=args.seed)
        for family in ("qwen3_vl", "qwen2_5_vl")
    }
    if args.tiny:
        policy = modeling.load_model(str(dirs["qwen3_vl"]), dtype="float32", attn_implementation="sdpa")
        backbone = rm_lib.load_backbone(str(dirs["qwen2_5_vl"]), dtype="float32", attn_implementation="sdpa")
    else:
        from transformers import AutoModel

        from open_r1.vision_attention import use_grouped_vision_attention

        def full_size(family, auto_class=None):
            config = tiny_models.build_config(full_size=True, family=family)
            return bench.build_full_size_model("sdpa", args.device, args.seed, config, auto_class)

        policy = full_size("qwen3_vl")
        backbone = full_size("qwen2_5_vl", AutoModel)  # the RM's backbone: the VLM without its LM head
        use_grouped_vision_attention(backbone, "grouped")
    policy.generation_config = tiny_models.build_generation_config("qwen3_vl", thinking=True)
    rm_processor = modeling.load_processor(str(dirs["qwen2_5_vl"]))
    reward_model = rm_lib.RewardModel(backbone.requires_grad_(False), rm_processor).to(args.device).eval()
    return policy, modeling.load_processor(str(dirs["qwen3_vl"])), reward_model


def cartoon_prompts(n: int, size: int, seed: int):
    from open_r1.tasks.captioning import data as data_lib
    from standin.captioning import cartoons as standin

    contests = standin.build_contests(n, standin.StandinConfig(captions=2, image_size=(size, size), seed=seed))
    return data_lib.prompt_rows(contests)


CAPTION_WORDS = "the cat said to my lawyer again why is this office so quiet never ask about it".split()


def caption_of(completion_ids) -> str:
    """A `protocol.MAX_WORDS`-word caption that depends on the completion's last ids (module docstring)."""
    from open_r1.tasks.captioning import protocol

    return " ".join(CAPTION_WORDS[int(i) % len(CAPTION_WORDS)] for i in list(completion_ids)[-protocol.MAX_WORDS :])


def rm_reward(reward_model, batch_size: int):
    """sigma(RM(image, caption)) with the caption = `caption_of` the completion's ids."""
    from open_r1.tasks.captioning import protocol
    from open_r1.tasks.captioning.rewards import _descriptions, sigmoid

    def caption_rm_shape(completions, completion_ids, image=None, **columns):
        captions = [caption_of(ids) for ids in completion_ids]
        descs = _descriptions(columns, len(captions))  # the description columns (scene, twist, ...) TRL passes
        messages = [protocol.rm_messages(d, c) for d, c in zip(descs, captions)]
        return [sigmoid(s) for s in reward_model.score(list(image), messages, batch_size=batch_size)]

    return caption_rm_shape


def run_grpo(name, args, result, sync) -> None:
    """Both generate the round's rows at once and take one optimizer step on them (on-policy). plain_trl: TRL's
    default micro-batch (8), no activation checkpointing (at 1536 tokens a micro-batch of 64 would not fit 80 GiB).
    ours: micro-batches of rows / 4 with activation checkpointing, beta 0 and dr_grpo as the captioning recipe, and
    our trainer's levers."""
    from peft import LoraConfig
    from trl import GRPOTrainer

    from open_r1.families import family_of
    from open_r1.trainer import VLMGRPOTrainer

    policy, processor, reward_model = build_models(args)
    rows = args.prompts * GENERATIONS
    ours = name == "ours"
    micro = rows // 4 if ours else min(8, rows)
    train_args = bench.bench_grpo_config(
        tempfile.mkdtemp(dir=args.work_dir),
        args.seed,
        args.completion_length,
        args.tiny,
        num_generations=GENERATIONS,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        max_steps=args.warmup + args.steps,
        remove_unused_columns=False,
        **({"gradient_checkpointing": True, "beta": 0.0, "loss_type": "dr_grpo"} if ours else {}),
    )
    levers = dict(fast_decode="graph" if args.device == "cuda" else "eager", dedupe_vision=True, dedupe_images=True)
    trainer = (VLMGRPOTrainer if ours else GRPOTrainer)(
        model=policy,
        reward_funcs=[rm_reward(reward_model, args.rm_batch_size)],
        args=train_args,
        train_dataset=args.dataset,
        processing_class=processor,
        peft_config=LoraConfig(
            r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=family_of(policy).lora_targets(False)
        ),
        **(dict(levers, lazy_images=True) if ours else {}),
    )
    # the models die with this frame; bench.measured frees their memory after it
    result.update(bench.train_measured(trainer, args.warmup, sync, args.tiny, args.completion_length))
    result.update(rows_per_round=rows, lora=LORA)


def run_rm(args, result, sync) -> None:
    """captions/s of the RM alone: n (image, caption) conversations in batches of --rm-batch-size, after one batch
    of warm-up."""
    from open_r1.tasks.captioning import protocol

    _, _, reward_model = build_models(args)
    n, batch = args.rm_captions, args.rm_batch_size
    images = [args.dataset[i % len(args.dataset)]["image"] for i in range(n)]
    messages = [protocol.rm_messages(None, caption_of(range(protocol.MAX_WORDS)))] * n
    reward_model.score(images[:batch], messages[:batch], batch_size=batch)
    sync()
    start = time.perf_counter()
    scores = reward_model.score(images, messages, batch_size=batch)
    sync()
    wall = time.perf_counter() - start
    result.update(captions=len(scores), wall_s=wall, captions_per_s=len(scores) / wall, batch_size=batch)


def main(argv=None) -> int:
    setup_logging()
    import torch

    from open_r1 import decoding

    args = parse_cli(argv)
    names = bench.comma_list(args.variants)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise bench.BenchError(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    started = time.perf_counter()
    args.device = bench.check_device(args.tiny, args.threads)
    # every round needs `prompts` distinct contests: enough for warm-up + measured rounds
    args.dataset = cartoon_prompts(args.prompts * (args.warmup + args.steps + 1), args.image_size, args.seed)
    bench.setup_device(args.device, args.memory_cap_gib)
    bench.set_layers_once(args.layers_once)
    on_cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)

    payload = {
        "bench": "grpo_caption",
        "mode": "tiny" if args.tiny else "full_size",
        "environment": bench.environment_info(args.device, args.memory_cap_gib),
        "shape": {
            "policy": "Qwen3-VL-2B Thinking (random) + LoRA",
            "reward_model": "Qwen2.5-VL-3B (random)",
            "image": f"{args.image_size}x{args.image_size}",
            "num_generations": GENERATIONS,
            "prompts_per_round": args.prompts,
            "completion_length": args.completion_length,
            "steps": args.steps,
            "warmup": args.warmup,
            "layers_once": decoding.LAYERS_ONCE,
        },
        "variants": [],
    }
    with bench.scratch_dir(args.work_dir, "bench-caption-") as args.work_dir:
        for name in names:
            result = {"name": name}
            skip = bench.deadline_passed(started, args.deadline_s)
            if skip:
                result.update(status="skipped", error=skip, total_s=0.0)
            else:
                with bench.measured(result, on_cuda, args.variant_timeout_s):
                    run_rm(args, result, sync) if name == "rm" else run_grpo(name, args, result, sync)
            payload["variants"].append(result)
            bench.write_json(args.out, payload)
            logger.info(
                f"[bench_caption] {name}: {result['status']} {result.get('error', '')} ({result['total_s']:.0f} s)"
            )
    grpo = [r for r in payload["variants"] if r["name"] != "rm"]
    bench.add_ratios(grpo)
    bench.write_json(args.out, payload)
    print(bench.format_table(grpo))
    for r in payload["variants"]:
        if r["name"] == "rm" and r["status"] == "ok":
            print(f"[bench_caption] RM: {r['captions_per_s']:.1f} captions/s (batch {r['batch_size']})")
        if r["name"] == "ours" and r.get("ratio_vs_plain_trl"):
            print(f"[bench_caption] ours / plain_trl = {r['ratio_vs_plain_trl']:.2f} (goal >= 3, within 80 GiB)")
    return 0 if all(r["status"] == "ok" for r in payload["variants"]) else 1


if __name__ == "__main__":
    sys.exit(bench.cli(entry=main))
