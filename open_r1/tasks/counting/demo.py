"""The CPU demo: a small Qwen2-VL learns to count under the grader's protocol, start and trained model side by side.

    python -m open_r1.tasks.counting.demo --out runs/demo         # `make demo`; measured time in docs/DEMO.md

Steps, each on the code the real pipeline runs (docs/DEMO.md explains them and has the measured run):
  1. data: easy CLEVR-style splits (1-5 objects, 168x112 px) from `scenes.write_splits` into `<out>/data`;
  2. start model: the shipped warm start, or one trained here (`--from-scratch`, `--build-start`): a small-vocabulary
     Qwen2-VL from random init, SFT (`open_r1.sft.train_sft`) on plain counting rows + the protocol format taught on
     arithmetic rows (`open_r1.tasks.counting.sft`);
  3. GRPO with `configs/demo.yaml` through `open_r1.grpo` and `open_r1.submission.export`, as `train.sh` runs them;
  4. the selfcheck protocol on val, compositional and ood_val for the start and the trained model: a side-by-side
     table, `<out>/demo.json`, `<out>/acc_by_count.png` and `<out>/curves.png`.
"""

import argparse
import logging
import math
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from open_r1 import grpo, tiny_models
from open_r1.errors import setup_logging
from open_r1.jsonio import read_json, write_json
from open_r1.modeling import load_model, load_processor
from open_r1.noise import quiet_library_noise
from open_r1.run.keep_best import load_history, plot_history
from open_r1.sft import SFTSettings, train_sft
from open_r1.submission.export import export_submission
from open_r1.tasks.counting import protocol, sft
from open_r1.tasks.counting.data import load_counting_dataset
from open_r1.tasks.counting.evaluate import evaluate_dataset
from open_r1.tasks.counting.scenes import write_splits

EVAL_SPLITS = ("val", "compositional", "ood_val")
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_RECIPE = "configs/demo.yaml"
# The warm start the repo ships (built by `make demo-start`, command and numbers in its start_report.json).
SHIPPED_START = Path(__file__).resolve().parent / "demo_start"
START_REPORT = "start_report.json"

# The demo model: Qwen2-VL classes at a size that trains in minutes on 2 CPU cores.
DEMO_MODEL = dict(
    hidden_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=384,
    vision_depth=2,
    vision_embed_dim=64,
    vision_num_heads=4,
    vision_mlp_ratio=2,
    max_position_embeddings=4096,
    dtype="float32",
)
DEMO_IMAGE_SIZE = "168x112"  # multiples of 28 px: 6 x 4 = 24 merged vision tokens, never resampled
DEMO_MAX_PIXELS = 168 * 112
DEMO_MIN_OBJECTS, DEMO_MAX_OBJECTS = 1, 5

logger = logging.getLogger(__name__)


# ---- Demo model ------------------------------------------------------------------------------------------------------
def build_demo_model(seed: int = 0):
    """(model, processor): random-init Qwen2-VL with the small vocabulary; every config id points at the new ids."""
    pixels = (tiny_models.REAL_MIN_PIXELS, DEMO_MAX_PIXELS)
    model, processor = tiny_models.small_vocab_model("qwen2_vl", seed, pixels, model_max_length=4096, **DEMO_MODEL)
    processor.tokenizer.padding_side = "left"
    return model, processor


# ---- Steps -----------------------------------------------------------------------------------------------------------
def render_data(data_dir: Path, args) -> None:
    import datasets

    sizes = {"train": args.train_size, **dict.fromkeys(EVAL_SPLITS, args.eval_size)}
    present = {}
    for split in sizes:
        try:
            present[split] = len(datasets.load_from_disk(str(data_dir / split)))
        except (FileNotFoundError, ValueError):
            present[split] = 0
    missing = {split: n for split, n in sizes.items() if present[split] < n}
    if not missing:
        logger.info(f"[demo] data: reusing {data_dir} {present}")
        return
    started = time.time()
    write_splits(
        str(data_dir),
        missing,
        seed=args.seed,
        overwrite=True,
        workers=args.workers,
        image_size=DEMO_IMAGE_SIZE,
        ood_image_size=DEMO_IMAGE_SIZE,
        min_objects=DEMO_MIN_OBJECTS,
        max_objects=DEMO_MAX_OBJECTS,
        progress=False,
    )
    logger.info(
        f"[demo] data: rendered {missing} into {data_dir} in {time.time() - started:.0f} s "
        f"({DEMO_IMAGE_SIZE}, {DEMO_MIN_OBJECTS}-{DEMO_MAX_OBJECTS} objects)"
    )


def warm_start(data_dir: Path, out_dir: Path, args) -> dict:
    """Random init -> full SFT (`open_r1.sft.train_sft`): plain counting rows + the format on arithmetic rows."""
    import datasets
    import torch

    started = time.time()
    train = load_counting_dataset(str(data_dir / "train"))
    plain = sft.to_exposure_sft_dataset(train)  # question alone -> bare number
    n_format = min(args.format_rows, len(train))
    fmt = sft.to_arithmetic_sft_dataset(
        train.select(range(n_format)), ["eval:0.5", "train:0.5"], seed=args.seed, style="mixed", think_share=0.5
    )
    rows = datasets.concatenate_datasets([fmt, plain.cast(fmt.features)]).shuffle(seed=args.seed)
    model, processor = build_demo_model(seed=args.seed)
    parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        f"[demo] warm start: {parameters / 1e6:.2f}M-parameter Qwen2-VL (vocab {model.config.text_config.vocab_size}),"
        f" SFT on {len(plain)} plain counting rows + {n_format} arithmetic rows in the protocol format, "
        f"{args.sft_steps} steps"
    )
    use_cuda = torch.cuda.is_available() and args.device != "cpu"
    torch.set_num_threads(max(1, args.threads))
    # cosine with a 5 % warm-up down to 0, AdamW beta2 0.98: the shipped start's settings (it was built by the older
    # hand-made loop, whose first step had lr 0 where train_sft's warm-up starts at 1e-3 x lr)
    warmup_steps = max(1, args.sft_steps // 20)
    settings = SFTSettings(
        learning_rate=args.sft_lr,
        schedule="cosine",
        warmup=warmup_steps / args.sft_steps,
        min_lr_ratio=0.0,
        epochs=None,
        max_steps=args.sft_steps,
        per_device_batch_size=args.sft_batch_size,
        gradient_accumulation_steps=1,
        weight_decay=0.01,
        lora_r=0,
        bf16=False,
        seed=args.seed,
        dataloader_workers=args.workers if use_cuda else 0,
        extra={"adam_beta2": 0.98, "use_cpu": not use_cuda},
    )
    report = train_sft(rows, str(out_dir), settings, model=model, processor=processor)
    seconds = time.time() - started
    logger.info(f"[demo] warm start saved to {out_dir} in {seconds:.0f} s")
    info = {
        "command": args.command,
        "device": torch.cuda.get_device_name(0) if use_cuda else "cpu",
        "parameters": parameters,
        "sft_rows": len(rows),
        "plain_rows": len(plain),
        "format_rows": n_format,
        "steps": args.sft_steps,
        "batch_size": args.sft_batch_size,
        "lr": args.sft_lr,
        "seconds": seconds,
        "loss_first": report["loss_first"],
        "loss_last": report["loss_last"],
    }
    write_json(out_dir / START_REPORT, info)
    return info


def evaluate_model(model_dir: Path, data_dir: Path, args, label: str) -> dict:
    """The selfcheck protocol on every eval split, and val asked plainly; {split: SetReport}."""
    import torch

    torch.set_num_threads(max(1, args.threads))
    model = load_model(str(model_dir), dtype="float32").eval()
    processor = load_processor(str(model_dir))
    protocol_kwargs = {"batch_size": args.eval_batch_size, "limit": args.eval_limit, "progress": False}
    started = time.time()
    reports = {
        split: evaluate_dataset(
            model, processor, load_counting_dataset(str(data_dir / split)), name=split, **protocol_kwargs
        )
        for split in EVAL_SPLITS
    }
    logger.info(
        f"[demo] {label}: "
        + ", ".join(f"{s} {r.accuracy_pct:.1f}%" for s, r in reports.items())
        + f" ({time.time() - started:.0f} s)"
    )
    # diagnostic, not the protocol: the question alone, first integer of the answer
    probe = evaluate_dataset(
        model,
        processor,
        load_counting_dataset(str(data_dir / "val")),
        name="val (asked plainly)",
        max_new_tokens=8,
        **protocol_kwargs,
        template=sft.PLAIN_PROMPT,
        extract=sft.plain_count,
    )
    reports["val_plain"] = probe
    logger.info(f"[demo] {label}, val asked plainly (diagnostic): {probe.accuracy_pct:.1f}%")
    return reports


def train_grpo(start_dir: Path, data_dir: Path, run_dir: Path, submission: Path, args) -> dict:
    """GRPO with configs/demo.yaml through open_r1.grpo (as train.sh runs it), then open_r1.submission.export."""

    started = time.time()
    recipe = args.recipe if os.path.isfile(args.recipe) else str(REPO_ROOT / args.recipe)
    argv = [
        "--config",
        recipe,
        "--model_name_or_path",
        str(start_dir),
        "--dataset_name",
        str(data_dir / "train"),
        "--output_dir",
        str(run_dir),
        "--use_cpu",
        "true",
        "--eval_sets",
        str(data_dir / "val"),
        str(data_dir / "compositional"),
        *args.grpo_args,
    ]
    if args.grpo_steps is not None:
        argv += ["--max_steps", str(args.grpo_steps)]
    logger.info(f"[demo] GRPO: python -m open_r1.grpo {' '.join(argv)}")
    script_args, training_args, model_args, task = grpo.parse_args(argv)
    trainer = grpo.main(script_args, training_args, model_args, task)
    steps = int(trainer.state.global_step)
    log_history = list(trainer.state.log_history)
    del trainer
    export_submission(str(run_dir), str(submission))
    seconds = time.time() - started
    logger.info(f"[demo] GRPO: {steps} steps in {seconds:.0f} s; exported to {submission}")
    return {"steps": steps, "seconds": seconds, "log_history": log_history}


# ---- Report ----------------------------------------------------------------------------------------------------------
def wilson_halfwidth(pct: float, n: int) -> float:
    """95 % half-width (points) of an accuracy measured on n rows: the noise of one evaluation."""
    if n <= 0:
        return float("nan")
    p = pct / 100.0
    return 100.0 * 1.96 * math.sqrt(max(p * (1 - p), 1.0 / n) / n)


def side_by_side(before: dict, after: dict) -> str:
    header = (
        "| split | n | start acc % | trained acc % | gain (points) | 95% noise ± | one constant answer % | "
        "start format % | trained format % | start tokens | trained tokens |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = []
    for split in EVAL_SPLITS:
        b, a = before[split], after[split]
        noise = math.hypot(wilson_halfwidth(b.accuracy_pct, b.n), wilson_halfwidth(a.accuracy_pct, a.n))
        rows.append(
            f"| {split} | {a.n} | {b.accuracy_pct:.1f} | {a.accuracy_pct:.1f} | "
            f"{a.accuracy_pct - b.accuracy_pct:+.1f} | {noise:.1f} | {constant_answer_pct(a.records):.1f} | "
            f"{b.format_pct:.1f} | {a.format_pct:.1f} | "
            f"{b.mean_completion_tokens:.1f} | {a.mean_completion_tokens:.1f} |"
        )
    return "\n".join([header, *rows])


def constant_answer_pct(records: list[dict]) -> float:
    """Accuracy of always answering the split's most frequent gold count: the floor a collapsed policy reaches."""
    golds = [int(r["gold"]) for r in records]
    return 100.0 * max(golds.count(g) for g in set(golds)) / len(golds) if golds else float("nan")


def by_count(records: list[dict]) -> dict[int, tuple[int, int]]:
    """{gold count: (correct, rows)}."""
    rows = Counter(int(r["gold"]) for r in records)
    correct = Counter(int(r["gold"]) for r in records if r["correct"])
    return {gold: (correct[gold], rows[gold]) for gold in sorted(rows)}


def write_plots(before: dict, after: dict, log_history: list[dict], eval_history: dict, out: Path) -> None:
    """`acc_by_count.png` (accuracy by gold count, start vs trained) and `curves.png` (in-training eval, reward:
    `keep_best.plot_history`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(EVAL_SPLITS), figsize=(4 * len(EVAL_SPLITS), 3.4), sharey=True)
    for ax, split in zip(axes, EVAL_SPLITS):
        for label, reports, offset in (("start", before, -0.2), ("trained", after, 0.2)):
            table = by_count(reports[split].records)
            ax.bar(
                [g + offset for g in table],
                [100.0 * c / max(n, 1) for c, n in table.values()],
                width=0.4,
                label=f"{label} ({reports[split].accuracy_pct:.0f}%)",
            )
        ax.set(title=split, xlabel="gold count", ylim=(0, 100))
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("accuracy % (selfcheck protocol)")
    fig.tight_layout()
    fig.savefig(out / "acc_by_count.png", dpi=100)
    plt.close(fig)

    plot_history(eval_history, log_history, str(out / "curves.png"))  # the training run's own plot, kept here


# ---- Command line ----------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--out", default="runs/demo", help="everything goes here: data, models, run, report, plots")
    parser.add_argument(
        "--start",
        help=f"start model dir (default: the shipped warm start {SHIPPED_START.relative_to(REPO_ROOT)}"
        ", or one trained first when it is missing or with --from-scratch)",
    )
    parser.add_argument(
        "--from-scratch",
        action="store_true",
        help="train the warm start first (SFT from random init, into <out>/start)",
    )
    parser.add_argument(
        "--build-start",
        metavar="DIR",
        help="only build a warm start into DIR (data, SFT, start_report.json), then stop",
    )
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help="GRPO recipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--train-size",
        type=int,
        help="train rows rendered (GRPO prompts; also the SFT rows when a start is trained). "
        "Default 400, or 4000 when a start is trained",
    )
    parser.add_argument("--eval-size", type=int, default=200, help="rows rendered per eval split")
    parser.add_argument("--eval-limit", type=int, default=200, help="rows scored per split (selfcheck --limit)")
    parser.add_argument("--eval-batch-size", type=int, default=100)
    parser.add_argument("--format-rows", type=int, default=500, help="arithmetic rows that teach the protocol format")
    parser.add_argument("--sft-steps", type=int, default=1500)
    parser.add_argument("--sft-batch-size", type=int, default=64)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument(
        "--device",
        help="SFT device: cuda / cpu (default: cuda when available); GRPO and the evaluation run on CPU",
    )
    parser.add_argument("--grpo-steps", type=int, help="GRPO steps (default: the recipe's max_steps)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: on a loaded 2-core machine more threads ran slower; docs/DEMO.md)",
    )
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="scene rendering processes")
    parser.add_argument("grpo_args", nargs="*", help="extra recipe overrides after --, e.g. -- --learning_rate 1e-3")
    args = parser.parse_args(argv)
    if args.sft_steps < 1:
        parser.error(f"--sft-steps must be >= 1, got {args.sft_steps}")
    args.command = "python -m open_r1.tasks.counting.demo " + " ".join(sys.argv[1:] if argv is None else argv)
    args.trains_start = bool(
        args.build_start or args.from_scratch or (args.start is None and not (SHIPPED_START / "config.json").is_file())
    )
    if args.train_size is None:
        args.train_size = 4000 if args.trains_start else 400
    return args


def main(argv=None) -> int:
    setup_logging()
    quiet_library_noise(progress_bars=False)
    args = parse_args(argv)

    started = time.time()
    out = Path(args.out).resolve()
    data_dir, run_dir, submission = out / "data", out / "grpo", out / "trained"
    out.mkdir(parents=True, exist_ok=True)
    timings = {}

    def lap(name: str) -> None:  # seconds since the previous lap
        timings[name] = time.time() - started - sum(timings.values())

    render_data(data_dir, args)
    lap("data_s")
    sft_info = None
    if args.build_start:
        start_dir = Path(args.build_start)
        sft_info = warm_start(data_dir, start_dir, args)
        before = evaluate_model(start_dir, data_dir, args, "warm start (selfcheck protocol)")
        sft_info["eval"] = {split: report.summary() for split, report in before.items()}
        write_json(start_dir / START_REPORT, sft_info)
        return 0
    if args.trains_start:
        start_dir = out / "start"
        sft_info = warm_start(data_dir, start_dir, args)
    else:
        start_dir = Path(args.start).resolve() if args.start else SHIPPED_START
        logger.info(
            f"[demo] start model: {start_dir} (warm start; rebuild it with `make demo-start`, or train one "
            "first with --from-scratch)"
        )
    lap("warm_start_s")
    before = evaluate_model(start_dir, data_dir, args, "start model (selfcheck protocol)")
    lap("eval_start_s")
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh GRPO run (auto-resume would continue an old one)
    grpo_info = train_grpo(start_dir, data_dir, run_dir, submission, args)
    lap("grpo_s")
    after = evaluate_model(submission, data_dir, args, "trained model (selfcheck protocol)")
    lap("eval_trained_s")
    total = time.time() - started

    table = side_by_side(before, after)
    write_plots(before, after, grpo_info["log_history"], load_history(str(run_dir)), out)
    report = {
        "command": args.command,
        "total_seconds": total,
        "timings_s": timings,
        "load_average": os.getloadavg(),
        "protocol": {
            "template": protocol.EVAL_TEMPLATE,
            "max_new_tokens": protocol.EVAL_MAX_NEW_TOKENS,
            "decoding": "greedy",
            "limit": args.eval_limit,
        },
        "start_model": str(start_dir),
        "trained_model": str(submission),
        "start_report": read_json(start_dir / START_REPORT, None),
        "warm_start": sft_info,
        "grpo": {"steps": grpo_info["steps"], "seconds": grpo_info["seconds"], "recipe": args.recipe},
        "splits": {
            split: {
                "constant_answer_pct": constant_answer_pct(after[split].records),
                "start": {**before[split].summary(), "by_count": by_count(before[split].records)},
                "trained": {**after[split].summary(), "by_count": by_count(after[split].records)},
            }
            for split in EVAL_SPLITS
        },
        "samples": {
            split: {
                "start": before[split].records[0]["completion"][:120],
                "trained": after[split].records[0]["completion"][:120],
            }
            for split in EVAL_SPLITS
        },
    }
    write_json(out / "demo.json", report)
    print()
    print(f"Start model (SFT warm start) vs trained model (+{grpo_info['steps']} GRPO steps), selfcheck protocol:")
    print(table)
    for split in EVAL_SPLITS:
        print(
            f"  {split} sample (gold {before[split].records[0]['gold']}): start "
            f"{' '.join(report['samples'][split]['start'].split())[:70]!r} -> trained "
            f"{' '.join(report['samples'][split]['trained'].split())[:70]!r}"
        )
    print(
        f"[demo] {total / 60:.1f} min in all ({', '.join(f'{k[:-2]} {v:.0f} s' for k, v in timings.items())}); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"[demo] report {out / 'demo.json'}; plots {out / 'acc_by_count.png'}, {out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
