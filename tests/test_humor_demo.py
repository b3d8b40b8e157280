"""The humor-r1 chain end to end on CPU (`make humor-demo`'s pipeline), on an even smaller setting: stand-in data,
tiny base models pre-trained from random init, trace synthesis (real code path), SFT + merge, RM + image-blind RM,
GRPO through the engine's `open_r1.grpo` with the `caption_rm` reward, and the best-of-N table."""
from __future__ import annotations

import json
import os

import pytest


def test_split_trace_drops_and_counts():
    from open_r1.tasks.captioning.stage_synthesize import split_trace

    assert split_trace("The blue cube is odd.</think>\n\n<caption>x</caption>") == ("The blue cube is odd.", "ok")
    assert split_trace("never closed because the budget ran out") == (None, "truncated")
    assert split_trace("  </think> anything") == (None, "empty")


def test_grpo_recipe_refuses_cispo_and_wires_caption_rm(tmp_path):
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import stage_common as common
    from open_r1.tasks.captioning import stage_grpo
    from open_r1.tiny_models import build_tiny

    policy = build_tiny("qwen3_vl", tmp_path / "policy", min_pixels=3136, max_pixels=12288)
    recipe = common.load_recipe("configs/captioning/standin_demo.yaml",
                                [f"work_dir={tmp_path}", f"grpo.model={policy}", "grpo.fail_value=0.0"])
    settings = stage_grpo.grpo_recipe(recipe, seed=3)
    assert settings["task"] == "captioning" and settings["reward_funcs"] == ["caption_rm"]
    assert settings["reward_kwargs"]["caption_rm"]["fail_value"] == 0.0
    assert settings["loss_type"] == "dapo" and settings["seed"] == 3
    assert (settings["min_pixels"], settings["max_pixels"]) == (3136, 12288)  # the policy's saved budget
    assert "seeds" not in settings and "max_seconds" not in settings  # pipeline keys stay out of the GRPO recipe
    common.apply_override(recipe, "grpo.loss_type=cispo")
    with pytest.raises(RecipeError, match="cispo"):
        stage_grpo.grpo_recipe(recipe, seed=0)


def test_parallel_jobs_split_independent_work():
    from open_r1.tasks.captioning import pipeline
    from open_r1.tasks.captioning import stage_common as common

    recipe = common.load_recipe("configs/captioning/standin_h200.yaml")
    assert pipeline.parallel_jobs(recipe, "grpo") == [["grpo.seeds=[0]"], ["grpo.seeds=[1]"], ["grpo.seeds=[2]"]]
    assert pipeline.parallel_jobs(recipe, "rm") == [["rm.only=rm"], ["rm.only=rm_blind"]]
    assert pipeline.parallel_jobs(recipe, "sft") is None
    demo = common.load_recipe("configs/captioning/standin_demo.yaml")
    assert pipeline.parallel_jobs(demo, "grpo") is None


def _fake_stages(monkeypatch, events, fail=None):
    """Stage modules and sub-job processes replaced by recorders: what the pipeline starts, runs and waits for."""
    import importlib

    from open_r1.tasks.captioning import pipeline

    for name in pipeline.ORDER:
        module = importlib.import_module(f"open_r1.tasks.captioning.stage_{name}")

        def run(recipe, name=name):
            events.append(("run", name))
            if name == fail:
                raise RuntimeError(f"{name} failed")
            return {"stage": name}

        monkeypatch.setattr(module, "run", run)

    class Proc:
        def __init__(self):
            self.terminated = False

        def poll(self):
            return None

        def terminate(self):
            self.terminated = True
            events.append(("terminate",))

        def wait(self):
            return 0

    class Handle:
        def close(self):
            pass

    def launch(recipe, name, jobs, overrides, sharing=None):
        events.append(("launch", name, sharing))
        return [(Proc(), Handle(), None, None, sets) for sets in jobs]

    def collect(name, procs):
        events.append(("collect", name))
        return {"stage": name}

    monkeypatch.setattr(pipeline, "launch_parallel", launch)
    monkeypatch.setattr(pipeline, "collect_parallel", collect)


def test_start_early_runs_the_rm_beside_synthesis_and_sft(tmp_path, monkeypatch):
    from open_r1.errors import RecipeError
    from open_r1.tasks.captioning import pipeline
    from open_r1.tasks.captioning import stage_common as common

    recipe = common.load_recipe("configs/captioning/standin_h200.yaml", [f"work_dir={tmp_path}"])
    assert recipe["start_early"] == {"rm": "synthesize"}
    events = []
    _fake_stages(monkeypatch, events)
    summary = pipeline.run_pipeline(recipe, ("synthesize", "sft", "rm", "grpo"))
    # the early RM jobs share the cores with this process: 2 jobs + 1
    assert events == [("launch", "rm", 3), ("run", "synthesize"), ("run", "sft"), ("collect", "rm"),
                      ("launch", "grpo", None), ("collect", "grpo")]
    assert summary["stages"]["rm"]["result"] == {"stage": "rm"}
    # without synthesize in the run, the RM starts beside the next stage before it
    events.clear()
    pipeline.run_pipeline(recipe, ("sft", "rm"))
    assert events == [("launch", "rm", 3), ("run", "sft"), ("collect", "rm")]
    # a failing stage does not leave the early jobs running
    events.clear()
    _fake_stages(monkeypatch, events, fail="sft")
    with pytest.raises(RuntimeError, match="sft failed"):
        pipeline.run_pipeline(recipe, ("synthesize", "sft", "rm"))
    assert ("terminate",) in events and ("collect", "rm") not in events
    common.apply_override(recipe, "start_early={grpo: eval}")
    with pytest.raises(RecipeError, match="before it"):
        pipeline.early_starts(recipe, pipeline.ORDER)


def test_grpo_checks_separate_point_estimates_from_cis():
    from open_r1.tasks.captioning import pipeline, stage_eval

    def ci(diff, lo, hi):
        return {"diff": diff, "lo": lo, "hi": hi}

    summary = {"splits": {"test": {"vs_baseline": {
        "grpo_s0": {"fail_as_zero": ci(0.17, 0.12, 0.21), "oracle_emitted": ci(0.2, 0.05, 0.4),
                    "oracle_pick": ci(0.3, -1, 1)},
        "grpo_s1": {"fail_as_zero": ci(0.17, 0.12, 0.21), "oracle_emitted": ci(0.001, -0.4, 0.4), "oracle_pick": None},
        "base": {"fail_as_zero": ci(-0.1, -0.2, 0.0), "oracle_emitted": ci(-1, -2, 0)}}}}}
    checks = stage_eval.grpo_checks(summary)
    assert set(checks) == {"grpo_s0", "grpo_s1"}  # only GRPO runs are checked
    assert checks["grpo_s0"]["test"]["both_up"] and checks["grpo_s0"]["test"]["both_up_ci"]
    assert checks["grpo_s1"]["test"]["both_up"] and not checks["grpo_s1"]["test"]["both_up_ci"]  # a +0.001 is no rise
    table = pipeline.results_markdown({"stages": {"eval": {"seconds": 2.0, "result": {"must_show_grpo": checks}},
                                                  "rm": {"seconds": 3.0, "result": {}}}, "total_seconds": 2.0})
    assert "| grpo_s1 | test | 0.170 [0.120, 0.210] | 0.001 [-0.400, 0.400] | – | yes | no |" in table
    assert "stages 5 s in all (the last invocation 2 s)" in table


def test_pretraining_rows_of_the_exposure_scenes(tmp_path):
    from open_r1.tasks.captioning import stage_common as common
    from open_r1.tasks.captioning import stage_data, stage_pretrain

    recipe = common.load_recipe("configs/captioning/standin_demo.yaml", [
        f"work_dir={tmp_path}", "data.contests=4", "data.ood_contests=1", "data.pretrain_ood_contests=2",
        "data.pretrain_main_contests=2", "data.captions=6", "data.image_size=96x64", "data.workers=1",
        "data.max_objects=4"])
    info = stage_data.run(recipe)
    assert info["splits"]["main_pretrain"]["contests"] == 2 and info["splits"]["ood_pretrain"]["contests"] == 2

    def kinds_by_source(rows):
        out = {}
        for kind, contest in zip(rows["kind"], rows["contest"]):
            out.setdefault("exposure" if contest >= stage_data.PRETRAIN_OFFSET else "train", set()).add(kind)
        return out

    default = kinds_by_source(stage_pretrain.pretrain_dataset(recipe, "policy"))
    assert default == {"train": {"describe", "question", "fluency"}, "exposure": {"describe", "question"}}
    common.apply_override(recipe, "pretrain.policy.exposure_kinds=[describe, fluency]")
    assert kinds_by_source(stage_pretrain.pretrain_dataset(recipe, "policy"))["exposure"] == {"describe", "fluency"}


def test_parallel_jobs_share_the_cores():
    from open_r1.tasks.captioning import pipeline

    env = pipeline.child_env({"PATH": "/bin"}, sharing=3, cpus=16)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "5" and env["PATH"] == "/bin"
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert pipeline.child_env({}, sharing=8, cpus=4)["OMP_NUM_THREADS"] == "1"  # never zero
    assert pipeline.child_env({"OMP_NUM_THREADS": "2"}, sharing=3, cpus=16)["OMP_NUM_THREADS"] == "2"  # the user's


@pytest.mark.slow  # ~5 minutes on 2 CPU cores
def test_humor_demo_end_to_end(tmp_path):
    from open_r1.tasks.captioning import pipeline
    from open_r1.tasks.captioning import stage_common as common

    overrides = [
        f"work_dir={tmp_path / 'run'}",
        "data.contests=10", "data.ood_contests=2", "data.pretrain_ood_contests=2",
        "data.pretrain_main_contests=2", "data.captions=10",
        "pretrain.policy.max_steps=1", "pretrain.rm_backbone.max_steps=1",
        "synthesize.limit=2", "synthesize.max_new_tokens=8",
        "sft.max_steps=1", "rm.max_steps=2", "rm.eval_cap_per_contest=4",
        "grpo.max_steps=1", "grpo.max_completion_length=16",
        "eval.n=2", "eval.limit=1", "eval.max_new_tokens=16",
    ]
    recipe = common.load_recipe("configs/captioning/standin_demo.yaml", overrides)
    out = tmp_path / "out"
    summary = pipeline.run_pipeline(recipe, out=str(out))

    root = tmp_path / "run"
    assert set(summary["stages"]) == set(pipeline.ORDER)
    # every stage left its artefact: full model dirs (LoRA merged), the RM dirs, the eval tables
    for model in ("policy-base", "rm-backbone", "policy-sft", "policy-grpo-seed0"):
        assert (root / "models" / model / "config.json").is_file(), model
        assert not (root / "models" / model / "adapter_config.json").exists(), model
    for rm in ("rm", "rm-blind"):
        meta = json.loads((root / "models" / rm / "reward_model.json").read_text())
        assert meta["pooling"] == "last_real_token" and meta["blind"] == (rm == "rm-blind")
    rm_result = summary["stages"]["rm"]["result"]
    for key in ("rm", "rm_blind"):
        for split in ("test", "ood"):
            accuracy = rm_result[key]["held_out"][split]
            assert 0.0 <= accuracy["ci_low"] <= accuracy["accuracy"] <= accuracy["ci_high"] <= 1.0
    # both bases were probed on held-out scenes: does it name the odd value (a share, with the answers it gave)
    for which in ("policy", "rm_backbone"):
        probe = summary["stages"]["pretrain"]["result"][which]["perception"]
        assert set(probe) == {"val", "ood"} and all(0.0 <= p["accuracy"] <= 1.0 and p["n"] >= 1 for p in probe.values())
    data_info = summary["stages"]["data"]["result"]["splits"]
    assert data_info["main_pretrain"] == {"rows": 2, "contests": 2} and data_info["ood_pretrain"]["rows"] == 2
    synth = summary["stages"]["synthesize"]["result"]
    assert synth["rows"] == 2 and synth["kept"] + synth["truncated"] + synth["empty"] + synth["leaks_caption"] == 2
    grpo_recipe = (root / "grpo" / "seed0" / "grpo_recipe.yaml").read_text()
    assert "task: captioning" in grpo_recipe and "caption_rm" in grpo_recipe and "cispo" not in grpo_recipe
    evaluation = summary["stages"]["eval"]["result"]
    for split in ("test", "ood"):
        metrics = evaluation["splits"][split]["metrics"]
        assert set(metrics) == {"base", "sft", "grpo_s0"}
        assert all(0.0 <= m["fail_as_zero"] <= 1.0 for m in metrics.values())
        assert (root / "results" / f"eval_{split}" / "bon_eval.md").is_file()
    assert "grpo_s0" in evaluation["must_show_grpo"]
    table = (root / "results" / "results.md").read_text()
    assert "Best-of-N, split test" in table and "image-blind" in table
    copied = sorted(os.listdir(out))
    assert "results.md" in copied and "pipeline.json" in copied and len(copied) <= 8
