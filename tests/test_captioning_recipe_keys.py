"""The captioning recipe: each section is one dataclass parsed strictly once, so a typo (``--set rm.max_second=300``)
or a value its stage cannot use is one error naming it before any stage runs, not a setting silently ignored on a
long GPU chain or a failure at the chain's last stage."""

from __future__ import annotations

import glob
import os
import re

import pytest

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import config, pipeline

H200 = "configs/captioning/standin_h200.yaml"
REAL = "configs/captioning/real_qwen3vl2b.yaml"
RECIPES = sorted(glob.glob("configs/captioning/*.yaml"))
RM_ON_CPU = "grpo.reward_kwargs.caption_rm.device=cpu"


def load(path=H200, overrides=()):
    from standin.captioning import demo

    return demo.load_recipe(path, list(overrides))


def stages(path=H200):
    from standin.captioning import demo

    return demo.stages_of(path)


def test_recipes_are_shipped():
    assert len(RECIPES) >= 4 and REAL in RECIPES


@pytest.mark.parametrize("path", RECIPES)
def test_every_shipped_recipe_parses_and_passes_the_preflight(tmp_path, path):
    """Each shipped recipe parses (the real one with the real pipeline's stages), and the whole chain's inputs are
    made by its own stages or, for the real recipe, found where it names them (models replaced by tiny ones)."""
    if path == REAL:
        import torch

        from open_r1.tiny_models import build_tiny

        data = tmp_path / "data"
        for split in ("train", "val", "test"):
            os.makedirs(data / split)
            (data / split / config.DATASET_MARKER).write_text("{}")
        models = [
            f"models.policy={build_tiny('qwen3_vl', tmp_path / 'policy')}",
            f"models.reward_backbone={build_tiny('qwen2_5_vl', tmp_path / 'rm')}",
        ]
        settings = [f"work_dir={tmp_path / 'w'}", f"data_dir={data}", *models]
        recipe = config.parse_recipe(path, settings, pipeline.STAGES)
        if not torch.cuda.device_count():  # its reward model scores on cuda:1: named before any model loads
            with pytest.raises(RecipeError, match=r"caption_rm.device 'cuda:1' is not on this machine"):
                pipeline.preflight(recipe, pipeline.STAGES, [s.NAME for s in pipeline.STAGES])
            recipe = config.parse_recipe(path, [*settings, RM_ON_CPU], pipeline.STAGES)
        pipeline.preflight(recipe, pipeline.STAGES, [s.NAME for s in pipeline.STAGES])
        assert recipe.paths.policy_base == str(tmp_path / "policy")
        return
    recipe = load(path, [f"work_dir={tmp_path}"])
    pipeline.preflight(recipe, stages(path), [s.NAME for s in stages(path)])


def test_the_real_recipe_names_its_models_and_refuses_the_standin_sections():
    recipe = config.parse_recipe(REAL, [], pipeline.STAGES)
    assert recipe.run.models.policy.endswith("Qwen3-VL-2B-Thinking")
    assert recipe.run.models.reward_backbone.endswith("Qwen2.5-VL-3B-Instruct")
    with pytest.raises(RecipeError, match=re.escape("unknown key(s) pretrain in the recipe")):
        config.parse_recipe(REAL, ["pretrain.policy.max_steps=3"], pipeline.STAGES)


# (override, the unknown key as the error names it, the key it suggests): one typo in every section
TYPOS = [
    ("data.contest=3", "data.contest", "data.contests"),
    ("pretrain.polcy.max_steps=3", "pretrain.polcy", "pretrain.policy"),
    ("pretrain.policy.max_step=3", "pretrain.policy.max_step", "pretrain.policy.max_steps"),
    (
        "pretrain.rm_backbone.learning_rat=0.1",
        "pretrain.rm_backbone.learning_rat",
        "pretrain.rm_backbone.learning_rate",
    ),
    ("synthesize.max_new_token=3", "synthesize.max_new_token", "synthesize.max_new_tokens"),
    ("traces.wordin=joke", "traces.wordin", "traces.wording"),
    ("sft.learning_rat=0.001", "sft.learning_rat", "sft.learning_rate"),
    ("ratings.contest=3", "ratings.contest", "ratings.contests"),
    ("rm.max_second=300", "rm.max_second", "rm.max_seconds"),
    ("rm.eval_image_swap=4", "rm.eval_image_swap", "rm.eval_image_swaps"),
    ("rm.lora={r: 16, alpah: 32}", "rm.lora.alpah", "rm.lora.alpha"),
    ("grpo.temprature=0.3", "grpo.temprature", "grpo.temperature"),
    ("grpo.seeeds=[1]", "grpo.seeeds", "grpo.seeds"),
    ("eval.temprature=0.7", "eval.temprature", "eval.temperature"),
    ("models.polcy=/m", "models.polcy", "models.policy"),
    ("rmm.seeds=[0]", "rmm", "rm"),
]


@pytest.mark.parametrize("override,bad,good", TYPOS, ids=[t[0].split("=")[0] for t in TYPOS])
def test_a_typo_in_any_section_is_one_line_naming_it_and_the_right_key(tmp_path, capsys, override, bad, good):
    """From the command line: one line, exit 2, nothing written (the recipe is parsed before any stage runs)."""
    from standin.captioning import demo

    code = demo.main(["--config", H200, "--set", f"work_dir={tmp_path}", "--set", override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not list(tmp_path.iterdir())
    assert f"unknown key(s) {bad} (did you mean {good}?)" in err


def test_the_error_names_every_unknown_key_and_the_valid_ones_sorted():
    with pytest.raises(RecipeError) as info:
        config.check_keys("rm", {"k": 3.0, "max_second": 1, "zzz": 2}, ("seeds", "max_seconds", "k"))
    assert str(info.value) == (
        "unknown key(s) rm.max_second (did you mean rm.max_seconds?), rm.zzz in section rm; "
        "valid: k, max_seconds, seeds"
    )
    config.check_keys("rm", {"k": 3.0}, ("seeds", "k"))  # nothing unknown: no error


def test_grpo_keys_are_the_open_r1_grpo_recipe_keys():
    """The grpo section's keys beyond the pipeline's are any open_r1.grpo recipe key (TRL's GRPOConfig /
    ModelConfig, the repo's script arguments): real fields pass, a typo fails when the recipe is read."""
    for good in (
        "temperature=0.3",
        "beta=0.04",
        "lora_dropout=0.1",
        "eval_limit=8",
        "top_p=0.9",
        "reward_weights=[1.0]",
    ):
        load(H200, [f"grpo.{good}"])
    for bad in ("temprature=0.3", "betta=0.1", "merge=false", "only=0", "extra={top_p: 0.9}"):
        with pytest.raises(RecipeError, match=rf"grpo\.{bad.split('=')[0]} "):
            load(H200, [f"grpo.{bad}"])


def test_time_budget_s_is_no_recipe_key(tmp_path):
    """Nothing read it: a recipe that sets it fails instead of seeming to cap the run."""
    path = tmp_path / "recipe.yaml"
    path.write_text("name: t\ntime_budget_s: 1500\nrm: {k: 3.0}\n")
    with pytest.raises(RecipeError, match=re.escape("unknown key(s) time_budget_s in the recipe")):
        load(str(path))


def test_cispo_is_refused_once_when_the_recipe_is_read():
    """TRL 1.16's cispo clamps the ratio at epsilon_high: refused before the first stage, by the section's parse."""
    with pytest.raises(RecipeError, match="grpo.loss_type cispo"):
        load(H200, ["grpo.loss_type=cispo"])
    load(H200, ["grpo.loss_type=dapo"])


# (override, what the one error says): a value the GRPO stage would refuse after the RM, refused before any stage
BAD_GRPO_VALUES = [
    ("grpo.learning_rate=fast", "argument --learning_rate/--learning-rate: invalid float value: 'fast'"),
    ("grpo.temperature=hot", "argument --temperature: invalid float value: 'hot'"),
    ("grpo.per_device_train_batch_size=12", "generation_batch_size (12) must be divisible by num_generations (8)"),
    ("grpo.num_generations=0", "num_generations must be >= 2, got 0"),  # was a ZeroDivisionError
    ("grpo.max_steps=-5", "max_steps must be >= 1, or -1 to train num_train_epochs, got -5"),
    ("grpo.loss_type=dapp", "grpo section: loss_type 'dapp' is not one of TRL's grpo, dr_grpo, dapo"),
    ("grpo.reward_kwargs={caption_rm: {fail_value: abc}}", "caption_rm: fail_value must be a number, got 'abc'"),
    ("grpo.reward_kwargs={caption_rm: {format_bonus: 1.5}}", "caption_rm: format_bonus must be in [0, 1), got 1.5"),
    ("grpo.reward_kwargs={caption_rm: {device: 0}}", "caption_rm: device must be a string"),
    ("grpo.seeds=[1, 1]", "grpo.seeds must be a list of distinct integers"),
    ("grpo.seeds=3", "grpo.seeds must be a list of (a whole number), got 3"),
    ("grpo.max_seconds=-1", "grpo.max_seconds must be > 0 or null, got -1"),
    ("grpo.parallel=yes please", "grpo.parallel must be true or false, got 'yes please'"),
    ("grpo.env=[A]", "grpo.env must map variable names to values"),
]


@pytest.mark.parametrize("override,message", BAD_GRPO_VALUES, ids=[b[0].split("=")[0] + "=" for b in BAD_GRPO_VALUES])
def test_a_bad_grpo_value_is_one_error_when_the_recipe_is_read(tmp_path, override, message):
    """The grpo section is parsed as its run will use it (the open_r1.grpo parser, caption_rm's own value checks):
    an argparse exit or a GRPOConfig ValueError at the chain's end becomes one RecipeError before the first stage."""
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        load(H200, [f"work_dir={tmp_path}", override])
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.parametrize(
    "key,instead",
    [
        ("seed", "grpo.seeds"),
        ("output_dir", "work_dir"),
        ("model_name_or_path", "the sft stage's output"),
        ("dataset_name", "data_dir"),
    ],
)
def test_keys_the_pipeline_sets_per_seed_are_refused_naming_the_key_to_use(key, instead):
    """`grpo.seed: 3` would win over each seed's own (three runs of one seed); `output_dir` would put every seed's
    run into one dir. Both are real open_r1.grpo keys, so the key check alone would let them through."""
    with pytest.raises(RecipeError, match=rf"^grpo\.{key}: the pipeline sets {key} .*{re.escape(instead)}"):
        load(H200, [f"grpo.{key}=x"])


def test_grpo_env_reaches_the_seed_run_not_the_preflight(tmp_path, monkeypatch):
    """``grpo.env``: set in the process when a seed's run starts, never by reading the recipe."""
    from open_r1.tasks.captioning import stage_grpo

    monkeypatch.delenv("OPEN_R1_TEST_ENV", raising=False)
    recipe = load(H200, [f"work_dir={tmp_path}", "grpo.env={OPEN_R1_TEST_ENV: 7}"])
    assert "OPEN_R1_TEST_ENV" not in os.environ and recipe.section("grpo").env == {"OPEN_R1_TEST_ENV": 7}
    monkeypatch.setattr(stage_grpo.config, "check_inputs", lambda inputs: None)

    class Stop(Exception):
        pass

    import open_r1.grpo

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(open_r1.grpo, "main", stop)
    with pytest.raises(Stop):
        stage_grpo.run_seed(recipe.section("grpo"), recipe.paths, 0)
    assert os.environ.get("OPEN_R1_TEST_ENV") == "7"


def test_a_rerun_grpo_stage_keeps_the_earlier_run_aside(tmp_path, monkeypatch, tiny_model_dir):
    """The pipeline starts each seed's run fresh (auto_resume false); open_r1.grpo refuses to start over a finished
    run's final model, so the stage first keeps an earlier invocation's run dir at <run>.prev-<time>, whole."""
    import shutil

    import open_r1.grpo
    from open_r1.tasks.captioning import stage_grpo

    recipe = load(H200, [f"work_dir={tmp_path}"])
    run = recipe.paths.grpo_run(0)
    os.makedirs(run)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(tiny_model_dir, name), run)
    monkeypatch.setattr(stage_grpo.config, "check_inputs", lambda inputs: None)
    seen = []

    def stop(script_args, training_args, *args, **kwargs):
        seen.append(os.path.exists(training_args.output_dir))
        raise KeyboardInterrupt

    monkeypatch.setattr(open_r1.grpo, "main", stop)
    with pytest.raises(KeyboardInterrupt):
        stage_grpo.run_seed(recipe.section("grpo"), recipe.paths, 0)
    kept = [p for p in os.listdir(os.path.dirname(run)) if p.startswith("seed0.prev-")]
    assert seen == [False] and len(kept) == 1
    assert sorted(os.listdir(os.path.join(os.path.dirname(run), kept[0]))) == ["config.json", "model.safetensors"]


# (override, the error): a value its stage could not use, in every section, refused before any stage runs (the eval
# one used to fail at the chain's last stage, int('sixteen'), after every model had trained)
BAD_VALUES = [
    ("seed=zero", "recipe.seed must be a whole number, got 'zero'"),
    ("data.contests=many", "data.contests must be a whole number, got 'many'"),
    ("data.val_frac=1.5", "data.val_frac and data.test_frac must be in [0, 1)"),
    ("data.image_size=big", "data.image_size: image size 'big' is not WIDTHxHEIGHT"),
    ("data.min_objects=9", "data.min_objects (9) is above data.max_objects"),
    ("data.min_objects=1", "data.min_objects must be >= 2, got 1"),  # no odd one out of one object
    ("pretrain.parallel=1", "pretrain.parallel must be true or false, got 1"),
    ("pretrain.policy.learning_rate=fast", "pretrain.policy.learning_rate must be a number, got 'fast'"),
    (
        "pretrain.rm_backbone.kinds=[describe, jokes]",
        "pretrain kinds must be a list of describe, question, fluency, got ['describe', 'jokes']",
    ),
    ("pretrain.policy.family=llama", "pretrain family must be one of qwen2_vl"),
    ("synthesize.top_p=0", "synthesize.top_p and synthesize.vllm_gpu_memory_utilization must be in (0, 1]"),
    ("synthesize.decoder=fast", "synthesize.decoder must be one of"),
    ("traces.wording=pun", "traces.wording must be one of ['caption', 'joke'], got 'pun'"),
    ("traces.template=short", "traces.template must be one of ['full', 'first_sentence'], got 'short'"),
    ("sft.schedule=linear", "sft schedule must be 'constant' or 'cosine', got 'linear'"),
    ("sft.lora_vision=no thanks", "sft.lora_vision must be true or false, got 'no thanks'"),
    ("sft.epochs=null|sft.max_seconds=null", "sft needs a stop"),
    ("rm.se_from=votes", "rm.se_from must be one of precision, std_over_sqrt_votes, got 'votes'"),
    ("rm.lr_scheduler=cosin", "rm.lr_scheduler must be one of linear, cosine"),
    ("rm.lora=16", "rm.lora must be a mapping or null, got 16"),
    ("rm.max_seconds=0", "rm.max_seconds must be > 0 or null, got 0"),
    ("rm.max_steps=0", "rm.max_steps must be >= 1, got 0"),  # trained by epochs
    ("rm.image_negative_top_k=0", "rm.image_negative_top_k must be >= 1, got 0"),
    ("rm.eval_image_swaps=2.5", "rm.eval_image_swaps must be a whole number, got 2.5"),
    ("eval.n=sixteen", "eval.n must be a whole number, got 'sixteen'"),
    ("eval.splits=test", "eval.splits must be a list of (a non-empty string), got 'test'"),
    ("eval.decoder=graf", "eval.decoder must be one of"),
    ("eval.top_p=1.5", "eval.top_p must be in (0, 1], got 1.5"),
    ("eval.top_k=-1", "eval.top_k must be >= 0, got -1"),
]


@pytest.mark.parametrize("override,message", BAD_VALUES, ids=[b[0].split("=")[0] + "=" for b in BAD_VALUES])
def test_a_value_its_stage_cannot_use_fails_when_the_recipe_is_read(tmp_path, override, message):
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        load(H200, [f"work_dir={tmp_path}", *override.split("|")])
    assert "\n" not in str(info.value) and not list(tmp_path.iterdir())


def test_the_eval_baseline_is_one_of_the_evaluated_policies(tmp_path):
    recipe = load(H200, [f"work_dir={tmp_path}", "eval.baseline=sfft"])
    with pytest.raises(
        RecipeError,
        match=re.escape(
            "eval.baseline 'sfft' is not one of the evaluated policies base, sft, grpo_s0, grpo_s1, grpo_s2"
        ),
    ):
        pipeline.preflight(recipe, stages(), [s.NAME for s in stages()])


def test_every_bad_value_of_a_section_is_named_in_one_error():
    with pytest.raises(RecipeError) as info:
        load(H200, ["eval.n=0.5", "eval.use_stop=maybe", "eval.batch_size=2.5"])
    assert str(info.value) == (
        "eval.n must be a whole number, got 0.5; eval.batch_size must be a whole number, got "
        "2.5; eval.use_stop must be true or false, got 'maybe'"
    )


def test_values_as_yaml_reads_them_still_pass():
    """YAML 1.1 reads ``1e-4`` as a string: a float field takes it as the number; null passes where the field
    allows it."""
    recipe = load(
        H200,
        [
            "sft.learning_rate=1e-4",
            "rm.learning_rate=5e-5",
            "eval.limit=null",
            "rm.max_steps=null",
            "pretrain.policy.max_seconds=null",
            "data.ood_contests=null",
        ],
    )
    assert recipe.section("sft").learning_rate == 1e-4 and recipe.section("rm").learning_rate == 5e-5
    assert recipe.section("eval").limit is None


@pytest.mark.parametrize(
    "override,split",
    [("eval.splits=[test, od]", "od"), ("rm.eval_splits=[tst]", "tst"), ("grpo.eval_sets=[vall]", "vall")],
)
def test_a_split_no_stage_writes_fails_in_preflight(tmp_path, override, split):
    """A misspelt split name used to fail only when its stage started (the eval's after every model trained)."""
    recipe = load(H200, [f"work_dir={tmp_path}", override])
    with pytest.raises(RecipeError, match=rf"{split} .*does not exist"):
        pipeline.preflight(recipe, stages(), [s.NAME for s in stages()])
    assert not list(tmp_path.iterdir())
    # a split already on disk is the user's own: not refused
    os.makedirs(tmp_path / "data" / split)
    (tmp_path / "data" / split / config.DATASET_MARKER).write_text("{}")
    pipeline.preflight(recipe, stages(), [s.NAME for s in stages()])


def test_every_cli_help_shows_its_defaults(capsys):
    from standin.captioning import cartoons, demo

    for main in (pipeline.main, demo.main, cartoons.main):
        with pytest.raises(SystemExit):
            main(["--help"])
        assert "(default:" in capsys.readouterr().out
    # every recipe key with its default and help, the stand-in's sections too
    assert demo.main(["--help-recipe"]) == 0
    listed = capsys.readouterr().out
    assert (
        "rm.max_seconds (default: None): wall-clock cap" in listed and "traces.wording (default: 'caption')" in listed
    )
    assert "grpo.seeds (default: [0])" in listed and "models.policy (default: None)" in listed
