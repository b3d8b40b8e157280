"""The CPU demo (open_r1.tasks.counting.demo): its small-vocabulary model, the shipped warm start, and a short run
end to end. The demo's numbers are measured in docs/DEMO.md, not asserted here."""

import json

import pytest

from open_r1.tasks.counting import demo


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
