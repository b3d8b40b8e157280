"""Stage 4: GRPO of the SFT policy against the reward model, through the engine's GRPO entry (TRL GRPOTrainer).

Algorithm (the seed's stage 3, on this repo's engine): for each seed, one ``open_r1.grpo`` run with ``task:
captioning`` (prompts = one row per training contest, ``protocol.build_messages(description)`` + the cartoon;
``open_r1/tasks/captioning/task.py``) and the registered reward ``caption_rm``: sigma(RM(image, caption)) when the
completion's caption parses strictly, else ``fail_value`` (0, the bottom of the sigmoid scale), no format bonus.
Group-normalised advantages over ``num_generations`` completions per prompt, TRL's clipped surrogate with
``loss_type: dapo`` (never TRL 1.16's ``cispo``, which clamps the ratio at epsilon_high: REINFORCE x 0.28), KL
coefficient ``beta``, a fresh LoRA on the merged SFT model's language model, the recipe's ``temperature`` (the seed's:
1.0; the H200 stand-in's 0.7); the rollouts never sample what the policy's generation config suppresses (the
stand-in's placeholder ids, ``open_r1.trainer``). The recipe written for each seed is saved as
``<work_dir>/grpo/seed<S>/grpo_recipe.yaml`` (the exact ``python -m open_r1.grpo --config`` input).
The LoRA is merged afterwards (``open_r1.export.load_for_export``) into ``models/policy-grpo-seed<S>``.

Deviations from the seed: the seed's GRPO sees 1 prompt per step (batch 1 x GA 8 with G=8) and uses ``cispo``; here
several prompts per step (``per_device_train_batch_size / num_generations``) and ``dapo``. The reward's knobs live
in the recipe (``reward_kwargs``), not in environment variables. The stand-in runs few steps with a higher
learning rate; the real recipe (configs/captioning/real_qwen3vl2b.yaml) is the seed's G=8, 200 steps, 1536 tokens.

    python -m open_r1.tasks.captioning.stage_grpo --config configs/captioning/standin_demo.yaml
"""
from __future__ import annotations

import os
import time

from open_r1.tasks.captioning import stage_common as common

# recipe keys of the grpo section that the pipeline reads itself, not open_r1.grpo recipe keys (`grpo_recipe`;
# `run_seed`: max_seconds; `run` and the pipeline's `parallel_jobs`: seeds, parallel); every other key of the section
# but PATH_KEYS (`inputs`), and every key of its ``extra`` mapping, goes into the open_r1.grpo recipe as it is
# (the kinds of their values; seeds: `grpo_seeds`, fail_value / format_bonus / rm_device: caption_rm's own checks)
PIPELINE_KEYS = {"seeds": common.ANY, "fail_value": common.ANY, "format_bonus": common.ANY,
                 "max_seconds": common.optional(common.number(0, above=True)), "rm_device": common.ANY,
                 "lora_r": common.whole(1), "lora_alpha": common.whole(1), "eval_sets": common.TEXTS,
                 "extra": common.ANY, "parallel": common.BOOL}
PATH_KEYS = ("model", "reward_model", "dataset")  # the inputs the section may name instead of the work_dir's
# open_r1.grpo keys that `seed_settings` sets for each seed, and the recipe key that decides each: set in the section
# or its extra, one would win over the pipeline's (every seed with one seed, all three into one output dir, a run
# without caption_rm), so they are refused
OWNED_KEYS = {"seed": "grpo.seeds", "output_dir": "work_dir", "model_name_or_path": "grpo.model",
              "dataset_name": "grpo.dataset", "task": None, "reward_funcs": None,
              "reward_kwargs": "grpo.fail_value, grpo.format_bonus and grpo.rm_device"}


def refuse_cispo(loss_type) -> None:
    """TRL 1.16's `cispo` clamps the ratio at epsilon_high (0.28 turns it into REINFORCE x 0.28): never ship it."""
    if loss_type == "cispo":
        from open_r1.errors import RecipeError

        raise RecipeError("grpo.loss_type cispo: TRL 1.16 clamps the ratio at epsilon_high (REINFORCE x 0.28); use "
                          "dapo or grpo")


def check_recipe(recipe: dict) -> None:
    """Before any stage runs (the pipeline's preflight): every key of the section is the pipeline's or a key of
    the ``open_r1.grpo`` recipe (`open_r1.grpo.recipe_keys`: TRL's GRPOConfig / ModelConfig fields and this repo's
    script arguments), so a typo fails here, not when the GRPO run parses its recipe at the end of the chain."""
    from open_r1.errors import RecipeError
    from open_r1.grpo import recipe_keys
    from open_r1.validate import check_loss_type

    cfg = common.section(recipe, "grpo")
    extra = cfg.get("extra") or {}
    if not isinstance(extra, dict):
        raise RecipeError(f"grpo.extra must map open_r1.grpo recipe keys to values, got {extra!r}")
    listed = (f"the pipeline's {', '.join(sorted([*PIPELINE_KEYS, *PATH_KEYS]))} and any open_r1.grpo recipe key "
              "(TRL's GRPOConfig / ModelConfig and open_r1.grpo's own: python -m open_r1.grpo --help-all)")
    grpo_keys = recipe_keys()
    common.check_keys("grpo", cfg, {*PIPELINE_KEYS, *PATH_KEYS, *grpo_keys}, listed=listed)
    common.check_keys("grpo.extra", extra, grpo_keys, listed="any open_r1.grpo recipe key (python -m open_r1.grpo "
                      "--help-all)")
    for where, mapping in (("grpo", cfg), ("grpo.extra", extra)):
        owned = [key for key in OWNED_KEYS if key in mapping]
        if owned:
            key = owned[0]
            decided = (f"set {OWNED_KEYS[key]} instead" if OWNED_KEYS[key] else
                       "the captioning pipeline always runs task captioning with the caption_rm reward")
            raise RecipeError(f"{where}.{key}: the pipeline sets {key} for each seed's run itself; {decided}")
    refuse_cispo(extra.get("loss_type", cfg.get("loss_type")))  # extra wins, as in `seed_settings`
    check_pipeline_values(cfg)
    # the values of the open_r1.grpo keys: parsed as the run will parse them (placeholder inputs, which exist only
    # once earlier stages ran)
    settings = seed_settings(recipe, grpo_seeds(recipe)[0], "<the SFT policy>", "<the reward model>", None)
    training_args = check_seed_settings(settings)[1]
    for problem in check_loss_type(training_args):  # (open_r1.grpo checks it too, once the chain reaches GRPO)
        raise RecipeError(f"grpo section: {problem}")


def grpo_seeds(recipe: dict) -> list[int]:
    """The GRPO seeds of the recipe (``grpo.seeds``, default [0]), validated: one run per seed."""
    return common.seed_list("grpo.seeds", common.section(recipe, "grpo").get("seeds", [0]))


def check_pipeline_values(cfg: dict) -> None:
    """The values of the section's pipeline keys (the open_r1.grpo keys are parsed by `parse_seed_recipe`)."""
    from open_r1.errors import RecipeError, RewardConfigError
    from open_r1.tasks.captioning.rewards import check_caption_rm_settings

    common.check_values("grpo", cfg, PIPELINE_KEYS)  # (the section's other keys: not in PIPELINE_KEYS, not checked)
    try:
        check_caption_rm_settings(cfg.get("fail_value", 0.0), cfg.get("format_bonus", 0.0),
                                  device=cfg.get("rm_device"))
    except RewardConfigError as exc:
        raise RecipeError(f"{exc} (from grpo.fail_value / grpo.format_bonus / grpo.rm_device)") from None


def inputs(recipe: dict) -> dict[str, common.Input]:
    cfg = common.section(recipe, "grpo")
    paths = common.Paths(recipe)
    out = {"policy": common.Input(cfg.get("model") or paths.policy_sft, "the SFT policy", "sft", "grpo.model"),
           "rm": common.Input(cfg.get("reward_model") or paths.rm, "the reward model", "rm", "grpo.reward_model",
                              common.RM_MARKER)}
    if not cfg.get("dataset"):
        out["train"] = common.split_input(paths, "train")
    return out


def grpo_recipe(recipe: dict, seed: int) -> dict:
    """The ``open_r1.grpo`` recipe of one seed's run (its inputs must exist: the SFT policy and the RM)."""
    from open_r1 import modeling

    found = common.check_inputs(inputs(recipe))
    pixels = modeling.pixel_budget(modeling.load_processor(found["policy"]))
    return seed_settings(recipe, seed, found["policy"], found["rm"], pixels)


def seed_settings(recipe: dict, seed: int, policy: str, rm: str, pixels: tuple[int, int] | None) -> dict:
    """`grpo_recipe` once its inputs are found: `pixels` is the policy processor's (min, max) budget (None: leave
    the parser's defaults, for the preflight's check of the values)."""
    cfg = common.section(recipe, "grpo")
    paths = common.Paths(recipe)
    cuda = common.device() == "cuda"
    out = {
        "task": "captioning",
        "model_name_or_path": policy,
        "dataset_name": cfg.get("dataset") or paths.split("train"),
        "output_dir": paths.grpo_run(seed),
        "seed": seed,
        "reward_funcs": ["caption_rm"],
        "reward_kwargs": {"caption_rm": {"reward_model": rm, "fail_value": float(cfg.get("fail_value", 0.0)),
                                         "format_bonus": float(cfg.get("format_bonus", 0.0)),
                                         "device": cfg.get("rm_device") or ("cuda:0" if cuda else "cpu")}},
        "use_peft": True,
        "lora_r": int(cfg.get("lora_r", 32)),
        "lora_alpha": int(cfg.get("lora_alpha", 32)),
        "bf16": cuda,
        "use_cpu": not cuda,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "dedupe_vision": False,
        "auto_resume": False,
        "eval_sets": [paths.split(s) for s in cfg.get("eval_sets", [])],
    }
    if pixels is not None:
        out["min_pixels"], out["max_pixels"] = pixels
    for key, value in cfg.items():
        if key not in PIPELINE_KEYS and key not in PATH_KEYS:
            out[key] = value
    out.update(cfg.get("extra") or {})
    refuse_cispo(out.get("loss_type"))
    return out


def parse_seed_recipe(path: str, where: str) -> tuple:
    """`open_r1.grpo.parse_args(["--config", path])`, the parse of a seed's run: a value TrlParser or GRPOConfig
    refuses (``learning_rate: fast``, a batch that ``num_generations`` does not divide) is one RecipeError naming
    it instead of an argparse exit."""
    import contextlib
    import io

    from open_r1 import grpo
    from open_r1.errors import RecipeError

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return grpo.parse_args(["--config", path])[:3]
    except SystemExit:  # argparse: a value its type refuses; the reason is the last line it printed
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        reason = lines[-1].split("error: ", 1)[-1] if lines else "the recipe did not parse"
    except (ValueError, TypeError) as exc:  # GRPOConfig's own checks when it is built
        reason = " ".join(str(exc).split()).rstrip(".")
    raise RecipeError(f"the grpo section does not parse as an open_r1.grpo recipe ({where}): {reason}; see "
                      "python -m open_r1.grpo --help")


def check_seed_settings(settings: dict) -> tuple:
    """`parse_seed_recipe` on `settings` written to a temporary recipe file, before any stage runs (the preflight).
    Left out: ``env`` (TrlParser would set those variables in this process) and the device (parsed as a CPU run:
    building GRPOConfig sets up its device, which on a GPU would open a CUDA context in the pipeline's process
    before the data stage forks its render workers)."""
    import tempfile

    import yaml

    checked = {**{key: value for key, value in settings.items() if key != "env"},
               "use_cpu": True, "bf16": False, "fp16": False}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "grpo_recipe.yaml")
        with open(path, "w") as handle:
            yaml.safe_dump(checked, handle, sort_keys=False)
        return parse_seed_recipe(path, "preflight")


def run_seed(recipe: dict, seed: int) -> dict:
    import yaml

    from open_r1 import grpo, modeling
    from open_r1.errors import RecipeError
    from open_r1.export import load_for_export
    from open_r1.modeling import save_model_dir

    paths = common.Paths(recipe)
    settings = grpo_recipe(recipe, seed)
    os.makedirs(settings["output_dir"], exist_ok=True)
    path = os.path.join(settings["output_dir"], "grpo_recipe.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(settings, handle, sort_keys=False)
    common.log(f"[grpo] seed {seed}: python -m open_r1.grpo --config {path}")
    started = time.time()
    script_args, training_args, model_args = parse_seed_recipe(path, f"seed {seed}")
    cap = common.section(recipe, "grpo").get("max_seconds")
    trainer = grpo.main(script_args, training_args, model_args, callbacks=[common.time_cap(cap)] if cap else None)
    if trainer.run_safety.exit_code:
        raise RecipeError(f"GRPO seed {seed} stopped with exit code {trainer.run_safety.exit_code}")
    history = [dict(e) for e in trainer.state.log_history]
    steps = int(trainer.state.global_step)
    del trainer
    seconds = time.time() - started
    from open_r1.run.keep_best import resolve_export_checkpoint

    # the keep-best checkpoint when the run evaluated (eval_sets), else the final adapter
    merged, _ = load_for_export(resolve_export_checkpoint(settings["output_dir"]))
    processor = modeling.load_processor(settings["output_dir"], settings["min_pixels"], settings["max_pixels"])
    save_model_dir(merged, processor, paths.grpo_model(seed))
    keys = ("reward", "caption_rm/format_ok", "caption_rm/sigmoid_mean", "kl", "completions/mean_length")
    curve = [{k: e[k] for k in ("step", *keys) if k in e} for e in history if "reward" in e]
    common.log(f"[grpo] seed {seed}: {steps} steps in {seconds:.1f} s; reward (logged every "
               f"{settings.get('logging_steps')} steps) "
               f"{curve[0].get('reward') if curve else None} -> {curve[-1].get('reward') if curve else None}")
    return {"seed": seed, "recipe": path, "seconds": seconds, "steps": steps, "model": paths.grpo_model(seed),
            "curve": curve}


def run(recipe: dict) -> dict:
    return {"runs": [run_seed(recipe, seed) for seed in grpo_seeds(recipe)]}


def main(argv=None) -> int:
    return common.stage_cli("grpo", run, __doc__, argv, check=check_recipe)


if __name__ == "__main__":
    raise SystemExit(main())
