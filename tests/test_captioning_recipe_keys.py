"""The captioning recipe's keys: every key of a section is one its stage reads, so a typo (``--set
rm.max_second=300``) is an error before any stage runs instead of a setting silently ignored on a long GPU chain."""
from __future__ import annotations

import glob
import re

import pytest

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import pipeline
from open_r1.tasks.captioning import stage_common as common

H200 = "configs/captioning/standin_h200.yaml"
RECIPES = sorted(glob.glob("configs/captioning/*.yaml"))


def test_recipes_are_shipped():
    assert len(RECIPES) >= 4


@pytest.mark.parametrize("path", RECIPES)
def test_every_shipped_recipe_passes_the_key_checks(path):
    """No key a stage reads is missing from its section's list: each shipped recipe passes the preflight's checks,
    and so do the overrides the pipeline gives its parallel sub-jobs."""
    recipe = common.load_recipe(path)
    pipeline.check_recipe(recipe)
    for name in ("pretrain", "rm", "grpo"):
        common.apply_override(recipe, f"{name}.parallel=true")
        for job in pipeline.parallel_jobs(recipe, name):
            pipeline.check_recipe(common.load_recipe(path, [f"{name}.parallel=true", *job]))


# (override, the unknown key as the error names it, the key it suggests): one typo in every section
TYPOS = [
    ("data.contest=3", "data.contest", "data.contests"),
    ("pretrain.polcy.max_steps=3", "pretrain.polcy", "pretrain.policy"),
    ("pretrain.policy.max_step=3", "pretrain.policy.max_step", "pretrain.policy.max_steps"),
    ("pretrain.rm_backbone.learning_rat=0.1", "pretrain.rm_backbone.learning_rat", "pretrain.rm_backbone.learning_rate"),
    ("synthesize.trace_sorce=templated", "synthesize.trace_sorce", "synthesize.trace_source"),
    ("sft.learning_rat=0.001", "sft.learning_rat", "sft.learning_rate"),
    ("ratings.contest=3", "ratings.contest", "ratings.contests"),
    ("rm.max_second=300", "rm.max_second", "rm.max_seconds"),
    ("rm.eval_image_swap=4", "rm.eval_image_swap", "rm.eval_image_swaps"),
    ("grpo.temprature=0.3", "grpo.temprature", "grpo.temperature"),
    ("grpo.seeeds=[1]", "grpo.seeeds", "grpo.seeds"),
    ("grpo.extra={temprature: 0.3}", "grpo.extra.temprature", "grpo.extra.temperature"),
    ("eval.temprature=0.7", "eval.temprature", "eval.temperature"),
]
each_typo = pytest.mark.parametrize("override,bad,good", TYPOS, ids=[t[0].split("=")[0] for t in TYPOS])


@each_typo
def test_a_typo_in_any_section_fails_in_preflight_naming_it_and_the_right_key(tmp_path, override, bad, good):
    recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", override])
    with pytest.raises(RecipeError, match=re.escape(f"unknown key(s) {bad} (did you mean {good}?)")):
        pipeline.preflight(recipe, pipeline.default_stages(recipe))


@each_typo
def test_a_stage_run_alone_checks_its_section_before_it_runs(monkeypatch, capsys, override, bad, good):
    """``python -m open_r1.tasks.captioning.stage_<name>``: one line, exit 2, the stage never started."""
    import importlib

    module = importlib.import_module(f"open_r1.tasks.captioning.stage_{override.split('.')[0]}")
    started = []
    monkeypatch.setattr(module, "run", lambda recipe: started.append(recipe) or {})
    code = module.main(["--config", H200, "--set", override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not started
    assert f"unknown key(s) {bad} (did you mean {good}?)" in err


def test_the_error_names_every_unknown_key_the_section_and_its_valid_keys_sorted():
    with pytest.raises(RecipeError) as info:
        common.check_keys("rm", {"k": 3.0, "max_second": 1, "zzz": 2}, ("seeds", "max_seconds", "k"), "a hint")
    assert str(info.value) == ("unknown key(s) rm.max_second (did you mean rm.max_seconds?), rm.zzz in section rm; "
                               "valid keys in section rm: k, max_seconds, seeds; a hint")
    common.check_keys("rm", {"k": 3.0}, ("seeds", "k"))  # nothing unknown: no error


def test_grpo_keys_beyond_the_pipelines_are_checked_against_the_grpo_recipe_fields():
    """The grpo section's other keys go into the open_r1.grpo recipe: real GRPOConfig / ModelConfig / script
    argument fields pass, a typo fails before any stage runs (not when GRPO parses its recipe at the chain's end),
    and the check agrees with the parser that would refuse it then."""
    import dataclasses

    from trl import GRPOConfig, ModelConfig, TrlParser

    from open_r1 import grpo
    from open_r1.tasks.captioning import stage_grpo

    keys = grpo.recipe_keys()
    assert {f.name for f in dataclasses.fields(GRPOConfig)} | {f.name for f in dataclasses.fields(ModelConfig)} <= keys
    assert {"temperature", "beta", "lora_dropout", "eval_limit", "task"} <= keys
    for good in ("temperature=0.3", "beta=0.04", "lora_dropout=0.1", "eval_limit=8", "extra={top_p: 0.9}"):
        stage_grpo.check_recipe(common.load_recipe(H200, [f"grpo.{good}"]))
    # merge and only were pipeline keys that nothing read: now refused like any other unknown key
    for bad in ("temprature=0.3", "betta=0.1", "merge=false", "only=0"):
        with pytest.raises(RecipeError, match=rf"grpo\.{bad.split('=')[0]} .*open_r1.grpo recipe key"):
            stage_grpo.check_recipe(common.load_recipe(H200, [f"grpo.{bad}"]))
    parser = TrlParser(tuple(grpo._argument_classes()))
    assert parser.set_defaults_with_config(**{key: None for key in keys - {"env"}}) == []
    assert parser.set_defaults_with_config(temprature=0.3) == ["--temprature", "0.3"]


def test_time_budget_s_is_no_longer_a_recipe_key(tmp_path):
    """Nothing read it: a recipe that sets it fails (in the file or from --set) instead of seeming to cap the run."""
    path = tmp_path / "recipe.yaml"
    path.write_text("name: t\ntime_budget_s: 1500\nrm: {k: 3.0}\n")
    with pytest.raises(RecipeError, match=r"unknown key\(s\) time_budget_s at the top level.*in the recipe "
                       + re.escape(str(path))):
        common.load_recipe(str(path))
    with pytest.raises(RecipeError, match=r"time_budget_s at the top level.*from --set time_budget_s=1500"):
        common.load_recipe(H200, ["time_budget_s=1500"])


def test_a_misspelt_section_from_set_fails_naming_the_override():
    with pytest.raises(RecipeError, match=re.escape("unknown key(s) rmm (did you mean rm?) at the top level")) as info:
        common.load_recipe(H200, ["rm.max_seconds=60", "rmm.seeds=[0]"])
    assert str(info.value).endswith("; from --set rmm.seeds=[0]")
    assert "start_early" in str(info.value) and "work_dir" in str(info.value)


@pytest.mark.parametrize("override", ["grpo.loss_type=cispo", "grpo.extra={loss_type: cispo}"])
def test_cispo_fails_in_preflight_not_when_grpo_starts(override):
    """TRL 1.16's cispo clamps the ratio at epsilon_high: refused before the first stage (it used to be refused only
    when the GRPO stage built its recipe, after the RM)."""
    recipe = common.load_recipe(H200, [override])
    with pytest.raises(RecipeError, match="grpo.loss_type cispo"):
        pipeline.preflight(recipe, ["data"])
    pipeline.check_recipe(common.load_recipe(H200, [override.replace("cispo", "dapo")]))


def test_the_rm_lora_mapping_is_checked_in_preflight():
    """rm.lora's keys are `build_reward_model`'s: a typo fails before the first stage, not when the RM is built."""
    pipeline.check_recipe(common.load_recipe(H200, ["rm.lora={r: 16, alpha: 32, dropout: 0.05}"]))
    with pytest.raises(RecipeError, match=re.escape("rm.lora.alpah (did you mean rm.lora.alpha?)")):
        pipeline.preflight(common.load_recipe(H200, ["rm.lora={r: 16, alpah: 32}"]), ["data"])
    with pytest.raises(RecipeError, match="rm.lora must be null or a mapping"):
        pipeline.preflight(common.load_recipe(H200, ["rm.lora=16"]), ["data"])


@pytest.mark.parametrize("script", ["sampling_probe", "sft_format_probe"])
def test_the_experiment_scripts_check_the_recipe_keys_too(script, capsys):
    """They read the recipe outside the pipeline (`pipeline.load_checked_recipe`): a misspelt --set is one error line
    and exit 2 before any model or data loads, not a probe sampled at the wrong temperature."""
    import importlib

    module = importlib.import_module(f"experiments.captioning.{script}")
    assert module.main(["--config", H200, "--set", "eval.temprature=0.3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval.temprature (did you mean eval.temperature?)" in err
