"""GRPO throughput and selfcheck speed benchmarks (entry points: bench_grpo.py, bench_selfcheck.py; usage there).

Each *variant* is a named dict of `GRPOConfig` overrides plus a few bench options (pixel budget, attention, our
trainer's levers); every variant runs TRL 1.16's own `GRPOTrainer` (or our subclass) on the same shape: the
full-size Qwen2-VL-2B with random bf16 weights built on the GPU (`--tiny`: the tiny CPU model), the project's
real-id processor, 480x320 counting images through `to_grpo_dataset` (the training prompts), 8 completions per
prompt forced to `--completion-length` tokens (vision special tokens suppressed), the recipe's rewards, and a KL
reference copied from the in-memory policy. Nothing of TRL is copied: its methods are wrapped on the instance and
timed with `torch.cuda.synchronize()` (`Probe`). Shape, columns and limits: docs/PERFORMANCE.md ("Running the
benches"). A failing variant is reported with its first error line and the run goes on; the JSON is rewritten
after every variant.
"""

import argparse
import contextlib
import copy
import functools
import gc
import importlib.util
import json
import logging
import math
import os
import platform
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from experiments.bench import compat
from open_r1.checks import granularity_problems
from open_r1.errors import RecipeError, error_exit, setup_logging
from open_r1.jsonio import read_recipe, write_json

logger = logging.getLogger(__name__)

# Everything is built locally (model, processor, data): never reach for a hub, and keep tokenizers single-threaded.
for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RECIPE = REPO_ROOT / "configs" / "qwen2vl_2b_counting.yaml"
GIB = 1024**3

BENCH_COMPLETION_LENGTH = 256
TINY_COMPLETION_LENGTH = 16
NUM_GENERATIONS = 8
# --tiny keeps every variant's geometry (accumulation, steps_per_generation, iterations) and divides its batch sizes,
# so that a CPU run exercises the same code paths in seconds: completions per batch / 32, generations per prompt / 4.
TINY_BATCH_DIVISOR = 32
TINY_GENERATIONS_DIVISOR = 4
# Vision special tokens (<|vision_start|> .. <|video_pad|>): a random policy would sample them and a sampled
# <|vision_start|><|video_pad|> pair makes the training forward look for a video. TRL itself suppresses only the
# image pad; the bench suppresses all five, identically for every variant.
VISION_SPECIAL_TOKEN_IDS = [151652, 151653, 151654, 151655, 151656]

# Recipe keys that define the algorithm, not its speed: `ours*` variants take them from the recipe, so the bench
# measures what training will run (a KL term with beta > 0 costs a reference model and its forward pass).
RECIPE_ALGORITHM_KEYS = (
    "beta",
    "loss_type",
    "num_generations",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "epsilon",
    "epsilon_high",
    "scale_rewards",
    "importance_sampling_level",
    "mask_truncated_completions",
    "learning_rate",
    "reward_weights",
    "weight_decay",
    "max_grad_norm",
    "cast_lm_head_to_fp32",
)
# Every variant reads our own recipe keys reward_funcs / reward_kwargs / prompt_templates; ours* also min/max_pixels.
DEFAULT_REWARD_FUNCS = ["exact_count", "format"]
DEFAULT_PROMPT_TEMPLATES = ["train:0.5", "eval:0.5"]

# The presets. `base` inherits another preset's keys; `recipe`: False (TRL defaults only) or True (the recipe's
# algorithm keys). Batch sizes count completions, as TRL's do.
PRESETS: dict[str, dict[str, Any]] = {
    "plain_trl": {
        "description": "TRL 1.16 defaults, per-device batch 64, no accumulation (the reference of every ratio)",
        "recipe": False,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 1,
    },
    "ours": {
        "description": "recipe algorithm; generate 256 at once (64 x accumulation 4, on-policy), grad ckpt",
        "recipe": True,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 4,
        "gradient_checkpointing": True,
    },
    "ours_gen512": {
        "base": "ours",
        "description": "generate 512 at once (64 x accumulation 8, on-policy)",
        "gradient_accumulation_steps": 8,
    },
    "ours_gen512_beta0": {"base": "ours_gen512", "description": "ours_gen512 with beta 0", "beta": 0.0},
    "ours_gen512_beta0_dedupe": {
        "base": "ours_gen512_beta0",
        "dedupe_vision": True,
        "description": "ours_gen512_beta0, each distinct image through the ViT once (dedupe_vision: same update)",
    },
    "ours_gen512_beta0_dedupe_graph": {
        "base": "ours_gen512_beta0_dedupe",
        "fast_decode": "graph",
        "description": "ours_gen512_beta0_dedupe with the CUDA-graph decoder (fast_decode: open_r1/decoding.py)",
    },
    "ours_fast": {
        "base": "ours_gen512_beta0_dedupe_graph",
        "dedupe_images": True,
        "description": "the shipped speed levers: ours_gen512_beta0_dedupe_graph + each distinct image "
        "preprocessed once per round (dedupe_images: open_r1/image_dedupe.py)",
    },
    "ours_fast_grouped": {
        "base": "ours_fast",
        "vision_attention": "grouped",
        "description": "ours_fast with the vision tower's attention once per image size "
        "(vision_attention: grouped, open_r1/vision_attention.py; what "
        "modeling.load_model, hence train.sh, now uses)",
    },
    "ours_fast_mb128": {
        "base": "ours_fast",
        "description": "ours_fast, training micro-batches of 128 (accumulation 4)",
        "per_device_train_batch_size": 128,
        "gradient_accumulation_steps": 4,
    },
    # train.sh's default path in one process: DeepSpeed ZeRO-3 with zero3.json (one variant per process: accelerate's
    # state is a process-wide singleton; `--merge` puts the JSONs of several processes into one table)
    "plain_trl_zero3": {
        "base": "plain_trl",
        "deepspeed": "zero3.json",
        "requires": ["deepspeed"],
        "description": "plain_trl under DeepSpeed ZeRO-3 (zero3.json; HF generate on TRL's gathered weights)",
    },
    "ours_fast_zero3": {
        "base": "ours_fast",
        "deepspeed": "zero3.json",
        "requires": ["deepspeed"],
        "description": "ours_fast under DeepSpeed ZeRO-3 (zero3.json): the graph decoder on a "
        "whole-weight copy refreshed once per optimizer step "
        "(open_r1/rollout_weights.py)",
    },
    # ZeRO-2 keeps fp32 master weights as ZeRO-3 does (no lost bf16 updates) but the bf16 weights whole on each card:
    # no per-module gathers, and the graph decoder runs on the policy itself. Not in train.sh until measured.
    "plain_trl_zero2": {
        "base": "plain_trl_zero3",
        "deepspeed": "experiments/bench/zero2.json",
        "description": "plain_trl under DeepSpeed ZeRO-2 (experiments/bench/zero2.json)",
    },
    "ours_fast_zero2": {
        "base": "ours_fast_zero3",
        "deepspeed": "experiments/bench/zero2.json",
        "description": "ours_fast under DeepSpeed ZeRO-2 (experiments/bench/zero2.json): the graph "
        "decoder on the policy's own bf16 weights",
    },
    "ours_vllm": {
        "base": "ours",
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.3,
        "requires": ["vllm"],
        "description": "vLLM colocate generation (TRL use_vllm; needs vllm; not measured on the project's GPU)",
    },
}
# Past runs' presets (compiled generate, frozen ViT, Liger, ...): experiments/LOG.md; `--define` rebuilds them.
# Most informative first: with --deadline-s the tail is what gets skipped.
DEFAULT_VARIANTS = "plain_trl,ours_fast,ours_gen512_beta0_dedupe_graph"
DEFAULT_TINY_VARIANTS = "plain_trl,ours"
BASELINE = "plain_trl"


class BenchError(ValueError):
    """A bench invocation that cannot work (unknown variant, bad --define); the message names the fix."""


# --- Variants ---------------------------------------------------------------------------------------------------------


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any]  # GRPOConfig fields
    description: str = ""
    recipe: bool = False
    min_pixels: int | None = None
    max_pixels: int | None = None
    attn_implementation: str = "sdpa"
    lazy_images: bool = False
    freeze_vision: bool = False
    dedupe_vision: bool = False
    fast_decode: str = "hf"  # our trainer's rollout decoder: hf (HF generate), graph (CUDA graphs), eager
    dedupe_images: bool = False  # each distinct image preprocessed once per round (open_r1/image_dedupe.py)
    # transformers' per-image loop unless a variant names 'grouped' (open_r1/vision_attention.py): the variants
    # measured before it existed keep their meaning
    vision_attention: str = "per_image"
    deepspeed: str = ""  # a DeepSpeed config (path from the repo root; zero3.json: train.sh's), one process
    zero_optimization: dict = field(default_factory=dict)  # keys over that config's zero_optimization
    requires: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        options = asdict(self)
        del options["name"]
        return {"description": options.pop("description"), "grpo_overrides": options.pop("overrides"), **options}


# Keys of a variant that are bench options, not GRPOConfig fields ('base' is gone once a preset is flattened).
BENCH_OPTION_KEYS = {f.name for f in fields(Variant)} - {"name", "overrides"}
RECIPE_OPTION_KEYS = ("min_pixels", "max_pixels", "attn_implementation", "freeze_vision")  # what ours* variants take


def parse_defines(defines: list[str] | None) -> dict[str, dict]:
    """`--define NAME=JSON` entries: ad-hoc variants, e.g. 'ours_mb48={"base": "ours", "per_device_train_batch_size":
    48}'."""
    presets = {}
    for entry in defines or []:
        name, sep, body = entry.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BenchError(f'--define {entry!r}: expected NAME=JSON, e.g. \'mine={{"base": "ours", "beta": 0}}\'')
        try:
            spec = json.loads(body)
        except json.JSONDecodeError as exc:
            raise BenchError(f"--define {name}: the value is not JSON ({exc})") from None
        if not isinstance(spec, dict):
            raise BenchError(f"--define {name}: the value must be a JSON object of GRPOConfig overrides")
        presets[name] = spec
    return presets


def flatten_preset(name: str, presets: dict[str, dict], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name not in presets:
        raise BenchError(f"unknown variant {name!r}; known: {', '.join(sorted(presets))} (or add one with --define)")
    if name in seen:
        raise BenchError(f"variant {name!r} inherits from itself through 'base': {' -> '.join((*seen, name))}")
    spec = dict(presets[name])
    base = spec.pop("base", None)
    merged = flatten_preset(base, presets, (*seen, name)) if base else {}
    merged.pop("description", None)
    merged.update(spec)
    return merged


def resolve_variant(name: str, presets: dict[str, dict], recipe: dict[str, Any]) -> Variant:
    """The variant's final GRPOConfig overrides: recipe keys (when it asks for them), then its own keys."""
    spec = flatten_preset(name, presets)
    overrides = {}
    options = {}
    if spec.get("recipe", False):
        overrides = {key: recipe[key] for key in RECIPE_ALGORITHM_KEYS if key in recipe}
        # lazy image decoding is on for every recipe variant (it changes no result), freeze_vision the recipe's;
        # the speed levers only where a variant names them
        options = {key: recipe[key] for key in RECIPE_OPTION_KEYS if recipe.get(key) is not None}
        options["lazy_images"] = recipe.get("lazy_images", True)
    for key, value in spec.items():
        (options if key in BENCH_OPTION_KEYS else overrides)[key] = value
    return Variant(name=name, overrides=overrides, **options)


def load_recipe(path: str | os.PathLike | None) -> dict[str, Any]:
    return read_recipe(path) if path else {}  # a bad one: RecipeError, which `cli` reports as one line


def missing_requirements(variant: Variant) -> list[str]:
    return [module for module in variant.requires if importlib.util.find_spec(module) is None]


# --- Data and model ---------------------------------------------------------------------------------------------------


def counting_dataset(n: int, args, work_dir: str, split: str = "train"):
    """(dataset, description): `n` rows of the scene renderer's `split` (the images training reads), cached in
    `work_dir`, rendered by up to 8 processes (one with --tiny)."""
    from open_r1.tasks.counting.scenes import build_split

    workers = 1 if args.tiny else min(8, os.cpu_count() or 1)
    dataset = build_split(split, n, seed=args.seed, workers=workers, progress=False, cache_dir=f"{work_dir}/data")
    return dataset, f"open_r1.tasks.counting.scenes.build_split({split!r})"


def build_full_size_model(
    attn_implementation: str = "sdpa", device: str = "cuda", seed: int = 0, config=None, auto_class=None
):
    """Full Qwen2-VL-2B dimensions (or `config`), random weights (transformers' own init, seeded), built directly
    on `device` in bf16 (as `auto_class`, default the VLM with its LM head): no 4.4 GB checkpoint is written or
    read. The real generation config (eos ids) is set."""
    import torch
    from transformers import AutoModelForImageTextToText

    from open_r1 import tiny_models as tiny_model

    torch.manual_seed(seed)
    config = config if config is not None else tiny_model.build_config(full_size=True)
    with torch.device(device):
        model = (auto_class or AutoModelForImageTextToText).from_config(
            config, dtype=torch.bfloat16, attn_implementation=attn_implementation
        )
    model.generation_config = tiny_model.build_generation_config()
    return model.eval()


def load_bench_model(
    tiny: bool, model_dir: str, attn_implementation: str, device: str, seed: int, vision_attention: str = "per_image"
):
    from open_r1.vision_attention import use_grouped_vision_attention

    if tiny:
        from open_r1 import modeling

        model = modeling.load_model(model_dir, dtype="float32", attn_implementation=attn_implementation)
    else:
        model = build_full_size_model(attn_implementation, device, seed)
    use_grouped_vision_attention(model, vision_attention)
    return model


def reference_model_from_policy(policy):
    """TRL builds the KL reference with `create_model_from_path(<the policy's path>)`; the bench's policy lives only
    in memory, so hand TRL a copy of it instead (the same weights the reference would load)."""
    from unittest import mock

    import trl.trainer.grpo_trainer as grpo_trainer_module

    return mock.patch.object(
        grpo_trainer_module, "create_model_from_path", lambda *args, **kwargs: copy.deepcopy(policy).eval()
    )


# --- Timing probe -----------------------------------------------------------------------------------------------------


class VariantTimeout(BaseException):
    """Raised by SIGALRM in the main thread when a variant runs past --variant-timeout-s. A BaseException, so that
    no library's `except Exception` swallows it; `run_variant` catches it and reports the variant as failed."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise VariantTimeout(f"ran past --variant-timeout-s {seconds:.0f}")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Probe:
    """Wraps the trainer's own methods on the instance; accumulates time only inside the measured window."""

    def __init__(self, trainer, warmup_optimizer_steps: int, total_optimizer_steps: int, sync):
        import torch
        from transformers import TrainerCallback

        self.sync = sync
        self.measuring = False
        self.seconds = defaultdict(float)
        self.counts = defaultdict(int)
        self.completion_lengths = []
        self.train_tokens = self.train_padded_tokens = self.train_sequences = 0
        self.window_start = self.window_end = None
        self.train_start = time.perf_counter()
        self.step_ends = []
        self.step_reserved_gib = []  # after each measured optimizer step: a leak shows as growth

        probe = self

        def wrap(method, key):
            def timed(*args, **kwargs):
                if not probe.measuring:
                    return method(*args, **kwargs)
                bucket = key or ("logp" if not torch.is_grad_enabled() else "train_logp")
                probe.sync()
                start = time.perf_counter()
                try:
                    result = method(*args, **kwargs)
                finally:
                    probe.sync()
                    probe.seconds[bucket] += time.perf_counter() - start
                    probe.counts[bucket] += 1
                if bucket == "gen":  # TRL 1.16: (prompt_ids, completion_ids, tool_mask, completions, ...)
                    probe.completion_lengths.extend(len(ids) for ids in result[1])
                elif bucket == "compute_loss":
                    probe._count_train_tokens(args[1] if len(args) > 1 else kwargs.get("inputs"))
                return result

            return timed

        for method, key in (
            ("_generate", "gen"),
            ("_get_per_token_logps_and_entropies", None),
            ("_calculate_rewards", "reward"),  # inside prep: the reward functions (the captioning RM's scoring)
            ("_prepare_inputs", "prepare"),
            ("training_step", "training_step"),
            ("compute_loss", "compute_loss"),
        ):
            setattr(trainer, method, wrap(getattr(trainer, method), key))

        class _Window(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                self.on_step_end(args, state, control)  # no warm-up: the window opens here

            def on_step_end(self, args, state, control, **kwargs):
                probe.sync()
                now = time.perf_counter()
                if state.global_step == warmup_optimizer_steps:
                    probe.window_start = now
                    probe.measuring = True
                elif probe.measuring:
                    probe.step_ends.append(now)
                    if torch.cuda.is_available():
                        probe.step_reserved_gib.append(round(torch.cuda.memory_reserved() / GIB, 2))
                if state.global_step >= total_optimizer_steps and probe.measuring:
                    probe.window_end = now
                    probe.measuring = False

        self.callback = _Window()

    def _count_train_tokens(self, inputs):
        if not isinstance(inputs, dict) or "completion_mask" not in inputs:
            return
        prompt_mask, completion_mask = inputs["prompt_mask"], inputs["completion_mask"]
        self.train_tokens += int(prompt_mask.sum().item() + completion_mask.sum().item())
        self.train_padded_tokens += int(prompt_mask.numel() + completion_mask.numel())
        self.train_sequences += int(completion_mask.size(0))

    def summary(self) -> dict[str, Any]:
        if self.window_start is None or self.window_end is None:
            raise RuntimeError(
                "the measured window never closed: training stopped before the last measured round (fewer dataset "
                "rows than one generation batch has prompts? raise --num-examples)"
            )
        wall = self.window_end - self.window_start
        gen, logp = self.seconds["gen"], self.seconds["logp"]
        prepare, training_step = self.seconds["prepare"], self.seconds["training_step"]
        train = training_step - prepare
        lengths = self.completion_lengths
        rollouts, gen_tokens = len(lengths), sum(lengths)
        return {
            "wall_s": wall,
            "rollouts": rollouts,
            "rollouts_per_s": rollouts / wall if wall > 0 else None,
            "gen_s": gen,
            "logp_s": logp,
            "prep_s": prepare - gen - logp,
            "train_s": train,
            "other_s": wall - training_step,
            "reward_s": self.seconds["reward"],  # reward_s: inside prep_s
            "gen_calls": self.counts["gen"],
            "logp_calls": self.counts["logp"],
            "train_micro_steps": self.counts["compute_loss"],
            "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / gen if gen > 0 else None,
            # all of `_generate` (tokenisation, image processing, prefill, decoding) per token step of one call
            "gen_ms_per_step": 1000 * gen / (self.counts["gen"] * max(lengths)) if gen > 0 and lengths else None,
            "train_tokens": self.train_tokens,
            "train_padded_tokens": self.train_padded_tokens,
            "train_tokens_per_s": self.train_tokens / train if train > 0 else None,
            "trained_sequences": self.train_sequences,
            "trained_sequences_per_s": self.train_sequences / wall if wall > 0 else None,
            "completion_len_min": min(lengths) if lengths else None,
            "completion_len_max": max(lengths) if lengths else None,
            "warmup_s": self.window_start - self.train_start,
            "step_reserved_gib": self.step_reserved_gib,
            "optimizer_step_s": [
                end - begin
                for begin, end in zip([self.window_start, *self.step_ends[:-1]], self.step_ends, strict=True)
            ],
        }


# --- One variant ------------------------------------------------------------------------------------------------------


@dataclass
class BenchContext:
    tiny: bool
    model_dir: str  # the tiny checkpoint: its processor always, its weights in --tiny mode
    recipe: dict[str, Any]
    completion_length: int
    steps: int
    warmup: int
    seed: int
    dataset: Any  # raw counting dataset (image/problem/solution)
    device: str
    work_dir: str
    variant_timeout_s: float | None = None
    min_rollouts: int = 0


def rounds_geometry(args) -> dict[str, int]:
    """Optimizer steps per round and generations per round for a resolved GRPOConfig."""
    micro_per_generation = args.steps_per_generation * args.num_iterations
    micro_per_round = math.lcm(micro_per_generation, args.gradient_accumulation_steps)
    return {
        "optimizer_steps_per_round": micro_per_round // args.gradient_accumulation_steps,
        "generations_per_round": micro_per_round // micro_per_generation,
    }


def tiny_batch_sizes(kwargs: dict[str, Any]) -> dict[str, Any]:
    """--tiny batch sizes for GRPOConfig kwargs: / TINY_BATCH_DIVISOR, generations / TINY_GENERATIONS_DIVISOR, and
    still whole prompt groups in every generation batch."""
    generations = max(2, int(kwargs.get("num_generations", NUM_GENERATIONS)) // TINY_GENERATIONS_DIVISOR)
    scaled = {"num_generations": generations}
    per_device = max(1, int(kwargs.get("per_device_train_batch_size", 8)) // TINY_BATCH_DIVISOR)
    if kwargs.get("generation_batch_size"):
        batch = max(1, int(kwargs["generation_batch_size"]) // TINY_BATCH_DIVISOR)
        scaled["generation_batch_size"] = max(generations, batch // generations * generations)
        per_device = min(per_device, scaled["generation_batch_size"])
    elif generation_batch({**kwargs, "per_device_train_batch_size": per_device}) % generations:
        per_device = generations
    scaled["per_device_train_batch_size"] = per_device
    return scaled


def bench_grpo_config(output_dir: str, seed: int, completion_length: int, tiny: bool, **kwargs):
    """A bench's GRPOConfig: `kwargs` over no reports and no saves; every completion exactly `completion_length`
    tokens, vision special tokens suppressed (the bench shape wins over any recipe value); --tiny: CPU, fp32."""
    from trl import GRPOConfig

    generation_kwargs = {
        **(kwargs.pop("generation_kwargs", None) or {}),
        "min_new_tokens": completion_length,
        "suppress_tokens": VISION_SPECIAL_TOKEN_IDS,
    }
    if tiny:
        kwargs.update(use_cpu=True, bf16=False)
    return GRPOConfig(
        **{"output_dir": output_dir, "report_to": "none", "save_strategy": "no", "seed": seed, **kwargs},
        max_completion_length=completion_length,
        generation_kwargs=generation_kwargs,
    )


def build_grpo_config(variant: Variant, ctx: BenchContext, output_dir: str):
    # max_steps: replaced once the round geometry is known
    kwargs = {"num_generations": NUM_GENERATIONS, "max_steps": 1, **variant.overrides}
    if ctx.tiny:
        kwargs.update(tiny_batch_sizes(kwargs))
    if variant.deepspeed:
        single_process_distributed_env()
        kwargs["deepspeed"] = deepspeed_config(variant)
    args = bench_grpo_config(output_dir, ctx.seed, ctx.completion_length, ctx.tiny, **kwargs)
    geometry = rounds_geometry(args)
    rollouts_per_round = args.generation_batch_size * geometry["generations_per_round"]
    geometry["rounds_measured"] = max(ctx.steps, math.ceil(ctx.min_rollouts / rollouts_per_round))
    args.max_steps = (ctx.warmup + geometry["rounds_measured"]) * geometry["optimizer_steps_per_round"]
    return args, geometry


def deepspeed_config(variant: Variant) -> dict:
    """The variant's DeepSpeed config (e.g. zero3.json, train.sh's) with its `zero_optimization` keys over its own."""
    config = json.loads((REPO_ROOT / variant.deepspeed).read_text())
    config["zero_optimization"].update(variant.zero_optimization)
    if problems := granularity_problems(config):  # train.sh's validation refuses it too
        raise BenchError(f"variant {variant.name}: {problems[0].removeprefix('--deepspeed: ')}")
    return config


def single_process_distributed_env() -> None:
    """The environment `accelerate launch --num_processes 1` gives its process (DeepSpeed initialises
    torch.distributed from it): rank 0 of 1 on this host."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        os.environ.setdefault(key, value)


def error_line(exc: BaseException) -> str:
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0] if message else ''}"[:300]


@contextlib.contextmanager
def measured(result: dict[str, Any], on_cuda: bool, timeout_s: float | None = None, reset_compiler: bool = True):
    """Runs the block as one variant, never raising: `result` gets status ok, or failed with the error's first line,
    then the wall seconds and peak GPU memory; the memory is freed after (one failing lever must not stop the rest)."""
    import torch

    if on_cuda:  # the peak of this variant alone, from an empty cache
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        with time_limit(timeout_s):
            yield start
        result["status"] = "ok"
    except (Exception, VariantTimeout) as exc:  # noqa: BLE001 - reported in the row
        result.update(
            status="failed", error=error_line(exc), traceback_tail=traceback.format_exc().strip().splitlines()[-6:]
        )
        traceback.clear_frames(exc.__traceback__)  # the failed variant's objects go before its memory is freed
        del exc
    finally:
        result["total_s"] = time.perf_counter() - start
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB if on_cuda else None
        result["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB if on_cuda else None
        release_memory(reset_compiler)
        result["allocated_after_cleanup_gib"] = torch.cuda.memory_allocated() / GIB if on_cuda else None


def run_variant(variant: Variant, ctx: BenchContext) -> dict[str, Any]:
    """One variant, never raising: status ok with its numbers, or failed with the first line of its error."""
    import torch

    on_cuda = ctx.device == "cuda"
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    result = {"name": variant.name, **variant.to_dict()}
    with measured(result, on_cuda, ctx.variant_timeout_s, reset_compiler=variant.fast_decode != "hf") as start:
        _train_variant(variant, ctx, result, sync, start)
    return result


def _train_variant(variant: Variant, ctx: BenchContext, result: dict[str, Any], sync, start: float) -> None:
    """Build the trainer, train warm-up + measured rounds, put the probe's numbers into `result`. Every object it
    makes dies with its frame, so the caller can free the GPU memory after it returns or raises."""
    from transformers import set_seed
    from trl import GRPOTrainer

    from open_r1 import grpo as grpo_lib
    from open_r1 import modeling
    from open_r1.families import vision_tower
    from open_r1.rewards import get_reward_funcs, parse_reward_kwargs
    from open_r1.tasks.counting import data as data_lib
    from open_r1.trainer import VLMGRPOTrainer

    trainer = None
    try:
        set_seed(ctx.seed)
        output_dir = tempfile.mkdtemp(prefix=f"{variant.name}-", dir=ctx.work_dir)
        args, geometry = build_grpo_config(variant, ctx, output_dir)
        result.update(
            {
                key: getattr(args, key)
                for key in (
                    "per_device_train_batch_size",
                    "gradient_accumulation_steps",
                    "steps_per_generation",
                    "generation_batch_size",
                    "num_iterations",
                    "num_generations",
                    "beta",
                    "loss_type",
                    "max_steps",
                )
            }
        )
        result.update(gradient_checkpointing=bool(args.gradient_checkpointing), warmup_rounds=ctx.warmup, **geometry)
        # Every variant scores with the recipe's rewards (CPU work, the same for all); plain TRL weighs them equally.
        reward_funcs = get_reward_funcs(
            ctx.recipe.get("reward_funcs") or DEFAULT_REWARD_FUNCS, parse_reward_kwargs(ctx.recipe.get("reward_kwargs"))
        )
        if args.reward_weights is not None and len(args.reward_weights) != len(reward_funcs):
            args.reward_weights = None  # plain TRL with the recipe's rewards: equal weights
        templates = data_lib.TemplateMix.parse(ctx.recipe.get("prompt_templates") or DEFAULT_PROMPT_TEMPLATES)
        data_lib.validate_counting_dataset(ctx.dataset, "bench data", image_check_rows=2)
        train_dataset = data_lib.to_grpo_dataset(ctx.dataset, templates, seed=ctx.seed)
        processor = modeling.load_processor(ctx.model_dir, variant.min_pixels, variant.max_pixels)
        model = load_bench_model(
            ctx.tiny, ctx.model_dir, variant.attn_implementation, ctx.device, ctx.seed, variant.vision_attention
        )
        if variant.freeze_vision:
            grpo_lib.freeze_vision_tower(model)
        ref_context = reference_model_from_policy(model) if args.beta != 0.0 else contextlib.nullcontext()
        # plain TRL where no lever of ours is on, else our subclass (the same trainer train.sh runs)
        levers = {
            key: getattr(variant, key) for key in ("lazy_images", "dedupe_vision", "fast_decode", "dedupe_images")
        }
        ours = levers != {**dict.fromkeys(levers, False), "fast_decode": "hf"}
        with ref_context:
            trainer = (VLMGRPOTrainer if ours else GRPOTrainer)(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                processing_class=processor,
                **(levers if ours else {}),
            )
        result["setup_s"] = time.perf_counter() - start
        warmup_steps = ctx.warmup * geometry["optimizer_steps_per_round"]
        result.update(train_measured(trainer, warmup_steps, sync, ctx.tiny, ctx.completion_length))
        copy_weights = getattr(trainer, "rollout_weights", None)
        if copy_weights is not None:  # ZeRO-3: the rollouts' whole-weight copy, its memory and refresh cost
            result.update(
                rollout_copy_gib=copy_weights.nbytes / GIB,
                rollout_copy_refreshes=copy_weights.refreshes,
                rollout_copy_gathers=copy_weights.gathers,
                rollout_copy_last_refresh_s=copy_weights.last_refresh_s,
            )
        if variant.dedupe_images:  # proof that the lever acted: images preprocessed vs images given
            from open_r1.image_dedupe import dedupe_state

            state = dedupe_state(trainer.processing_class)
            result.update(images_preprocessed=state.images_processed, images_given=state.images_seen)
        if variant.dedupe_vision:  # proof that the lever acted: images the ViT ran on vs images it was given
            visual = vision_tower(trainer.model)
            result.update(
                vit_images_seen=getattr(visual, "images_seen", None),
                vit_images_encoded=getattr(visual, "images_encoded", None),
                regrouped_micro_batches=bool(getattr(trainer, "regroup_rounds", False)),
            )
    finally:
        if trainer is not None:
            with contextlib.suppress(Exception):
                trainer.accelerator.free_memory()


def train_measured(trainer, warmup_steps: int, sync, tiny: bool, completion_length: int) -> dict[str, Any]:
    """Train `trainer` under a `Probe` that leaves its first `warmup_steps` optimizer steps unmeasured: the probe's
    numbers, the graph decoder's split, and whether every completion had the forced `completion_length`."""
    probe = Probe(trainer, warmup_steps, trainer.args.max_steps, sync)
    trainer.add_callback(probe.callback)
    # --tiny: TRL scores every position where Triton is missing (CPU), ~15x slower with the real vocabulary
    with compat.completion_only_scoring(tiny):
        trainer.train()
    sync()
    result = probe.summary()
    result.update(decoder_summary(trainer, result["gen_calls"]))
    result["forced_length_ok"] = result["completion_len_min"] == result["completion_len_max"] == completion_length
    return result


def decoder_split(timings: list[dict], calls: int) -> dict[str, Any]:
    """The graph decoder's own prefill / decode-loop seconds over its last `calls` calls (the measured ones)."""
    measured = timings[-calls:] if calls else []
    steps = sum(t["steps"] - 1 for t in measured)
    decode = sum(t["decode_s"] for t in measured)
    return {
        "decoder_batches_timed": len(measured),
        "decoder_prefill_s": sum(t["prefill_s"] for t in measured),
        "decoder_decode_s": decode,
        "decode_ms_per_step": 1000 * decode / steps if steps else None,
    }


def decoder_summary(trainer, calls: int) -> dict[str, Any]:
    """The graph decoder's split over the measured calls, its compile mode and first (compiling) call, or {}."""
    decoder = getattr(trainer, "_graph_decoder", None)
    if decoder is None or not decoder.timings:
        return {}
    first = decoder.timings[0]
    return {
        **decoder_split(decoder.timings, calls),
        "layers_once": decoder.layers_once,
        "first_call_s": first["prefill_s"] + first["decode_s"],
        "decoder_calls": decoder.calls,
        "decoder_cache_allocations": decoder.allocations,
    }


def release_memory(reset_compiler: bool = False) -> None:
    import torch

    sys.last_traceback = sys.last_value = sys.last_type = None
    import open_r1.generation as generation_lib

    generation_lib.forget_decoders()  # the registry holds each model's decoder (and so the model) until told
    gc.collect()
    if reset_compiler:
        with contextlib.suppress(Exception):
            torch.compiler.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- Report -----------------------------------------------------------------------------------------------------------


def add_ratios(results: list[dict]) -> None:
    base = next((r for r in results if r["name"] == BASELINE and r.get("status") == "ok"), None)
    for r in results:
        ok = base and r.get("status") == "ok" and base.get("rollouts_per_s")
        r["ratio_vs_plain_trl"] = r["rollouts_per_s"] / base["rollouts_per_s"] if ok else None


def _fmt(value, digits=2):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# (header, result key, digits) of the table's numeric columns
TABLE_COLUMNS = (
    ("rollouts/s", "rollouts_per_s", 2),
    ("x plain_trl", "ratio_vs_plain_trl", 2),
    ("trained seq/s", "trained_sequences_per_s", 2),
    ("gen s", "gen_s", 1),
    ("logp s", "logp_s", 1),
    ("prep s", "prep_s", 1),
    ("train s", "train_s", 1),
    ("other s", "other_s", 1),
    ("gen tok/s", "gen_tokens_per_s", 0),
    ("gen ms/step", "gen_ms_per_step", 1),
    ("decode ms/step", "decode_ms_per_step", 1),
    ("train tok/s", "train_tokens_per_s", 0),
)


def format_table(results: list[dict]) -> str:
    header = " | ".join(h for h, _, _ in TABLE_COLUMNS)
    rows = [
        f"| variant | status | {header} | peak alloc GiB | peak reserved GiB |",
        "|---|---|" + "---:|" * (len(TABLE_COLUMNS) + 2),
    ]
    for r in results:
        memory = f"{_fmt(r.get('peak_allocated_gib'), 1)} | {_fmt(r.get('peak_reserved_gib'), 1)} |"
        if r.get("status") != "ok":
            rows.append(
                f"| {r['name']} | {r.get('status')}: {r.get('error', '')} | " + "- | " * len(TABLE_COLUMNS) + memory
            )
            continue
        status = "ok" if r.get("forced_length_ok", True) else "ok, but completions not all forced-length!"
        cells = " | ".join(_fmt(r.get(key), digits) for _, key, digits in TABLE_COLUMNS)
        rows.append(f"| {r['name']} | {status} | {cells} | {memory}")
    return "\n".join(rows)


def environment_info(device: str, memory_cap_gib: float | None) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "device": device,
        "memory_cap_gib": memory_cap_gib,
        **{
            f"has_{name}": importlib.util.find_spec(name) is not None for name in ("liger_kernel", "flash_attn", "vllm")
        },
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update({"gpu": props.name, "gpu_total_gib": props.total_memory / GIB, "cuda": torch.version.cuda})
    return info


# --- CLI --------------------------------------------------------------------------------------------------------------


def comma_list(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']: the benches' --variants and --batch-sizes."""
    return [item.strip() for item in text.split(",") if item.strip()]


def deadline_passed(started: float, deadline_s: float | None) -> str | None:
    """Why the next variant is skipped under --deadline-s, or None."""
    elapsed = time.perf_counter() - started
    if deadline_s is None or elapsed <= deadline_s:
        return None
    return f"deadline: {elapsed:.0f} s > --deadline-s {deadline_s:.0f}"


def check_device(tiny: bool, threads: int | None = None) -> str:
    """The device, checked before any work (without initialising CUDA: the scene renderer forks workers later)."""
    import torch

    if tiny:
        # The tiny model's ops are far too small for a thread pool: on a loaded 2-core machine two threads made a
        # training step 6x slower than one (OpenMP waits dominate). One thread, unless --threads says otherwise.
        torch.set_num_threads(threads or 1)
        return "cpu"
    if threads:
        torch.set_num_threads(threads)
    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: the full-size bench needs a GPU; use --tiny for the CPU mode")
    return "cuda"


def setup_device(device: str, memory_cap_gib: float | None) -> None:
    """Cap this process's GPU memory (a variant over the cap then fails with an OOM)."""
    import torch

    if device == "cuda" and memory_cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_cap_gib * GIB / total), 0)


def scratch_dir(work_dir: str | None, prefix: str):
    """A context holding `work_dir` (made if missing), or a temp dir removed at the end."""
    if not work_dir:
        return tempfile.TemporaryDirectory(prefix=prefix)
    os.makedirs(work_dir, exist_ok=True)
    return contextlib.nullcontext(work_dir)


@contextlib.contextmanager
def scratch_checkpoint(work_dir: str | None, prefix: str):
    """(work_dir, model_dir): `scratch_dir` holding the tiny checkpoint, whose real-id processor every run uses
    (and, in --tiny mode, its weights)."""
    from open_r1.tiny_models import build_qwen2vl

    with scratch_dir(work_dir, prefix) as work_dir:
        yield work_dir, str(build_qwen2vl(Path(work_dir) / "tiny-qwen2vl", full_size=False, seed=0))


def add_common_arguments(
    parser: argparse.ArgumentParser,
    out: str,
    lengths: tuple[int, int] = (BENCH_COMPLETION_LENGTH, TINY_COMPLETION_LENGTH),
) -> None:
    """The options of every bench but the decode one (`lengths`: the default forced completion tokens, full size
    and --tiny)."""
    parser.add_argument("--tiny", action="store_true", help="CPU mode: the tiny model, short completions")
    parser.add_argument(
        "--completion-length",
        type=int,
        help=f"forced completion tokens (default {lengths[0]}; --tiny {lengths[1]})",
    )
    parser.add_argument("--memory-cap-gib", type=float, help="GPU memory cap (over it: out of memory)")
    parser.add_argument("--deadline-s", type=float, help="skip runs not started by then (seconds)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (--tiny default: 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=out, help="JSON report (rewritten after every run)")
    parser.add_argument("--work-dir", help="scratch dir (default: a temp dir, removed at the end)")


def add_round_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    """The options of both GRPO benches (counting and captioning)."""
    parser.add_argument("--steps", type=int, default=steps, help="measured rounds (a generation batch and its steps)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    parser.add_argument("--variant-timeout-s", type=float, help="stop a longer variant (reported failed)")
    parser.add_argument(
        "--layers-once",
        action=argparse.BooleanOptionalAction,
        help="graph decoder: one compile region per decoder layer (default: decoding.LAYERS_ONCE)",
    )


def set_layers_once(value: bool | None) -> None:
    """--layers-once / --no-layers-once: the module default the trainer reads when it builds its graph decoder."""
    from open_r1 import decoding

    if value is not None:
        decoding.LAYERS_ONCE = value


def parse_cli(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO throughput bench: plain TRL defaults vs our recipe's levers, one process.",
        epilog="Presets: " + "; ".join(f"{k}: {v.get('description', '')}" for k, v in PRESETS.items()),
    )
    add_common_arguments(parser, "bench.json")
    parser.add_argument(
        "--variants",
        help=f"comma-separated presets (default {DEFAULT_VARIANTS}; --tiny: {DEFAULT_TINY_VARIANTS})",
    )
    parser.add_argument("--define", action="append", default=[], metavar="NAME=JSON", help="an ad-hoc variant")
    add_round_arguments(parser, steps=3)
    parser.add_argument("--min-rollouts", type=int, default=0, help="measure at least this many completions")
    parser.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="recipe whose algorithm keys ours* variants use")
    parser.add_argument("--num-examples", type=int, help="dataset rows (default: enough for 2 rounds)")
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="no run: one table from runs' JSONs")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_cli(argv)
    presets = {**PRESETS, **parse_defines(args.define)}
    if args.list:
        for name in presets:
            print(f"{name}: {json.dumps(flatten_preset(name, presets), default=str)}")
        return 0
    if args.merge:
        return merge_main(args.merge, args.out)
    recipe = load_recipe(args.recipe)
    names = comma_list(args.variants or (DEFAULT_TINY_VARIANTS if args.tiny else DEFAULT_VARIANTS))
    variants = [resolve_variant(name, presets, recipe) for name in names]  # unknown names fail before any work
    if any(v.deepspeed for v in variants) and len(variants) > 1:
        raise BenchError(
            "a DeepSpeed variant runs alone in its process (accelerate's DeepSpeed state is process-wide): "
            "one --variants NAME per run, then --merge their JSONs into one table"
        )
    completion_length = args.completion_length or (TINY_COMPLETION_LENGTH if args.tiny else BENCH_COMPLETION_LENGTH)
    if args.steps < 1 or args.warmup < 0:
        raise BenchError("--steps must be >= 1 and --warmup >= 0")

    started = time.perf_counter()
    device = check_device(args.tiny, args.threads)
    with scratch_checkpoint(args.work_dir, "bench-grpo-") as (work_dir, model_dir):
        # Enough prompts for the largest generation batch twice over (the sampler needs whole generation batches).
        largest = max(prompts_per_generation(v, args.tiny) for v in variants)
        n = args.num_examples or max(16 if args.tiny else 64, 2 * largest)
        data_start = time.perf_counter()
        dataset, data_source = counting_dataset(n, args, work_dir)
        setup_device(device, args.memory_cap_gib)
        ctx = BenchContext(
            tiny=args.tiny,
            model_dir=model_dir,
            recipe=recipe,
            completion_length=completion_length,
            steps=args.steps,
            warmup=args.warmup,
            seed=args.seed,
            dataset=dataset,
            device=device,
            work_dir=work_dir,
            variant_timeout_s=args.variant_timeout_s,
            min_rollouts=args.min_rollouts,
        )
        set_layers_once(args.layers_once)
        shape = {
            "completion_length": completion_length,
            "num_generations": NUM_GENERATIONS,
            "image": "x".join(str(side) for side in dataset[0]["image"].size),
            "data": data_source,
            "num_examples": n,
            "data_s": time.perf_counter() - data_start,
            "recipe": str(args.recipe),
            "steps": args.steps,
            "min_rollouts": args.min_rollouts,
            "warmup": args.warmup,
        }
        payload = {
            "bench": "grpo",
            "mode": "tiny" if args.tiny else "full_size",
            "environment": environment_info(device, args.memory_cap_gib),
            "shape": shape,
            "variants": [],
        }
        env = payload["environment"]
        logger.info(
            f"[bench] {env.get('gpu', 'cpu')} torch {env['torch']} transformers {env['transformers']} "
            f"trl {env['trl']} | cap {args.memory_cap_gib} GiB | data: {data_source}"
        )
        results = payload["variants"]
        for variant in variants:
            missing = missing_requirements(variant)
            skip = f"not installed: {', '.join(missing)}" if missing else deadline_passed(started, args.deadline_s)
            if skip:
                result = {"name": variant.name, **variant.to_dict(), "status": "skipped", "error": skip}
            else:
                logger.info(f"[bench] {variant.name}: {variant.description}")
                result = run_variant(variant, ctx)
            results.append(result)
            add_ratios(results)
            payload["elapsed_s"] = time.perf_counter() - started
            write_json(args.out, payload)
            line = (
                f"{result['rollouts_per_s']:.2f} rollouts/s"
                if result.get("status") == "ok"
                else f"{result['status']}: {result.get('error')}"
            )
            logger.info(f"[bench] {variant.name}: {line} ({result.get('total_s', 0):.0f} s)")
        payload["summary"] = summarize(results, args.memory_cap_gib)
        payload["elapsed_s"] = time.perf_counter() - started
        write_json(args.out, payload)
    print()
    print(format_table(results))
    print()
    print(payload["summary"]["line"])
    print(f"[bench] JSON: {os.path.abspath(args.out)} ({payload['elapsed_s']:.0f} s)")
    return 0


# (numerator, denominator, issue 43's goal): the ZeRO-3 comparison's ratios, printed by --merge
ZERO3_GOALS = (
    ("ours_fast_zero3", "plain_trl_zero3", 4.0),
    ("ours_fast_zero3", "ours_fast", 0.8),
    ("ours_fast", "plain_trl", 6.0),
)


def merge_results(payloads: list[dict]) -> dict[str, Any]:
    """One report from several runs' JSONs (variants in the given order, ratios recomputed, ZeRO-3 goal lines)."""
    results = [dict(r) for payload in payloads for r in payload.get("variants", [])]
    add_ratios(results)
    by_name = {r["name"]: r for r in results if r.get("status") == "ok" and r.get("rollouts_per_s")}
    goals = []
    for top, bottom, goal in ZERO3_GOALS:
        if top in by_name and bottom in by_name:
            ratio = by_name[top]["rollouts_per_s"] / by_name[bottom]["rollouts_per_s"]
            goals.append({"ratio": f"{top} / {bottom}", "value": ratio, "goal": goal, "met": ratio >= goal})
    environments = [p.get("environment") for p in payloads]
    return {
        "bench": "grpo",
        "merged_from": len(payloads),
        "environment": environments[0] if environments else None,
        "environments": environments,
        "shape": payloads[0].get("shape") if payloads else None,
        "variants": results,
        "goals": goals,
    }


def merge_main(paths: list[str], out: str) -> int:
    payloads = []
    for path in paths:
        try:
            with open(path) as handle:
                payloads.append(json.load(handle))
        except (OSError, json.JSONDecodeError) as exc:
            logger.warning(f"[bench] --merge: skipping {path} ({exc})")
    merged = merge_results(payloads)
    write_json(out, merged)
    print(format_table(merged["variants"]))
    for goal in merged["goals"]:
        print(
            f"[bench] {goal['ratio']} = {goal['value']:.2f} (goal >= {goal['goal']}: "
            f"{'met' if goal['met'] else 'NOT met'})"
        )
    print(f"[bench] JSON: {os.path.abspath(out)}")
    return 0


def prompts_per_generation(variant: Variant, tiny: bool) -> int:
    """Distinct prompts in one generation batch of `variant` (the dataset needs at least that many rows)."""
    kwargs = {"num_generations": NUM_GENERATIONS, **variant.overrides}
    if tiny:
        kwargs.update(tiny_batch_sizes(kwargs))
    return max(1, generation_batch(kwargs) // int(kwargs["num_generations"]))


def generation_batch(kwargs: dict[str, Any]) -> int:
    """The generation batch GRPOConfig makes of these kwargs in one process: generation_batch_size, else the
    per-device batch x steps_per_generation (default: the accumulation steps)."""
    steps = kwargs.get("steps_per_generation") or kwargs.get("gradient_accumulation_steps", 1)
    return int(kwargs.get("generation_batch_size") or int(kwargs.get("per_device_train_batch_size", 8)) * int(steps))


def summarize(results: list[dict], memory_cap_gib: float | None) -> dict[str, Any]:
    ok = [r for r in results if r.get("status") == "ok" and r["name"] != BASELINE and r.get("ratio_vs_plain_trl")]
    if memory_cap_gib is None:  # under a cap, a variant over it has failed with an OOM
        ok = [r for r in ok if (r.get("peak_reserved_gib") or 0) <= 40.0]
    best = max(ok, key=lambda r: r["ratio_vs_plain_trl"], default=None)
    if best is None:
        return {"best": None, "line": "[bench] no variant to compare with plain_trl"}
    return {
        "best": best["name"],
        "best_ratio": best["ratio_vs_plain_trl"],
        "best_peak_reserved_gib": best.get("peak_reserved_gib"),
        "line": f"[bench] best: {best['name']} at {best['ratio_vs_plain_trl']:.2f}x plain_trl "
        f"({best['rollouts_per_s']:.2f} rollouts/s, peak reserved {_fmt(best.get('peak_reserved_gib'), 1)} GiB)",
    }


# --- selfcheck speed (experiments/bench/bench_selfcheck.py) -----------------------------------------------------------

SELFCHECK_TARGET_EXAMPLES = 3000
SELFCHECK_BUDGET_S = 35.0  # issue #16 target on one H200 (was 90 s)
DEFAULT_SELFCHECK_BATCH_SIZES = "64,128,256"
DEFAULT_TINY_SELFCHECK_BATCH_SIZES = "4,8"


def force_completion_length(model, length: int) -> None:
    """Every `generate` on `model` makes at least `length` new tokens: selfcheck's worst case, through the
    generation config that `generate_batch` leaves to the model (no change to the evaluation code)."""
    model.generation_config.min_new_tokens = length


def parse_selfcheck_cli(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="selfcheck speed: open_r1.tasks.counting.evaluate.evaluate_dataset (the grader's protocol, greedy) "
        "on the "
        "full-size random Qwen2-VL-2B, every completion forced to 256 tokens (the worst case).",
    )
    add_common_arguments(parser, "selfcheck_bench.json")
    parser.add_argument(
        "--n",
        type=int,
        default=SELFCHECK_TARGET_EXAMPLES,
        help="examples per batch size (and the projection target), default 3000",
    )
    parser.add_argument(
        "--measure-batches",
        type=int,
        help="time only this many batches per batch size and project to --n (saves GPU time)",
    )
    parser.add_argument(
        "--batch-sizes",
        help=f"comma-separated (default {DEFAULT_SELFCHECK_BATCH_SIZES}; --tiny "
        f"{DEFAULT_TINY_SELFCHECK_BATCH_SIZES}); a 'c' suffix (512c) runs selfcheck --compile",
    )
    parser.add_argument("--budget-s", type=float, default=SELFCHECK_BUDGET_S, help="target seconds for --n examples")
    parser.add_argument("--max-pixels", type=int, help="processor budget (default: the checkpoint's)")
    parser.add_argument("--attn-implementation", default="sdpa")
    parser.add_argument(
        "--split", default="val", help="scenes split: val (480x320) or ood_val (640x480, more vision tokens)"
    )
    parser.add_argument("--unique-examples", type=int, default=256, help="distinct rows made, then cycled to --n")
    parser.add_argument(
        "--decoder",
        default="hf",
        choices=["auto", "graph", "eager", "hf"],
        help="generate_texts' decoder for every batch size (open_r1/decoding.py; selfcheck --decoder)",
    )
    parser.add_argument(
        "--compare-hf",
        type=int,
        default=0,
        help="after timing: this many examples greedy with --decoder and with HF generate, "
        "answers and tokens compared (the JSON's 'compare_hf')",
    )
    return parser.parse_args(argv)


CHUNK_TOKENS = 1 << 16  # the 'k' suffix's cap on vision-attention tokens per SDPA call

# --batch-sizes suffix letters: c = selfcheck --compile, n = the next batch's CPU work serial with the GPU's, g = image
# preprocessing on the GPU, v = time the vision tower (GPU syncs around it: a row of its own), u = transformers'
# per-image vision attention, p = M-RoPE positions in the prefill on the GPU, k = vision attention in CHUNK_TOKENS calls
SELFCHECK_SUFFIXES = {
    "c": "compile",
    "n": "no_prefetch",
    "g": "gpu_images",
    "v": "vision_timing",
    "u": "per_image_vision_attention",
    "p": "gpu_positions",
    "k": "chunked_vision_attention",
}


@contextlib.contextmanager
def vision_timer(module, cuda: bool):
    """{'vision_s', 'vision_calls'}: the seconds and calls inside `module`'s forward (the vision tower, which runs
    only in the prefill), through forward hooks that synchronise the GPU at entry and exit: a profiling row's tool
    (the syncs cost a little)."""
    import torch

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    timing, starts = {"vision_s": 0.0, "vision_calls": 0}, []

    def start(module, args):
        sync()
        starts.append(time.perf_counter())

    def stop(module, args, output):
        sync()
        timing["vision_s"] += time.perf_counter() - starts.pop()
        timing["vision_calls"] += 1

    handles = [module.register_forward_pre_hook(start), module.register_forward_hook(stop)]
    try:
        yield timing
    finally:
        for handle in handles:
            handle.remove()


def parse_selfcheck_batch_sizes(text: str) -> list[tuple[int, dict[str, bool]]]:
    """'256,512n' -> [(256, {}), (512, {'no_prefetch': True})]: a batch size and its SELFCHECK_SUFFIXES letters."""
    runs = []
    for item in comma_list(text):
        number = item.rstrip("".join(SELFCHECK_SUFFIXES))
        flags = {SELFCHECK_SUFFIXES[letter]: True for letter in item[len(number) :]}
        if not number.isdigit() or int(number) < 1:
            raise BenchError(
                f"--batch-sizes: {item!r} is not a positive integer with optional suffixes "
                f"({', '.join(f'{k}={v}' for k, v in SELFCHECK_SUFFIXES.items())})"
            )
        runs.append((int(number), flags))
    if not runs:
        raise BenchError("--batch-sizes must list at least one batch size")
    return runs


def selfcheck_label(entry: dict) -> str:
    return f"{entry['batch_size']}" + "".join(
        f" {name.replace('_', ' ')}" for name in SELFCHECK_SUFFIXES.values() if entry.get(name)
    )


def selfcheck_main(argv=None) -> int:
    import open_r1.generation as generation_lib
    from open_r1 import modeling, vision_attention
    from open_r1.families import vision_tower
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    args = parse_selfcheck_cli(argv)
    runs = parse_selfcheck_batch_sizes(
        args.batch_sizes or (DEFAULT_TINY_SELFCHECK_BATCH_SIZES if args.tiny else DEFAULT_SELFCHECK_BATCH_SIZES)
    )
    batch_sizes = [batch_size for batch_size, _ in runs]
    if args.n < 1:
        raise BenchError("--n must be >= 1")
    completion_length = args.completion_length or (TINY_COMPLETION_LENGTH if args.tiny else BENCH_COMPLETION_LENGTH)
    started = time.perf_counter()
    device = check_device(args.tiny, args.threads)
    with scratch_checkpoint(args.work_dir, "bench-selfcheck-") as (work_dir, model_dir):
        to_time = {bs: min(args.n, bs * args.measure_batches) if args.measure_batches else args.n for bs in batch_sizes}
        rows_needed = max(*to_time.values(), *batch_sizes)
        base, data_source = counting_dataset(min(rows_needed, args.unique_examples), args, work_dir, args.split)
        setup_device(device, args.memory_cap_gib)
        # cycled to `rows_needed` rows: speed depends on the image size and question, not on novelty
        dataset = base.select([i % len(base) for i in range(rows_needed)])
        processor = modeling.load_processor(model_dir, None, args.max_pixels)
        model = load_bench_model(args.tiny, model_dir, args.attn_implementation, device, args.seed).eval()
        force_completion_length(model, completion_length)
        generation_lib.DEFAULT_DECODER = args.decoder
        shape = {
            "completion_length": completion_length,
            "target_examples": args.n,
            "data": data_source,
            "image": "x".join(str(side) for side in dataset[0]["image"].size),
            "budget_s": args.budget_s,
        }
        payload = {
            "bench": "selfcheck",
            "decoder": args.decoder,
            "mode": "tiny" if args.tiny else "full_size",
            "environment": environment_info(device, args.memory_cap_gib),
            "shape": shape,
            "batch_sizes": [],
        }
        outputs = {}  # id(entry) -> its evaluation records (not written to the JSON)
        env = payload["environment"]
        logger.info(
            f"[selfcheck-bench] {env.get('gpu', 'cpu')} torch {env['torch']} transformers {env['transformers']} | "
            f"data: {data_source}"
        )
        for batch_size, flags in runs:
            compiled = flags.get("compile", False)
            evaluate = functools.partial(
                evaluate_dataset,
                model,
                processor,
                dataset,
                batch_size=batch_size,
                max_new_tokens=completion_length,
                progress=False,
                compile_generation=compiled,
                prefetch=not flags.get("no_prefetch", False),
                image_device="cuda" if flags.get("gpu_images") and device == "cuda" else None,
                cpu_positions=not flags.get("gpu_positions", False),
            )
            vision_attention.use_grouped_vision_attention(
                model, "per_image" if flags.get("per_image_vision_attention") else "grouped"
            )
            vision_attention.MAX_TOKENS_PER_CALL = CHUNK_TOKENS if flags.get("chunked_vision_attention") else None
            entry = {
                "batch_size": batch_size,
                "examples": to_time[batch_size],
                **{name: flags.get(name, False) for name in SELFCHECK_SUFFIXES.values()},
            }
            skip = deadline_passed(started, args.deadline_s)
            if skip:
                entry.update(status="skipped", error=skip)
                payload["batch_sizes"].append(entry)
                write_json(args.out, payload)
                logger.info(f"[selfcheck-bench] batch {batch_size}: skipped ({entry['error']})")
                continue
            # reset_compiler: a row's peak memory never includes the previous row's CUDA-graph pools
            with measured(entry, device == "cuda", reset_compiler=args.decoder != "hf" or compiled):
                evaluate(name="warmup", limit=batch_size)  # not timed (kernel selection, allocator growth)
                batch_timings = []
                timer = vision_timer(vision_tower(model), device == "cuda") if flags.get("vision_timing") else None
                with timer or contextlib.nullcontext({}) as vision:
                    report = evaluate(name=f"bs{batch_size}", limit=to_time[batch_size], timings=batch_timings)
                entry.update(vision)
                outputs[id(entry)] = report.records  # compared below
                per_s = report.n / report.seconds
                decoder = (generation_lib._DECODERS or {}).get(model)
                batches = math.ceil(report.n / batch_size)  # the measured batches are the decoder's last calls
                timed = decoder.timings[-batches:] if decoder is not None and decoder.timings else []
                if timed:  # the graph decoder's own split of the measured batches
                    entry.update(decoder_split(timed, len(timed)))
                entry.update(selfcheck_batch_split(batch_timings, timed))
                entry.update(
                    seconds=report.seconds,
                    examples_per_s=per_s,
                    projected_s=args.n / per_s,
                    mean_completion_tokens=report.mean_completion_tokens,
                    within_budget=args.n / per_s <= args.budget_s,
                )
            payload["batch_sizes"].append(entry)
            payload["elapsed_s"] = time.perf_counter() - started
            write_json(args.out, payload)
            line = (
                f"{entry['examples_per_s']:.1f} ex/s, {args.n} in {entry['projected_s']:.0f} s"
                if entry["status"] == "ok"
                else f"failed: {entry['error']}"
            )
            logger.info(f"[selfcheck-bench] batch {selfcheck_label(entry)}: {line}")
        ok = [e for e in payload["batch_sizes"] if e["status"] == "ok"]
        compare_with_first(payload["batch_sizes"], [outputs.get(id(e)) for e in payload["batch_sizes"]])
        write_json(args.out, payload)
        best = min(ok, key=lambda e: e["projected_s"], default=None)
        payload["best"] = best
        if args.compare_hf:
            payload["compare_hf"] = compare_with_hf(
                model, processor, dataset, args.compare_hf, max(batch_sizes), completion_length, args.decoder
            )
            print(f"[selfcheck-bench] vs HF generate: {payload['compare_hf']}", flush=True)
        payload["elapsed_s"] = time.perf_counter() - started
        write_json(args.out, payload)
    print()
    print(format_selfcheck_table(payload))
    if best:
        verdict = "within" if best["within_budget"] else "OVER"
        print(
            f"\n[selfcheck-bench] best: batch {selfcheck_label(best)}: {args.n} examples x {completion_length} tokens "
            f"in "
            f"{best['projected_s']:.0f} s ({verdict} the {args.budget_s:.0f} s budget)"
        )
    print(f"[selfcheck-bench] JSON: {os.path.abspath(args.out)}")
    return 0


def agreement(records: list[dict], others: list[dict]) -> tuple[int, int, int]:
    """(rows compared, equal predictions, equal completion texts) of two evaluations' records, row by row."""
    pairs = list(zip(records, others))
    same = [sum(a[key] == b[key] for a, b in pairs) for key in ("prediction", "completion")]
    return len(pairs), *same


def compare_with_first(entries: list[dict], outputs: list[list[dict] | None]) -> None:
    """Every ok entry after the first ok one counts its answers and completion texts equal to the first's
    (`outputs`: per entry, None or its evaluation records). Greedy decoding of the same inputs must give the same
    texts; with random weights the answers agree trivially (nothing parses), so the texts are the real check."""
    pairs = [(e, out) for e, out in zip(entries, outputs) if e.get("status") == "ok" and out is not None]
    for entry, out in pairs[1:]:
        keys = ("answers_compared", "same_answers_as_first", "same_completions_as_first")
        entry.update(zip(keys, agreement(out, pairs[0][1])))


def selfcheck_batch_split(batch_timings: list[dict], decoder_timings: list[dict]) -> dict[str, Any]:
    """The evaluation's per-batch split (wait_s, the first batch's build included; generate_s; post_s) with the graph
    decoder's prefill / decode seconds beside them when it timed as many batches, and the totals."""
    batches = [dict(t) for t in batch_timings]
    if decoder_timings and len(decoder_timings) == len(batches):
        for batch, timed in zip(batches, decoder_timings):
            batch.update(prefill_s=timed["prefill_s"], decode_s=timed["decode_s"])
    if not batches:
        return {}
    totals = {key: sum(b[key] for b in batches) for key in ("wait_s", "generate_s", "post_s")}
    return {"batches": batches, "first_batch_wait_s": batches[0]["wait_s"], **totals}


def compare_with_hf(model, processor, dataset, n, batch_size, completion_length, decoder) -> dict[str, Any]:
    """Greedy answers of `decoder` against HF generate on the first `n` examples: equal predictions / texts."""
    import open_r1.generation as generation_lib
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    reports = {}
    for name in (decoder, "hf"):
        generation_lib.DEFAULT_DECODER = name
        reports[name] = evaluate_dataset(
            model, processor, dataset, name, batch_size, n, max_new_tokens=completion_length, progress=False
        ).records
    generation_lib.DEFAULT_DECODER = decoder
    ours, hf = reports[decoder], reports["hf"]
    examples, same_prediction, same_text = agreement(ours, hf)
    tokenizer = processor.tokenizer

    def common_prefix(a, b):
        x, y = tokenizer(a)["input_ids"], tokenizer(b)["input_ids"]
        k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        return k / max(len(x), len(y), 1)

    prefix = [common_prefix(a["completion"], b["completion"]) for a, b in zip(ours, hf)]
    return {
        "examples": examples,
        "same_prediction": same_prediction,
        "same_completion_text": same_text,
        "mean_common_prefix_fraction": sum(prefix) / max(len(prefix), 1),
        "predictions_parsed": sum(r["prediction"] is not None for r in hf),
    }


def format_selfcheck_table(payload: dict) -> str:
    n = payload["shape"]["target_examples"]
    rows = [
        (
            f"| batch | status | examples timed | seconds | examples/s | projected s for {n} | mean tokens | "
            "first batch wait s | same texts as first | peak reserved GiB |"
        ),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in payload["batch_sizes"]:
        label = selfcheck_label(e)
        if e["status"] != "ok":
            rows.append(
                f"| {label} | {e['status']}: {e['error']} |{' - |' * 7} {_fmt(e.get('peak_reserved_gib'), 1)} |"
            )
            continue
        same = (
            f"{e['same_completions_as_first']} / {e['answers_compared']}" if "same_completions_as_first" in e else "-"
        )
        rows.append(
            f"| {label} | ok | {e['examples']} | {e['seconds']:.1f} | {e['examples_per_s']:.2f} | "
            f"{e['projected_s']:.0f} | {e['mean_completion_tokens']:.0f} | "
            f"{_fmt(e.get('first_batch_wait_s'), 2)} | {same} | {_fmt(e.get('peak_reserved_gib'), 1)} |"
        )
    return "\n".join(rows)


def cli(argv=None, entry=None) -> int:
    setup_logging()
    try:
        return (entry or main)(argv)
    except (BenchError, RecipeError) as exc:
        return error_exit(exc)


if __name__ == "__main__":
    sys.exit(cli())
