"""Stage 4: GRPO of the SFT policy against the reward model, through the engine's GRPO entry (TRL GRPOTrainer).

The ``grpo`` section is an ``open_r1.grpo`` recipe (``python -m open_r1.grpo --help-all``) plus `Settings`, parsed
once before any stage runs by TrlParser over `DEFAULTS` (task captioning, the ``caption_rm`` reward). The pipeline
sets the model (the SFT policy), the dataset (the train split), each seed's output dir and seed, and caption_rm's
``reward_model`` and ``device`` where left out; the LoRA is merged into ``models/policy-grpo-seed<S>``. ``cispo`` is
refused: TRL 1.16's clamps the ratio at epsilon_high (REINFORCE x 0.28).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import os
import time
from typing import NamedTuple

from open_r1 import grpo, modeling
from open_r1.checks import check_loss_type
from open_r1.errors import RecipeError, RewardConfigError
from open_r1.export import load_for_export
from open_r1.grpo import recipe_keys
from open_r1.rewards import parse_reward_kwargs
from open_r1.run.budget import TimeCapCallback
from open_r1.run.keep_best import resolve_export_checkpoint
from open_r1.tasks.captioning import config
from open_r1.tasks.captioning.config import help_field
from open_r1.tasks.captioning.rewards import check_caption_rm_settings

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
    max_seconds: float | None = help_field(None, "wall-clock cap of each run (open_r1.run.budget.TimeCapCallback)")
    parallel: bool = help_field(False, "run the seeds as parallel processes")

    def __post_init__(self):
        config.seed_list("grpo.seeds", self.seeds)
        config.require(
            self.max_seconds is None or self.max_seconds > 0,
            f"grpo.max_seconds must be > 0 or null, got {self.max_seconds!r}",
        )


class Section(NamedTuple):
    settings: Settings
    args: tuple  # (script_args, training_args, model_args), parsed once
    env: dict


def parse_grpo(values: dict) -> tuple:
    """(script_args, training_args, model_args) of an open_r1.grpo recipe mapping, typed as ``--config`` types
    them; a value it refuses is one RecipeError."""
    from trl import TrlParser  # deferred: heavy

    parser = TrlParser(grpo._argument_classes())
    parser.set_defaults_with_config(**values)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = list(parser.parse_args_into_dataclasses(args=[]))
    except SystemExit:  # argparse: a value its type refuses; the reason is the last line it printed
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        reason = lines[-1].split("error: ", 1)[-1] if lines else "the recipe did not parse"
    except (ValueError, TypeError) as exc:  # GRPOConfig's own checks when it is built
        reason = " ".join(str(exc).split()).rstrip(".")
    else:
        return grpo.combine_parsed(parsed)  # the tasks' settings and the alias, as open_r1.grpo's parse_args
    raise RecipeError(f"the grpo section does not parse as an open_r1.grpo recipe: {reason}; see open-r1-grpo --help")


def parse(mapping, recipe) -> Section:
    mapping = dict(mapping or {})
    own = [f.name for f in dataclasses.fields(Settings)]
    settings = config.parse_section(NAME, Settings, {k: mapping.pop(k) for k in own if k in mapping})
    config.check_keys(NAME, mapping, {*own, *recipe_keys()})
    for key, instead in OWNED.items():
        config.require(key not in mapping, f"grpo.{key}: the pipeline sets {key} for each seed's run; set {instead}")
    config.require(
        mapping.get("loss_type") != "cispo",
        "grpo.loss_type cispo: TRL 1.16 clamps the ratio at epsilon_high (REINFORCE x 0.28); use dapo or grpo",
    )
    cuda = config.device() == "cuda"
    values = {**DEFAULTS, "bf16": cuda, "use_cpu": not cuda, **mapping}
    paths, seed = recipe.paths, settings.seeds[0]
    env = values.pop("env", None) or {}
    config.require(isinstance(env, dict), f"grpo.env must map variable names to values, got {env!r}")
    kwargs = copy.deepcopy(parse_reward_kwargs(values.get("reward_kwargs")))
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


def seed_args(recipe, seed: int) -> tuple:
    """Copies of the section's parsed arguments, with this seed and its output dir."""
    script_args, training_args, model_args = (copy.deepcopy(a) for a in recipe.section(NAME).args)
    training_args.seed, training_args.output_dir = seed, recipe.paths.grpo_run(seed)
    return script_args, training_args, model_args


def inputs(recipe) -> dict[str, config.Input]:
    script_args = recipe.section(NAME).args[0]
    out = {
        "policy": config.Input(recipe.paths.policy_sft, "the SFT policy", "run the sft stage"),
        "train": config.split_input(recipe.paths, "train"),
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


def outputs(recipe) -> list[str]:
    return [recipe.paths.grpo_model(seed) for seed in recipe.section(NAME).settings.seeds]


def run_seed(recipe, seed: int) -> dict:
    section = recipe.section(NAME)
    config.check_inputs(inputs(recipe))
    script_args, training_args, model_args = seed_args(recipe, seed)
    os.environ.update({str(k): str(v) for k, v in section.env.items()})
    config.log(f"[grpo] seed {seed}: open_r1.grpo into {training_args.output_dir}")
    started = time.time()
    trainer = grpo.main(
        script_args, training_args, model_args, callbacks=[TimeCapCallback(section.settings.max_seconds)]
    )
    if trainer.run_safety.exit_code:
        raise RecipeError(f"GRPO seed {seed} stopped with exit code {trainer.run_safety.exit_code}")
    history = [dict(e) for e in trainer.state.log_history]
    steps = int(trainer.state.global_step)
    del trainer
    seconds = time.time() - started
    # the keep-best checkpoint when the run evaluated (eval_sets), else the final adapter
    merged, _ = load_for_export(resolve_export_checkpoint(training_args.output_dir))
    processor = modeling.load_processor(training_args.output_dir)
    modeling.save_model_dir(merged, processor, recipe.paths.grpo_model(seed))
    keys = ("reward", "caption_rm/format_ok", "caption_rm/sigmoid_mean", "kl", "completions/mean_length")
    curve = [{k: e[k] for k in ("step", *keys) if k in e} for e in history if "reward" in e]
    config.log(
        f"[grpo] seed {seed}: {steps} steps in {seconds:.1f} s; reward "
        f"{curve[0].get('reward') if curve else None} -> {curve[-1].get('reward') if curve else None}"
    )
    return {
        "seed": seed,
        "output_dir": training_args.output_dir,
        "seconds": seconds,
        "steps": steps,
        "model": recipe.paths.grpo_model(seed),
        "curve": curve,
    }


def run(recipe) -> dict:
    return {"runs": [run_seed(recipe, seed) for seed in recipe.section(NAME).settings.seeds]}
