"""Proxy experiment tooling: arms, equal-rollout sync, SFT rows, the report, and both scripts end to end (--tiny)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from experiments.proxy import proxy
from open_r1.tasks.counting import protocol

REPO = Path(__file__).resolve().parent.parent


def _grpo_args(arm: str):
    from open_r1 import grpo

    argv = [
        "--config",
        str(proxy.ARMS[arm].config_path()),
        "--output_dir",
        "/tmp/unused",
        *proxy.arm_overrides(arm),
        "--bf16",
        "false",
        "--use_cpu",
        "true",
    ]  # the YAMLs are for the GPU
    return grpo.parse_args(argv)[:3]


# --------------------------------------------------------------------------------------------------------------------
# Arms
# --------------------------------------------------------------------------------------------------------------------
def test_every_arm_parses_and_changes_only_what_it_claims():
    from open_r1.rewards import parse_reward_kwargs

    ours_script, ours_train, ours_model = _grpo_args("ours")
    weak_script, weak_train, _ = _grpo_args("weak_baseline")
    assert weak_script.reward_funcs == ["answer_tag"] and weak_script.prompt_templates == ["train:1.0"]
    assert weak_train.num_generations == 4 and weak_train.beta == pytest.approx(0.04)
    # Same rollouts per optimizer step for the two main recipes.
    assert weak_train.generation_batch_size == ours_train.generation_batch_size
    assert ours_script.reward_funcs == ["exact_count", "format", "soft_count", "length_penalty"]
    ours_kwargs = parse_reward_kwargs(ours_script.reward_kwargs)
    # The length penalty's budget is the completion cap (rewards.py: set budget_tokens when the cap is < 256).
    assert ours_kwargs["length_penalty"]["budget_tokens"] == ours_train.max_completion_length

    assert ours_kwargs["format"] == {"require_think": False} and ours_kwargs["length_penalty"]["think_budget"] == 0
    script, train, _ = _grpo_args("think")
    kwargs = parse_reward_kwargs(script.reward_kwargs)
    assert kwargs["format"] == {"require_think": True}
    assert kwargs["length_penalty"]["think_budget"] == proxy.THINK_ARM_BUDGET
    assert kwargs["soft_count"] == ours_kwargs["soft_count"]

    script, train, _ = _grpo_args("exact_only")
    assert script.reward_funcs == ["exact_count", "format", "length_penalty"]
    assert train.reward_weights == [1.0, 0.25, 0.5] and "soft_count" not in parse_reward_kwargs(script.reward_kwargs)

    assert _grpo_args("no_kl")[1].beta == 0.0 and ours_train.beta > 0
    g4 = _grpo_args("g4")[1]
    assert g4.num_generations == 4 and g4.generation_batch_size == ours_train.generation_batch_size
    assert _grpo_args("train_template")[0].prompt_templates == ["train:1.0"]
    _, lora_train, lora_model = _grpo_args("lora")
    assert lora_model.use_peft and not ours_model.use_peft
    assert lora_train.learning_rate == pytest.approx(proxy.LORA_LR_FACTOR * ours_train.learning_rate)
    assert _grpo_args("frozen_vit")[0].freeze_vision and not _grpo_args("ours")[0].freeze_vision
    noisy = _grpo_args("noisy_rollouts")[0]
    assert noisy.noisy_rollouts == 0.5 and noisy.noise_std == 0.1 and _grpo_args("ours")[0].noisy_rollouts == 0.0
    low = _grpo_args("low_lr")[1]
    assert low.learning_rate == pytest.approx(proxy.LOW_LR_FACTOR * ours_train.learning_rate)
    for arm in proxy.ARMS:
        assert ours_train.generation_batch_size % proxy.arm_num_generations(arm) == 0, arm


def test_learning_rate_override_keeps_lora_factor():
    assert proxy.arm_overrides("ours", learning_rate=1e-4) == ["--learning_rate", "0.0001"]
    lora = proxy.arm_overrides("lora", learning_rate=1e-4)
    assert lora[lora.index("--learning_rate") + 1] == f"{1e-4 * proxy.LORA_LR_FACTOR:g}"
    with pytest.raises(KeyError):
        proxy.arm_overrides("no_such_arm")


# --------------------------------------------------------------------------------------------------------------------
# Equal rollouts
# --------------------------------------------------------------------------------------------------------------------
def _record(step, first, last):
    return {"step": step, "first_step_time": first, "last_time": last}


def test_stop_step_waits_until_every_arm_is_measured():
    assert proxy.decide_stop_at({"a": _record(5, 0, 8), "b": None}, 10, 100, 400) is None  # b not started
    assert proxy.decide_stop_at({"a": _record(5, 0, 8), "b": _record(2, 0, 2)}, 10, 100, 400) is None  # too few


def test_stop_step_is_what_the_slowest_arm_reaches_by_the_deadline():
    progress = {"fast": _record(11, 0.0, 10.0), "slow": _record(6, 0.0, 10.0)}  # 1.0 and 0.5 steps/s
    stop = proxy.decide_stop_at(progress, now=10.0, train_deadline=110.0, max_steps=400, safety=1.0)
    assert stop == 6 + 50  # slow: 0.5 steps/s x 100 s
    assert proxy.decide_stop_at(progress, 10.0, 110.0, max_steps=20, safety=1.0) == 20  # capped
    # Never below the furthest arm's next step; finished arms are ignored.
    late = {"fast": _record(40, 0.0, 10.0), "slow": _record(6, 0.0, 10.0), "gone": {"done": True}}
    assert proxy.decide_stop_at(late, 10.0, 12.0, 400, safety=1.0) == 41


def test_stop_step_is_raised_when_arms_run_faster_but_never_lowered():
    # two arms at 1 step/s from t=0; at t=10 (step 11) with 40 s left they can reach ~45 (0.85 safety)
    fast = {"a": _record(11, 0.0, 10.0), "b": _record(11, 0.0, 10.0)}
    assert proxy.raise_stop_at(30, fast, now=10.0, train_deadline=50.0, max_steps=400) == 45
    # an arm within 2 steps of the old stop may already have stopped on it: keep it
    near = {"a": _record(29, 0.0, 28.0), "b": _record(20, 0.0, 19.0)}
    assert proxy.raise_stop_at(30, near, now=28.0, train_deadline=200.0, max_steps=400) == 30
    # slower than projected: never lowered (the deadline callback stops the arm instead)
    slow = {"a": _record(5, 0.0, 40.0), "b": _record(5, 0.0, 40.0)}
    assert proxy.raise_stop_at(30, slow, now=40.0, train_deadline=50.0, max_steps=400) == 30
    assert proxy.raise_stop_at(30, {"a": {"done": True}}, now=1.0, train_deadline=50.0, max_steps=400) == 30
    # an arm that already ended (it stopped on the old step) cannot follow a raise, however far the others are
    # (proxy run 5: arms at 22-24 raised the step to 27 after three had stopped at 26)
    ended = {"a": {**_record(26, 0.0, 25.0), "done": True}, "b": _record(11, 0.0, 10.0)}
    assert proxy.raise_stop_at(26, ended, now=10.0, train_deadline=200.0, max_steps=400) == 26


def test_sync_callback_stops_at_common_step_and_deadline(tmp_path):
    from transformers import TrainerControl, TrainerState

    control_path, progress_path = tmp_path / "control.json", tmp_path / "progress.json"
    callback = proxy.make_sync_callback(str(progress_path), str(control_path), hard_deadline=None)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = 100
    callback.on_train_begin(None, state, control)
    state.global_step = 1
    callback.on_step_end(None, state, control)
    assert not control.should_training_stop and json.loads(progress_path.read_text())["step"] == 1
    control_path.write_text(json.dumps({"stop_at": 2}))
    state.global_step = 2
    callback.on_step_end(None, state, control)
    assert control.should_training_stop and callback.stop_reason == "sync stop_at=2"
    late = proxy.make_sync_callback(None, None, hard_deadline=0.0)
    control = TrainerControl()
    late.on_step_end(None, state, control)
    assert control.should_training_stop and late.stop_reason == "hard deadline"


# --------------------------------------------------------------------------------------------------------------------
# SFT rows
# --------------------------------------------------------------------------------------------------------------------
def test_sft_targets_score_as_correct_and_well_formed():
    from open_r1.tasks.counting.rewards import format_checks

    think, answer = proxy.sft_target(7, "think"), proxy.sft_target(10, "answer")
    assert think == "<think>There are 7 objects.</think> <answer>7</answer>"
    assert protocol.is_correct(think, 7) and protocol.is_correct(answer, 10)
    assert all(format_checks(think).values())
    checks = format_checks(answer)
    assert checks["parseable"] and checks["single_answer"] and checks["clean_end"] and not checks["think_ok"]


def test_sft_rows_mix_templates_and_styles(scene_data_dir, tiny_model_dir):
    import datasets
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    train = datasets.load_from_disk(os.path.join(scene_data_dir, "train"))
    rows = proxy.to_sft_dataset(train, ["eval:0.5", "train:0.5"], seed=0, style="mixed")
    assert set(rows["template"]) == {"eval", "train"}
    styles = {"<think>" in r[0]["content"] for r in rows["completion"]}
    assert styles == {True, False}
    for row in rows:
        gold = protocol.parse_gold(row["solution"])
        expected = protocol.format_prompt(row["problem"], protocol.TEMPLATES[row["template"]])
        assert row["prompt"][0]["content"] == expected
        assert protocol.is_correct(row["completion"][0]["content"], gold)
    # TRL's VLM collator trains on the completion only, and it ends with the eos of generation.
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    collator = DataCollatorForVisionLanguageModeling(processor=processor, completion_only_loss=True)
    batch = collator([{k: rows[i][k] for k in ("prompt", "completion", "image")} for i in range(2)])
    for i in range(2):
        trained = batch["input_ids"][i][batch["labels"][i] != -100]
        text = processor.tokenizer.decode(trained)
        assert text.startswith(rows[i]["completion"][0]["content"])
        assert "<|im_end|>" in text and "<|im_start|>" not in text and "How many" not in text


def test_think_noise_makes_only_think_targets_wrong_and_consistent(scene_data_dir):
    """--think-noise: a start model whose thinking hurts. Wrong counts only in think-style rows, within +-2 of the
    gold and never equal to it, the answer agreeing with the thought; answer-style rows always correct."""
    import re

    import datasets

    train = datasets.load_from_disk(os.path.join(scene_data_dir, "train"))
    train = datasets.concatenate_datasets([train] * 25)  # 200 rows, enough for the shares to show
    rows = proxy.to_sft_dataset(train, ["eval:1.0"], seed=3, style="mixed", think_share=0.8, think_noise=0.5)
    clean = proxy.to_sft_dataset(train, ["eval:1.0"], seed=3, style="mixed", think_share=0.8)
    think_rows = wrong = 0
    for row, clean_row in zip(rows, clean):
        gold, text = protocol.parse_gold(row["solution"]), row["completion"][0]["content"]
        answer = protocol.extract_answer(text)
        assert answer == row["target_count"]
        if "<think>" in text:
            think_rows += 1
            assert int(re.search(r"There are (\d+) objects", text).group(1)) == answer  # thought and answer agree
            if answer != gold:
                wrong += 1
                assert abs(answer - gold) <= 2 and answer >= 1
        else:
            assert answer == gold
        assert ("<think>" in text) == ("<think>" in clean_row["completion"][0]["content"])  # same style draw
        assert clean_row["target_count"] == gold
    assert 0.7 < think_rows / len(rows) < 0.9 and 0.35 < wrong / think_rows < 0.65
    with pytest.raises(ValueError, match="think_noise"):
        proxy.to_sft_dataset(train, ["eval:1.0"], think_noise=1.5)


def test_exposure_rows_are_plain_questions_answered_with_the_bare_number(scene_data_dir, tiny_model_dir):
    """The warm start's OOD exposure: OOD-renderer images, the question without any protocol template, the bare
    number as the trained completion (so the protocol format is never taught on that renderer)."""
    import datasets
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    ood = datasets.load_from_disk(os.path.join(scene_data_dir, proxy.EXPOSURE_SPLIT))
    rows = proxy.to_exposure_sft_dataset(ood)
    assert set(rows["template"]) == {proxy.EXPOSURE_TEMPLATE}
    for row in rows:
        assert row["prompt"][0]["content"] == row["problem"].strip()
        assert row["completion"][0]["content"] == str(protocol.parse_gold(row["solution"]))
        assert "<answer>" not in row["completion"][0]["content"] and "<think>" not in row["prompt"][0]["content"]
    # the exposure and protocol rows train together in one SFT dataset
    train = proxy.to_sft_dataset(datasets.load_from_disk(os.path.join(scene_data_dir, "train")), ["eval:1.0"])
    mixed = datasets.concatenate_datasets([train, rows.cast(train.features)])
    assert len(mixed) == len(train) + len(rows)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    collator = DataCollatorForVisionLanguageModeling(processor=processor, completion_only_loss=True)
    batch = collator([{k: rows[0][k] for k in ("prompt", "completion", "image")}])
    trained = processor.tokenizer.decode(batch["input_ids"][0][batch["labels"][0] != -100])
    assert trained.startswith(rows[0]["completion"][0]["content"] + "<|im_end|>")


def test_arithmetic_rows_teach_the_format_on_another_task(scene_data_dir):
    """--format-rows: train images asked "What is A plus B?" under a protocol template, answered in the format with
    the sum (thought and answer agree); the counting question and its gold are gone from those rows."""
    import datasets

    train = datasets.load_from_disk(os.path.join(scene_data_dir, "train"))
    rows = proxy.to_arithmetic_sft_dataset(train, ["eval:0.5", "train:0.5"], seed=0, style="mixed")
    assert len(rows) == len(train) and set(rows["template"]) <= {"eval", "train"}
    styles = set()
    for row in rows:
        a, b = (int(x) for x in row["problem"].removeprefix("What is ").removesuffix("?").split(" plus "))
        assert 1 <= a <= 9 and 1 <= b <= 9 and row["target_count"] == a + b
        assert protocol.parse_gold(row["solution"]) == a + b
        prompt, target = row["prompt"][0]["content"], row["completion"][0]["content"]
        assert prompt == protocol.format_prompt(row["problem"], protocol.TEMPLATES[row["template"]])
        assert protocol.is_correct(target, a + b)
        styles.add("<think>" in target)
        if "<think>" in target:
            assert f"<think>{a} plus {b} is {a + b}.</think>" in target
    assert styles == {True, False}
    assert rows["problem"] == proxy.to_arithmetic_sft_dataset(train, ["eval:1.0"], seed=0)["problem"]


def test_plain_count_reads_the_first_integer_and_is_not_the_protocol():
    assert proxy.plain_count("7") == 7 and proxy.plain_count(" 10 objects, maybe 11") == 10
    assert proxy.plain_count("seven") is None and proxy.plain_count("") is None
    # the protocol would not score a bare number: the probe is a diagnostic only
    assert protocol.extract_answer("7") is None


def test_split_plain_rows_is_a_seeded_partition():
    plain, formatted = proxy.split_plain_rows(100, 0.9, seed=0)
    assert len(plain) == 90 and len(formatted) == 10 and sorted(plain + formatted) == list(range(100))
    assert (plain, formatted) == proxy.split_plain_rows(100, 0.9, seed=0)
    assert formatted != proxy.split_plain_rows(100, 0.9, seed=1)[1]
    assert proxy.split_plain_rows(5, 0.0) == ([], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="plain_share"):
        proxy.split_plain_rows(5, 1.5)


def test_ensure_splits_renders_only_what_is_missing(tmp_path):
    from open_r1.tasks.counting.scenes import write_splits

    data = tmp_path / "data"
    write_splits(str(data), {"train": 2, "val": 1}, seed=0, workers=1, image_size="112x84", progress=False)
    train_state = (data / "train" / "state.json").read_text()
    info = proxy.ensure_splits(
        data,
        {"train": 2, "val": 1, proxy.EXPOSURE_SPLIT: 2},
        image_size="112x84",
        ood_image_size="112x84",
        workers=1,
        progress=False,
        log=lambda *_: None,
    )
    assert info["generated"] and info["sizes"] == {"train": 2, "val": 1, proxy.EXPOSURE_SPLIT: 2}
    assert (data / "train" / "state.json").read_text() == train_state  # kept, not re-rendered
    again = proxy.ensure_splits(data, {"train": 2, proxy.EXPOSURE_SPLIT: 2}, log=lambda *_: None)
    assert not again["generated"]


# --------------------------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------------------------
def _run(arm, seed, accs, status="ok", ood_format=100.0):
    splits = {
        s: {
            "n": 10,
            "accuracy_pct": a,
            "format_pct": ood_format if s == "ood_val" else 100.0,
            "mean_completion_tokens": 18.0,
            "truncated_pct": 0.0,
            "seconds": 1.0,
            "by_count": {"3": [int(a // 10), 10]},
        }
        for s, a in zip(proxy.EVAL_SPLITS, accs)
    }
    return {
        "job": f"{arm}-s{seed}",
        "arm": arm,
        "seed": seed,
        "kind": "train",
        "status": status,
        "steps": 5,
        "rollouts": 640,
        "splits": splits if status == "ok" else {},
        "command": f"python -m open_r1.grpo --arm {arm}",
        "rerun": f"python -m experiments.proxy.proxy_experiment --arms {arm}",
    }


def _synthetic_results():
    partial = _run("g4", 0, [50, 0, 0])  # stopped by the budget after scoring val only
    partial.update(status="partial", splits={"val": partial["splits"]["val"]})
    before_splits = _run("x", 0, [40, 40, 20])["splits"]
    for report in before_splits.values():  # 6 of 10 rows have gold 3: answering 3 always scores 60 %
        report["by_count"] = {"3": [2, 6], "4": [2, 4]}
    return {
        "meta": {
            "splits": list(proxy.EVAL_SPLITS),
            "command": "python -m experiments.proxy.proxy_experiment",
            "eval_limit": 10,
            "generation_batch_size": 128,
            "stop_at": 5,
            "start": {"path": "m", "parameters_m": 47.0},
        },
        "arm_order": ["weak_baseline", "ours", "no_kl", "g4"],
        "arms": {
            a: {"role": proxy.ARMS[a].role, "question": proxy.ARMS[a].question, "change": proxy.ARMS[a].change}
            for a in ("weak_baseline", "ours", "no_kl", "g4")
        },
        "before": {"job": "before", "status": "ok", "splits": before_splits},
        "runs": [
            _run("weak_baseline", 0, [40, 40, 20]),
            _run("weak_baseline", 1, [41, 40, 21]),
            _run("ours", 0, [60, 55, 30]),
            _run("ours", 1, [62, 57, 22], ood_format=50.0),
            _run("no_kl", 0, [0, 0, 0], "failed"),
            partial,
        ],
    }


def test_verdict_needs_a_gap_larger_than_the_seed_spread():
    verdict = proxy.summarize(_synthetic_results())["verdict"]
    assert verdict["val"]["beats"] and verdict["val"]["delta"] == pytest.approx(20.5)
    assert verdict["compositional"]["beats"]
    # ood_val: +5.5 mean gap, but the ours seeds differ by 8 points -> not beyond the spread.
    assert verdict["ood_val"]["spread"] == pytest.approx(8.0) and not verdict["ood_val"]["beats"]


def test_verdict_reports_seed_pair_wins_permutation_p_and_constant_floor():
    summary = proxy.summarize(_synthetic_results())
    # ood_val: ours 30, 22 vs weak 20, 21 -> ours wins all 4 pairs; 2 vs 2 seeds has 6 relabellings, one as extreme
    assert summary["verdict"]["ood_val"]["wins"] == pytest.approx(1.0)
    assert summary["verdict"]["ood_val"]["p_value"] == pytest.approx(1 / 6)
    assert summary["constant_floor"] == {s: pytest.approx(60.0) for s in proxy.EVAL_SPLITS}


def test_permutation_p_value_and_pairwise_wins_by_hand():
    # first=[2], second=[1, 3]: relabellings {1}: 1 - 2 = -1, {2}: 2 - 2 = 0 (the observed), {3}: 3 - 1.5 -> 2 of 3
    assert proxy.permutation_p_value([([2.0], [1.0, 3.0])]) == pytest.approx(2 / 3)
    assert proxy.permutation_p_value([([3, 4, 5], [0, 1, 2])]) == pytest.approx(1 / 20)  # best a 3-vs-3 run can do
    assert proxy.permutation_p_value([([0, 1, 2], [3, 4, 5])]) == pytest.approx(1.0)
    # two runs, each all-higher: labels move only within a run -> 1 / (20 * 20)
    assert proxy.permutation_p_value([([3, 4, 5], [0, 1, 2]), ([13, 14, 15], [10, 11, 12])]) == pytest.approx(1 / 400)
    assert proxy.pairwise_wins([3, 5], [4, 4]) == pytest.approx(0.5)
    assert proxy.pairwise_wins([4], [4]) == pytest.approx(0.5)  # a tie counts half
    assert proxy.best_constant_accuracy({"3": [0, 2], "4": [1, 6], "5": [0, 2]}) == pytest.approx(60.0)


def test_pool_results_strata_and_errors(tmp_path):
    first, second = _synthetic_results(), _synthetic_results()
    for run in second["runs"]:  # a second run whose ours ood_val seeds tie the weak ones in one pair
        if run["arm"] == "ours":
            run["splits"]["ood_val"]["accuracy_pct"] = 21.0
    pooled = proxy.pool_runs([first, second])
    assert pooled["val"]["runs_beating_spread"] == 2 and pooled["val"]["p_value"] == pytest.approx(1 / 36)
    # ood_val of the second run: ours 21, 21 vs weak 20, 21 -> 2 wins + 2 ties (half each) of 4 pairs; the first
    # run: 4 of 4
    assert pooled["ood_val"]["wins"] == pytest.approx((4 + 3) / 8)
    assert pooled["ood_val"]["delta"] == pytest.approx((5.5 + 0.5) / 2)
    paths = []
    for name, results in (("a", first), ("b", second)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(results))
    md = tmp_path / "POOLED.md"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.proxy.pool_results",
            *map(str, paths),
            "--labels",
            "A",
            "B",
            "--md",
            str(md),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr
    assert (
        "| val | 61.0 (4) | 40.5 (4) | +20.5 (2.0) | +20.5 (2.0) | 2 of 2 | +20.5 | 100 % | 0.0278 |" in md.read_text()
    )
    del second["runs"][0:2]  # no weak_baseline left in the second run
    paths[1].write_text(json.dumps(second))
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.proxy.pool_results", *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert completed.returncode == 2 and "without scored ours and weak_baseline" in completed.stderr


def test_make_results_rebuilds_tables_and_plot(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_synthetic_results()))
    md, png = tmp_path / "docs" / "RESULTS.md", tmp_path / "docs" / "figures" / "acc.png"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.proxy.make_results",
            str(results),
            "--md",
            str(md),
            "--png",
            str(png),
            "--note",
            "Made before X changed.",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr
    text = md.read_text()
    assert "> Made before X changed." in text and f"--md {md} --png {png} --note" in text  # how to rebuild it
    assert "| recipe | seed | val | compositional | ood_val |" in text
    assert "| ours | 1 | 62.0 | 57.0 | 22.0 |" in text and "| weak_baseline | 0 | 40.0 | 40.0 | 20.0 |" in text
    assert "| ours | 2 | 61.0 ± 2.0 (1.4)" in text  # mean ± range (sd)
    assert "| ood_val | +5.5 | 8.0 | no | 100 % | 0.167 |" in text and "| val | +20.5 | 2.0 | yes |" in text
    assert "| *one constant answer (the most frequent gold count)* | – | 60.0 | 60.0 | 60.0 |" in text
    assert "| no_kl |" in text and "failed" in text  # a failed arm is a row, not a crash
    assert "| g4 | 0 | 50.0 | not scored | not scored |" in text  # a partial run keeps what was scored
    assert "| ours | 1 | 100.0 (62.0) | 100.0 (57.0) | 50.0 (44.0) |" in text  # parseable % (accuracy among them)
    assert "python -m open_r1.grpo --arm ours" in text and "](figures/acc.png)" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ood_val: ours - weak_baseline = +5.5" in completed.stdout and "does not beat" in completed.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert (
        subprocess.run(
            [sys.executable, "-m", "experiments.proxy.make_results", str(bad)], cwd=REPO, capture_output=True
        ).returncode
        == 2
    )


# --------------------------------------------------------------------------------------------------------------------
# End to end (--tiny, CPU)
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sft_warmstart_tiny_saves_a_loadable_left_padded_model(tmp_path, scene_data_dir):
    import importlib.util

    from transformers import AutoProcessor

    from open_r1 import modeling

    module = importlib.import_module("experiments.proxy.sft_warmstart")
    out = tmp_path / "warm"
    report = module.main(
        ["--tiny", "--out", str(out), "--data", scene_data_dir, "--max-steps", "1", "--eval-every", "1", "--seed", "0"]
    )
    assert report["steps"] == 1 and report["stop_reason"] == "max steps"
    assert len(report["quick_checks"]) == 1 and report["quick_checks"][0]["step"] == 1
    assert report["loss_first"] is not None and report["val"]["n"] == 4
    assert report["ood_exposure_rows"] == proxy.TINY_EXPOSURE_ROWS and report["ood_val"]["n"] == 4
    assert AutoProcessor.from_pretrained(out).tokenizer.padding_side == "left"
    model = modeling.load_model(str(out), dtype="float32")
    processor = modeling.load_processor(str(out))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert processor.image_processor.size["longest_edge"] == proxy.TINY_MAX_PIXELS
    assert json.loads((out / "sft_report.json").read_text())["command"].startswith(
        "python -m experiments.proxy.sft_warmstart"
    )
    assert (out / "preprocessor_config.json").is_file() and (out / "chat_template.json").is_file()
    # The SFT step moved the weights away from the seeded random init.
    import torch

    from open_r1 import tiny_models as tiny_model

    init = tiny_model.build_model(tiny_model.build_config(**proxy.MODEL_PRESETS["tiny"]), seed=0)
    name, trained = next((n, p) for n, p in model.named_parameters() if "layers.0.mlp.up_proj" in n)
    assert not torch.equal(trained, dict(init.named_parameters())[name])


def test_sft_warmstart_plain_share_teaches_plain_rows_and_probes_them(tmp_path, scene_data_dir):
    """--plain-share: that fraction of the CLEVR rows is taught as question -> bare number, the protocol format
    from the rest; the report carries the plain-question probe next to the protocol scores."""
    import importlib.util

    module = importlib.import_module("experiments.proxy.sft_warmstart")
    report = module.main(
        [
            "--tiny",
            "--out",
            str(tmp_path / "warm"),
            "--data",
            scene_data_dir,
            "--max-steps",
            "1",
            "--eval-every",
            "0",
            "--plain-share",
            "0.5",
        ]
    )
    assert report["plain_train_rows"] + report["protocol_train_rows"] == report["train_rows"]
    assert report["plain_train_rows"] == round(0.5 * report["train_rows"])
    assert set(report["asked_plainly"]) == {"val", "ood_val"}
    assert report["asked_plainly"]["val"]["n"] == report["val"]["n"] == 4
    with pytest.raises(SystemExit, match="plain-share"):
        module.main(["--tiny", "--out", str(tmp_path / "bad"), "--data", scene_data_dir, "--plain-share", "1"])
    # all counting rows plain, the format taught on arithmetic rows only
    report = module.main(
        [
            "--tiny",
            "--out",
            str(tmp_path / "warm2"),
            "--data",
            scene_data_dir,
            "--max-steps",
            "1",
            "--eval-every",
            "0",
            "--plain-share",
            "1",
            "--format-rows",
            "3",
        ]
    )
    assert report["protocol_train_rows"] == 0 and report["format_rows"] == 3
    assert report["plain_train_rows"] == report["train_rows"]
    assert report["format_ood_rows"] == 0
    with pytest.raises(SystemExit, match="format-rows"):
        module.main(["--tiny", "--out", str(tmp_path / "bad"), "--data", scene_data_dir, "--format-rows", "10000"])
    # the format also taught on OOD-renderer images; their number is bounded by the exposure rows
    rows_with_3_clevr_format_rows = report["sft_rows"]
    report = module.main(
        [
            "--tiny",
            "--out",
            str(tmp_path / "warm3"),
            "--data",
            scene_data_dir,
            "--max-steps",
            "1",
            "--eval-every",
            "0",
            "--plain-share",
            "1",
            "--format-ood-rows",
            "2",
        ]
    )
    assert report["format_rows"] == 0 and report["format_ood_rows"] == 2
    assert report["sft_rows"] == rows_with_3_clevr_format_rows - 3 + 2
    with pytest.raises(SystemExit, match="raise --ood-exposure"):
        module.main(
            [
                "--tiny",
                "--out",
                str(tmp_path / "bad"),
                "--data",
                scene_data_dir,
                "--ood-exposure",
                "1",
                "--format-ood-rows",
                "2",
            ]
        )


@pytest.mark.slow
def test_proxy_experiment_tiny_end_to_end(tmp_path):
    out = tmp_path / "proxy"
    old_default = os.path.join(REPO, "data", "proxy-tiny")  # where --tiny used to write, inside the working tree
    existed = os.path.exists(old_default)
    completed = subprocess.run(  # no --data: the tiny run renders its data under --out, never into the repo
        [sys.executable, "-m", "experiments.proxy.proxy_experiment", "--tiny", "--out", str(out), "--max-steps", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert (out / "data" / "train" / "dataset_info.json").is_file()
    assert os.path.exists(old_default) == existed
    results = json.loads((out / "results.json").read_text())
    assert results["meta"]["tiny"] and results["arm_order"] == ["weak_baseline", "ours"]
    assert results["before"]["status"] == "ok"
    runs = {(r["arm"], r["seed"]): r for r in results["runs"]}
    assert set(runs) == {("weak_baseline", 0), ("ours", 0)}
    for (arm, _), run in runs.items():
        assert run["status"] == "ok", run.get("error")
        assert run["steps"] == 1 and run["rollouts"] == results["meta"]["generation_batch_size"]
        assert run["command"].startswith("python -m open_r1.grpo --config ")
        assert str(proxy.ARMS[arm].config_path()) in run["command"] and "--max_steps 1" in run["command"]
        for split in proxy.EVAL_SPLITS:
            cell = run["splits"][split]
            assert cell["n"] == 4 and {"accuracy_pct", "format_pct", "mean_completion_tokens"} <= set(cell)
            assert sum(total for _, total in cell["by_count"].values()) == 4
    text = (out / "RESULTS.md").read_text()
    assert "| recipe | seed | val | compositional | ood_val |" in text and "| before (warm start) |" in text
    assert "| weak_baseline | 0 |" in text and "| ours | 0 |" in text and "## Verdict" in text
    assert (out / "acc_by_count.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
        predictions = json.load(tar.extractfile("predictions/ours-s0.json"))
    assert {"logs/before.log", "logs/ours-s0.log", "logs/weak_baseline-s0.log"} <= set(names)
    # per row: gold, prediction, tokens and the (cut) completion text, consistent with the protocol
    for gold, prediction, tokens, completion in predictions["val"]:
        assert prediction == protocol.extract_answer(completion) or len(completion) == proxy.PREDICTION_TEXT_CHARS
        assert isinstance(gold, int) and isinstance(tokens, int)
    # The report is a pure function of results.json (only the line naming the rebuild command differs).
    rebuilt = tmp_path / "rebuilt" / "RESULTS.md"
    subprocess.run(
        [sys.executable, "-m", "experiments.proxy.make_results", str(out / "results.json"), "--md", str(rebuilt)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    original_lines, rebuilt_lines = text.splitlines(), rebuilt.read_text().splitlines()
    assert f"--md {rebuilt}`" in rebuilt_lines[2]
    assert original_lines[:2] + original_lines[3:] == rebuilt_lines[:2] + rebuilt_lines[3:]
