"""The GRPO throughput bench (experiments/bench/bench.py, experiments/bench/bench_grpo.py), the selfcheck speed bench
and the vLLM recipe.

The GPU numbers themselves come from the lead's H200 runs (docs/PERFORMANCE.md); here the CPU `--tiny` mode proves the
machinery: every variant trains through TRL's own GRPOTrainer, the probe's time split and counts are consistent, a
failing variant is reported and the run goes on, and completions have exactly the forced length.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from experiments.bench import bench

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "configs" / "qwen2vl_2b_counting.yaml"
VLLM_RECIPE = REPO / "configs" / "qwen2vl_2b_counting_vllm.yaml"
VLLM_KEYS = {"use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "output_dir"}
TINY_BENCH_TIMEOUT_S = 900  # a hang guard only (seconds); no assertion on speed


def run_script(args, timeout):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - start


@pytest.mark.slow
def test_tiny_bench_end_to_end(tmp_path):
    """Two variants x 2 measured rounds on CPU, plus one broken variant that must not stop the run. (Its speed is the
    bench's to measure, not this test's: a loaded machine must not fail it.)"""
    out = tmp_path / "bench.json"
    proc, _ = run_script(
        [
            "-m",
            "experiments.bench.bench_grpo",
            "--tiny",
            "--variants",
            "plain_trl,broken,ours",
            "--steps",
            "2",
            "--define",
            'broken={"base": "plain_trl", "no_such_grpo_field": 1}',
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        timeout=TINY_BENCH_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    report = json.loads(out.read_text())
    assert report["mode"] == "tiny"
    for key in ("torch", "transformers", "trl", "device"):
        assert report["environment"][key]
    length = report["shape"]["completion_length"]
    assert length == bench.TINY_COMPLETION_LENGTH
    variants = {v["name"]: v for v in report["variants"]}
    assert list(variants) == ["plain_trl", "broken", "ours"]

    broken = variants["broken"]
    assert broken["status"] == "failed"
    assert "no_such_grpo_field" in broken["error"] and "\n" not in broken["error"]

    recipe_beta = yaml.safe_load(RECIPE.read_text()).get("beta", 0.0)
    for name in ("plain_trl", "ours"):
        v = variants[name]
        assert v["status"] == "ok", v.get("error")
        assert v["rollouts_per_s"] > 0
        # every measured round generated one whole generation batch, each completion exactly the forced length
        assert v["rollouts"] == v["rounds_measured"] * v["generations_per_round"] * v["generation_batch_size"]
        assert v["rounds_measured"] == 2
        assert v["completion_len_min"] == v["completion_len_max"] == length
        assert v["gen_tokens"] == v["rollouts"] * length
        assert abs(v["rollouts_per_s"] - v["rollouts"] / v["wall_s"]) < 1e-9
        assert v["gen_s"] > 0 and v["train_s"] > 0 and v["train_tokens_per_s"] > 0
        parts = v["gen_s"] + v["logp_s"] + v["prep_s"] + v["train_s"]
        assert parts <= v["wall_s"] + 1e-6 and v["other_s"] >= -1e-6
        assert 0 < v["reward_s"] <= v["prep_s"]  # the reward functions, timed inside prep
        assert v["trained_sequences"] == v["rollouts"] * v["num_iterations"]
        for key in ("peak_allocated_gib", "peak_reserved_gib", "ratio_vs_plain_trl", "setup_s", "warmup_s"):
            assert key in v
    plain, ours = variants["plain_trl"], variants["ours"]
    assert plain["ratio_vs_plain_trl"] == 1.0
    assert ours["ratio_vs_plain_trl"] == pytest.approx(ours["rollouts_per_s"] / plain["rollouts_per_s"])
    # plain TRL: one optimizer step per generation of per-device-batch completions, no reference model (beta 0)
    assert plain["generation_batch_size"] == plain["per_device_train_batch_size"]
    assert plain["beta"] == 0.0 and plain["logp_calls"] == 0
    # ours: the recipe's algorithm (its beta: the reference forward runs iff beta != 0), 4 micro-batches a round
    assert ours["beta"] == recipe_beta
    assert (ours["logp_calls"] > 0) == (recipe_beta != 0.0)
    assert ours["generation_batch_size"] == 4 * ours["per_device_train_batch_size"]
    assert ours["train_micro_steps"] == 4 * ours["rounds_measured"]

    table = proc.stdout
    assert "| variant | status | rollouts/s | x plain_trl |" in table
    assert "| broken | failed: TypeError" in table
    assert "| ours | ok |" in table and "| plain_trl | ok |" in table


def test_grpo_bench_layers_once_flag_reaches_the_trainers_decoder(tmp_path, monkeypatch):
    from open_r1 import decoding

    monkeypatch.setattr(decoding, "LAYERS_ONCE", True)  # restored after: the flag sets the module's default
    out = tmp_path / "lo.json"
    assert bench.main(["--tiny", "--variants", "ours_fast", "--steps", "1", "--no-layers-once", "--out", str(out)]) == 0
    result = json.loads(out.read_text())["variants"][0]
    assert result["status"] == "ok" and result["layers_once"] is False and result["first_call_s"] > 0


def test_selfcheck_bench_forces_the_completion_length(tmp_path):
    out = tmp_path / "selfcheck.json"
    proc, _ = run_script(
        [
            "-m",
            "experiments.bench.bench_selfcheck",
            "--tiny",
            "--n",
            "12",
            "--batch-sizes",
            "4,4nv,4upk",
            "--decoder",
            "eager",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    entry, serial, before = report["batch_sizes"]
    assert {entry["status"], serial["status"], before["status"]} == {"ok"}, report["batch_sizes"]
    assert entry["examples"] == 12 and entry["examples_per_s"] > 0
    assert entry["projected_s"] == pytest.approx(12 / entry["examples_per_s"])
    # the decoder's phase split covers every measured batch (3 of 4), not the last one only
    assert entry["decoder_batches_timed"] == 3
    steps = 3 * (bench.TINY_COMPLETION_LENGTH - 1)
    assert entry["decode_ms_per_step"] == pytest.approx(1000 * entry["decoder_decode_s"] / steps)
    # the worst case: greedy decoding never stops before the forced length
    assert entry["mean_completion_tokens"] == report["shape"]["completion_length"] == bench.TINY_COMPLETION_LENGTH
    assert "projected s for 12" in proc.stdout
    # the evaluation's own per-batch split, beside the decoder's
    assert [b["rows"] for b in entry["batches"]] == [4, 4, 4]
    assert [b["built"] for b in entry["batches"]] == ["here", "ahead", "ahead"]
    assert entry["first_batch_wait_s"] == entry["batches"][0]["wait_s"]
    assert entry["decoder_prefill_s"] == pytest.approx(sum(b["prefill_s"] for b in entry["batches"]))
    assert entry["decoder_decode_s"] == pytest.approx(sum(b["decode_s"] for b in entry["batches"]))
    assert [b["built"] for b in serial["batches"]] == ["here", "here", "here"]  # 4nv: no prefetch
    # v: the vision tower's share of the prefill, timed in every measured batch (and only there)
    assert serial["vision_calls"] == 3 and 0 < serial["vision_s"] <= serial["decoder_prefill_s"]
    assert "vision_s" not in entry
    # greedy, the same inputs: the second entry's texts are the first's, counted beside the answers
    assert "same_completions_as_first" not in entry
    assert (serial["answers_compared"], serial["same_answers_as_first"], serial["same_completions_as_first"]) == (
        12,
        12,
        12,
    )
    # 4upk: transformers' per-image vision attention, positions in the prefill (the path before the prefill
    # levers), chunked calls: the same texts as the default's
    assert before["per_image_vision_attention"] and before["gpu_positions"] and before["chunked_vision_attention"]
    assert before["same_completions_as_first"] == 12
    assert "| 4 no prefetch vision timing | ok | 12 |" in proc.stdout and "| 12 / 12 |" in proc.stdout
    assert all("answers" not in e and "completions" not in e for e in report["batch_sizes"])  # not in the JSON


def test_vllm_recipe_wiring(tmp_path):
    from open_r1 import grpo

    script_args, training_args, model_args, task = grpo.parse_args(
        ["--config", str(VLLM_RECIPE), "--use_cpu", "true", "--output_dir", str(tmp_path / "run")]
    )
    assert training_args.use_vllm is True
    assert training_args.vllm_mode == "colocate"
    assert 0.0 < training_args.vllm_gpu_memory_utilization < 1.0
    assert training_args.generation_batch_size % training_args.num_generations == 0  # GRPOConfig checked it too
    # TRL sizes vLLM's batch from the same keys; the rest of the recipe is the measured one.
    assert training_args.per_device_train_batch_size % training_args.num_generations == 0


def test_vllm_recipe_is_the_main_recipe_plus_vllm_keys():
    main_recipe = yaml.safe_load(RECIPE.read_text())
    vllm_recipe = yaml.safe_load(VLLM_RECIPE.read_text())
    assert vllm_recipe["use_vllm"] is True and vllm_recipe["vllm_mode"] == "colocate"
    strip = lambda recipe: {k: v for k, v in recipe.items() if k not in VLLM_KEYS}  # noqa: E731
    assert strip(vllm_recipe) == strip(main_recipe), (
        "configs/qwen2vl_2b_counting_vllm.yaml must be configs/qwen2vl_2b_counting.yaml plus the vLLM keys: "
        "copy the changed keys over"
    )
    header = VLLM_RECIPE.read_text().splitlines()[0]
    assert header.startswith("#") and "not measured" in header.lower()


def tiny_context(tmp_path):
    return bench.BenchContext(
        tiny=True,
        model_dir="unused",
        recipe=bench.load_recipe(RECIPE),
        completion_length=16,
        steps=3,
        warmup=1,
        seed=0,
        dataset=None,
        device="cpu",
        work_dir=str(tmp_path),
    )


def test_vllm_variant_wiring(tmp_path):
    variant = bench.resolve_variant("ours_vllm", bench.PRESETS, bench.load_recipe(RECIPE))
    args, _ = bench.build_grpo_config(variant, tiny_context(tmp_path), str(tmp_path / "out"))
    assert args.use_vllm is True and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == 0.3
    # forced length reaches vLLM too (TRL passes generation_kwargs to its sampling params)
    assert args.generation_kwargs["min_new_tokens"] == 16
    if bench.importlib.util.find_spec("vllm") is None:
        assert bench.missing_requirements(variant) == ["vllm"]


# Geometries no preset ships any more (their runs are over), built with --define's keys
GEOMETRY_PRESETS = {
    **bench.PRESETS,
    **bench.parse_defines(
        [
            'ours_spg4={"base": "ours", "gradient_accumulation_steps": 1, "steps_per_generation": 4}',
            'ours_iter2={"base": "ours", "num_iterations": 2}',
            'ours_nogc_mb8={"base": "ours", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 32, '
            '"gradient_checkpointing": false}',
        ]
    ),
}


@pytest.mark.parametrize(
    "name, optimizer_steps_per_round, generation_batch",
    [
        ("plain_trl", 1, 64),
        ("ours", 1, 256),
        ("ours_gen512", 1, 512),
        ("ours_spg4", 4, 256),
        ("ours_iter2", 2, 256),
        ("ours_nogc_mb8", 1, 256),
    ],
)
def test_round_geometry(tmp_path, name, optimizer_steps_per_round, generation_batch):
    ctx = tiny_context(tmp_path)
    ctx.tiny = False  # full-size batch sizes; use_cpu keeps GRPOConfig off the GPU checks
    variant = bench.resolve_variant(name, GEOMETRY_PRESETS, ctx.recipe)
    variant.overrides.update({"use_cpu": True, "bf16": False})
    args, geometry = bench.build_grpo_config(variant, ctx, str(tmp_path / "out"))
    assert args.generation_batch_size == generation_batch
    assert geometry["optimizer_steps_per_round"] == optimizer_steps_per_round
    assert geometry["generations_per_round"] == 1
    assert args.max_steps == (ctx.warmup + ctx.steps) * optimizer_steps_per_round
    assert args.max_completion_length == 16 and args.generation_kwargs["min_new_tokens"] == 16
    assert set(bench.VISION_SPECIAL_TOKEN_IDS) <= set(args.generation_kwargs["suppress_tokens"])


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "full"])
def test_every_preset_builds_a_valid_config(tmp_path, tiny):
    """Each preset resolves to a GRPOConfig with whole prompt groups, at full size and scaled down for --tiny."""
    ctx = tiny_context(tmp_path)
    ctx.tiny = tiny
    for name in bench.PRESETS:
        variant = bench.resolve_variant(name, bench.PRESETS, ctx.recipe)
        if variant.deepspeed:  # GRPOConfig(deepspeed=...) needs DeepSpeed and, where it is installed, starts
            continue  # torch.distributed for the whole process (the bench runs it alone): test_zero3_variants
        if not tiny:
            variant.overrides.update({"use_cpu": True, "bf16": False})
        args, geometry = bench.build_grpo_config(variant, ctx, str(tmp_path / name))
        assert args.generation_batch_size % args.num_generations == 0, name
        assert geometry["optimizer_steps_per_round"] >= 1 and geometry["generations_per_round"] >= 1, name
        assert bench.prompts_per_generation(variant, tiny) == args.generation_batch_size // args.num_generations, name


def test_min_rollouts_measures_small_rounds_longer(tmp_path):
    ctx = tiny_context(tmp_path)
    ctx.tiny, ctx.steps, ctx.min_rollouts = False, 1, 192
    rounds = {}
    for name in ("plain_trl", "ours", "ours_gen512"):
        variant = bench.resolve_variant(name, bench.PRESETS, ctx.recipe)
        variant.overrides.update({"use_cpu": True, "bf16": False})
        args, geometry = bench.build_grpo_config(variant, ctx, str(tmp_path / name))
        rounds[name] = geometry["rounds_measured"]
        assert args.max_steps == (ctx.warmup + rounds[name]) * geometry["optimizer_steps_per_round"]
    assert rounds == {"plain_trl": 3, "ours": 1, "ours_gen512": 1}


def test_plain_trl_takes_nothing_from_the_recipe(tmp_path):
    recipe = bench.load_recipe(RECIPE)
    plain = bench.resolve_variant("plain_trl", bench.PRESETS, recipe)
    assert plain.overrides == {"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1}
    assert plain.max_pixels is None and plain.attn_implementation == "sdpa"
    ours = bench.resolve_variant("ours", bench.PRESETS, recipe)
    for key in ("beta", "loss_type", "num_generations"):
        if key in recipe:
            assert ours.overrides[key] == recipe[key]
    assert ours.max_pixels == recipe.get("max_pixels")


def test_defines_and_unknown_variants():
    presets = {**bench.PRESETS, **bench.parse_defines(['mine={"base": "ours", "per_device_train_batch_size": 48}'])}
    mine = bench.resolve_variant("mine", presets, {})
    assert mine.overrides["per_device_train_batch_size"] == 48 and mine.overrides["gradient_accumulation_steps"] == 4
    with pytest.raises(bench.BenchError, match="unknown variant"):
        bench.resolve_variant("nope", presets, {})
    with pytest.raises(bench.BenchError, match="NAME=JSON"):
        bench.parse_defines(["no-equals-sign"])
    with pytest.raises(bench.BenchError, match="not JSON"):
        bench.parse_defines(["x={bad"])


def test_in_memory_model_builder_on_cpu():
    """The GPU path builds the model in memory (no checkpoint): check it on CPU with the tiny config."""
    import torch

    from open_r1 import compat
    from open_r1 import tiny_models as tiny_model

    model = bench.build_full_size_model("sdpa", "cpu", seed=0, config=tiny_model.build_config(full_size=False))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert compat.attn_implementation(model.config) == "sdpa"
    assert model.generation_config.eos_token_id == [tiny_model.EOS_TOKEN_ID, tiny_model.BOS_TOKEN_ID]
    weight = model.model.language_model.layers[0].mlp.gate_proj.weight.float()
    assert torch.isfinite(weight).all() and 0.01 < weight.std().item() < 0.05
    full = bench.build_full_size_model("sdpa", "meta", seed=0)  # full size, no memory
    assert 2.1e9 < sum(p.numel() for p in full.parameters()) < 2.3e9


def test_forced_length_overrides_an_eager_end_of_turn(tiny_model_dir, scene_data_dir):
    """selfcheck's worst case: even a model whose favourite token is <|im_end|> generates the full forced length."""
    from open_r1 import modeling
    from open_r1 import tiny_models as tiny_model
    from open_r1.tasks.counting.evaluate import generate_batch

    model = modeling.load_model(str(tiny_model_dir), dtype="float32", attn_implementation="sdpa").eval()
    processor = modeling.load_processor(str(tiny_model_dir), max_pixels=12544)

    def end_of_turn_first(module, inputs, output):
        output[..., tiny_model.EOS_TOKEN_ID] = 1e4
        return output

    model.lm_head.register_forward_hook(end_of_turn_first)
    from open_r1.tasks.counting.data import load_counting_dataset

    images = load_counting_dataset(os.path.join(scene_data_dir, "val"))["image"][:2]
    questions = ["How many items are there in the image?"] * 2
    _, lengths, _ = generate_batch(model, processor, images, questions, max_new_tokens=8)
    assert lengths == [1, 1]  # the hook works: without forcing, generation stops at once
    bench.force_completion_length(model, 8)
    _, lengths, truncated = generate_batch(model, processor, images, questions, max_new_tokens=8)
    assert lengths == [8, 8] and truncated == [True, True]


def test_selfcheck_bench_batch_size_suffixes_pick_the_options():
    from experiments.bench.bench import BenchError, parse_selfcheck_batch_sizes, selfcheck_label

    runs = parse_selfcheck_batch_sizes("256, 512n,512g,128cn")
    assert runs == [
        (256, {}),
        (512, {"no_prefetch": True}),
        (512, {"gpu_images": True}),
        (128, {"compile": True, "no_prefetch": True}),
    ]
    assert selfcheck_label({"batch_size": 512, "gpu_images": True}) == "512 gpu images"
    assert parse_selfcheck_batch_sizes("512upk") == [
        (512, {"per_image_vision_attention": True, "gpu_positions": True, "chunked_vision_attention": True})
    ]
    with pytest.raises(BenchError, match="positive integer"):
        parse_selfcheck_batch_sizes("512x")


def test_selfcheck_bench_counts_answers_and_completion_texts_equal_to_the_first_entry():
    """Random weights: every answer is None, so answers agree trivially; the completion texts are the real check."""
    entries = [{"status": "failed"}, {"status": "ok"}, {"status": "ok"}, {"status": "skipped"}, {"status": "ok"}]

    def records(answers, completions):
        return [{"prediction": a, "completion": c} for a, c in zip(answers, completions, strict=True)]

    outputs = [
        None,
        records([None, None, 3], ["a b", "c d", "<answer>3</answer>"]),
        records([None, None, 3], ["a b", "c e", "<answer>3</answer>"]),
        None,
        records([None, 2], ["x", "c d"]),
    ]  # a shorter run: compared over 2
    bench.compare_with_first(entries, outputs)
    failed, first, second, skipped, third = entries
    assert "same_answers_as_first" not in first and "same_completions_as_first" not in failed
    assert (second["answers_compared"], second["same_answers_as_first"], second["same_completions_as_first"]) == (
        3,
        3,
        2,
    )
    assert (third["answers_compared"], third["same_answers_as_first"], third["same_completions_as_first"]) == (2, 1, 1)
    assert skipped == {"status": "skipped"}
    bench.compare_with_first([{"status": "failed"}], [None])  # nothing to compare: no error
    table = bench.format_selfcheck_table(
        {
            "shape": {"target_examples": 3},
            "batch_sizes": [
                {
                    "batch_size": 4,
                    "status": "ok",
                    "examples": 3,
                    "seconds": 1.0,
                    "examples_per_s": 3.0,
                    "projected_s": 1.0,
                    "mean_completion_tokens": 16.0,
                    "first_batch_wait_s": 0.25,
                    **second,
                }
            ],
        }
    )
    assert "| first batch wait s | same texts as first |" in table and "| 0.25 | 2 / 3 |" in table


def test_selfcheck_batch_split_joins_the_decoders_timings():
    batches = [
        {"rows": 4, "built": "here", "wait_s": 2.0, "generate_s": 5.0, "post_s": 0.1},
        {"rows": 2, "built": "ahead", "wait_s": 0.5, "generate_s": 4.0, "post_s": 0.1},
    ]
    decoder = [{"prefill_s": 3.0, "decode_s": 1.5}, {"prefill_s": 2.0, "decode_s": 1.5}]
    split = bench.selfcheck_batch_split(batches, decoder)
    assert split["first_batch_wait_s"] == 2.0 and split["wait_s"] == 2.5
    assert split["generate_s"] == 9.0 and split["post_s"] == pytest.approx(0.2)
    assert [(b["prefill_s"], b["decode_s"]) for b in split["batches"]] == [(3.0, 1.5), (2.0, 1.5)]
    assert "prefill_s" not in batches[0]  # the caller's dicts are not changed
    assert "prefill_s" not in bench.selfcheck_batch_split(batches, decoder[:1])["batches"][0]  # counts differ
    assert bench.selfcheck_batch_split([], []) == {}


def test_zero3_variants_run_alone_and_merge_into_one_table(tmp_path, monkeypatch, caplog):
    """The ZeRO-3 variants (train.sh's path, one process): zero3.json on top of plain_trl / ours_fast, alone in their
    process (accelerate's state is process-wide); --merge joins the runs' JSONs with the issue's goal ratios."""
    recipe = bench.load_recipe(RECIPE)
    for name, base in (("plain_trl_zero3", "plain_trl"), ("ours_fast_zero3", "ours_fast")):
        variant, plain = (bench.resolve_variant(n, bench.PRESETS, recipe) for n in (name, base))
        assert variant.deepspeed == "zero3.json" and not plain.deepspeed and "deepspeed" in variant.requires
        assert variant.overrides == plain.overrides and variant.fast_decode == plain.fast_decode
    shipped = json.loads((bench.REPO_ROOT / "zero3.json").read_text())
    assert bench.deepspeed_config(variant) == shipped  # train.sh's config, unchanged
    zero2 = bench.deepspeed_config(bench.resolve_variant("ours_fast_zero2", bench.PRESETS, recipe))
    assert zero2["zero_optimization"]["stage"] == 2 and not any("stage3" in key for key in zero2["zero_optimization"])
    ablation = bench.parse_defines(
        ['z3_no_leaf={"base": "ours_fast_zero3", "zero_optimization": {"stage3_module_granularity_threshold": 0}}']
    )
    no_leaf = bench.deepspeed_config(bench.resolve_variant("z3_no_leaf", {**bench.PRESETS, **ablation}, recipe))
    assert no_leaf["zero_optimization"] == {**shipped["zero_optimization"], "stage3_module_granularity_threshold": 0}
    leafy = bench.parse_defines(
        ['z3_leafy={"base": "ours_fast_zero3", "zero_optimization": {"stage3_module_granularity_threshold": 5e6}}']
    )
    with pytest.raises(bench.BenchError, match="z3_leafy: remove stage3_module_granularity_threshold"):
        bench.deepspeed_config(bench.resolve_variant("z3_leafy", {**bench.PRESETS, **leafy}, recipe))
    with pytest.raises(bench.BenchError, match="alone in its process"):
        bench.main(["--variants", "plain_trl,plain_trl_zero3", "--out", str(tmp_path / "x.json")])
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # registers the restore, so the variables set below leave with this test (a
        monkeypatch.delenv(key)  # later test's accelerate would otherwise rendezvous on a port in use)
    bench.single_process_distributed_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1") and int(os.environ["MASTER_PORT"]) > 0

    def run(name, rate):
        path = tmp_path / f"{name}.json"
        path.write_text(
            json.dumps(
                {
                    "environment": {"gpu": "x"},
                    "variants": [
                        {
                            "name": name,
                            "status": "ok",
                            "rollouts_per_s": rate,
                            **dict.fromkeys(
                                (
                                    "trained_sequences_per_s",
                                    "gen_s",
                                    "logp_s",
                                    "prep_s",
                                    "train_s",
                                    "other_s",
                                    "gen_tokens_per_s",
                                    "train_tokens_per_s",
                                ),
                                1.0,
                            ),
                        }
                    ],
                }
            )
        )
        return str(path)

    paths = [
        run("plain_trl", 5.0),
        run("ours_fast", 30.0),
        run("plain_trl_zero3", 5.0),
        run("ours_fast_zero3", 25.0),
        str(tmp_path / "missing.json"),
    ]
    merged = bench.merge_results([json.loads(Path(p).read_text()) for p in paths[:4]])
    goals = {g["ratio"]: (round(g["value"], 3), g["met"]) for g in merged["goals"]}
    assert goals == {
        "ours_fast_zero3 / plain_trl_zero3": (5.0, True),
        "ours_fast_zero3 / ours_fast": (0.833, True),
        "ours_fast / plain_trl": (6.0, True),
    }
    assert [r["ratio_vs_plain_trl"] for r in merged["variants"]] == [1.0, 6.0, 1.0, 5.0]
    assert bench.main(["--merge", *paths, "--out", str(tmp_path / "all.json")]) == 0
    assert "skipping" in caplog.text and json.loads((tmp_path / "all.json").read_text())["merged_from"] == 4


def test_caption_bench_scores_caption_sized_text_from_the_completion():
    """A random policy's 1536 ids decode to ~15k RM tokens; the bench's RM reads MAX_WORDS words picked by them."""
    from experiments.bench.bench_caption import caption_of
    from open_r1.tasks.captioning import protocol

    ids = list(range(100, 1636))
    caption = caption_of(ids)
    assert len(caption.split()) == protocol.MAX_WORDS
    assert caption_of(ids[:-1]) != caption  # the reward follows the completion
    assert caption_of([7] * 3).split() == [caption_of([7]).strip()] * 3


@pytest.mark.slow
def test_caption_bench_tiny_runs_every_variant(tmp_path):
    """The captioning-shape bench on CPU (tiny Qwen3-VL policy with LoRA, tiny Qwen2.5-VL RM): plain TRL and ours
    train with forced-length completions and RM rewards, the RM variant scores every caption; no timing asserted."""
    from experiments.bench import bench_caption

    out = tmp_path / "caption.json"
    assert (
        bench_caption.main(["--tiny", "--steps", "1", "--rm-captions", "6", "--rm-batch-size", "4", "--out", str(out)])
        == 0
    )
    results = {r["name"]: r for r in json.loads(out.read_text())["variants"]}
    assert set(results) == {"plain_trl", "ours", "rm"}
    for name in ("plain_trl", "ours"):
        r = results[name]
        assert r["status"] == "ok" and r["forced_length_ok"] and r["rollouts"] == r["rows_per_round"] == 16, name
    assert results["ours"]["decode_ms_per_step"] is not None  # the rollouts went through the graph decoder
    assert results["ours"]["ratio_vs_plain_trl"] is not None
    assert results["rm"]["captions"] == 6 and results["rm"]["captions_per_s"] > 0
    assert results["ours"]["layers_once"] is True  # the shipped default
    with pytest.raises(bench.BenchError, match="unknown variant"):
        bench_caption.main(["--tiny", "--variants", "ours,nope"])


@pytest.mark.slow
def test_caption_bench_layers_once_reaches_the_trainers_decoder(tmp_path, monkeypatch):
    from experiments.bench import bench_caption
    from open_r1 import decoding

    monkeypatch.setattr(decoding, "LAYERS_ONCE", True)  # restored after: --no-layers-once sets the module's default
    out = tmp_path / "caption.json"
    assert (
        bench_caption.main(["--tiny", "--steps", "1", "--variants", "ours", "--no-layers-once", "--out", str(out)]) == 0
    )
    payload = json.loads(out.read_text())
    assert payload["shape"]["layers_once"] is False and payload["variants"][0]["layers_once"] is False
