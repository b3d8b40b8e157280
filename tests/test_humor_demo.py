"""The humor-r1 chain on CPU (`make humor-demo`: ``python -m standin.captioning.demo``): the stand-in's stages
(generated data, tiny bases pre-trained from random init, templated traces, a simulated ratings round) around the real
ones (trace synthesis, SFT + merge, RM + image-blind RM, GRPO through `open_r1.grpo` with `caption_rm`, best-of-N)."""

from __future__ import annotations

import json
import os
import re

import pytest

DEMO, H200 = "configs/captioning/standin_demo.yaml", "configs/captioning/standin_h200.yaml"


def load(path, overrides=()):
    from standin.captioning import demo

    return demo.load_recipe(path, list(overrides))


def stages(recipe_path=DEMO):
    from standin.captioning import demo

    return demo.stages_of(recipe_path)


def names(recipe_path=DEMO):
    return [stage.NAME for stage in stages(recipe_path)]


def test_split_trace_drops_and_counts():
    from open_r1.tasks.captioning.stage_synthesize import split_trace

    assert split_trace("The blue cube is odd.</think>\n\n<caption>x</caption>") == ("The blue cube is odd.", "ok")
    assert split_trace("never closed because the budget ran out") == (None, "truncated")
    assert split_trace("<think>never closed", close=True) == ("never closed", "closed")  # synthesize.close_unterminated
    assert split_trace("  </think> anything") == (None, "empty")


def test_the_grpo_section_is_an_open_r1_grpo_recipe_with_caption_rm_wired(tmp_path):
    """The section parses into open_r1.grpo's arguments: the recipe's values, the pipeline's model, dataset, output
    dir and seed, caption_rm with the chain's RM filled in; each seed's run differs only in seed and output dir."""
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import stage_grpo

    recipe = load(H200, [f"work_dir={tmp_path}", "grpo.temperature=0.3", "grpo.top_p=0.9"])
    script_args, training_args, model_args, task = stage_grpo.seed_args(recipe.section("grpo"), recipe.paths, 2)
    paths = recipe.paths
    assert script_args.task == "captioning" and script_args.reward_funcs == ["caption_rm"]
    assert task is recipe.section("grpo").args[3] and task.name == "captioning"  # built once, shared by the seeds
    assert script_args.reward_kwargs["caption_rm"] == {"fail_value": 0.0, "reward_model": paths.rm, "device": "cpu"}
    assert training_args.temperature == 0.3 and training_args.top_p == 0.9 and training_args.loss_type == "dapo"
    assert training_args.seed == 2 and training_args.output_dir == paths.grpo_run(2)
    assert model_args.model_name_or_path == paths.policy_sft and script_args.dataset_name == paths.split("train")
    assert (script_args.min_pixels, script_args.max_pixels) == (3136, 62208) and model_args.lora_r == 16
    first = recipe.section("grpo").args[1]
    assert first.seed == 0 and training_args is not first  # the parsed section itself is left as it was
    # rewards and weights are the recipe's
    other = load(DEMO, ["grpo.reward_funcs=[caption_rm, format]", "grpo.reward_weights=[1.0, 0.5]"])
    assert other.section("grpo").args[0].reward_funcs == ["caption_rm", "format"]
    assert other.section("grpo").args[1].reward_weights == [1.0, 0.5]
    with pytest.raises(RecipeError, match="cispo"):
        load(DEMO, ["grpo.loss_type=cispo"])


def test_the_grpo_section_is_parsed_once_per_preflight_and_not_again_per_seed(tmp_path, monkeypatch):
    """One parse of the grpo section (the parser train.sh uses) when the recipe is read; the seeds' runs reuse it."""
    from open_r1.tasks.captioning import stage_grpo

    calls = []
    parse = stage_grpo.parse_grpo
    monkeypatch.setattr(stage_grpo, "parse_grpo", lambda values: calls.append(values) or parse(values))
    recipe = load(H200, [f"work_dir={tmp_path}"])
    assert len(calls) == 1 and calls[0]["task"] == "captioning"
    for seed in recipe.section("grpo").settings.seeds:
        stage_grpo.seed_args(recipe.section("grpo"), recipe.paths, seed)
    assert len(calls) == 1


def test_parallel_jobs_split_independent_work():
    from open_r1.tasks.captioning import stage_sft
    from standin.captioning import stage_grpo, stage_pretrain, stage_rm
    from standin.captioning.parallel import jobs

    recipe = load(H200)
    assert jobs(stage_grpo, recipe) == [["grpo.seeds=[0]"], ["grpo.seeds=[1]"], ["grpo.seeds=[2]"]]
    assert jobs(stage_pretrain, recipe) == [["pretrain.only=policy"], ["pretrain.only=rm_backbone"]]
    # one seed: the RM and the blind control
    assert jobs(stage_rm, load(H200, ["rm.seeds=[0]"])) == [["rm.only=rm"], ["rm.only=rm_blind"]]
    # several RM seeds: one process each, and the blind control (trained once)
    assert jobs(stage_rm, load(H200, ["rm.seeds=[0, 1, 2]"])) == [
        ["rm.only=rm", "rm.seed=0"],
        ["rm.only=rm", "rm.seed=1"],
        ["rm.only=rm", "rm.seed=2"],
        ["rm.only=rm_blind"],
    ]
    assert jobs(stage_sft, recipe) is None and jobs(stage_grpo, load(DEMO)) is None
    # every job's overrides parse too (they are the sub-process's --set)
    for job in (jobs(stage_grpo, recipe), jobs(stage_rm, recipe), jobs(stage_pretrain, recipe)):
        for sets in job:
            load(H200, sets)


def test_the_standin_wrappers_keep_the_real_stages_finish_and_check(tmp_path):
    """The stand-in's rm stage run as one job per seed: once the jobs end, the runner keeps the best seed on val as
    models/rm (GRPO's RM); its grpo stage: the real preflight check of the RM's device, before any input."""
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import pipeline
    from standin.captioning import parallel, stage_rm

    recipe = load(H200, [f"work_dir={tmp_path}", "rm.seeds=[0, 1]"])
    paths, procs = recipe.paths, []

    class Done:
        def wait(self):
            return 0

    for seed, val in ((0, 0.61), (1, 0.74)):
        os.makedirs(paths.rm_seed(seed))
        result, log = tmp_path / f"rm_{seed}.json", tmp_path / f"rm_{seed}.log"
        result.write_text(json.dumps({f"rm_s{seed}": {"out": paths.rm_seed(seed), "held_out": {"val": _acc(val)}}}))
        log.write_text("")
        procs.append((Done(), open(log), str(result), str(log), [f"rm.seed={seed}"]))
    report = parallel.collect_parallel(stage_rm, recipe, procs)
    assert report["rm"]["selected"]["seed"] == 1 and os.path.isdir(paths.rm)
    bad = load(H200, [f"work_dir={tmp_path}", "grpo.reward_kwargs={caption_rm: {device: 'cuda:7'}}"])
    with pytest.raises(RecipeError, match="caption_rm.device 'cuda:7' is not"):
        pipeline.preflight(bad, stages(H200), ["grpo"])


def _fake_stages(monkeypatch, events, fail=None):
    """Stages and sub-job processes replaced by recorders: what the pipeline starts, runs and waits for."""
    from open_r1.tasks.captioning import pipeline
    from standin.captioning import parallel

    for stage in stages(H200):

        def run(*args, name=stage.NAME):
            events.append(("run", name))
            if name == fail:
                raise RuntimeError(f"{name} failed")
            return {"stage": name}

        monkeypatch.setattr(stage, "run", run)

    class Proc:
        def poll(self):
            return None

        def terminate(self):
            events.append(("terminate",))

        def wait(self):
            return 0

    class Handle:
        def close(self):
            pass

    def launch(recipe, name, jobs, sharing=None):
        events.append(("launch", name, sharing))
        return [(Proc(), Handle(), None, None, sets) for sets in jobs]

    def collect(stage, recipe, procs):
        events.append(("collect", stage.NAME))
        return {"stage": stage.NAME}

    monkeypatch.setattr(parallel, "launch_parallel", launch)
    monkeypatch.setattr(parallel, "collect_parallel", collect)
    monkeypatch.setattr(pipeline, "preflight", lambda recipe, stages, run: None)  # no work_dir on disk here


def test_start_early_runs_the_rm_beside_synthesis_and_sft(tmp_path, monkeypatch):
    from open_r1.errors import RecipeError
    from standin.captioning import parallel

    # the H200 recipe's RM trains on the ratings round (it needs the SFT policy): it cannot start early
    base = [f"work_dir={tmp_path}", "rm.seeds=[0, 1, 2]", "start_early={rm: synthesize}"]
    with pytest.raises(RecipeError, match="train_rated, which the ratings stage writes after synthesize begins"):
        parallel.early_starts(load(H200, base), stages(H200), names(H200))
    recipe = load(H200, [*base, "rm.train_split=train"])  # an RM on the data stage's pairs may start early
    events = []
    _fake_stages(monkeypatch, events)
    summary = parallel.run_pipeline(recipe, stages(H200), ["synthesize", "sft", "rm", "grpo"])
    # the early RM jobs (3 seeds + the blind control) share the cores with this process: 4 jobs + 1
    assert events == [
        ("launch", "rm", 5),
        ("run", "synthesize"),
        ("run", "sft"),
        ("collect", "rm"),
        ("launch", "grpo", None),
        ("collect", "grpo"),
    ]
    assert summary["stages"]["rm"]["result"] == {"stage": "rm"}
    # without synthesize in the run, the RM starts beside the next stage before it
    events.clear()
    parallel.run_pipeline(recipe, stages(H200), ["sft", "rm"])
    assert events == [("launch", "rm", 5), ("run", "sft"), ("collect", "rm")]
    # a failing stage does not leave the early jobs running
    events.clear()
    _fake_stages(monkeypatch, events, fail="sft")
    with pytest.raises(RuntimeError, match="sft failed"):
        parallel.run_pipeline(recipe, stages(H200), ["synthesize", "sft", "rm"])
    assert ("terminate",) in events and ("collect", "rm") not in events
    with pytest.raises(RecipeError, match="before it"):
        parallel.early_starts(load(H200, ["start_early={grpo: eval}"]), stages(H200), names(H200))
    with pytest.raises(RecipeError, match="needs sft.parallel"):
        parallel.early_starts(load(H200, ["start_early={sft: synthesize}"]), stages(H200), names(H200))
    # the real chain runs stages one by one: the sub-job keys are the stand-in's, unknown to the real recipe
    from open_r1.tasks.captioning import config, pipeline

    real = "configs/captioning/real_qwen3vl2b.yaml"
    for key in ("rm.parallel=true", "rm.only=rm", "grpo.parallel=true", "start_early={rm: synthesize}"):
        with pytest.raises(RecipeError, match=re.escape(f"unknown key(s) {key.split('=')[0]}")):
            config.parse_recipe(real, [key], pipeline.STAGES)


def _acc(value):
    return {"accuracy": value, "ci_low": value - 0.05, "ci_high": value + 0.05, "n_pairs": 10, "n_groups": 2}


def test_the_ratings_stage_is_optional_and_checked(tmp_path):
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import pipeline
    from standin.captioning import stage_ratings

    assert "ratings" in names(H200) and "ratings" not in names("configs/captioning/standin_cpu_rm.yaml")
    recipe = load(H200, [f"work_dir={tmp_path}"])
    assert vars(recipe.section("ratings")) == {"n": 8, "contests": None, "split": "train_rated"}
    for bad, match in (
        ("n=0", "ratings.n"),
        ("n=2.5", "ratings.n"),
        ("contests=0", "ratings.contests"),
        ("split=train", "name a new split"),
        ("split=a/b", "name a new split"),
        ("samples=3", "unknown key"),
    ):
        with pytest.raises(RecipeError, match=match):
            load(H200, [f"ratings.{bad}"])
    with pytest.raises(RecipeError, match="SFT policy .* does not exist: run the sft stage"):  # before any loading
        stage_ratings.run(*recipe.args(stage_ratings))
    table = pipeline.results_markdown(
        {
            "stages": {
                "ratings": {
                    "seconds": 1.0,
                    "result": {
                        "samples": 40,
                        "format_rate": 0.25,
                        "counts": {"rated": 9},
                        "oracle_rated_mean": 0.1,
                        "oracle_candidates_mean": -0.2,
                        "pairs": 500,
                        "pairs_with_a_rated_caption": 30,
                        "pairs_of_two_rated_captions": 2,
                        "split": "/w/data/train_rated",
                    },
                }
            },
            "total_seconds": 1.0,
        },
        stages(H200),
    )
    assert (
        "40 samples of the SFT policy, format 25.0 %, 9 new captions rated (oracle mean 0.100, the candidates' "
        "-0.200); 30 of the RM's 500 training pairs (2 of two rated captions) in split `train_rated`"
    ) in table


def test_the_ratings_round_rates_with_the_recipes_readers(tmp_path, monkeypatch, tiny_model_dirs):
    """The simulated readers of a ratings round are the recipe's data section's (votes per caption), as the
    contests' own candidates were rated; only the policy's sampling is replaced here."""
    import shutil

    import datasets

    from standin.captioning import cartoons, stage_ratings

    recipe = load(H200, [f"work_dir={tmp_path}", "data.min_votes=200", "data.mean_votes=250", "ratings.n=1"])
    paths = recipe.paths
    cartoons.write_standin(
        paths.data, cartoons.StandinConfig(contests=4, ood_contests=0, captions=6, image_size=(64, 48), max_objects=4)
    )
    shutil.copytree(tiny_model_dirs["qwen3_vl"], paths.policy_sft)
    train = datasets.load_from_disk(paths.split("train"))
    contests = sorted(set(train["contest"]))

    def sample(*args, **kwargs):  # one new caption per training contest
        return [{"contest": c, "caption": f"a caption no reader saw {c}"} for c in contests]

    monkeypatch.setattr(stage_ratings.ev, "evaluate_policy", sample)
    summary = stage_ratings.run(*recipe.args(stage_ratings))
    assert summary["counts"]["rated"] == len(contests)
    rated = datasets.load_from_disk(summary["split"]).select(range(len(train), summary["rows"]))
    assert min(rated["votes"]) >= 200  # the defaults' readers (min 10, mean 30) would give about 30


def test_ctrl_c_in_a_stage_is_one_line_naming_the_stages_left(tmp_path, monkeypatch, capsys):
    from standin.captioning import demo, stage_pretrain

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage_pretrain, "run", interrupted)
    code = demo.main(
        [
            "--config",
            DEMO,
            "--set",
            f"work_dir={tmp_path}",
            "--set",
            "data.contests=4",
            "--stages",
            "data",
            "pretrain",
            "synthesize",
        ]
    )
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert (
        err.splitlines()[-1]
        == "error: interrupted; stage pretrain did not finish; continue with --stages pretrain synthesize"
    )
    assert os.path.isfile(os.path.join(tmp_path, "data", "standin.json"))  # the finished stage's output stays


def test_a_missing_input_fails_before_any_stage_runs_naming_the_stage_to_run(tmp_path, capsys):
    from open_r1 import modeling, reward_model
    from open_r1.errors import ModelError, RecipeError
    from open_r1.tasks.captioning import config, pipeline
    from standin.captioning import demo

    assert config.RM_MARKER == reward_model.META_FILE
    recipe = load(H200, [f"work_dir={tmp_path}"])
    paths, chain = recipe.paths, stages(H200)
    pipeline.preflight(recipe, chain, names(H200))  # the whole chain makes its own inputs
    # the second call of a chain on a machine whose work_dir is gone (run 10): one line, exit 2, no stage started
    code = demo.main(["--config", H200, "--set", f"work_dir={tmp_path}", "--stages", "grpo", "eval"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"the SFT policy {paths.policy_sft} does not exist: run the sft stage first" in err
    assert not os.path.exists(paths.results)  # nothing written into the work_dir

    def make(path, marker=config.MODEL_MARKER):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, marker), "w").close()

    os.makedirs(paths.rm)  # a dir without its marker file: "has no"
    make(paths.policy_sft)
    for split in ("val", "test", "ood"):
        make(paths.split(split), config.DATASET_MARKER)
    with pytest.raises(RecipeError, match="the train split .* run the data stage first"):
        pipeline.preflight(recipe, chain, ["grpo", "eval"])
    make(paths.split("train"), config.DATASET_MARKER)
    with pytest.raises(RecipeError, match=f"reward model {paths.rm} has no reward_model.json: run the rm stage"):
        pipeline.preflight(recipe, chain, ["grpo", "eval"])
    make(paths.rm, config.RM_MARKER)
    with pytest.raises(RecipeError, match="the policy 'base' .* run the pretrain stage"):  # eval's inputs too
        pipeline.preflight(recipe, chain, ["grpo", "eval"])
    make(paths.policy_base)
    pipeline.preflight(recipe, chain, ["grpo", "eval"])
    # the RM of this recipe trains on the ratings stage's split, so that is the stage to run
    make(paths.rm_base)
    with pytest.raises(RecipeError, match="train_rated split .* run the ratings stage first .* or set rm.train_split"):
        pipeline.preflight(recipe, chain, ["rm"])
    pipeline.preflight(recipe, chain, ["ratings", "rm"])
    # the real pipeline (no data stage): a missing split points to the prepare command
    real = pipeline.STAGES
    from open_r1.tasks.captioning.config import parse_recipe

    plain = parse_recipe(
        "configs/captioning/real_qwen3vl2b.yaml",
        [f"work_dir={tmp_path}/real", f"data_dir={tmp_path}/none", f"models.policy={paths.policy_base}"],
        real,
    )
    with pytest.raises(
        RecipeError,
        match="the train split .* does not exist: prepare the data with open-r1-caption-prepare and set data_dir",
    ):
        pipeline.preflight(plain, real, ["synthesize"])
    # a policy named in the recipe is not made by a stage: the fix is the key
    with pytest.raises(RecipeError, match=r"the policy 'mine' .*nowhere does not exist: set eval.policies to"):
        pipeline.preflight(
            load(H200, [f"work_dir={tmp_path}", f"eval.policies={{mine: {tmp_path}/nowhere}}"]), chain, ["eval"]
        )
    # beneath the stages: a missing dir is named as such (transformers would call it an invalid hub repo id)
    with pytest.raises(ModelError, match=f"processor directory {tmp_path}/nowhere does not exist"):
        modeling.load_processor(f"{tmp_path}/nowhere")


def test_eval_policies_from_the_recipe_are_checked():
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import stage_eval

    assert stage_eval.policies(load(DEMO, ["eval.policies={sft: /m/policy-sft}"]).section("eval"), None, []) == {
        "sft": "/m/policy-sft"
    }
    # without the space YAML reads one key with no value: one clear error, not a TypeError deep in model loading
    with pytest.raises(RecipeError, match="eval.policies must map names to model dirs"):
        load(DEMO, ["eval.policies={sft:/m/policy-sft}"])


def test_rm_seeds_keep_the_best_on_val_as_the_rm(tmp_path):
    from open_r1.errors import OpenR1Error, RecipeError
    from open_r1.tasks.captioning import pipeline, stage_rm

    recipe = load(H200, [f"work_dir={tmp_path}", "rm.seeds=[0, 1, 2]"])
    paths = recipe.paths
    cfg = recipe.section("rm")
    assert stage_rm.rm_seeds(cfg, 0) == [0, 1, 2]
    assert stage_rm.scored_splits(cfg, 0) == ["val", "test", "ood"]  # val joins: the choice reads it
    report = {}
    for seed, (val, test) in {0: (0.61, 0.90), 1: (0.74, 0.70), 2: (0.74, 0.55)}.items():
        out = paths.rm_seed(seed)
        os.makedirs(out)
        with open(os.path.join(out, "weights"), "w") as handle:
            handle.write(f"seed {seed}")
        report[f"rm_s{seed}"] = {"out": out, "seed": seed, "held_out": {"val": _acc(val), "test": _acc(test)}}
    report["rm_blind"] = {"out": paths.rm_blind, "held_out": {"val": _acc(0.99), "test": _acc(0.5)}}
    os.makedirs(paths.rm)
    with open(os.path.join(paths.rm, "stale"), "w") as handle:
        handle.write("an older RM")
    result = stage_rm.finish(*recipe.args(stage_rm), report)
    # val decides (test never does; the blind control never competes); a tie goes to the lower seed
    assert result["rm"]["selected"] == {"seed": 1, "by": "val accuracy", "val_accuracy": {0: 0.61, 1: 0.74, 2: 0.74}}
    assert result["rm"]["out"] == paths.rm and result["rm"]["held_out"]["test"]["accuracy"] == 0.70
    assert sorted(os.listdir(paths.rm)) == ["weights"]  # a whole copy of seed 1's dir, the older RM replaced
    assert open(os.path.join(paths.rm, "weights")).read() == "seed 1"
    assert all(os.path.isdir(paths.rm_seed(seed)) for seed in (0, 1, 2))  # every seed's RM stays
    table = pipeline.results_markdown({"stages": {"rm": {"seconds": 1.0, "result": result}}, "total_seconds": 1.0})
    assert "| with image (kept: seed 1, best on val) | test | 0.700 |" in table
    assert "| with image, seed 2 | val | 0.740 |" in table and "| image-blind | test | 0.500 |" in table
    # one seed: no choice, no copy
    single = load(DEMO, [f"work_dir={tmp_path / 'one'}"])
    assert stage_rm.finish(*single.args(stage_rm), {"rm": {"x": 1}}) == {"rm": {"x": 1}}
    assert stage_rm.scored_splits(single.section("rm"), single.seed) == ["test", "ood"]
    # a seed without val, bad seed lists, a job seed outside the list: one clear error each
    del report["rm_s2"]["held_out"]["val"]
    with pytest.raises(OpenR1Error, match=r"seed\(s\) \[2\] have no val accuracy"):
        stage_rm.finish(*recipe.args(stage_rm), report)
    for bad in ("[]", "[1, 1]", "[0.5]", "3"):
        with pytest.raises(RecipeError, match="rm.seeds must be"):
            load(H200, [f"rm.seeds={bad}"])
    with pytest.raises(RecipeError, match=r"rm.seed=7 is not one of rm.seeds \[0, 1\]"):
        load(H200, ["rm.seeds=[0, 1]", "rm.seed=7"])


def test_grpo_checks_separate_point_estimates_from_cis():
    from open_r1.tasks.captioning import pipeline
    from standin.captioning import oracle_eval

    def ci(diff, lo, hi):
        return {"diff": diff, "lo": lo, "hi": hi}

    summary = {
        "splits": {
            "test": {
                "vs_baseline": {
                    "grpo_s0": {
                        "fail_as_zero": ci(0.17, 0.12, 0.21),
                        "oracle_emitted": ci(0.2, 0.05, 0.4),
                        "oracle_fail_as_worst": ci(-0.1, -0.3, 0.1),
                        "oracle_pick": ci(0.3, -1, 1),
                    },
                    "grpo_s1": {
                        "fail_as_zero": ci(0.17, 0.12, 0.21),
                        "oracle_emitted": ci(0.001, -0.4, 0.4),
                        "oracle_fail_as_worst": ci(0.9, 0.5, 1.3),
                        "oracle_pick": None,
                    },
                    "base": {"fail_as_zero": ci(-0.1, -0.2, 0.0), "oracle_emitted": ci(-1, -2, 0)},
                }
            }
        }
    }
    checks = oracle_eval.grpo_checks(summary)
    assert set(checks) == {"grpo_s0", "grpo_s1"}  # only GRPO runs are checked
    assert checks["grpo_s0"]["test"]["both_up"] and checks["grpo_s0"]["test"]["both_up_ci"]
    assert checks["grpo_s1"]["test"]["both_up"] and not checks["grpo_s1"]["test"]["both_up_ci"]  # a +0.001 is no rise
    # the second oracle measure is checked on its own
    assert not checks["grpo_s0"]["test"]["both_up_worst"] and not checks["grpo_s0"]["test"]["both_up_worst_ci"]
    assert checks["grpo_s1"]["test"]["both_up_worst"] and checks["grpo_s1"]["test"]["both_up_worst_ci"]
    table = pipeline.results_markdown(
        {
            "stages": {
                "eval": {"seconds": 2.0, "result": {"extra_markdown": oracle_eval.grpo_markdown(checks)}},
                "rm": {"seconds": 3.0, "result": {}},
            },
            "total_seconds": 2.0,
        }
    )
    assert (
        "| grpo_s1 | test | 0.170 [0.120, 0.210] | 0.001 [-0.400, 0.400] | 0.900 [0.500, 1.300] | – "
        "| yes / no | yes / yes |"
    ) in table
    assert "stages 5 s in all (the last invocation 2 s)" in table


def test_pretraining_rows_of_the_exposure_scenes(tmp_path):
    from standin.captioning import cartoons, stage_data, stage_pretrain

    sets = [
        f"work_dir={tmp_path}",
        "data.contests=4",
        "data.ood_contests=1",
        "data.pretrain_ood_contests=2",
        "data.pretrain_main_contests=2",
        "data.captions=6",
        "data.image_size=96x64",
        "data.workers=1",
        "data.max_objects=4",
    ]
    recipe = load(DEMO, sets)
    info = stage_data.run(*recipe.args(stage_data))
    assert info["splits"]["main_pretrain"]["contests"] == 2 and info["splits"]["ood_pretrain"]["contests"] == 2

    def kinds_by_source(rows):
        out = {}
        for kind, contest in zip(rows["kind"], rows["contest"]):
            out.setdefault("exposure" if contest >= cartoons.PRETRAIN_OFFSET else "train", set()).add(kind)
        return out

    default = kinds_by_source(stage_pretrain.pretrain_dataset(*recipe.args(stage_pretrain), "policy"))
    assert default == {"train": {"describe", "question", "fluency"}, "exposure": {"describe", "question"}}
    other = load(DEMO, [*sets, "pretrain.policy.exposure_kinds=[describe, fluency]"])
    assert kinds_by_source(stage_pretrain.pretrain_dataset(*other.args(stage_pretrain), "policy"))["exposure"] == {
        "describe",
        "fluency",
    }


def test_the_start_policy_is_copied_instead_of_pre_training(tmp_path):
    """``pretrain.policy.start``: the shipped start policy becomes the base policy (no pre-training from random
    init)."""
    from open_r1.tiny_models import build_tiny
    from standin.captioning import stage_pretrain

    start = build_tiny("qwen3_vl", tmp_path / "start")
    recipe = load(
        DEMO,
        [
            f"work_dir={tmp_path / 'w'}",
            f"pretrain.policy.start={start}",
            "pretrain.only=policy",
            "pretrain.policy.probe_limit=0",
        ],
    )
    report = stage_pretrain.pretrain_one(*recipe.args(stage_pretrain), "policy")
    assert report == {"start": str(start), "out": recipe.paths.policy_base}
    assert sorted(os.listdir(recipe.paths.policy_base)) == sorted(os.listdir(start))


def test_the_demo_starts_from_the_shipped_policy_which_writes_the_format(tmp_path):
    """make humor-demo's pretrain stage copies standin/captioning/start_policy (pretrain.policy.start) instead of
    pre-training from random init; the copy loads with from_pretrained and, sampled as the demo's eval samples
    (seeded), writes captions the protocol parses on the demo's test cartoons. A missing start fails in preflight."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import data as cdata
    from open_r1.tasks.captioning import evaluate, pipeline, stage_eval
    from standin.captioning import stage_data, stage_pretrain

    sets = [
        f"work_dir={tmp_path}",
        "data.pretrain_ood_contests=0",
        "data.workers=1",
        "pretrain.only=policy",
        "pretrain.policy.probe_limit=0",
    ]
    recipe = load(DEMO, sets)
    pipeline.preflight(recipe, stages(), ["data", "pretrain"])
    stage_data.run(*recipe.args(stage_data))
    report = stage_pretrain.run(*recipe.args(stage_pretrain))["policy"]
    paths = recipe.paths
    assert report["start"] == os.path.abspath("standin/captioning/start_policy") and report["out"] == paths.policy_base
    shipped = open("standin/captioning/start_policy/model.safetensors", "rb").read()
    assert open(os.path.join(paths.policy_base, "model.safetensors"), "rb").read() == shipped
    model = AutoModelForImageTextToText.from_pretrained(paths.policy_base, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(paths.policy_base)
    assert model.config.model_type == "qwen3_vl"
    test = cdata.load_captions(paths.split("test"), check_images="none")
    sampling = {
        **stage_eval.sampling_kwargs(recipe.section("eval"), recipe.seed),
        "n": 4,
        "max_cartoons": 2,
        "decoder": "hf",
    }
    with torch.no_grad():
        records = evaluate.evaluate_policy(model, processor, test, None, **sampling)
    assert len(records) == 8 and sampling["temperature"] == 1.0 and sampling["max_new_tokens"] == 64
    assert sum(r["caption"] is not None for r in records) >= 2, [r["completion"] for r in records]
    missing = load(DEMO, [*sets, f"pretrain.policy.start={tmp_path}/nowhere"])
    with pytest.raises(
        RecipeError,
        match=f"the policy start {tmp_path}/nowhere does not exist: set pretrain.policy.start to an existing one",
    ):
        pipeline.preflight(missing, stages(), ["data", "pretrain"])


def test_only_the_policy_suppresses_unused_ids_unless_the_recipe_says_otherwise():
    from open_r1.errors import RecipeError
    from standin.captioning import stage_pretrain

    section = load(DEMO).section("pretrain")
    assert stage_pretrain.suppress_unused(section, "policy") and not stage_pretrain.suppress_unused(
        section, "rm_backbone"
    )
    off = load(DEMO, ["pretrain.policy.suppress_unused_tokens=false"]).section("pretrain")
    assert not stage_pretrain.suppress_unused(off, "policy")
    with pytest.raises(RecipeError, match="pretrain.rm_backbone.suppress_unused_tokens must be true or false"):
        load(DEMO, ["pretrain.rm_backbone.suppress_unused_tokens=yes please"])


def test_unknown_pretrain_keys_fail_when_the_recipe_is_read():
    from open_r1.errors import RecipeError

    with pytest.raises(RecipeError, match=r"pretrain\.max_steps"):  # a model's key one level too high
        load(DEMO, ["pretrain.max_steps=30"])
    with pytest.raises(
        RecipeError,
        match=r"pretrain\.rm_backbone\.max_step \(did you mean "
        r"pretrain\.rm_backbone\.max_steps\?\)",
    ):
        load(DEMO, ["pretrain.rm_backbone.max_step=30"])


def test_parallel_jobs_share_the_cores():
    from standin.captioning import parallel

    env = parallel.child_env({"PATH": "/bin"}, sharing=3, cpus=16)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "5" and env["PATH"] == "/bin"
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert parallel.child_env({}, sharing=8, cpus=4)["OMP_NUM_THREADS"] == "1"  # never zero
    assert parallel.child_env({"OMP_NUM_THREADS": "2"}, sharing=3, cpus=16)["OMP_NUM_THREADS"] == "2"  # the user's


def test_open_r1_never_imports_the_standin():
    import pathlib
    import re

    found = [
        str(p)
        for p in pathlib.Path("open_r1").rglob("*.py")
        if re.search(r"^\s*(from|import)\s+standin\b", p.read_text(), re.M)
    ]
    assert found == []


@pytest.mark.slow  # ~5 minutes on 2 CPU cores
def test_humor_demo_end_to_end(tmp_path):
    from open_r1.tasks.captioning import pipeline
    from standin.captioning import cartoons

    overrides = [
        f"work_dir={tmp_path / 'run'}",
        "data.contests=10",
        "data.ood_contests=2",
        "data.pretrain_ood_contests=2",
        "data.pretrain_main_contests=2",
        "data.captions=10",
        "pretrain.policy.max_steps=1",
        "pretrain.rm_backbone.max_steps=1",
        "synthesize.limit=2",
        "synthesize.max_new_tokens=8",
        "traces.template=first_sentence",
        "sft.max_steps=1",
        "rm.max_steps=2",
        "rm.eval_cap_per_contest=4",
        "rm.seeds=[0, 1]",
        "grpo.max_steps=2",
        "grpo.max_completion_length=16",
        "grpo.logging_steps=5",
        "eval.n=2",
        "eval.limit=1",
        "eval.max_new_tokens=16",
    ]
    recipe = load(DEMO, overrides)
    out = tmp_path / "out"
    summary = pipeline.run_pipeline(recipe, stages(), out=str(out))

    root = tmp_path / "run"
    assert list(summary["stages"]) == names()
    # the ratings round ran and the RM trained on its split (the demo's untrained policy may parse nothing)
    ratings = summary["stages"]["ratings"]["result"]
    from open_r1.tasks.captioning import data as cdata

    train_contests = set(cdata.load_captions(str(root / "data" / "train"), check_images="none")["contest"])
    assert ratings["samples"] == 2 * len(train_contests)  # ratings.n = 2 per training contest
    assert (root / "data" / "train_rated" / "dataset_info.json").is_file()
    # the SFT traces are the recipe's template: what is odd, one sentence
    import datasets

    traces = datasets.load_from_disk(str(root / "traces" / "train_top_k")).select_columns(["scene_meta", "thinking"])
    assert [r["thinking"] for r in traces] == [
        cartoons.templated_thinking(r, template="first_sentence") for r in traces
    ]
    assert "A good" not in traces[0]["thinking"]
    # every stage left its artefact: full model dirs (LoRA merged), the RM dirs, the eval tables
    for model in ("policy-base", "rm-backbone", "policy-sft", "policy-grpo-seed0"):
        assert (root / "models" / model / "config.json").is_file(), model
        assert not (root / "models" / model / "adapter_config.json").exists(), model
    # the policy's generation config keeps suppressing the ids no text encodes to, stage after stage; the RM's
    # backbone never generates
    from transformers import GenerationConfig

    def suppressed(model):
        return GenerationConfig.from_pretrained(root / "models" / model).suppress_tokens

    assert suppressed("policy-base") and not suppressed("rm-backbone")  # the shipped start: its padding rows
    assert suppressed("policy-base") == suppressed("policy-sft") == suppressed("policy-grpo-seed0")
    for rm in ("rm", "rm-blind"):
        meta = json.loads((root / "models" / rm / "reward_model.json").read_text())
        assert meta["pooling"] == "last_real_token" and meta["blind"] == (rm == "rm-blind")
    rm_result = summary["stages"]["rm"]["result"]
    for key in ("rm", "rm_s0", "rm_s1", "rm_blind"):
        for split in ("val", "test", "ood"):  # val too: two seeds compete on it
            accuracy = rm_result[key]["held_out"][split]
            assert 0.0 <= accuracy["ci_low"] <= accuracy["accuracy"] <= accuracy["ci_high"] <= 1.0
            # own cartoon vs another: the blind control sees one blank image on both sides, a tie every time
            swap = accuracy["image_swap"]
            assert swap["accuracy"] == 0.5 if key == "rm_blind" else 0.0 <= swap["accuracy"] <= 1.0
            # the stand-in's rm stage adds how far the hidden rule agrees with the held-out labels
            assert 0.0 <= accuracy["oracle_agreement_of_labels"] <= 1.0
    # the kept RM is a copy of the seed that did best on val, and says so
    kept = rm_result["rm"]["selected"]["seed"]
    val = {seed: rm_result[f"rm_s{seed}"]["held_out"]["val"]["accuracy"] for seed in (0, 1)}
    assert val[kept] == max(val.values()) and rm_result["rm"]["selected"]["val_accuracy"] == val
    kept_meta = json.loads((root / "models" / "rm" / "reward_model.json").read_text())
    assert kept_meta["seed"] == kept and (root / "models" / f"rm-s{1 - kept}" / "reward_model.json").is_file()
    assert (root / "models" / "rm" / "reward_head.safetensors").read_bytes() == (
        root / "models" / f"rm-s{kept}" / "reward_head.safetensors"
    ).read_bytes()
    # both bases were probed on held-out scenes: does it name the odd value (a share, with the answers it gave)
    for which in ("policy", "rm_backbone"):
        probe = summary["stages"]["pretrain"]["result"][which]["perception"]
        assert set(probe) == {"val", "ood"} and all(0.0 <= p["accuracy"] <= 1.0 and p["n"] >= 1 for p in probe.values())
    data_info = summary["stages"]["data"]["result"]["splits"]
    assert data_info["main_pretrain"] == {"rows": 2, "contests": 2} and data_info["ood_pretrain"]["rows"] == 2
    synth = summary["stages"]["synthesize"]["result"]
    assert synth["rows"] == 2 and synth["kept"] + synth["truncated"] + synth["empty"] + synth["leaks_caption"] == 2
    # optimizer steps, not logged points (logging every 5 steps: 2 steps, fewer points)
    assert [run["steps"] for run in summary["stages"]["grpo"]["result"]["runs"]] == [2]
    meta = json.loads((root / "grpo" / "seed0" / "training_meta.json").read_text())
    assert meta["reward_funcs"] == ["caption_rm"]
    evaluation = summary["stages"]["eval"]["result"]
    for split in ("test", "ood"):
        metrics = evaluation["splits"][split]["metrics"]
        assert set(metrics) == {"base", "sft", "grpo_s0"}
        assert all(0.0 <= m["fail_as_zero"] <= 1.0 for m in metrics.values())
        assert (root / "results" / f"eval_{split}" / "bon_eval.md").is_file()
    assert "grpo_s0" in evaluation["must_show_grpo"]
    table = (root / "results" / "results.md").read_text()
    assert "Best-of-N, split test" in table and "image-blind" in table and "image swap" in table
    assert "label/oracle agreement" in table and "hidden oracle" in table  # the stand-in's own analysis
    copied = sorted(os.listdir(out))
    assert "results.md" in copied and "pipeline.json" in copied and len(copied) <= 8


def test_rm_stage_keeps_a_seed_whenever_one_process_trains_them_all(tmp_path, monkeypatch):
    """rm.only=rm without rm.seed trains every seed in this process: the choice of models/rm is made here too (it
    used to be skipped, leaving GRPO without an RM); one seed's job (rm.seed) leaves the choice to the pipeline.
    (The stand-in's rm stage: rm.only / rm.seed are its sub-job keys, over the real stage's train and finish.)"""
    from open_r1.tasks.captioning import stage_rm
    from standin.captioning import stage_rm as standin_rm

    trained, finished = [], []
    monkeypatch.setattr(
        stage_rm,
        "train_one",
        lambda cfg, paths, seed, blind, rm_seed: trained.append((blind, rm_seed)) or {"seed": rm_seed, "blind": blind},
    )
    monkeypatch.setattr(stage_rm, "finish", lambda *args: finished.append(sorted(args[-1])) or args[-1])
    monkeypatch.setattr(stage_rm, "inputs", lambda *args: {})  # no backbone or data on disk here
    base = [f"work_dir={tmp_path}", "rm.seeds=[0, 1]"]
    for extra, jobs, choice in (
        (["rm.only=rm"], [(False, 0), (False, 1)], [["rm_s0", "rm_s1"]]),
        ([], [(False, 0), (False, 1), (True, 0)], [["rm_blind", "rm_s0", "rm_s1"]]),
        (["rm.only=rm", "rm.seed=1"], [(False, 1)], []),
        (["rm.only=rm_blind"], [(True, 0)], []),
    ):
        trained.clear()
        finished.clear()
        standin_rm.run(*load(H200, base + extra).args(standin_rm))
        assert trained == jobs and finished == choice, extra
