"""GRPO for a Qwen-VL model on TRL's own `GRPOTrainer`, for any task of `open_r1/tasks/` (the recipe's `task`).

Usage:
    accelerate launch --config_file zero3.json-accelerate... -m open_r1.grpo --config configs/qwen2vl_2b_counting.yaml
    python -m open_r1.grpo --config configs/demo.yaml --output_dir runs/demo        # CPU demo
Any recipe key can be overridden on the command line (`--learning_rate 2e-6 --reward_funcs exact_count format`).

parse -> build the task once -> validate before the model loads -> the run's callbacks (`open_r1.run`) -> the
trainer (`open_r1.trainer`) -> train -> save, with `training_meta.json` (what export needs) beside the weights.
"""

import dataclasses
import os
import sys
import textwrap
from dataclasses import dataclass

from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from open_r1 import modeling, validate
from open_r1 import rewards as rewards_lib
from open_r1.checks import check_counts, closest_key, raise_all
from open_r1.errors import OpenR1Error, RecipeError, error_exit, help_field, setup_logging, user_error
from open_r1.families import FAMILIES, vision_tower
from open_r1.jsonio import write_json
from open_r1.noise import quiet_library_noise
from open_r1.run import safety as run_lib
from open_r1.submission.export import TRAINING_META_FILE
from open_r1.tasks import TASK_SETTINGS, get_task, settings_class, task_settings
from open_r1.trainer import VLMGRPOTrainer, check_noisy_rollouts

BATCH_HINT = (
    "per_device_train_batch_size counts completions, not prompts: make the generation batch a multiple of "
    "num_generations"
)


@dataclass
class GRPOScriptArguments(ScriptArguments):
    """Recipe keys of our own (the rest are TRL's `GRPOConfig` and `ModelConfig`)."""

    task: str = help_field(
        "counting",
        "Which task folder builds the prompts and scores held-out sets: counting | captioning (open_r1/tasks/).",
    )
    dataset_name: str | None = help_field(
        None,
        "Train split: a save_to_disk dir, a hub snapshot folder, a .parquet/.jsonl/.json file or a hub id "
        "(docs/R1V.md).",
    )
    reward_funcs: list[str] = help_field(
        ["exact_count", "format"], "Reward names from open_r1.rewards.REWARD_REGISTRY; weights go in reward_weights."
    )
    reward_kwargs: dict | str | None = help_field(
        None,
        "Per-reward parameters, a YAML mapping (JSON text on the command line), e.g. "
        '{"soft_count": {"tolerance": 2}}; each checked against its reward\'s parameters before the model loads.',
    )
    min_pixels: int | None = help_field(
        None,
        "Smallest image area (pixels) after resizing (default: 4 merged tokens of the "
        "model family: 3136 for Qwen2/2.5-VL's 28x28, 4096 for Qwen3-VL's 32x32).",
    )
    max_pixels: int | None = help_field(
        None,
        "Vision-token budget: largest image area (default: 512 merged tokens of the "
        "model family: 401408 for Qwen2/2.5-VL, 524288 for Qwen3-VL).",
    )
    max_train_samples: int | None = help_field(None, "Use only the first N rows (smoke runs).")
    lora_vision: bool = help_field(False, "Also put LoRA adapters on the vision tower.")
    image_check_rows: int = help_field(
        8,
        "Images fully decoded by the data module; -1 decodes every row. Independently, every image "
        "of every set the run reads is verified up front (header + checksums, open_r1/validate.py).",
    )
    # Run safety (open_r1/run/): time budget, in-training protocol evaluation with keep-best, resume.
    time_budget: str | None = help_field(
        None,
        "Deadline for the submission: '55m', '1h30m', '3600' (seconds from $TRAIN_START_TIME or "
        "process start) or an ISO datetime. Training stops early enough to save, export and verify.",
    )
    eval_sets: list[str] = help_field(
        [],
        "Held-out sets (any form dataset_name takes) scored with the selfcheck protocol during training "
        "(names = basenames, e.g. /app/data/ood_val /app/data/val).",
    )
    eval_steps_protocol: int = help_field(50, "Evaluate eval_sets every N optimizer steps.")
    eval_limit: int | None = help_field(200, "Fixed subset: the first N rows of each eval set.")
    eval_batch_size: int = help_field(32, "Generation batch size of the in-training evaluation.")
    eval_primary: str | None = help_field(
        None, "Keep-best set (highest score wins; default: the task's, counting: ood_val)."
    )
    eval_secondary: str | None = help_field(None, "Keep-best tie-break set (default: the task's, counting: val).")
    eval_first_step: bool = help_field(True, "Also evaluate after step 1 (baseline score, measures the eval time).")
    keep_best: bool | None = help_field(
        None, "Export the best evaluated checkpoint instead of the last (default: true with eval_sets)."
    )
    auto_resume: bool = help_field(True, "Resume from the newest complete checkpoint-N in output_dir, if any.")
    resume_mismatch_ok: bool = help_field(
        False,
        "Resume a run dir trained from another base model / reward or prompt recipe (refused by "
        "default: open_r1/validate.py).",
    )
    # Speed levers (open_r1/trainer.py; measured in docs/PERFORMANCE.md).
    fast_decode: str = help_field(
        "auto",
        "Rollouts with the CUDA-graph decoder (open_r1/decoding.py) instead of HF generate: auto "
        "(on a CUDA device without vLLM; under ZeRO-3 from a whole-weight copy of the policy, "
        "open_r1/rollout_weights.py), true (required), false (HF generate).",
    )
    lazy_images: bool = help_field(True, "Decode each round's images once, in threads, instead of at every micro-step.")
    dedupe_vision: bool = help_field(
        True,
        "Encode each distinct image of a batch once in the ViT and keep a prompt's completions in "
        "one micro-batch (same update, less ViT compute; measured in docs/PERFORMANCE.md).",
    )
    dedupe_images: bool = help_field(
        True,
        "Preprocess each distinct image of a round once (TRL preprocesses every completion's copy, "
        "twice per round); the processor's outputs are unchanged (open_r1/image_dedupe.py).",
    )
    noisy_rollouts: float = help_field(
        0.0,
        "Fraction of each group generated and trained on a Gaussian-noised image (NoisyRollout-"
        "style; 0 = off). See open_r1/trainer.py.",
    )
    noise_std: float = help_field(0.1, "Pixel noise std for noisy_rollouts, pixel range [0, 1].")
    freeze_vision: bool = help_field(
        False, "Train the language model and merger only; the vision tower's blocks stay as loaded."
    )

    def __post_init__(self):
        self.reward_kwargs = rewards_lib.parse_reward_kwargs(self.reward_kwargs)  # {reward: {param: value}}


def lora_config(model_args: ModelConfig, lora_vision: bool, family=FAMILIES["qwen2_vl"]):
    """peft LoraConfig from the recipe; targets the family's language model only unless lora_vision."""
    from trl import get_peft_config

    if model_args.use_peft and model_args.lora_target_modules is None:
        model_args.lora_target_modules = family.lora_targets(vision=lora_vision)
    return get_peft_config(model_args)


def freeze_vision_tower(model) -> int:
    """Stop gradients into the ViT (patch embedding and blocks); the mergers (`merger`, Qwen3-VL's
    `deepstack_merger_list`) train. Returns the number of frozen parameters."""
    visual = vision_tower(model)
    if visual is None:
        raise RecipeError(f"freeze_vision: {type(model).__name__} has no vision tower (model.visual)")
    frozen = 0
    for name, param in visual.named_parameters():
        if not name.startswith(("merger.", "deepstack_merger_list.")):
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def build_trainer(
    script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, task, callbacks=None
):
    """Everything up to `trainer.train()` for a validated recipe (`validate.validate_training`): data, rewards, model,
    processor, LoRA, the trainer. `task`: the run's (`parse_args` builds it)."""
    training_args.remove_unused_columns = False  # the data's columns must reach the reward functions
    reward_funcs = rewards_lib.get_reward_funcs(script_args.reward_funcs, script_args.reward_kwargs)
    check_noisy_rollouts(script_args.noisy_rollouts, script_args.noise_std)  # before the slow loads
    family = modeling.family_of_dir(model_args.model_name_or_path)
    train_dataset = task.train_dataset(script_args, training_args)

    model = modeling.load_model(
        model_args.model_name_or_path,
        dtype=model_args.dtype,
        attn_implementation=model_args.attn_implementation,
    )
    if script_args.freeze_vision:
        if model_args.use_peft:
            raise RecipeError("freeze_vision is for full fine-tuning; with LoRA the tower is frozen unless lora_vision")
        freeze_vision_tower(model)
    default_min, default_max = modeling.default_pixel_budget(family)  # the family's patch x merge geometry
    processor = modeling.load_processor(
        model_args.model_name_or_path,
        default_min if script_args.min_pixels is None else script_args.min_pixels,
        default_max if script_args.max_pixels is None else script_args.max_pixels,
    )
    return VLMGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=processor,
        peft_config=lora_config(model_args, script_args.lora_vision, family),
        callbacks=callbacks,
        lazy_images=script_args.lazy_images,
        noisy_fraction=script_args.noisy_rollouts,
        dedupe_vision=script_args.dedupe_vision,
        dedupe_images=script_args.dedupe_images,
        noise_std=script_args.noise_std,
        fast_decode=script_args.fast_decode,
    )


def write_training_meta(output_dir: str, script_args, model_args, processor, task) -> None:
    min_pixels, max_pixels = modeling.pixel_budget(processor)
    meta = {
        "base_model": os.path.abspath(model_args.model_name_or_path),
        "use_peft": bool(model_args.use_peft),
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "task": script_args.task,
        "reward_funcs": list(script_args.reward_funcs),
        **task.training_meta(),
    }
    write_json(os.path.join(output_dir, TRAINING_META_FILE), meta)


def announce_rank(trainer) -> None:
    """One line per process, so a multi-GPU log shows every rank joined (and under which distribution): a print, as
    the logger shows rank 0's lines only."""
    state = trainer.accelerator.state
    plugin = getattr(state, "deepspeed_plugin", None)
    zero = f", ZeRO stage {plugin.zero_stage}" if plugin is not None else ""
    print(
        f"[grpo] rank {state.process_index}/{state.num_processes} on {state.device}: {state.distributed_type}{zero}",
        flush=True,
    )


def main(script_args: GRPOScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, task, callbacks=None):
    """Train one recipe (`parse_args`' four values: `task` is built once there and keeps the sets it loads)."""
    # every recipe value, path, device, model file and image, before the model loads
    validate.validate_training(script_args, training_args, model_args, task, submission=os.environ.get("SUBMISSION"))
    # time budget, SIGTERM/SIGINT stop, in-training eval, keep-best, resume
    run = run_lib.build_run_callbacks(script_args, training_args, task)
    trainer = build_trainer(
        script_args, training_args, model_args, task, callbacks=[*run.callbacks, *(callbacks or [])]
    )
    announce_rank(trainer)
    run.bind(trainer)
    trainer.run_safety = run
    if trainer.accelerator.is_main_process:  # before training, so a checkpoint of a killed run stays exportable
        os.makedirs(training_args.output_dir, exist_ok=True)
        write_training_meta(training_args.output_dir, script_args, model_args, trainer.processing_class, task)
    trainer.train(resume_from_checkpoint=run.resume_from)
    if not run.stopped_by_signal:  # on a signal the checkpoint just saved is the final state: leave quickly
        trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(training_args.output_dir)
        run.finish(trainer, training_args.output_dir, final_model_saved=not run.stopped_by_signal)
    trainer.accelerator.wait_for_everyone()
    return trainer


@dataclass
class _ActivationCheckpointingAlias:
    """transformers < 5.23 knows only `gradient_checkpointing`; our recipes write the new name
    `activation_checkpointing` (5.23+ warns on the old one), so on those versions the new key is accepted here."""

    activation_checkpointing: bool | None = help_field(
        None, "Activation (gradient) checkpointing; transformers < 5.23 calls it gradient_checkpointing."
    )


def _argument_classes() -> list[type]:
    """The dataclasses `parse_args` parses a recipe into: the engine's, TRL's, every task's own keys
    (`open_r1.tasks.task_settings`), and the alias last, where this transformers needs it."""
    classes = [GRPOScriptArguments, GRPOConfig, ModelConfig, *task_settings()]
    if "activation_checkpointing" not in {f.name for f in dataclasses.fields(GRPOConfig)}:
        classes.append(_ActivationCheckpointingAlias)
    return classes


def recipe_keys() -> frozenset[str]:
    """Every key a recipe of this entry may set: the ``init`` fields of `_argument_classes` and ``env`` (TrlParser
    sets those environment variables); the captioning pipeline checks its GRPO keys against these up front."""
    return frozenset({"env", *(f.name for cls in _argument_classes() for f in dataclasses.fields(cls) if f.init)})


class _RecipeParser(TrlParser):
    """TrlParser with no abbreviations (`--learning_rat` is not `--learning_rate`) and argparse's errors as one
    RecipeError (its default prints the usage of every key, 220 lines, before the one that matters)."""

    def __init__(self, dataclass_types):
        super().__init__(dataclass_types, allow_abbrev=False)

    def parse_known_args(self, args=None, namespace=None):
        parsed, rest = super().parse_known_args(args, namespace)
        raise_all(check_counts(vars(parsed)), header="invalid recipe")  # before GRPOConfig divides by them
        return parsed, rest

    def error(self, message):
        raise RecipeError(f"invalid recipe: {message}")


def unknown_keys_error(config_rest: list[str], cli_rest: list[str]) -> RecipeError:
    """One error naming each unknown key (YAML keys and command-line flags) with the closest known one."""
    keys = sorted(recipe_keys())
    found = []
    for where, rest in (("recipe key", config_rest), ("command-line flag", cli_rest)):
        for item in rest:
            if not item.startswith("--") and found:  # a value of the unknown flag before it
                continue
            key = item[2:].split("=", 1)[0].replace("-", "_") if item.startswith("--") else item
            close = closest_key(key, keys)
            found.append(f"{where} {key!r}" + (f" (did you mean {close}?)" if close else ""))
    return RecipeError("unknown " + "; ".join(found) + " (open-r1-grpo --help lists the keys)")


def parse_args(argv=None, values: dict | None = None) -> tuple:
    """(script_args, training_args, model_args, task): the recipe (`--config` YAML and flags, or `values`: a recipe
    mapping, the captioning pipeline's grpo section) parsed by one parser into the engine's, TRL's and the tasks'
    dataclasses, and the recipe's task built once from its settings. Every problem is one RecipeError naming the key
    and the fix (unknown keys and abbreviations with the closest key)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[-1:] == ["--config"]:  # TrlParser would fail on an IndexError
        raise RecipeError("--config needs a recipe file, e.g. --config configs/demo.yaml")
    classes = _argument_classes()
    parser = _RecipeParser(tuple(classes))
    try:
        given_rest = parser.set_defaults_with_config(**values) if values else []
        *parsed, config_rest, cli_rest = parser.parse_args_and_config(
            args=argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except OpenR1Error:  # already one clear line (unknown key, bad value)
        raise
    except FileNotFoundError as exc:  # --config pointing nowhere
        raise RecipeError(f"recipe file {exc.filename} does not exist (--config); see configs/*.yaml") from None
    except OSError as exc:
        raise RecipeError(f"cannot read the recipe ({exc}) (--config)") from None
    except ImportError as exc:  # transformers checks for DeepSpeed while parsing --deepspeed
        if "deepspeed" not in str(exc):
            raise
        raise RecipeError(
            "--deepspeed needs DeepSpeed, which is not installed: pip install -e '.[gpu]' "
            "(train.sh passes --deepspeed zero3.json unless ZERO3=0)"
        ) from None
    except (ValueError, TypeError) as exc:  # GRPOConfig validates its fields when it is built
        hint = BATCH_HINT if "num_generations" in str(exc) else "check the recipe and its overrides"
        if "bf16/gpu" in str(exc):
            hint = (
                "no GPU is visible: pass --use_cpu true (train.sh does when NUM_GPUS=0) with a CPU recipe "
                "such as configs/demo.yaml, or run on a GPU machine"
            )
        raise RecipeError(f"invalid recipe: {' '.join(str(exc).split()).rstrip('.')} ({hint})") from None
    except Exception as exc:  # a YAML syntax error (yaml.YAMLError); anything else is a bug: re-raised
        if type(exc).__module__.split(".")[0] != "yaml":
            raise
        raise RecipeError(f"the recipe is not valid YAML: {exc} (--config)") from None
    if given_rest or config_rest or cli_rest:
        raise unknown_keys_error(given_rest + config_rest, cli_rest)
    return combine_parsed(parsed[: len(classes)])


def combine_parsed(parsed) -> tuple:
    """(script_args, training_args, model_args, task) from the parsed `_argument_classes`: the alias sets
    gradient_checkpointing; the recipe's task is built with its own settings (the other tasks' are unused)."""
    script_args, training_args, model_args, *extra = parsed
    by_class = {type(settings): settings for settings in extra}
    alias = by_class.get(_ActivationCheckpointingAlias)
    if alias is not None and alias.activation_checkpointing is not None:
        training_args.gradient_checkpointing = alias.activation_checkpointing
    settings = by_class.get(settings_class(script_args.task)) if script_args.task in TASK_SETTINGS else None
    return script_args, training_args, model_args, get_task(script_args.task, script_args, settings)


# The TRL keys a recipe of ours usually sets, shown by the short --help (the rest: --help-all).
COMMON_TRL_KEYS = (
    "model_name_or_path",
    "output_dir",
    "learning_rate",
    "lr_scheduler_type",
    "max_steps",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_completion_length",
    "temperature",
    "beta",
    "loss_type",
    "reward_weights",
    "use_peft",
    "lora_r",
    "activation_checkpointing",
    "bf16",
    "dtype",
    "use_vllm",
    "logging_steps",
    "save_steps",
    "report_to",
    "seed",
)


def short_help() -> str:
    """--help: our recipe keys first, then the common TRL ones; TRL's full list (hundreds of keys) is --help-all."""

    def describe(field_) -> str:
        text = " ".join(str(field_.metadata.get("help", "")).split())
        default = (
            field_.default
            if field_.default is not dataclasses.MISSING
            else (field_.default_factory() if field_.default_factory is not dataclasses.MISSING else None)
        )
        head = f"  --{field_.name} (default: {default!r})"
        return head + "\n" + textwrap.fill(text, width=110, initial_indent=" " * 6, subsequent_indent=" " * 6)

    ours = [
        f
        for cls in (GRPOScriptArguments, *task_settings())
        for f in dataclasses.fields(cls)
        if f.name == "dataset_name" or f.name not in {g.name for g in dataclasses.fields(ScriptArguments)}
    ]
    trl_fields = {f.name: f for cls in (GRPOConfig, ModelConfig) for f in dataclasses.fields(cls)}
    common = [trl_fields[name] for name in COMMON_TRL_KEYS if name in trl_fields]
    total = len(trl_fields) + len(dataclasses.fields(ScriptArguments))
    return "\n".join(
        [
            "usage: open-r1-grpo --config RECIPE.yaml [--KEY VALUE ...]   (= python -m open_r1.grpo)",
            "       (bash train.sh RECIPE.yaml [--KEY VALUE ...]: model, data and output dir from MODEL_PATH, DATA and "
            "OUTPUT_DIR, else the recipe's)",
            "",
            "Every key can go in the recipe YAML or on the command line; the command line wins.",
            "",
            "Recipe keys of this project (open_r1/grpo.py: GRPOScriptArguments):",
            *map(describe, ours),
            "",
            "Common keys of TRL's GRPOConfig / ModelConfig:",
            *map(describe, common),
            "",
            f"All {total} keys, TRL's included: open-r1-grpo --help-all",
        ]
    )


def cli(argv=None) -> int:
    setup_logging()
    quiet_library_noise()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help-all" in argv:  # TRL's own parser help: every GRPOConfig / ModelConfig / ScriptArguments key
        argv = ["--help" if arg == "--help-all" else arg for arg in argv]
    elif "-h" in argv or "--help" in argv:
        print(short_help())
        return 0
    try:
        script_args, training_args, model_args, task = parse_args(argv)
        trainer = main(script_args, training_args, model_args, task)
    except Exception as exc:  # ours, also from a worker process (data map, DataLoader), wrapped by the library
        found = user_error(exc)
        if found is None:
            raise
        return error_exit(found)
    return trainer.run_safety.exit_code  # 128+signal after SIGTERM/SIGINT (checkpoint saved), so train.sh stops


if __name__ == "__main__":
    sys.exit(cli())
