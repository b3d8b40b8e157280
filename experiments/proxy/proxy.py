"""The proxy experiment: a small Qwen2-VL that learns to count on our scenes, so that the whole method can be measured.

The real Qwen2-VL-2B weights cannot be obtained here, so a Qwen2-VL-architecture model of tens of millions of
parameters (`open_r1.tiny_models`) is warm-started by SFT (`sft_warmstart.py`), trained further with GRPO under
several recipes (`proxy_experiment.py`) and scored with the grader's protocol. This module holds what they share:
presets, the arms, the worker that runs one arm (``python -m experiments.proxy.proxy worker --spec spec.json``), the
equal-rollout stop of concurrent arms, and the report (markdown tables and the accuracy-by-gold-count plot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from open_r1.jsonio import read_json, read_recipe, write_json
from open_r1.tasks.counting import protocol

# the SFT rows live in the package (the CPU demo uses the same rows); re-exported for the proxy's scripts and tests
from open_r1.tasks.counting.sft import (  # noqa: F401
    EXPOSURE_TEMPLATE,
    PLAIN_PROMPT,
    TARGET_STYLES,
    plain_count,
    sft_target,
    split_plain_rows,
    to_arithmetic_sft_dataset,
    to_exposure_sft_dataset,
    to_sft_dataset,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PROXY_CONFIG_DIR = REPO_ROOT / "experiments" / "proxy" / "configs"
EVAL_SPLITS = ("val", "compositional", "ood_val")
EXPOSURE_SPLIT = "ood_train"  # OOD-renderer scenes the warm start sees without the protocol (sft_warmstart.py)
ALL_SPLITS = ("train", *EVAL_SPLITS, EXPOSURE_SPLIT)
RESULTS_SCHEMA = 1

# --- Model presets (overrides for open_r1.tiny_models.build_config). The embedding (151936 rows, the real vocabulary,
# so token ids mean what they mean in Qwen2-VL-2B) dominates the parameter count; the rest is small enough to train
# from scratch in minutes on one H200.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # 47.6M parameters: 38.9M in the tied real-size embedding, 8.7M in the vision tower and the decoder.
    "small": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vision_depth": 4,
        "vision_embed_dim": 256,
        "vision_num_heads": 4,
        "vision_mlp_ratio": 4,
        "dtype": "float32",
    },
    # open_r1.tiny_models defaults (~10M, hidden 64): CPU tests only.
    "tiny": {"dtype": "float32"},
}

# Data: CLEVR splits rendered at 0.7x CLEVR's 480x320 so that 10k training images render in well under a minute on
# 16 cores; OOD keeps its own 4:3 ratio. Both sides are multiples of 28 px, so the Qwen2-VL processor does not
# resample (28 px per merged vision token): 336x224 -> 12x8 = 96 tokens, 336x252 -> 12x9 = 108 tokens.
PROXY_IMAGE_SIZE = "336x224"
PROXY_OOD_IMAGE_SIZE = "336x252"
PROXY_SIZES = {"train": 10000, "val": 400, "compositional": 400, "ood_val": 400}
TINY_IMAGE_SIZE = "112x84"
TINY_OOD_IMAGE_SIZE = "112x84"
TINY_SIZES = {"train": 24, "val": 4, "compositional": 4, "ood_val": 4}
# OOD-renderer exposure rows of the warm start (split ood_train; experiments/proxy/sft_warmstart.py --ood-exposure)
PROXY_EXPOSURE_ROWS = 3000
TINY_EXPOSURE_ROWS = 4

# Pixel budget of the proxy recipes (as configs/qwen2vl_2b_counting.yaml: 512 tokens, images are not downscaled).
PROXY_MIN_PIXELS = 3136
PROXY_MAX_PIXELS = 401408
TINY_MAX_PIXELS = 12544


# --- Data -------------------------------------------------------------------------------------------------------------
def split_sizes_on_disk(data_dir: str | os.PathLike) -> dict[str, int]:
    """{split: rows} for the save_to_disk splits present in `data_dir`."""
    import datasets

    sizes = {}
    for split in ALL_SPLITS:
        path = Path(data_dir) / split
        if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
            try:
                sizes[split] = len(datasets.load_from_disk(str(path)))
            except Exception:  # noqa: BLE001 - a broken split is regenerated
                continue
    return sizes


def ensure_splits(
    data_dir: str | os.PathLike,
    sizes: dict[str, int],
    seed: int = 0,
    image_size: str | None = None,
    ood_image_size: str | None = None,
    workers: int | None = None,
    progress: bool = True,
    log=print,
    required: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Render (`scenes.write_splits`) the splits of `sizes` ({split: rows}) that `data_dir` lacks or holds fewer rows of
    than `required` asks (default `sizes`); the others are reused untouched. Returns {generated, sizes, seconds, stats}.
    """
    start = time.perf_counter()
    present = split_sizes_on_disk(data_dir)
    need = required or sizes
    short = {split: n for split, n in sizes.items() if present.get(split, 0) < need.get(split, 1)}
    if not short:
        log(f"[data] reusing {data_dir}: {present}")
        return {"generated": False, "sizes": present, "seconds": 0.0, "stats": {}}
    from open_r1.tasks.counting.scenes import write_splits

    stats: dict = {}
    log(
        f"[data] rendering {short} into {data_dir} (clevr {image_size or 'default'}, ood {ood_image_size or 'default'})"
    )
    write_splits(
        str(data_dir),
        short,
        seed=seed,
        overwrite=True,
        workers=workers,
        image_size=image_size,
        ood_image_size=ood_image_size,
        progress=progress,
        stats=stats,
    )
    seconds = time.perf_counter() - start
    log(f"[data] rendered in {seconds:.1f} s")
    return {"generated": True, "sizes": split_sizes_on_disk(data_dir), "seconds": seconds, "stats": stats}


# --- Arms -------------------------------------------------------------------------------------------------------------
LOW_LR_FACTOR = 0.3  # the low_lr arm: 1e-4 -> 3e-5
THINK_ARM_BUDGET = 24  # the think arm's free thinking tokens (the first recipe's 96 of 256, scaled to the 64 cap)


@dataclass
class Arm:
    """One recipe of the experiment: a proxy YAML plus overrides (computed from the YAML, so they stay consistent)."""

    name: str
    config: str  # file name in experiments/proxy/configs/
    role: str  # baseline | recipe | ablation
    question: str  # what the row answers
    change: str  # what differs from its config, in words

    def config_path(self) -> Path:
        return PROXY_CONFIG_DIR / self.config


ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in [
        Arm(
            "weak_baseline",
            "weak_baseline.yaml",
            "baseline",
            "the inherited weak setup",
            "answer_tag reward only, train template only, G=4, beta 0.04",
        ),
        Arm(
            "ours",
            "ours.yaml",
            "recipe",
            "the proposed recipe",
            "exact + format (no think block required) + soft + length (thinking charged from its first token) rewards, "
            "eval/train template mix, G=8, beta 0.01, DAPO loss",
        ),
        Arm(
            "think",
            "ours.yaml",
            "ablation",
            "short vs no thinking",
            "format requires the `<think>` block and the length penalty allows 24 thinking tokens (the first recipe)",
        ),
        Arm("exact_only", "ours.yaml", "ablation", "exact vs exact + soft reward", "soft_count reward removed"),
        Arm("no_kl", "ours.yaml", "ablation", "KL on/off", "beta 0 (no reference model)"),
        Arm("g4", "ours.yaml", "ablation", "group size", "num_generations 4 (same completions per step: 2x prompts)"),
        Arm("train_template", "ours.yaml", "ablation", "template mixing on/off", "train template only"),
        Arm(
            "lora",
            "ours.yaml",
            "ablation",
            "LoRA vs full fine-tuning",
            "LoRA r=16 alpha=32 on the language model, learning rate x5",
        ),
        Arm(
            "frozen_vit",
            "ours.yaml",
            "ablation",
            "train or freeze the vision tower (a speed lever)",
            "freeze_vision: the ViT blocks stay as loaded; language model and merger train",
        ),
        Arm(
            "noisy_rollouts",
            "ours.yaml",
            "ablation",
            "clean vs clean + noisy-image rollouts (NoisyRollout-style)",
            "half of each group generated and trained on the image with Gaussian noise (std 0.1)",
        ),
        Arm(
            "low_lr",
            "ours.yaml",
            "ablation",
            "learning rate",
            f"learning rate x{LOW_LR_FACTOR:g} (the first proxy runs' 3e-5)",
        ),
    ]
}
MAIN_ARMS = ("weak_baseline", "ours")
LORA_LR_FACTOR = 5.0


# the arms whose change is a fixed list of overrides
FIXED_OVERRIDES = {
    "weak_baseline": [],
    "ours": [],
    "no_kl": ["--beta", "0.0"],
    "g4": ["--num_generations", "4"],
    "train_template": ["--prompt_templates", "train:1.0"],
    "frozen_vit": ["--freeze_vision", "true"],
    "noisy_rollouts": ["--noisy_rollouts", "0.5", "--noise_std", "0.1"],
}


def arm_overrides(name: str, learning_rate: float | None = None) -> list[str]:
    """CLI overrides of arm `name` on top of its proxy YAML (empty for weak_baseline and ours).

    `learning_rate` replaces the YAML's learning rate (full fine-tuning; LoRA gets LORA_LR_FACTOR x it)."""
    from open_r1.rewards import parse_reward_kwargs

    if name not in ARMS:
        raise KeyError(f"unknown arm {name!r}; known: {sorted(ARMS)}")
    recipe = read_recipe(ARMS[name].config_path())
    base_lr = float(recipe["learning_rate"]) if learning_rate is None else float(learning_rate)
    if name == "lora":
        return [
            "--use_peft",
            "true",
            "--lora_r",
            "16",
            "--lora_alpha",
            "32",
            "--learning_rate",
            f"{base_lr * LORA_LR_FACTOR:g}",
        ]
    if name == "low_lr":
        return ["--learning_rate", f"{base_lr * LOW_LR_FACTOR:g}"]
    lr_override = [] if learning_rate is None else ["--learning_rate", f"{base_lr:g}"]
    kwargs = dict(parse_reward_kwargs(recipe.get("reward_kwargs")))
    if name == "think":
        kwargs["format"] = {**kwargs.get("format", {}), "require_think": True}
        kwargs["length_penalty"] = {**kwargs.get("length_penalty", {}), "think_budget": THINK_ARM_BUDGET}
        return ["--reward_kwargs", json.dumps(kwargs, sort_keys=True), *lr_override]
    if name == "exact_only":
        funcs = list(recipe["reward_funcs"])
        weights = list(recipe.get("reward_weights") or [1.0] * len(funcs))
        keep = [i for i, f in enumerate(funcs) if f != "soft_count"]
        kwargs.pop("soft_count", None)
        return [
            "--reward_funcs",
            *[funcs[i] for i in keep],
            "--reward_weights",
            *[str(weights[i]) for i in keep],
            "--reward_kwargs",
            json.dumps(kwargs, sort_keys=True),
            *lr_override,
        ]
    return [*FIXED_OVERRIDES[name], *lr_override]


def arm_num_generations(name: str, overrides: list[str] | None = None) -> int:
    recipe = read_recipe(ARMS[name].config_path())
    value = int(recipe.get("num_generations", 8))
    args = list(overrides if overrides is not None else arm_overrides(name))
    for i, token in enumerate(args[:-1]):
        if token == "--num_generations":
            value = int(args[i + 1])
    return value


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(str(a)) for a in argv)


# --- Equal rollouts for concurrent arms -------------------------------------------------------------------------------
def make_sync_callback(progress_path: str | None, control_path: str | None, hard_deadline: float | None):
    """A TrainerCallback: writes {step, times} after every optimizer step, stops at the coordinator's `stop_at`
    (control file) so that concurrent arms end at the same step, i.e. the same number of rollouts, and stops at
    `hard_deadline` (Unix time) whatever happens (that run is then flagged as short)."""
    from transformers import TrainerCallback

    class SyncStopCallback(TrainerCallback):
        first_step_time = stop_reason = None

        def _progress(self, state, **extra):
            if progress_path:
                write_json(
                    progress_path,
                    {
                        "step": int(state.global_step),
                        "first_step_time": self.first_step_time,
                        "last_time": time.time(),
                        "pid": os.getpid(),
                        **extra,
                    },
                )

        def on_train_begin(self, args, state, control, **kwargs):
            self._progress(state, phase="train")

        def on_step_end(self, args, state, control, **kwargs):
            now = time.time()
            if self.first_step_time is None:
                self.first_step_time = now
            self._progress(state, phase="train")
            control_payload = read_json(control_path, None) if control_path else None
            stop_at = (control_payload or {}).get("stop_at")
            if stop_at is not None and state.global_step >= int(stop_at):
                control.should_training_stop = True
                self.stop_reason = f"sync stop_at={int(stop_at)}"
            elif hard_deadline is not None and now >= hard_deadline:
                control.should_training_stop = True
                self.stop_reason = "hard deadline"
            elif state.global_step >= state.max_steps:
                self.stop_reason = "max_steps"
            return control

    return SyncStopCallback()


def decide_stop_at(
    progress: dict[str, dict],
    now: float,
    train_deadline: float,
    max_steps: int,
    safety: float = 0.85,
    min_steps: int = 6,
) -> int | None:
    """The common last step of all running arms, or None while it cannot be decided yet: the step every arm reaches by
    `train_deadline` at `safety` x its rate (measured from its first step, which holds the warm-up, to its latest),
    never below the furthest arm's next step nor above `max_steps`. `progress`: {job: latest record, None before it
    starts; `done` once it ended}."""
    rates = {}
    for job, record in progress.items():
        if record is None:
            return None  # not started: cannot project it yet
        if record.get("done"):
            continue
        step = int(record.get("step") or 0)
        if step < min_steps or record.get("first_step_time") is None:
            return None
        elapsed = float(record["last_time"]) - float(record["first_step_time"])
        if elapsed <= 0:
            return None
        rates[job] = (step - 1) / elapsed
    if not rates:
        return None
    remaining = max(0.0, train_deadline - now)
    projected = [int(progress[job]["step"]) + safety * rate * remaining for job, rate in rates.items()]
    furthest = max(int(progress[job]["step"]) for job in rates)
    return int(min(max_steps, max(math.floor(min(projected)), furthest + 1)))


def raise_stop_at(
    stop_at: int, progress: dict[str, dict], now: float, train_deadline: float, max_steps: int, margin: int = 2
) -> int:
    """`stop_at`, or a later common step when the arms turned out faster than first projected (start-up costs weigh
    on the first rates). Raised only while every arm is at least `margin` steps short of it, never once an arm has
    ended (it stopped on the old value and cannot follow), never lowered."""
    if any(record is not None and record.get("done") for record in progress.values()):
        return stop_at
    steps = [int((record or {}).get("step") or 0) for record in progress.values() if record is not None]
    if not steps or max(steps) > stop_at - margin:
        return stop_at
    candidate = decide_stop_at(progress, now, train_deadline, max_steps)
    return max(stop_at, candidate) if candidate is not None else stop_at


# --- Evaluation (the selfcheck protocol) ------------------------------------------------------------------------------
def by_count(records: list[dict]) -> dict[str, list[int]]:
    """{gold count: [correct, total]} (keys are strings, for JSON)."""
    table: dict[int, list[int]] = {}
    for record in records:
        cell = table.setdefault(int(record["gold"]), [0, 0])
        cell[0] += int(bool(record["correct"]))
        cell[1] += 1
    return {str(k): table[k] for k in sorted(table)}


PREDICTION_TEXT_CHARS = 120  # per-row completion text kept in the proxy's predictions files (logs.tar.gz)


def evaluate_splits(
    model,
    processor,
    data_dir: str,
    splits=EVAL_SPLITS,
    limit: int | None = None,
    batch_size: int = 64,
    max_new_tokens: int = protocol.EVAL_MAX_NEW_TOKENS,
    template: str = protocol.EVAL_TEMPLATE,
    log=print,
    on_split=None,
) -> tuple[dict, dict]:
    """The protocol on each split: ({split: summary + by_count}, {split: [(gold, prediction, tokens, text cut to
    PREDICTION_TEXT_CHARS)]}); `on_split(summaries)` after each split, so a caller can save partial results."""
    from open_r1.tasks.counting.data import load_counting_dataset
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    summaries, predictions = {}, {}
    for split in splits:
        dataset = load_counting_dataset(os.path.join(data_dir, split))
        report = evaluate_dataset(
            model,
            processor,
            dataset,
            name=split,
            batch_size=batch_size,
            limit=limit,
            template=template,
            max_new_tokens=max_new_tokens,
            progress=False,
        )
        summaries[split] = {**report.summary(), "by_count": by_count(report.records)}
        predictions[split] = [
            [r["gold"], r["prediction"], r["completion_tokens"], r["completion"][:PREDICTION_TEXT_CHARS]]
            for r in report.records
        ]
        log(
            f"[eval] {split}: accuracy {report.accuracy_pct:.2f}% format {report.format_pct:.2f}% "
            f"tokens {report.mean_completion_tokens:.1f} n={report.n} ({report.seconds:.1f} s)"
        )
        if on_split is not None:
            on_split(summaries)
    return summaries, predictions


# --- Worker: one arm x seed (or the start model) in its own process ---------------------------------------------------
def _train_curve(log_history: list[dict]) -> dict[str, list]:
    keys = (
        "reward",
        "rewards/exact_count/mean",
        "exact_count/accuracy",
        "completions/mean_length",
        "kl",
        "frac_reward_zero_std",
    )
    curve: dict[str, list] = {"step": []}
    for entry in log_history:
        if "step" not in entry or not any(k in entry for k in keys):
            continue
        curve["step"].append(entry["step"])
        for key in keys:
            curve.setdefault(key, []).append(entry.get(key))
    return curve


def _edge_mean(values: list, head: bool, k: int = 5) -> float | None:
    clean = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not clean:
        return None
    part = clean[:k] if head else clean[-k:]
    return sum(part) / len(part)


def run_worker(spec: dict) -> dict:
    """Run one job described by `spec` and write its result JSON (also on failure). Returns the result."""
    import torch

    result: dict[str, Any] = {
        "job": spec["job"],
        "arm": spec.get("arm"),
        "seed": spec.get("seed"),
        "kind": spec["kind"],
        "status": "running",
        "started": time.time(),
    }
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    eval_cfg = spec["eval"]
    device = "cuda" if torch.cuda.is_available() and not spec.get("cpu") else "cpu"
    result["device"] = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    try:
        if spec["kind"] == "before":
            from open_r1 import modeling

            model = modeling.load_model(spec["model"], dtype="float32").to(device).eval()
            processor = modeling.load_processor(spec["model"])
            result.update(steps=0, rollouts=0, train_seconds=0.0, stop_reason="no training")
        else:
            from open_r1 import grpo

            argv = list(spec["grpo_argv"])
            log(f"[worker] python -m open_r1.grpo {shell_join(argv)}")
            script_args, training_args, model_args = grpo.parse_args(argv)[:3]
            sync = spec.get("sync") or {}
            callback = make_sync_callback(sync.get("progress"), sync.get("control"), sync.get("hard_deadline"))
            trainer = grpo.build_trainer(script_args, training_args, model_args, callbacks=[callback])
            begin = time.time()
            trainer.train()
            train_seconds = time.time() - begin
            steps = int(trainer.state.global_step)
            curve = _train_curve(trainer.state.log_history)
            accuracy_key = (
                "rewards/exact_count/mean"
                if any(v is not None for v in curve.get("rewards/exact_count/mean", []))
                else "exact_count/accuracy"
            )
            result.update(
                steps=steps,
                generation_batch_size=int(training_args.generation_batch_size),
                num_generations=int(training_args.num_generations),
                rollouts=steps * int(training_args.generation_batch_size) * int(training_args.world_size),
                train_seconds=train_seconds,
                seconds_per_step=train_seconds / max(steps, 1),
                stop_reason=callback.stop_reason or "max_steps",
                completion_length_last=_edge_mean(curve.get("completions/mean_length", []), head=False),
                train_curve=curve,
            )
            for name, key in (
                ("train_reward", "reward"),
                ("train_exact", accuracy_key),
                ("zero_std", "frac_reward_zero_std"),
            ):
                result[f"{name}_first"] = _edge_mean(curve.get(key, []), head=True)
                result[f"{name}_last"] = _edge_mean(curve.get(key, []), head=False)
            if sync.get("progress"):
                write_json(sync["progress"], {"step": steps, "done": True, "phase": "eval", "last_time": time.time()})
            model = trainer.accelerator.unwrap_model(trainer.model)
            if hasattr(model, "merge_and_unload"):  # LoRA: score the merged weights, as export would
                model = model.merge_and_unload()
            model.eval()
            processor = trainer.processing_class
            if spec.get("save_model"):
                model.save_pretrained(spec["save_model"])
                processor.save_pretrained(spec["save_model"])
        result["status"] = "evaluating"  # what the coordinator finds if it has to stop this job mid-evaluation
        write_json(spec["result"], result)

        def save_partial(summaries):
            write_json(spec["result"], {**result, "splits": dict(summaries)})

        summaries, predictions = evaluate_splits(
            model,
            processor,
            eval_cfg["data_dir"],
            eval_cfg.get("splits", EVAL_SPLITS),
            eval_cfg.get("limit"),
            eval_cfg.get("batch_size", 64),
            eval_cfg.get("max_new_tokens", protocol.EVAL_MAX_NEW_TOKENS),
            log=log,
            on_split=save_partial,
        )
        result.update(status="ok", splits=summaries)
        if spec.get("predictions"):
            write_json(spec["predictions"], predictions)
    except Exception as exc:  # noqa: BLE001 - a failed arm is a row in the report, not a lost experiment
        traceback.print_exc()
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
    finally:
        result["finished"] = time.time()
        result["wall_seconds"] = result["finished"] - result["started"]
        sync = spec.get("sync") or {}
        if sync.get("progress"):
            record = read_json(sync["progress"], None) or {}
            write_json(sync["progress"], {**record, "done": True, "last_time": time.time()})
        write_json(spec["result"], result)
    return result


# --- Report -----------------------------------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict:
    """mean, sample sd, range (max - min) and n; the range is the 'seed-to-seed spread' the verdict uses."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"n": 0, "mean": None, "sd": None, "range": None, "min": None, "max": None}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "range": max(values) - min(values),
        "min": min(values),
        "max": max(values),
    }


USABLE_STATUSES = ("ok", "partial")  # partial: stopped during evaluation, some splits scored


def ok_runs(results: dict, arm: str) -> list[dict]:
    return [r for r in results.get("runs", []) if r.get("arm") == arm and r.get("status") in USABLE_STATUSES]


def _acc(run: dict | None, split: str):
    cell = ((run or {}).get("splits") or {}).get(split)
    return None if cell is None else cell.get("accuracy_pct")


def _seed_accuracies(results: dict, arm: str, split: str) -> list[float]:
    """The scored accuracies of `arm` on `split`, one per usable seed."""
    return [a for a in (_acc(r, split) for r in ok_runs(results, arm)) if a is not None]


def best_constant_accuracy(by_count: dict) -> float | None:
    """Accuracy (%) of always answering the most frequent gold count, from a split's `by_count` {count: [correct,
    total]}: what a recipe that ignores the image can reach (e.g. a weak baseline collapsed to one answer)."""
    totals = [int(total) for _, total in by_count.values()]
    return 100.0 * max(totals) / sum(totals) if totals and sum(totals) else None


def pairwise_wins(first: list[float], second: list[float]) -> float | None:
    """Fraction of (first, second) pairs with first > second, ties counted half (the Mann-Whitney U / n1 n2)."""
    pairs = [(a, b) for a in first for b in second]
    if not pairs:
        return None
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def permutation_p_value(strata: list[tuple[list[float], list[float]]]) -> float | None:
    """One-sided exact permutation p-value that the first samples are higher than the second ones. `strata`: one
    (first, second) pair of seed samples per run; labels are exchanged only within a stratum (runs differ in their
    start model). Statistic: the sum over strata of the mean differences; every relabelling is enumerated (3 vs 3
    seeds: 20 per stratum, so one run alone can reach no p below 0.05)."""
    import itertools

    options = []  # per stratum: the statistic of each relabelling
    for first, second in strata:
        values, k = list(first) + list(second), len(first)
        if not first or not second:
            return None
        value_sum = sum(values)
        options.append(
            [
                sum(values[i] for i in chosen) / k - (value_sum - sum(values[i] for i in chosen)) / len(second)
                for chosen in itertools.combinations(range(len(values)), k)
            ]
        )
    observed = sum(statistics.fmean(first) - statistics.fmean(second) for first, second in strata)
    hits = relabellings = 0
    for combo in itertools.product(*options):
        relabellings += 1
        hits += sum(combo) >= observed - 1e-9
    return hits / relabellings


def summarize(results: dict) -> dict:
    """{arm: {split: stats of accuracy over seeds}}, the verdict of ours vs weak_baseline per split (with the
    seed-pair wins and the exact permutation p-value beside the spread rule) and each split's constant-answer floor."""
    splits = results.get("meta", {}).get("splits", list(EVAL_SPLITS))
    arms = [a for a in results.get("arm_order", []) if ok_runs(results, a)]
    table = {arm: {split: _stats(_seed_accuracies(results, arm, split)) for split in splits} for arm in arms}
    verdict = {}
    if "ours" in table and "weak_baseline" in table:
        for split in splits:
            ours, weak = table["ours"][split], table["weak_baseline"][split]
            if ours["mean"] is None or weak["mean"] is None:
                continue
            delta = ours["mean"] - weak["mean"]
            spread = max(ours["range"], weak["range"])
            ours_seeds = _seed_accuracies(results, "ours", split)
            weak_seeds = _seed_accuracies(results, "weak_baseline", split)
            verdict[split] = {
                "delta": delta,
                "spread": spread,
                "seeds": min(ours["n"], weak["n"]),
                "beats": bool(delta > spread and min(ours["n"], weak["n"]) >= 2),
                "wins": pairwise_wins(ours_seeds, weak_seeds),
                "p_value": permutation_p_value([(ours_seeds, weak_seeds)]),
            }
    floor = {}
    for run in [results.get("before"), *results.get("runs", [])]:
        for split in splits:
            by_count = (((run or {}).get("splits") or {}).get(split) or {}).get("by_count")
            if split not in floor and by_count:
                floor[split] = best_constant_accuracy(by_count)
    return {"table": table, "verdict": verdict, "constant_floor": floor}


def _fmt(value, digits=1, sign=False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _fmt_share(value) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def _mean_over_splits(run: dict, key: str, splits) -> float | None:
    values = [run["splits"][s][key] for s in splits if s in (run.get("splits") or {})]
    return sum(values) / len(values) if values else None


def _row(*cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _trend(run: dict, key: str, digits: int) -> str:
    return f"{_fmt(run.get(key + '_first'), digits)} → {_fmt(run.get(key + '_last'), digits)}"


def _by_seed(results: dict, arm: str, usable_only: bool = True) -> list[dict]:
    runs = ok_runs(results, arm) if usable_only else [r for r in results.get("runs", []) if r.get("arm") == arm]
    return sorted(runs, key=lambda r: r.get("seed", 0))


def render_markdown(results: dict, png_name: str | None = "acc_by_count.png") -> str:
    meta = results.get("meta", {})
    splits = meta.get("splits", list(EVAL_SPLITS))
    summary = summarize(results)
    arm_order = results.get("arm_order", [])
    before = results.get("before")
    before_ok = bool(before) and before.get("status") in USABLE_STATUSES
    title = meta.get("title") or (
        "Proxy experiment: does GRPO with our rewards raise counting accuracy over the weak baseline?"
    )
    rebuild = (
        meta.get("rebuild_command")
        or f"python -m experiments.proxy.make_results {meta.get('results_json', 'results.json')}"
    )
    lines = [
        f"# {title}",
        "",
        f"Generated by `{meta.get('command', 'experiments/proxy/proxy_experiment.py')}` on "
        f"{meta.get('created', '?')}; rebuild this file from the JSON with `{rebuild}`.",
        "",
    ]
    add = lines.append
    if meta.get("note"):
        lines += [f"> {meta['note']}", ""]
    if meta.get("tiny"):
        lines += [
            "> **--tiny mode** (CPU smoke test): random tiny model, a handful of examples, 1-2 steps, shortened "
            "generation. These numbers test the tooling, not the method.",
            "",
        ]
    lines += ["## Setup", ""]
    start = meta.get("start", {})
    sft = start.get("sft_report") or {}
    add(
        f"- Start model: `{start.get('path', '?')}` ({_fmt(start.get('parameters_m'), 1)}M parameters, "
        f"Qwen2-VL architecture, random init{' + SFT warm start' if sft else ''})."
    )
    if sft:
        add(
            f"  SFT (`experiments/proxy/sft_warmstart.py`, TRL `SFTTrainer`): {sft.get('steps', '?')} steps, "
            f"{_fmt(sft.get('epochs'), 2)} epochs of {sft.get('train_rows', '?')} train rows"
            + (
                f" + {sft['ood_exposure_rows']} OOD-renderer exposure rows (split `{EXPOSURE_SPLIT}`: the question "
                "alone answered with the bare number, never the protocol format; `to_exposure_sft_dataset`)"
                if sft.get("ood_exposure_rows")
                else ""
            )
            + f", target style `{sft.get('target_style', '?')}`"
            + (
                f" (think share {sft.get('think_share'):g}, think noise {sft['think_noise']:g}: that fraction of think "
                "targets state a wrong count)"
                if sft.get("think_noise")
                else ""
            )
            + f", {_fmt(sft.get('train_seconds'), 0)} s; stop reason: "
            f"{sft.get('stop_reason', '?')}. Command: `{sft.get('command', '?')}`"
        )
    data = meta.get("data", {})
    add(
        f"- Data: `{data.get('dir', '?')}` rendered by `open_r1.tasks.counting.scenes.write_splits` (sizes "
        f"{data.get('sizes', '?')}; clevr {data.get('image_size', '?')}, ood {data.get('ood_image_size', '?')})."
    )
    if meta.get("versions"):
        add(
            "- Software: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v) + "; device: "
            f"{meta.get('device') or '?'}."
        )
    add(
        f"- Evaluation: the selfcheck protocol (EVAL template after the image, greedy, max_new_tokens="
        f"{meta.get('eval_max_new_tokens', protocol.EVAL_MAX_NEW_TOKENS)}, first `<answer>N</answer>`, integer "
        f"equality) on {('the first ' + str(meta['eval_limit'])) if meta.get('eval_limit') else 'all'} rows of "
        f"{', '.join(splits)}."
    )
    rollouts = sorted(
        {
            r.get("rollouts")
            for r in results.get("runs", [])
            if r.get("status") in USABLE_STATUSES
            and r.get("kind", "train") == "train"
            and r.get("rollouts") is not None
        }
    )
    stop_at = meta.get("stop_at")
    how = (
        f"common stop step {stop_at}"
        if stop_at is not None and meta.get("sync", True)
        else f"fixed step count {stop_at}"
        if stop_at is not None
        else "no common stop step could be decided (arms ended first)"
    )
    add(
        f"- Training budget: {meta.get('generation_batch_size', '?')} completions per optimizer step for every arm, "
        f"{how}; rollouts per run: {', '.join(str(r) for r in rollouts) or '–'}"
        + (" (**unequal: compare rows by their rollouts column**)" if len(rollouts) > 1 else " (equal for all runs)")
        + "."
    )
    add("")

    def means(run: dict) -> list[str]:
        return [_fmt(_mean_over_splits(run, key, splits)) for key in ("format_pct", "mean_completion_tokens")]

    lines += [
        "## Accuracy (%) by split × recipe × seed",
        "",
        _row("recipe", "seed", *splits, "format % (mean)", "tokens (mean)", "steps", "rollouts"),
        "|" + "---|" * 2 + "---:|" * (len(splits) + 4),
    ]
    if before_ok:
        add(_row("before (warm start)", "–", *(_fmt(_acc(before, s)) for s in splits), *means(before), 0, 0))
    for arm in arm_order:
        for run in _by_seed(results, arm, usable_only=False):
            if run.get("status") not in USABLE_STATUSES:
                add(
                    _row(
                        arm,
                        run.get("seed"),
                        *[run.get("status", "failed")] * len(splits),
                        "–",
                        "–",
                        run.get("steps", "–"),
                        run.get("rollouts", "–"),
                    )
                )
                continue
            cells = [_fmt(_acc(run, s)) if _acc(run, s) is not None else "not scored" for s in splits]
            add(_row(arm, run.get("seed"), *cells, *means(run), run.get("steps"), run.get("rollouts")))
    lines += [
        "",
        "### Mean ± spread over seeds",
        "",
        "Spread = max − min over seeds (sd in brackets).",
        "",
        _row("recipe", "seeds", *splits),
        "|---|---:|" + "---:|" * len(splits),
    ]
    if before_ok:
        add(_row("before (warm start)", "–", *(_fmt(_acc(before, s)) for s in splits)))
    for arm, row in summary["table"].items():
        n = max(v["n"] for v in row.values()) if row else 0
        cells = [
            (f"{_fmt(v['mean'])} ± {_fmt(v['range'])} ({_fmt(v['sd'])})" if v["n"] > 1 else _fmt(v["mean"]))
            if v["n"]
            else "–"
            for v in row.values()
        ]
        add(_row(arm, n, *cells))
    if summary["constant_floor"]:
        add(
            _row(
                "*one constant answer (the most frequent gold count)*",
                "–",
                *(_fmt(summary["constant_floor"].get(s)) for s in splits),
            )
        )
    lines += [
        "",
        "## Verdict: ours vs weak_baseline",
        "",
        "`yes` when the difference of the seed means is larger than the seed spread (the larger of the two "
        "recipes' max − min over seeds), with at least 2 seeds each. Beside it: the share of (ours seed, weak "
        "seed) pairs that ours wins, and the one-sided exact permutation p-value of the mean difference "
        "(`permutation_p_value`; with 3 seeds each it cannot go below 0.05, pool runs with "
        "`experiments/proxy/pool_results.py`).",
        "",
    ]
    if summary["verdict"]:
        lines += [
            "| split | Δ mean (ours − weak) | seed spread (max of the two ranges) "
            "| beats by more than the spread? | seed pairs ours wins | permutation p |",
            "|---|---:|---:|---|---:|---:|",
        ]
        for split, v in summary["verdict"].items():
            note = "yes" if v["beats"] else ("no (fewer than 2 seeds)" if v["seeds"] < 2 else "no")
            add(
                _row(
                    split,
                    _fmt(v["delta"], 1, sign=True),
                    _fmt(v["spread"]),
                    note,
                    _fmt_share(v.get("wins")),
                    _fmt(v.get("p_value"), 3),
                )
            )
    else:
        add("Not available: ours and weak_baseline both need at least one successful run.")
    add("")

    ablations = [a for a in arm_order if results.get("arms", {}).get(a, {}).get("role") == "ablation"]
    if ablations:
        lines += [
            "## Ablations (each against `ours`)",
            "",
            _row("arm", "question", "change", *splits, f"Δ mean vs ours ({', '.join(splits)})"),
            "|---|---|---|" + "---:|" * (len(splits) + 1),
        ]
        ours = summary["table"].get("ours", {})
        for arm in ablations:
            info = results["arms"][arm]
            row = summary["table"].get(arm)
            if not row:
                add(_row(arm, info.get("question"), info.get("change"), *["failed"] * len(splits), "–"))
                continue
            cells = [
                f"{_fmt(row[s]['mean'])}" + (f" ± {_fmt(row[s]['range'])}" if row[s]["n"] > 1 else "") for s in splits
            ]
            deltas = [
                _fmt(row[s]["mean"] - ours[s]["mean"], 1, sign=True)
                if ours.get(s, {}).get("mean") is not None and row[s]["mean"] is not None
                else "–"
                for s in splits
            ]
            add(_row(arm, info.get("question"), info.get("change"), *cells, " / ".join(deltas)))
        add("")
        if "ours" in summary["table"]:
            spreads = ", ".join(f"{s} {_fmt(summary['table']['ours'][s]['range'])}" for s in splits)
            lines += [
                f"Read a Δ against the seed spread of `ours` ({spreads}); a single-seed ablation whose Δ is "
                "inside that spread is not evidence either way.",
                "",
            ]

    lines += [
        "## Answer format by split",
        "",
        "An unparseable completion (no `<answer>N</answer>`) scores 0 under the protocol, so a split's accuracy "
        "is parseable % × accuracy among parseable answers. Each cell: parseable % (accuracy % among "
        "parseable).",
        "",
        _row("recipe", "seed", *splits),
        "|---|---|" + "---:|" * len(splits),
    ]
    format_rows = [("before (warm start)", "–", before)] if before_ok else []
    format_rows += [(arm, run.get("seed"), run) for arm in arm_order for run in _by_seed(results, arm)]
    for label, seed, run in format_rows:
        cells = []
        for split in splits:
            report = (run.get("splits") or {}).get(split) or {}
            fmt, acc = report.get("format_pct"), report.get("accuracy_pct")
            among = 100.0 * acc / fmt if fmt and acc is not None else None
            cells.append(f"{_fmt(fmt)} ({_fmt(among)})" if fmt is not None else "–")
        add(_row(label, seed, *cells))
    lines += [
        "",
        "## Training signal",
        "",
        "Means over the first and last 5 logged steps. A group whose rewards are all equal has zero advantage "
        "and teaches nothing: a reward the start model already maxes out (e.g. `answer_tag` once the format is "
        "learned) leaves that run at the start model.",
        "",
        "| recipe | seed | train reward | train exact accuracy | groups with zero reward spread | "
        "completion tokens (last) | s/step | stop reason |",
        "|---|---:|---|---|---|---:|---:|---|",
    ]
    for arm in arm_order:
        for run in _by_seed(results, arm):
            add(
                _row(
                    arm,
                    run.get("seed"),
                    _trend(run, "train_reward", 3),
                    _trend(run, "train_exact", 3),
                    _trend(run, "zero_std", 2),
                    _fmt(run.get("completion_length_last"), 1),
                    _fmt(run.get("seconds_per_step"), 2),
                    run.get("stop_reason", "–"),
                )
            )
    add("")
    if png_name:
        lines += [
            "## Accuracy by gold count",
            "",
            f"![accuracy by gold count]({png_name})",
            "",
            "Seeds pooled per recipe. Top row: the warm start (dashed), weak_baseline and ours; bottom row: each "
            "ablation beside ours.",
            "",
        ]

    lines += [
        "## Commands",
        "",
        "Each row's exact training command (the arm's `open_r1.grpo` argv) and how to rerun that row alone:",
        "",
    ]
    seen = set()
    for arm in arm_order:
        for run in _by_seed(results, arm, usable_only=False):
            if (arm, run.get("seed")) in seen:
                continue
            seen.add((arm, run.get("seed")))
            add(f"- **{arm}, seed {run.get('seed')}**: `{run.get('command', '?')}`")
            if run.get("rerun"):
                add(f"  - rerun: `{run['rerun']}`")
    add("")
    failed = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    if before and before.get("status") != "ok":
        failed.append(before)
    if failed:
        lines += ["## Failures", ""]
        lines += [
            f"- {run.get('job')}: {run.get('error', run.get('status'))} (log: {run.get('log', '?')})" for run in failed
        ]
        add("")
    return "\n".join(lines)


def pool_runs(results_list: list[dict]) -> dict:
    """ours vs weak_baseline over several proxy runs (results.json dicts), each run one stratum: per split, the
    per-run verdicts, the mean of the per-run differences, the share of within-run (ours seed, weak seed) pairs
    that ours wins, and the stratified exact permutation p-value (`permutation_p_value`)."""
    splits = [
        s for s in EVAL_SPLITS if all(s in r.get("meta", {}).get("splits", list(EVAL_SPLITS)) for r in results_list)
    ]
    verdicts = [summarize(results)["verdict"] for results in results_list]
    pooled = {}
    for split in splits:
        strata = []
        for results in results_list:
            ours = _seed_accuracies(results, "ours", split)
            weak = _seed_accuracies(results, "weak_baseline", split)
            if not ours or not weak:
                raise ValueError(
                    f"a run without scored ours and weak_baseline seeds on {split}: "
                    f"{results.get('meta', {}).get('command', '?')}"
                )
            strata.append((ours, weak))
        per_run = [verdict[split] for verdict in verdicts]
        pair_counts = [len(ours) * len(weak) for ours, weak in strata]
        pooled[split] = {
            "runs": per_run,
            "ours_seeds": sum(len(o) for o, _ in strata),
            "weak_seeds": sum(len(w) for _, w in strata),
            "ours_mean": statistics.fmean(a for o, _ in strata for a in o),
            "weak_mean": statistics.fmean(b for _, w in strata for b in w),
            "delta": statistics.fmean(v["delta"] for v in per_run),
            "runs_beating_spread": sum(v["beats"] for v in per_run),
            # within-run pairs only: each run's share, weighted by its number of pairs
            "wins": sum(pairwise_wins(ours, weak) * n for (ours, weak), n in zip(strata, pair_counts))
            / sum(pair_counts),
            "p_value": permutation_p_value(strata),
        }
    return pooled


def load_results(path: str | os.PathLike) -> dict:
    """A proxy experiment's results.json, or ValueError naming what is wrong with the file."""
    try:
        with open(path) as handle:
            results = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(results, dict) or "runs" not in results or "meta" not in results:
        raise ValueError(f"{path} is not a proxy-experiment results.json (no 'runs'/'meta')")
    return results


def render_pooled_markdown(results_list: list[dict], labels: list[str], command: str = "") -> str:
    """The pooled comparison of `pool_runs` as markdown: one row per split, one column group per run."""
    pooled = pool_runs(results_list)
    lines = ["# Proxy runs pooled: ours vs weak_baseline over several runs", ""]
    if command:
        lines += [f"Generated by `{command}`.", ""]
    lines += [
        "Each run is one stratum (its own warm start): seed labels are exchanged only within a run for the "
        "exact permutation test (`experiments.proxy.proxy.permutation_p_value`, one-sided: ours higher), and only "
        "within-run seed pairs are compared. The spread rule of each run's own report is listed per run.",
        "",
    ]
    lines += ["| run | warm start | proxy command |", "|---|---|---|"]
    lines += [
        f"| {label} | `{((r.get('meta', {}).get('start') or {}).get('sft_report') or {}).get('command', '?')}` | "
        f"`{r.get('meta', {}).get('command', '?')}` |"
        for label, r in zip(labels, results_list)
    ]
    per_run_columns = " | ".join(f"{label}: Δ (spread)" for label in labels)
    lines += [
        "",
        f"| split | ours mean (seeds) | weak mean (seeds) | {per_run_columns} | runs beating their spread "
        "| mean Δ | within-run seed pairs ours wins | stratified permutation p |",
        "|---|---:|---:|" + "---:|" * len(labels) + "---:|---:|---:|---:|",
    ]
    for split, v in pooled.items():
        cells = " | ".join(f"{_fmt(r['delta'], 1, sign=True)} ({_fmt(r['spread'])})" for r in v["runs"])
        lines.append(
            f"| {split} | {_fmt(v['ours_mean'])} ({v['ours_seeds']}) | {_fmt(v['weak_mean'])} "
            f"({v['weak_seeds']}) | {cells} | {v['runs_beating_spread']} of {len(v['runs'])} | "
            f"{_fmt(v['delta'], 1, sign=True)} | {_fmt_share(v['wins'])} | {_fmt(v['p_value'], 4)} |"
        )
    return "\n".join(lines) + "\n"


def _pooled_by_count(runs: list[dict], split: str) -> tuple[list[int], list[float]]:
    pooled: dict[int, list[int]] = {}
    for run in runs:
        counts = ((run.get("splits") or {}).get(split) or {}).get("by_count") or {}
        for count, (correct, total) in counts.items():
            cell = pooled.setdefault(int(count), [0, 0])
            cell[0] += correct
            cell[1] += total
    xs = sorted(pooled)
    return xs, [100.0 * pooled[x][0] / max(pooled[x][1], 1) for x in xs]


def plot_acc_by_count(results: dict, path: str | os.PathLike) -> str:
    """Accuracy by gold count, one column per split: the top row compares the warm start, weak_baseline and ours;
    the bottom row (when there are ablations) puts each ablation beside ours. Seeds are pooled per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - used as matplotlib.ticker

    splits = results.get("meta", {}).get("splits", list(EVAL_SPLITS))
    arm_order = [a for a in results.get("arm_order", []) if ok_runs(results, a)]
    main = [a for a in arm_order if a in MAIN_ARMS]
    ablations = [a for a in arm_order if a not in MAIN_ARMS]
    rows = [("recipe vs weak baseline", main, True)]
    if ablations:
        rows.append(("ablations (each a change to ours)", (["ours"] if "ours" in main else []) + ablations, False))
    fig, axes = plt.subplots(len(rows), len(splits), figsize=(5.2 * len(splits), 4.0 * len(rows)), squeeze=False)
    colors = {arm: f"C{i}" for i, arm in enumerate(ARMS)}
    before = results.get("before")
    for r, (title, arms, with_before) in enumerate(rows):
        for c, split in enumerate(splits):
            ax = axes[r][c]
            if with_before and before and before.get("status") in USABLE_STATUSES:
                xs, ys = _pooled_by_count([before], split)
                ax.plot(xs, ys, linestyle="--", marker="o", markersize=3, color="black", label="before (warm start)")
            for arm in arms:
                runs = ok_runs(results, arm)
                xs, ys = _pooled_by_count(runs, split)
                if not xs:
                    continue
                width = 2.4 if arm in MAIN_ARMS else 1.4
                ax.plot(
                    xs,
                    ys,
                    marker="o",
                    markersize=3,
                    linewidth=width,
                    color=colors.get(arm),
                    label=f"{arm} ({len(runs)} seed{'s' if len(runs) != 1 else ''})",
                )
            ax.set_title(f"{split}: {title}", fontsize=10)
            ax.set_xlabel("gold count")
            ax.set_ylim(-2, 102)
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            if c == 0:
                ax.set_ylabel("accuracy % (selfcheck protocol)")
        handles, labels = axes[r][0].get_legend_handles_labels()
        if handles:
            axes[r][-1].legend(handles, labels, fontsize=7, loc="upper right", frameon=True, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def write_report(
    results: dict, md_path: str | os.PathLike, png_path: str | os.PathLike | None = None
) -> tuple[str, str]:
    """RESULTS.md-style markdown and the accuracy-by-count PNG (default: beside the markdown) from results.json data.

    The markdown links the PNG by its path relative to the markdown's folder."""
    md_path = Path(md_path)
    png_path = Path(png_path) if png_path else md_path.parent / "acc_by_count.png"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    plot_acc_by_count(results, png_path)
    link = os.path.relpath(png_path.resolve(), md_path.parent.resolve())
    md_path.write_text(render_markdown(results, png_name=link) + "\n")
    return str(md_path), str(png_path)


# --- CLI (worker entry point) -----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Proxy-experiment worker (started by experiments/proxy/proxy_experiment.py)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="run one job from a spec JSON")
    worker.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    result = run_worker(read_json(args.spec))
    return 0 if result.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
