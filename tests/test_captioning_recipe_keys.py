"""The captioning recipe's keys: every key of a section is one its stage reads, so a typo (``--set
rm.max_second=300``) is an error before any stage runs instead of a setting silently ignored on a long GPU chain."""
from __future__ import annotations

import glob
import os
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


# (override, what the one error says): a value the GRPO stage would refuse after the RM, refused before any stage
BAD_GRPO_VALUES = [
    ("grpo.learning_rate=fast", "argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
    ("grpo.extra={temperature: hot}", "argument --temperature: invalid float value: 'hot'"),
    ("grpo.per_device_train_batch_size=12", "generation_batch_size (12) must be divisible by num_generations (8)"),
    ("grpo.loss_type=dapp", "grpo section: loss_type 'dapp' is not one of TRL's grpo, dr_grpo, dapo"),
    ("grpo.fail_value=abc", "caption_rm: fail_value must be a number, got 'abc'"),
    ("grpo.format_bonus=1.5", "caption_rm: format_bonus must be in [0, 1), got 1.5"),
    ("grpo.rm_device=0", "caption_rm: device must be a string"),
    ("grpo.seeds=[1, 1]", "grpo.seeds must be a list of distinct integers"),
    ("grpo.seeds=3", "grpo.seeds must be a list of distinct integers"),
    ("grpo.max_seconds=-1", "grpo.max_seconds must be a number > 0 or null, got -1"),
    ("grpo.lora_r=0", "grpo.lora_r must be a whole number >= 1, got 0"),
    ("grpo.parallel=yes please", "grpo.parallel must be true or false, got 'yes please'"),
    ("grpo.eval_sets=val", "grpo.eval_sets must be a list of non-empty strings, got 'val'"),
]


@pytest.mark.parametrize("override,message", BAD_GRPO_VALUES, ids=[b[0].split("=")[0] + "=" for b in BAD_GRPO_VALUES])
def test_a_bad_grpo_value_fails_in_preflight_with_one_error(tmp_path, override, message):
    """The grpo section's values are checked as its run will check them (`stage_grpo.parse_seed_recipe`: the
    open_r1.grpo parser on the seed's recipe, placeholder inputs; caption_rm's own value checks): an argparse exit
    or a GRPOConfig ValueError at the chain's end becomes one RecipeError before the first stage."""
    recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", override])
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        pipeline.preflight(recipe, pipeline.default_stages(recipe))
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.parametrize("key,instead", [("seed", "grpo.seeds"), ("output_dir", "work_dir"),
                                         ("model_name_or_path", "grpo.model"), ("dataset_name", "grpo.dataset"),
                                         ("reward_kwargs", "grpo.fail_value"), ("reward_funcs", "caption_rm"),
                                         ("task", "caption_rm")])
@pytest.mark.parametrize("where", ["grpo", "grpo.extra"])
def test_keys_the_pipeline_sets_per_seed_are_refused_naming_the_key_to_use(key, instead, where):
    """`grpo.seed: 3` used to win over each seed's own (three runs of one seed); `output_dir` would put every
    seed's run into one dir. Both are real open_r1.grpo keys, so the key check alone let them through."""
    from open_r1.tasks.captioning import stage_grpo

    value = {"seed": 3, "reward_kwargs": {}, "reward_funcs": ["caption_rm"]}.get(key, "x")
    recipe = common.load_recipe(H200)
    if where == "grpo":
        recipe["grpo"][key] = value
    else:
        recipe["grpo"]["extra"] = {key: value}
    with pytest.raises(RecipeError, match=rf"^{re.escape(where)}\.{key}: the pipeline sets {key} .*{instead}"):
        stage_grpo.check_recipe(recipe)


def test_the_preflight_parse_is_the_runs_parse(tmp_path):
    """What the preflight parses is what `run_seed` writes for the seed, but the two inputs (placeholders until the
    SFT and RM stages ran) and the processor's pixel budget; every recipe value reaches the parsed arguments."""
    from open_r1.tasks.captioning import stage_grpo

    recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", "grpo.temperature=0.3", "grpo.extra={top_p: 0.9}"])
    settings = stage_grpo.seed_settings(recipe, 1, "/p/policy", "/p/rm", (3136, 200704))
    assert settings["seed"] == 1 and settings["output_dir"] == common.Paths(recipe).grpo_run(1)
    assert (settings["min_pixels"], settings["max_pixels"]) == (3136, 200704)
    script_args, training_args, model_args = stage_grpo.check_seed_settings({**settings, "env": {"OPEN_R1_X": "1"}})
    assert training_args.temperature == 0.3 and training_args.top_p == 0.9 and training_args.seed == 1
    assert training_args.loss_type == "dapo" and model_args.lora_r == 16 and model_args.model_name_or_path == "/p/policy"
    assert script_args.reward_kwargs["caption_rm"]["reward_model"] == "/p/rm"
    assert (script_args.min_pixels, script_args.max_pixels) == (3136, 200704)
    assert "min_pixels" not in stage_grpo.seed_settings(recipe, 1, "/p/policy", "/p/rm", None)
    assert "OPEN_R1_X" not in os.environ  # the preflight's parse leaves the process's environment alone


def test_the_seed_run_parses_its_saved_recipe_env_included(tmp_path, monkeypatch):
    """`run_seed` parses the recipe file it saved (``grpo_recipe.yaml``), so ``grpo.env`` reaches the run."""
    from open_r1.tasks.captioning import stage_grpo

    monkeypatch.delenv("OPEN_R1_TEST_ENV", raising=False)
    recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", "grpo.env={OPEN_R1_TEST_ENV: 7}"])
    stage_grpo.check_recipe(recipe)
    assert "OPEN_R1_TEST_ENV" not in os.environ
    path = tmp_path / "grpo_recipe.yaml"
    path.write_text(__import__("yaml").safe_dump(stage_grpo.seed_settings(recipe, 0, "/p/policy", "/p/rm", None)))
    stage_grpo.parse_seed_recipe(str(path), "seed 0")
    assert os.environ.get("OPEN_R1_TEST_ENV") == "7"


# (override, the error): a value its stage could not use, in every section, refused before any stage runs (the eval
# one used to fail at the chain's last stage, int('sixteen'), after every model had trained)
BAD_VALUES = [
    ("seed=zero", "seed must be a whole number, got 'zero'"),
    ("data.contests=many", "data.contests must be a whole number >= 1, got 'many'"),
    ("data.val_frac=1.5", "data.val_frac must be a number >= 0 and < 1, got 1.5"),
    ("data.image_size=big", "data.image_size: image size 'big' is not WIDTHxHEIGHT"),
    ("data.min_objects=9", "data.min_objects (9) is above data.max_objects"),
    ("pretrain.parallel=1", "pretrain.parallel must be true or false, got 1"),
    ("pretrain.policy.learning_rate=fast", "pretrain.policy.learning_rate must be a number > 0, got 'fast'"),
    ("pretrain.rm_backbone.kinds=[describe, jokes]", "pretrain.rm_backbone.kinds must be a list of describe, question, "
     "fluency, got ['describe', 'jokes']"),
    ("pretrain.policy.family=llama", "pretrain.policy.family must be one of 'qwen2_vl'"),
    ("synthesize.top_p=0", "synthesize.top_p must be a number > 0 and <= 1, got 0"),
    ("synthesize.decoder=fast", "synthesize.decoder must be one of"),
    ("sft.schedule=linear", "sft.schedule must be one of 'constant', 'cosine', got 'linear'"),
    ("sft.lora_vision=no thanks", "sft.lora_vision must be true or false, got 'no thanks'"),
    ("sft.epochs=null|sft.max_seconds=null", "the sft section needs a stop"),
    ("rm.se_from=votes", "rm.se_from must be one of 'precision', 'std_over_sqrt_votes', got 'votes'"),
    ("rm.lr_scheduler=cosin", "rm.lr_scheduler must be a transformers scheduler name"),
    ("rm.dtype=fp8", "rm.dtype must be one of 'float32', 'bfloat16', 'float16', 'auto' or null, got 'fp8'"),
    ("rm.max_seconds=0", "rm.max_seconds must be a number > 0 or null, got 0"),
    ("eval.n=sixteen", "eval.n must be a whole number >= 1, got 'sixteen'"),
    ("eval.splits=test", "eval.splits must be a list of non-empty strings, got 'test'"),
    ("eval.decoder=graf", "eval.decoder must be one of"),
    ("eval.baseline=sfft", "eval.baseline 'sfft' is not one of the evaluated policies base, sft, grpo_s0, grpo_s1, "
     "grpo_s2"),
]


@pytest.mark.parametrize("override,message", BAD_VALUES, ids=[b[0].split("=")[0] + "=" for b in BAD_VALUES])
def test_a_value_its_stage_cannot_use_fails_in_preflight(tmp_path, override, message):
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", *override.split("|")])  # (the top level: here)
        pipeline.preflight(recipe, pipeline.default_stages(recipe))
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())


def test_every_bad_value_of_a_section_is_named_in_one_error():
    with pytest.raises(RecipeError) as info:
        pipeline.check_recipe(common.load_recipe(H200, ["eval.n=0", "eval.use_stop=maybe", "eval.batch_size=2.5"]))
    assert str(info.value) == ("eval.n must be a whole number >= 1, got 0; eval.batch_size must be a whole number "
                               ">= 1, got 2.5; eval.use_stop must be true or false, got 'maybe'")


def test_values_the_stages_read_as_they_are_still_pass():
    """YAML 1.1 reads ``1e-4`` as a string, and the stages' ``float()`` takes it: accepted, as before. Whole floats
    and digit strings pass as whole numbers (``int()`` takes them); null passes where the stage has a default."""
    recipe = common.load_recipe(H200, ["sft.learning_rate=1e-4", "rm.learning_rate=5e-5", "eval.n=16.0",
                                       "eval.batch_size='64'", "eval.limit=null", "rm.max_steps=null",
                                       "pretrain.policy.max_seconds=null", "data.ood_contests=null"])
    assert recipe["sft"]["learning_rate"] == "1e-4"
    pipeline.check_recipe(recipe)


def test_the_value_kinds():
    whole, number = common.whole(1), common.number(0, 1, above=True)
    assert [whole.ok(v) for v in (1, 2.0, "3", 0, 2.5, "2.0", True, None, [1])] == [True] * 3 + [False] * 6
    assert [number.ok(v) for v in (1, 0.5, "1e-1", 0, 1.01, "x", float("nan"), False)] == [True] * 3 + [False] * 5
    assert common.optional(whole).ok(None) and not whole.ok(None)
    assert common.choice("a", "b").ok("a") and not common.choice("a", "b").ok("c")
    assert common.TEXTS.ok(["test"]) and not common.TEXTS.ok("test") and not common.TEXTS.ok([""])
    assert (whole.what, number.what, common.number(0).what) == ("a whole number >= 1", "a number > 0 and <= 1",
                                                               "a number >= 0")


@pytest.mark.parametrize("override,stage", [("eval.splits=[test, od]", "eval"), ("rm.eval_splits=[tst]", "rm"),
                                            ("grpo.eval_sets=[vall]", "grpo")])
def test_a_split_the_data_stage_does_not_write_fails_in_preflight(tmp_path, override, stage):
    """A misspelt split name used to fail only when its stage started (the eval's after every model trained)."""
    recipe = common.load_recipe(H200, [f"work_dir={tmp_path}", override])
    with pytest.raises(RecipeError, match=rf"the {stage} stage reads the split '[a-z]+', which the data stage does "
                       r"not write \(it writes train, val, test, ood, ood_pretrain, main_pretrain\)"):
        pipeline.preflight(recipe, pipeline.default_stages(recipe))
    assert not list(tmp_path.iterdir())
    # a split already on disk is the user's own (the data stage keeps an existing stand-in): not refused
    split = override.split("[")[1].rstrip("]").split(", ")[-1]
    (tmp_path / "data" / split).mkdir(parents=True)
    pipeline.preflight(recipe, pipeline.default_stages(recipe))


def test_the_preflight_parse_sets_up_no_gpu(monkeypatch):
    """On a GPU machine the preflight's GRPOConfig would open a CUDA context in the pipeline's process (TrainingArguments
    sets up its device when built): it is parsed as a CPU run, whatever the machine and the recipe's precision."""
    from open_r1.tasks.captioning import stage_grpo

    monkeypatch.setattr(common, "device", lambda: "cuda")  # as on the H200: the run itself would use bf16 on cuda
    recipe = common.load_recipe(H200, ["grpo.extra={fp16: true}"])
    settings = stage_grpo.seed_settings(recipe, 0, "/p/policy", "/p/rm", None)
    assert settings["bf16"] is True and settings["use_cpu"] is False and settings["fp16"] is True
    training_args = stage_grpo.check_seed_settings(settings)[1]
    assert training_args.use_cpu and not training_args.bf16 and not training_args.fp16
    assert str(training_args.device) == "cpu"
