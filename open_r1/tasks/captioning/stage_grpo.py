"""Stage 4: GRPO of the SFT policy against the reward model, through the engine's GRPO entry (TRL GRPOTrainer).

The ``grpo`` section is an ``open_r1.grpo`` recipe (``python -m open_r1.grpo --help-all``) plus `Settings`, parsed
once before any stage runs by ``open_r1.grpo.parse_args`` over `DEFAULTS` (task captioning, the ``caption_rm``
reward). The pipeline sets the model (the SFT policy), the dataset (the train split), each seed's output dir and
seed, and caption_rm's ``reward_model`` and ``device`` where left out; the LoRA is merged into
``models/policy-grpo-seed<S>``. ``cispo`` is refused: TRL 1.16's clamps the ratio at epsilon_high (REINFORCE x 0.28).
"""

import copy
import dataclasses
import logging
import os
import time
from typing import NamedTuple

from open_r1 import grpo, modeling
from open_r1.checks import check_loss_type
from open_r1.errors import RecipeError, RewardConfigError
from open_r1.rewards import parse_reward_kwargs
from open_r1.run.budget import TimeBudgetCallback
from open_r1.run.keep_best import has_weights, resolve_export_checkpoint
from open_r1.submission.export import load_for_export
from open_r1.submission.install import kept_path
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning.config import help_field
from open_r1.tasks.captioning.rewards import check_caption_rm_settings

logger = logging.getLogger(__name__)

NAME = "grpo"
DEFAULTS = {
    "task": "captioning",
    "reward_funcs": ["caption_rm"],
    "use_peft": True,
    "lora_r": 32,
    "lora_alpha": 32,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "dedupe_vision": False,
    "auto_resume": False,
}
OWNED = {
    "seed": "grpo.seeds",
    "output_dir": "work_dir",
    "model_name_or_path": "the sft stage's output",
    "dataset_name": "data_dir",
}  # set by the pipeline for each seed's run


@dataclasses.dataclass
class Settings:
    """The pipeline's keys of the grpo section (the rest is the open_r1.grpo recipe)."""

    seeds: list[int] = help_field([0], "one GRPO run per seed")
    max_seconds: float | None = help_field(None, "wall-clock cap of each run (open_r1.run.budget.TimeBudgetCallback)")

    def __post_init__(self):
        config.seed_list("grpo.seeds", self.seeds)
        config.require(
            self.max_seconds is None or self.max_seconds > 0,
            f"grpo.max_seconds must be > 0 or null, got {self.max_seconds!r}",
        )


class Section(NamedTuple):
    settings: Settings
    args: tuple  # (script_args, training_args, model_args, task), parsed once
    env: dict


def parse_grpo(values: dict) -> tuple:
    """(script_args, training_args, model_args, task) of an open_r1.grpo recipe mapping, by open_r1.grpo's own
    parser; a value it refuses is one RecipeError."""
    try:
        return grpo.parse_args([], values)
    except RecipeError as exc:
        raise RecipeError(
            f"the grpo section does not parse as an open_r1.grpo recipe: {exc}; see open-r1-grpo --help"
        ) from None


def parse(mapping, paths, settings_class: type = Settings) -> Section:
    """The section: `settings_class` (the pipeline's keys; the stand-in adds its own) and the open_r1.grpo recipe."""
    mapping = dict(mapping or {})
    own = [f.name for f in dataclasses.fields(settings_class)]
    settings = config.parse_section(NAME, settings_class, {k: mapping.pop(k) for k in own if k in mapping})
    config.check_keys(NAME, mapping, {*own, *grpo.recipe_keys()})
    for key, instead in OWNED.items():
        config.require(key not in mapping, f"grpo.{key}: the pipeline sets {key} for each seed's run; set {instead}")
    config.require(
        mapping.get("loss_type") != "cispo",
        "grpo.loss_type cispo: TRL 1.16 clamps the ratio at epsilon_high (REINFORCE x 0.28); use dapo or grpo",
    )
    cuda = config.device() == "cuda"
    values = {**DEFAULTS, "bf16": cuda, "use_cpu": not cuda, **mapping}
    seed = settings.seeds[0]
    env = values.pop("env", None) or {}
    config.require(isinstance(env, dict), f"grpo.env must map variable names to values, got {env!r}")
    kwargs = copy.deepcopy(parse_reward_kwargs(values.get("reward_kwargs")))  # a mapping, or JSON text
    if "caption_rm" in values["reward_funcs"]:
        rm = kwargs.setdefault("caption_rm", {})
        rm.setdefault("reward_model", paths.rm)
        rm.setdefault("device", "cuda:0" if cuda else "cpu")
        try:
            check_caption_rm_settings(**{k: v for k, v in rm.items() if k != "reward_model"})
        except (RewardConfigError, TypeError) as exc:
            raise RecipeError(f"grpo.reward_kwargs.caption_rm: {exc}") from None
    values.update(
        reward_kwargs=kwargs,
        model_name_or_path=paths.policy_sft,
        dataset_name=paths.split("train"),
        output_dir=paths.grpo_run(seed),
        seed=seed,
        eval_sets=[s if os.sep in s else paths.split(s) for s in values.get("eval_sets") or []],
    )
    args = parse_grpo(values)  # (on a GPU this sets up the device, as the run will: a CUDA context from here on)
    for problem in check_loss_type(args[1]):
        raise RecipeError(f"grpo section: {problem}")
    return Section(settings, args, env)


def seed_args(section, paths, seed) -> tuple:
    """Copies of the section's parsed arguments, with this seed and its output dir, and the task (built once)."""
    *args, task = section.args
    script_args, training_args, model_args = (copy.deepcopy(a) for a in args)
    training_args.seed, training_args.output_dir = seed, paths.grpo_run(seed)
    return script_args, training_args, model_args, task


def check(section, *_) -> None:
    """The reward model's device is on this machine (the pipeline's preflight: before any stage loads a model)."""
    device = (section.args[0].reward_kwargs.get("caption_rm") or {}).get("device")
    if device is not None:
        config.check_device("grpo.reward_kwargs.caption_rm.device", device)


def inputs(section, paths, *_) -> dict[str, config.Input]:
    script_args = section.args[0]
    out = {
        "policy": config.Input(paths.policy_sft, "the SFT policy", "run the sft stage"),
        "train": config.split_input(paths, "train"),
    }
    rm = (script_args.reward_kwargs.get("caption_rm") or {}).get("reward_model")
    if rm:
        out["rm"] = config.Input(
            rm, "the reward model", "set grpo.reward_kwargs.caption_rm.reward_model", config.RM_MARKER
        )
    for path in script_args.eval_sets or []:
        out[path] = config.Input(
            path, f"the eval set {path}", "set grpo.eval_sets to existing splits", config.DATASET_MARKER
        )
    return out


def outputs(section, paths, *_) -> list[str]:
    return [paths.grpo_model(seed) for seed in section.settings.seeds]


def run_seed(section, paths, seed) -> dict:
    config.check_inputs(inputs(section, paths))
    script_args, training_args, model_args, task = seed_args(section, paths, seed)
    os.environ.update({str(k): str(v) for k, v in section.env.items()})
    if has_weights(training_args.output_dir):  # an earlier invocation's finished run: kept, never trained over
        aside = kept_path(training_args.output_dir, "prev")
        os.rename(training_args.output_dir, aside)
        logger.info(f"[grpo] seed {seed}: the earlier run in {training_args.output_dir} kept at {aside}")
    logger.info(f"[grpo] seed {seed}: open_r1.grpo into {training_args.output_dir}")
    started = time.time()
    cap = TimeBudgetCallback(max_seconds=section.settings.max_seconds)
    trainer = grpo.main(script_args, training_args, model_args, task, callbacks=[cap])
    if trainer.run_safety.exit_code:
        raise RecipeError(f"GRPO seed {seed} stopped with exit code {trainer.run_safety.exit_code}")
    keys = ("step", "reward", "caption_rm/format_ok", "caption_rm/sigmoid_mean", "kl", "completions/mean_length")
    curve = [{k: e[k] for k in keys if k in e} for e in trainer.state.log_history if "reward" in e]
    steps = int(trainer.state.global_step)
    del trainer
    seconds = time.time() - started
    # the keep-best checkpoint when the run evaluated (eval_sets), else the final adapter
    merged, _ = load_for_export(resolve_export_checkpoint(training_args.output_dir))
    processor = modeling.load_processor(training_args.output_dir)
    modeling.save_model_dir(merged, processor, paths.grpo_model(seed))
    logger.info(
        f"[grpo] seed {seed}: {steps} steps in {seconds:.1f} s; reward "
        f"{curve[0].get('reward') if curve else None} -> {curve[-1].get('reward') if curve else None}"
    )
    return {
        "seed": seed,
        "output_dir": training_args.output_dir,
        "seconds": seconds,
        "steps": steps,
        "model": paths.grpo_model(seed),
        "curve": curve,
    }


def run(section, paths, *_) -> dict:
    return {"runs": [run_seed(section, paths, seed) for seed in section.settings.seeds]}
