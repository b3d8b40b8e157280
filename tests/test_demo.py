"""The CPU demo (open_r1.tasks.counting.demo): its small-vocabulary model, the shipped warm start, and a short run
end to end. The demo's numbers are measured in docs/DEMO.md, not asserted here."""

import json
import os

import pytest

from open_r1.tasks.counting import demo, protocol, sft


def test_small_vocab_model_keeps_the_special_tokens_consistent(tmp_path):
    model, processor = demo.build_demo_model(seed=0)
    tokenizer = processor.tokenizer
    assert len(tokenizer) < 4096 <= 151936  # the point: a small embedding, not the real 151936 rows
    assert model.config.text_config.vocab_size >= len(tokenizer)
    ids = {
        name: tokenizer.convert_tokens_to_ids(name)
        for name in ("<|image_pad|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>")
    }
    assert model.config.image_token_id == ids["<|image_pad|>"]
    assert model.config.vision_start_token_id == ids["<|vision_start|>"]
    assert model.config.vision_end_token_id == ids["<|vision_end|>"]
    assert model.config.text_config.eos_token_id == ids["<|im_end|>"]
    assert ids["<|im_end|>"] in model.generation_config.eos_token_id
    # the chat template renders the image placeholder and the turns like the real checkpoint's
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>" in text


def test_shipped_warm_start_loads_and_answers_through_the_protocol(scene_data_dir):
    from open_r1.modeling import load_model, load_processor
    from open_r1.tasks.counting.data import load_counting_dataset
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    start = demo.SHIPPED_START
    report = json.loads((start / demo.START_REPORT).read_text())
    assert report["command"].startswith("python -m open_r1.tasks.counting.demo --build-start")
    model = load_model(str(start), dtype="float32").eval()
    processor = load_processor(str(start))
    result = evaluate_dataset(
        model, processor, load_counting_dataset(f"{scene_data_dir}/val"), name="val", batch_size=6, progress=False
    )
    # a trained start stops by itself, far inside the 256-token budget (a random model never does)
    assert result.n == 6 and result.truncated_pct == 0.0 and result.mean_completion_tokens < 64


def test_constant_answer_floor_and_noise():
    records = [{"gold": g} for g in (1, 1, 1, 2)]
    assert demo.constant_answer_pct(records) == 75.0
    assert demo.wilson_halfwidth(50.0, 200) == pytest.approx(6.93, abs=0.01)


@pytest.mark.slow
def test_demo_end_to_end_writes_table_plots_and_json(tmp_path, capsys):
    out = tmp_path / "demo"
    assert (
        demo.main(
            [
                "--out",
                str(out),
                "--train-size",
                "16",
                "--eval-size",
                "6",
                "--eval-limit",
                "6",
                "--grpo-steps",
                "2",
                "--",
                "--eval_steps_protocol",
                "1",
                "--eval_limit",
                "4",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| split | n | start acc % | trained acc % |" in printed
    for split in demo.EVAL_SPLITS:
        assert f"| {split} | 6 |" in printed
    report = json.loads((out / "demo.json").read_text())
    assert report["grpo"]["steps"] == 2
    assert set(report["splits"]) == set(demo.EVAL_SPLITS)
    for split in demo.EVAL_SPLITS:
        assert report["splits"][split]["start"]["n"] == report["splits"][split]["trained"]["n"] == 6
    assert (out / "acc_by_count.png").stat().st_size > 0 and (out / "curves.png").stat().st_size > 0
    assert (out / "trained" / "config.json").is_file()


def test_a_warm_start_of_no_steps_is_one_clear_error(capsys):
    with pytest.raises(SystemExit) as stop:
        demo.parse_args(["--out", "x", "--sft-steps", "0"])
    assert stop.value.code == 2 and "--sft-steps must be >= 1, got 0" in capsys.readouterr().err


# The warm start's SFT rows (open_r1.tasks.counting.sft; these tests came from the retired tests/test_proxy.py).


def test_sft_targets_score_as_correct_and_well_formed():
    from open_r1.tasks.counting.rewards import format_checks

    think, answer = sft.sft_target(7, "think"), sft.sft_target(10, "answer")
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
    rows = sft.to_sft_dataset(train, ["eval:0.5", "train:0.5"], seed=0, style="mixed")
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


def test_exposure_rows_are_plain_questions_answered_with_the_bare_number(scene_data_dir, tiny_model_dir):
    """The warm start's OOD exposure: OOD-renderer images, the question without any protocol template, the bare
    number as the trained completion (so the protocol format is never taught on that renderer)."""
    import datasets
    from transformers import AutoProcessor
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    ood = datasets.load_from_disk(os.path.join(scene_data_dir, "ood_train"))
    rows = sft.to_exposure_sft_dataset(ood)
    assert set(rows["template"]) == {sft.EXPOSURE_TEMPLATE}
    for row in rows:
        assert row["prompt"][0]["content"] == row["problem"].strip()
        assert row["completion"][0]["content"] == str(protocol.parse_gold(row["solution"]))
        assert "<answer>" not in row["completion"][0]["content"] and "<think>" not in row["prompt"][0]["content"]
    # the exposure and protocol rows train together in one SFT dataset
    train = sft.to_sft_dataset(datasets.load_from_disk(os.path.join(scene_data_dir, "train")), ["eval:1.0"])
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
    rows = sft.to_arithmetic_sft_dataset(train, ["eval:0.5", "train:0.5"], seed=0, style="mixed")
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
    assert rows["problem"] == sft.to_arithmetic_sft_dataset(train, ["eval:1.0"], seed=0)["problem"]


def test_plain_count_reads_the_first_integer_and_is_not_the_protocol():
    assert sft.plain_count("7") == 7 and sft.plain_count(" 10 objects, maybe 11") == 10
    assert sft.plain_count("seven") is None and sft.plain_count("") is None
    # the protocol would not score a bare number: the probe is a diagnostic only
    assert protocol.extract_answer("7") is None
