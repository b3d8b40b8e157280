#!/usr/bin/env python
"""Warm start for the proxy experiment: a small Qwen2-VL trained from random init by SFT to count moderately well.

    # GPU (one H200, ~4-5 min including data): renders data/proxy if missing, trains, saves models/proxy-warmstart
    python -m experiments.proxy.sft_warmstart --out models/proxy-warmstart --data data/proxy --max-minutes 3.5
    # CPU smoke test (seconds): tiny model, tiny data, 2 steps
    python -m experiments.proxy.sft_warmstart --tiny --out /tmp/warm --data /tmp/warm-data

Renders the splits (`open_r1.tasks.counting.scenes.write_splits`) unless `--data` holds them; builds a seeded
random Qwen2-VL-architecture model (`open_r1.tiny_models`, preset `small`: 47.6M parameters, 38.9M of them the
real-size embedding); SFTs it with TRL's `SFTTrainer` on protocol-format rows (`experiments.proxy.proxy.to_sft_dataset`)
plus the optional OOD exposure, plain and arithmetic format rows (`--ood-exposure`, `--plain-share`, `--format-rows`,
`--format-ood-rows`: each flag's help says why); stops at `--max-steps` / `--epochs`, `--max-minutes` (the LR schedule
follows the larger of the step and time fractions) or `--stop-at-acc` on a quick greedy check; saves a model dir
that `open_r1.modeling` loads, scores it with the selfcheck protocol and writes `sft_report.json` into it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from experiments.proxy import proxy

REPORT_FILE = "sft_report.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models/proxy-warmstart", help="model dir to write (replaced)")
    parser.add_argument("--data", default="data/proxy", help="dir with the save_to_disk splits (rendered if missing)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, tiny data, 2 steps")
    parser.add_argument("--seed", type=int, default=0)
    # data
    parser.add_argument(
        "--train-size", type=int, default=None, help=f"rows to render for train ({proxy.PROXY_SIZES['train']})"
    )
    parser.add_argument(
        "--eval-size",
        type=int,
        default=None,
        help=f"rows to render for val / compositional / ood_val ({proxy.PROXY_SIZES['val']})",
    )
    parser.add_argument(
        "--ood-exposure",
        type=int,
        default=None,
        help="OOD-renderer rows (split ood_train) taught as the question alone -> the bare number "
        f"({proxy.PROXY_EXPOSURE_ROWS}; tiny {proxy.TINY_EXPOSURE_ROWS}; 0 = off)",
    )
    parser.add_argument("--image-size", default=None, help=f"clevr splits ({proxy.PROXY_IMAGE_SIZE})")
    parser.add_argument("--ood-image-size", default=None, help=f"ood_val ({proxy.PROXY_OOD_IMAGE_SIZE})")
    parser.add_argument("--render-workers", type=int, default=None, help="scene rendering processes (all cores)")
    # model
    parser.add_argument("--preset", default=None, choices=sorted(proxy.MODEL_PRESETS), help="model size (small)")
    parser.add_argument(
        "--model-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="build_config override, e.g. hidden_size=384 or vision_depth=6 (repeatable)",
    )
    parser.add_argument("--min-pixels", type=int, default=proxy.PROXY_MIN_PIXELS)
    parser.add_argument("--max-pixels", type=int, default=None, help=f"vision-token budget ({proxy.PROXY_MAX_PIXELS})")
    # SFT
    parser.add_argument("--target-style", default="think", choices=proxy.TARGET_STYLES)
    parser.add_argument(
        "--think-share",
        type=float,
        default=0.5,
        help="with --target-style mixed: fraction of rows with a think target (the rest answer only)",
    )
    parser.add_argument(
        "--think-noise",
        type=float,
        default=0.0,
        help="fraction of think targets that state a wrong count (+-1 or 2) in thought and answer: a "
        "start model whose thinking hurts, as the real one's does; 0 = off",
    )
    parser.add_argument(
        "--plain-share",
        type=float,
        default=0.0,
        help="fraction of the CLEVR train rows taught as the question alone -> bare number (as the "
        "OOD exposure rows); the protocol format is learned from the rest only. 0 = off",
    )
    parser.add_argument(
        "--format-rows",
        type=int,
        default=0,
        help="train images asked 'What is A plus B?' under a protocol template, answered in the "
        "format: the format taught on another task. 0 = off",
    )
    parser.add_argument(
        "--format-ood-rows",
        type=int,
        default=0,
        help="more arithmetic format rows, on OOD-renderer exposure images (needs --ood-exposure >= "
        "this): the format taught on more than one renderer's images. 0 = off",
    )
    parser.add_argument(
        "--templates",
        nargs="+",
        default=["eval:0.5", "train:0.5"],
        help="prompt template mix, entries name:weight (open_r1.tasks.counting.protocol.TEMPLATES)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="per-step batch (128; tiny 4)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (from scratch)")
    parser.add_argument("--min-lr-ratio", type=float, default=0.05, help="cosine floor, as a fraction of --lr")
    parser.add_argument("--warmup", type=float, default=0.05, help="warm-up fraction of the run (steps or time)")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--epochs", type=float, default=None, help="stop after this many epochs")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="wall-clock cap of the training loop (3.5 when neither --epochs nor --max-steps is given)",
    )
    parser.add_argument(
        "--stop-at-acc",
        type=float,
        default=None,
        help="stop once the quick check reaches this accuracy in [0, 1] (0.65; 0 = never)",
    )
    parser.add_argument("--dev-size", type=int, default=None, help="train rows held out for the quick check (256)")
    parser.add_argument("--eval-every", type=int, default=None, help="quick check every N steps (100; 0 = never)")
    parser.add_argument("--workers", type=int, default=None, help="dataloader workers (min(8, cores - 1); tiny 0)")
    # final evaluation
    parser.add_argument("--eval-limit", type=int, default=None, help="val rows scored at the end (200; tiny 4)")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="generation batch of the evaluations")
    parser.add_argument(
        "--eval-max-new-tokens", type=int, default=None, help="final evaluation budget (the protocol's 256; tiny 16)"
    )
    parser.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    return finalize_args(args)


def finalize_args(args):
    tiny = args.tiny
    defaults = {
        "train_size": proxy.TINY_SIZES["train"] if tiny else proxy.PROXY_SIZES["train"],
        "eval_size": proxy.TINY_SIZES["val"] if tiny else proxy.PROXY_SIZES["val"],
        "ood_exposure": proxy.TINY_EXPOSURE_ROWS if tiny else proxy.PROXY_EXPOSURE_ROWS,
        "image_size": proxy.TINY_IMAGE_SIZE if tiny else proxy.PROXY_IMAGE_SIZE,
        "ood_image_size": proxy.TINY_OOD_IMAGE_SIZE if tiny else proxy.PROXY_OOD_IMAGE_SIZE,
        "preset": "tiny" if tiny else "small",
        "max_pixels": proxy.TINY_MAX_PIXELS if tiny else proxy.PROXY_MAX_PIXELS,
        "batch_size": 4 if tiny else 128,
        "stop_at_acc": 0.0 if tiny else 0.65,
        "dev_size": 4 if tiny else 256,
        "eval_every": 1 if tiny else 100,
        "workers": 0 if tiny else max(0, min(8, (os.cpu_count() or 1) - 1)),
        "eval_limit": 4 if tiny else 200,
        "eval_batch_size": 4 if tiny else 128,
        "eval_max_new_tokens": 16 if tiny else 256,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if tiny and args.max_steps is None and args.epochs is None and args.max_minutes is None:
        args.max_steps = 2
    if args.max_steps is None and args.epochs is None and args.max_minutes is None:
        args.max_minutes = 3.5
    for name in ("think_share", "think_noise", "plain_share"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be in [0, 1] (got {getattr(args, name)})")
    for name in ("format_rows", "format_ood_rows"):
        if getattr(args, name) < 0:
            raise SystemExit(
                f"error: --{name.replace('_', '-')} must be >= 0 (got {getattr(args, name)}); 0 switches it off"
            )
    if args.format_ood_rows > args.ood_exposure:
        raise SystemExit(
            f"error: --format-ood-rows {args.format_ood_rows} takes its images from the OOD exposure "
            f"rows, but --ood-exposure is {args.ood_exposure}; raise --ood-exposure to at least "
            f"{args.format_ood_rows}"
        )
    if args.ood_exposure < 0:
        raise SystemExit(f"error: --ood-exposure must be >= 0 rows (got {args.ood_exposure}); 0 switches it off")
    return args


def parse_overrides(items: list[str]) -> dict:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --model-override {item!r} is not KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def make_callback(cap, dev_dataset, processor, args, history: list, log):
    import torch
    from transformers import TrainerCallback

    from open_r1.tasks.counting.evaluate import evaluate_dataset

    class ProgressCallback(TrainerCallback):
        stop_reason = None

        def on_step_end(self, targs, state, control, model=None, **kwargs):
            if args.eval_every and dev_dataset is not None and state.global_step % args.eval_every == 0:
                accuracy = self.quick_check(model, state.global_step)
                if args.stop_at_acc and accuracy >= 100.0 * args.stop_at_acc:
                    control.should_training_stop = True
                    self.stop_reason = f"quick check {accuracy:.1f}% >= {100 * args.stop_at_acc:.0f}%"
            return control

        def quick_check(self, model, step) -> float:
            was_training = model.training
            model.eval()
            autocast = (
                torch.autocast("cuda", dtype=torch.bfloat16)
                if model.device.type == "cuda"
                else torch.autocast("cpu", enabled=False)
            )
            with torch.no_grad(), autocast:
                report = evaluate_dataset(
                    model,
                    processor,
                    dev_dataset,
                    name="dev",
                    batch_size=args.eval_batch_size,
                    max_new_tokens=32,
                    progress=False,
                )
            if was_training:
                model.train()
            history.append(
                {
                    "step": step,
                    "time": cap.elapsed(),
                    "accuracy_pct": report.accuracy_pct,
                    "format_pct": report.format_pct,
                    "mean_completion_tokens": report.mean_completion_tokens,
                }
            )
            log(
                f"[sft] step {step}: quick check (train hold-out, {report.n} rows, 32 new tokens) accuracy "
                f"{report.accuracy_pct:.1f}% format {report.format_pct:.1f}% "
                f"tokens {report.mean_completion_tokens:.1f}"
            )
            return report.accuracy_pct

    return ProgressCallback()


def main(argv=None) -> dict:
    args = parse_args(argv)
    command = "python -m experiments.proxy.sft_warmstart " + proxy.shell_join(
        sys.argv[1:] if argv is None else list(argv)
    )
    started = time.time()
    log = lambda msg: print(msg, flush=True)  # noqa: E731

    import datasets
    import torch
    from transformers import set_seed
    from trl import SFTConfig

    from open_r1 import modeling
    from open_r1 import tiny_models as tiny_model
    from open_r1.run.budget import TimeCapCallback
    from open_r1.sft import SFTSettings, capped_trainer_class, lr_multiplier
    from open_r1.tasks.counting import data as data_lib
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    use_cuda = device.startswith("cuda")
    if use_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # 1. data
    sizes = {"train": args.train_size, **{split: args.eval_size for split in proxy.EVAL_SPLITS}}
    required = {"train": 2, "val": 1}
    if args.ood_exposure:
        sizes[proxy.EXPOSURE_SPLIT] = required[proxy.EXPOSURE_SPLIT] = args.ood_exposure
    data_info = proxy.ensure_splits(
        args.data,
        sizes,
        seed=args.seed,
        image_size=args.image_size,
        ood_image_size=args.ood_image_size,
        workers=args.render_workers,
        progress=not args.tiny,
        log=log,
        required=required,
    )
    train_full = data_lib.load_counting_dataset(os.path.join(args.data, "train"))
    data_lib.validate_counting_dataset(train_full, "train")
    dev_size = min(args.dev_size, max(len(train_full) // 4, 1)) if args.dev_size else 0
    train_rows = len(train_full) - dev_size
    train_split = train_full.select(range(train_rows))
    dev_split = train_full.select(range(train_rows, len(train_full))) if dev_size else None
    plain_index, protocol_index = proxy.split_plain_rows(train_rows, args.plain_share, seed=args.seed)
    if not protocol_index and not (args.format_rows or args.format_ood_rows):
        raise SystemExit(
            "error: --plain-share 1 leaves no row in the protocol format; the start model must learn it "
            "from some rows (lower it, e.g. 0.9, or add --format-rows N to teach it on another task)"
        )
    if args.format_rows > train_rows:
        raise SystemExit(
            f"error: --format-rows {args.format_rows} is more than the {train_rows} train rows it takes its images from"
        )
    parts = []
    if protocol_index:
        parts.append(
            proxy.to_sft_dataset(
                train_split.select(protocol_index),
                args.templates,
                seed=args.seed,
                style=args.target_style,
                think_share=args.think_share,
                think_noise=args.think_noise,
            )
        )
    if args.format_rows:
        parts.append(
            proxy.to_arithmetic_sft_dataset(
                train_split.select(range(args.format_rows)),
                args.templates,
                seed=args.seed,
                style=args.target_style,
                think_share=args.think_share,
            )
        )
    exposure_split = (
        data_lib.load_counting_dataset(os.path.join(args.data, proxy.EXPOSURE_SPLIT)) if args.ood_exposure else None
    )
    format_ood_rows = 0
    if args.format_ood_rows:
        format_ood_rows = min(args.format_ood_rows, len(exposure_split))
        # seed + 1: other sums than the CLEVR-image format rows draw
        parts.append(
            proxy.to_arithmetic_sft_dataset(
                exposure_split.select(range(format_ood_rows)),
                args.templates,
                seed=args.seed + 1,
                style=args.target_style,
                think_share=args.think_share,
            )
        )
    if plain_index:
        parts.append(proxy.to_exposure_sft_dataset(train_split.select(plain_index)))
    exposure_rows = min(args.ood_exposure, len(exposure_split)) if args.ood_exposure else 0
    if exposure_rows:
        parts.append(proxy.to_exposure_sft_dataset(exposure_split.select(range(exposure_rows))))
    # every part cast to the first one's schema
    train_dataset = datasets.concatenate_datasets([parts[0], *(part.cast(parts[0].features) for part in parts[1:])])

    # 2. model (random init, seeded) + processor with the real ids and chat template
    set_seed(args.seed)
    overrides = {**proxy.MODEL_PRESETS[args.preset], **parse_overrides(args.model_override)}
    config = tiny_model.build_config(**overrides)
    model = tiny_model.build_model(config, seed=args.seed).train()
    processor = tiny_model.build_processor(
        tiny_model.build_tokenizer(), min_pixels=args.min_pixels, max_pixels=args.max_pixels
    )
    processor.tokenizer.padding_side = "left"  # generation (evaluation, GRPO) pads left; TRL's collator sets its own
    parameters = sum(p.numel() for p in model.parameters())
    log(
        f"[sft] model: {parameters / 1e6:.1f}M parameters ({overrides}); train rows {train_rows} + OOD exposure "
        f"rows {exposure_rows}, of the train rows {len(plain_index)} plain and {len(protocol_index)} in the protocol "
        f"format, + {args.format_rows} + {format_ood_rows} (OOD images) arithmetic rows in the format; quick-check "
        f"rows {dev_size}, target style {args.target_style} (think share {args.think_share:g}, think noise "
        f"{args.think_noise:g}), templates {args.templates}"
    )

    # 3. SFT
    steps_per_epoch = max(1, math.ceil(len(train_dataset) / args.batch_size))
    max_steps = args.max_steps
    if args.epochs is not None:
        by_epochs = max(1, math.ceil(args.epochs * steps_per_epoch))
        max_steps = by_epochs if max_steps is None else min(max_steps, by_epochs)
    # the engine's SFT pieces: the wall-clock cap (clock from the end of step 1) and the step/time-aware cosine
    cap = TimeCapCallback(60.0 * args.max_minutes if args.max_minutes else None)
    multiplier = lr_multiplier(
        cap, max_steps, SFTSettings(schedule="cosine", warmup=args.warmup, min_lr_ratio=args.min_lr_ratio)
    )
    history: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sft-warmstart-") as trainer_dir:
        sft_args = SFTConfig(
            output_dir=trainer_dir,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=1,
            learning_rate=args.lr,
            weight_decay=args.weight_decay,
            adam_beta2=0.98,
            max_grad_norm=1.0,
            max_steps=max_steps if max_steps is not None else 10**7,  # time-capped runs stop through the callback
            logging_steps=1 if args.tiny else 25,
            save_strategy="no",
            report_to="none",
            bf16=use_cuda,
            activation_checkpointing=False,
            dataloader_num_workers=args.workers,
            dataloader_persistent_workers=args.workers > 0,
            dataloader_prefetch_factor=4 if args.workers > 0 else None,
            seed=args.seed,
            data_seed=args.seed,
            max_length=None,  # never cut image tokens; rows are ~100-200 tokens
            completion_only_loss=True,
            packing=False,
            disable_tqdm=True,
            use_cpu=not use_cuda,
        )
        trainer_class = capped_trainer_class()
        trainer_class.multiplier = staticmethod(multiplier)
        callback = make_callback(cap, dev_split, processor, args, history, log)
        trainer = trainer_class(
            model=model,
            args=sft_args,
            train_dataset=train_dataset,
            processing_class=processor,
            callbacks=[cap, callback],
        )
        train_begin = time.time()
        trainer.train()
        train_seconds = time.time() - train_begin
        steps = int(trainer.state.global_step)
        losses = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
        model = trainer.accelerator.unwrap_model(trainer.model)
    stop_reason = callback.stop_reason or (
        "wall-clock cap" if cap.stopped else "max steps" if max_steps and steps >= max_steps else "end of data"
    )
    log(f"[sft] {steps} steps ({steps / steps_per_epoch:.2f} epochs) in {train_seconds:.1f} s; stop: {stop_reason}")

    # 4. save, reload the way training/selfcheck do, score val with the protocol
    out_dir = Path(args.out)
    model.eval()
    modeling.save_model_dir(model, processor, out_dir)
    del trainer
    loaded = modeling.load_model(str(out_dir), dtype="float32").to(device).eval()
    loaded_processor = modeling.load_processor(str(out_dir))

    def score(split: str, plain: bool = False):
        dataset = data_lib.load_counting_dataset(os.path.join(args.data, split))
        how = {"template": proxy.PLAIN_PROMPT, "extract": proxy.plain_count} if plain else {}
        result = evaluate_dataset(
            loaded,
            loaded_processor,
            dataset,
            name=split,
            batch_size=args.eval_batch_size,
            limit=args.eval_limit,
            max_new_tokens=args.eval_max_new_tokens,
            progress=False,
            **how,
        )
        what = "asked plainly, first integer (diagnostic)" if plain else "selfcheck protocol"
        log(
            f"[sft] {split} ({what}, {result.n} rows, max_new_tokens {args.eval_max_new_tokens}): "
            f"accuracy {result.accuracy_pct:.2f}% format {result.format_pct:.2f}% mean tokens "
            f"{result.mean_completion_tokens:.1f} truncated {result.truncated_pct:.2f}%"
        )
        return result

    report = score("val")
    # what the exposure bought: counting on the OOD renderer under the protocol
    ood_report = score("ood_val") if exposure_rows else None
    # what the model knows when asked the way its plain rows taught: the gap to the protocol is what RL can close
    plain_splits = (["val"] if plain_index else []) + (["ood_val"] if exposure_rows else [])
    plain_reports = {split: score(split, plain=True) for split in plain_splits}
    # "counts moderately well": under the protocol, or, when no counting row was taught in the format (the format
    # learned on arithmetic only), asked plainly; the protocol score of such a start is meant to be low
    knows, how = (plain_reports["val"], "asked plainly") if not protocol_index else (report, "under the protocol")
    if not args.tiny and not 30.0 <= knows.accuracy_pct <= 70.0:
        log(
            f"[sft] WARNING: val accuracy {how} {knows.accuracy_pct:.1f}% is outside the 'moderate' 30-70% band the "
            "proxy experiment wants (raise --max-minutes/--epochs if lower; lower --stop-at-acc if higher)"
        )

    sft_report = {
        "command": command,
        "args": vars(args),
        "device": torch.cuda.get_device_name(0) if use_cuda else "cpu",
        "parameters": parameters,
        "parameters_m": parameters / 1e6,
        "model_overrides": overrides,
        "target_style": args.target_style,
        "think_share": args.think_share,
        "think_noise": args.think_noise,
        "templates": args.templates,
        "train_rows": train_rows,
        "ood_exposure_rows": exposure_rows,
        "ood_exposure_form": "question alone -> bare number (experiments.proxy.proxy.to_exposure_sft_dataset)",
        "plain_share": args.plain_share,
        "plain_train_rows": len(plain_index),
        "protocol_train_rows": len(protocol_index),
        "format_rows": args.format_rows,
        "format_ood_rows": format_ood_rows,
        "sft_rows": len(train_dataset),
        "quick_check_rows": dev_size,
        "batch_size": args.batch_size,
        "steps": steps,
        "epochs": steps / steps_per_epoch,
        "train_seconds": train_seconds,
        "total_seconds": time.time() - started,
        "stop_reason": stop_reason,
        "loss_first": losses[0][1] if losses else None,
        "loss_last": losses[-1][1] if losses else None,
        "loss_curve": losses[:: max(1, len(losses) // 200)],
        "quick_checks": history,
        "data": {
            "dir": os.path.abspath(args.data),
            **data_info,
            "image_size": args.image_size,
            "ood_image_size": args.ood_image_size,
        },
        "val": {
            **report.summary(),
            "by_count": proxy.by_count(report.records),
            "max_new_tokens": args.eval_max_new_tokens,
        },
        "ood_val": ({**ood_report.summary(), "by_count": proxy.by_count(ood_report.records)} if ood_report else None),
        # diagnostic, not the protocol: the question alone, first integer of the answer
        # (experiments.proxy.proxy.plain_count)
        "asked_plainly": {
            split: {**result.summary(), "by_count": proxy.by_count(result.records)}
            for split, result in plain_reports.items()
        },
    }
    proxy.write_json(out_dir / REPORT_FILE, sft_report)
    log(f"[sft] saved {out_dir} ({time.time() - started:.1f} s total); report {out_dir / REPORT_FILE}")
    return sft_report


if __name__ == "__main__":
    main()
