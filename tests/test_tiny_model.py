"""The self-built Qwen2-VL checkpoint behaves like Qwen/Qwen2-VL-2B-Instruct on the real loading path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

from open_r1.families import get_family
from open_r1.tiny_models import (
    PLACEHOLDER_TOKEN_FORMAT,
    QWEN2VL_SPECIAL_TOKENS,
    REAL_MAX_PIXELS,
    REAL_MIN_PIXELS,
    REAL_VOCAB_SIZE,
    build_config,
    build_qwen2vl,
    main,
)

COUNTING_PROMPT = (
    "How many items are there in the image? First output the thinking process in <think> </think> and final "
    "answer (number) in <answer> </answer> tags."
)
IMAGE_TEXT_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": COUNTING_PROMPT}]}]
# What the real Qwen2-VL-2B-Instruct template renders for one image + text turn, with the generation prompt.
EXPECTED_RENDERING = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + COUNTING_PROMPT + "<|im_end|>\n"
    "<|im_start|>assistant\n"
)
IMAGE_PAD_ID = QWEN2VL_SPECIAL_TOKENS["<|image_pad|>"]


def count_parameters(config) -> int:
    """Parameter count of a config without allocating weights (built on the meta device); tied weights count once."""
    with torch.device("meta"):
        model = get_family(config.model_type).model_class()(config)
    return sum(parameter.numel() for parameter in model.parameters())


def random_image(width: int = 480, height: int = 320, seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_special_tokens_have_the_real_ids(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    vocab_size = config.get("text_config", config)["vocab_size"]

    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    for token, token_id in QWEN2VL_SPECIAL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id], token
    assert len(tokenizer) == 151657 <= vocab_size == REAL_VOCAB_SIZE  # same as the real tokenizer
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 151643
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151645
    assert tokenizer.bos_token is None
    assert "<|image_pad|>" in tokenizer.all_special_tokens


def test_counting_text_uses_trained_tokens_and_round_trips(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = COUNTING_PROMPT + "\n<think> I count 3 red cubes and 12 balls. </think> <answer> 15 </answer>"
    ids = tokenizer.encode(text, add_special_tokens=False)

    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 3  # whole words, not bytes: the BPE learned the prompt vocabulary
    # The placeholders that pad the BPE vocab up to the special ids are never produced by text.
    placeholder_prefix = PLACEHOLDER_TOKEN_FORMAT.split("{")[0]
    assert not any(token.startswith(placeholder_prefix) for token in tokenizer.convert_ids_to_tokens(ids))
    assert tokenizer.convert_ids_to_tokens(151642) == PLACEHOLDER_TOKEN_FORMAT.format(151642)
    # Qwen2's pre-tokenizer puts every digit in its own token, so numbers are read digit by digit.
    assert tokenizer.tokenize("12") == ["1", "2"]


def test_chat_template_renders_the_qwen2vl_layout(tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    for owner in (processor, tokenizer):
        rendered = owner.apply_chat_template(IMAGE_TEXT_MESSAGES, tokenize=False, add_generation_prompt=True)
        assert rendered == EXPECTED_RENDERING
    with_system = [{"role": "system", "content": "Count."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(with_system, tokenize=False) == (
        "<|im_start|>system\nCount.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_processor_expands_image_pad_to_the_merged_patch_count(tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir, padding_side="left")
    assert type(processor).__name__ == "Qwen2VLProcessor"
    assert processor.tokenizer.padding_side == "left"
    image_processor = processor.image_processor
    assert (image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size) == (14, 2, 2)
    assert (image_processor.size["shortest_edge"], image_processor.size["longest_edge"]) == (
        REAL_MIN_PIXELS,
        REAL_MAX_PIXELS,
    )

    long_prompt = processor.apply_chat_template(IMAGE_TEXT_MESSAGES, add_generation_prompt=True)
    short_prompt = "<|vision_start|><|image_pad|><|vision_end|>How many?"
    batch = processor(
        text=[long_prompt, short_prompt],
        images=[random_image(480, 320, seed=0), random_image(480, 320, seed=1)],
        padding=True,
        return_tensors="pt",
    )

    merge_length = image_processor.merge_size**2
    # 320x480 resizes to 308x476 (multiples of 28): a 22x34 patch grid, 187 merged tokens.
    assert batch["image_grid_thw"].tolist() == [[1, 22, 34], [1, 22, 34]]
    expected_pads = (batch["image_grid_thw"].prod(dim=-1) // merge_length).tolist()
    assert (batch["input_ids"] == IMAGE_PAD_ID).sum(dim=1).tolist() == expected_pads == [187, 187]
    assert batch["pixel_values"].shape == (2 * 22 * 34, 3 * 2 * 14 * 14)
    # Left padding: the shorter prompt is padded at the front with <|endoftext|>, both end on real tokens.
    assert batch["attention_mask"][:, -1].tolist() == [1, 1]
    assert batch["attention_mask"][1, 0] == 0 and batch["input_ids"][1, 0] == 151643


def test_model_loads_and_generates_from_pixels(tiny_model_dir):
    processor = AutoProcessor.from_pretrained(tiny_model_dir, padding_side="left")
    model = Qwen2VLForConditionalGeneration.from_pretrained(tiny_model_dir).eval()

    assert model.config.image_token_id == IMAGE_PAD_ID
    assert model.config.video_token_id == 151656
    assert (model.config.vision_start_token_id, model.config.vision_end_token_id) == (151652, 151653)
    assert model.config.text_config.vocab_size == REAL_VOCAB_SIZE
    assert model.generation_config.eos_token_id == [151645, 151643]
    assert model.generation_config.pad_token_id == model.generation_config.bos_token_id == 151643
    # Tied like the real 2B: the LM head is the embedding matrix.
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()

    prompt = processor.apply_chat_template(IMAGE_TEXT_MESSAGES, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[random_image()], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert output.shape == (1, inputs["input_ids"].shape[1] + 4)
    assert torch.equal(output[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])
    assert isinstance(processor.batch_decode(output[:, -4:])[0], str)


def test_same_seed_gives_identical_weights(tiny_model_dir, tmp_path):
    rebuilt = build_qwen2vl(tmp_path / "seed0", seed=0)
    other_seed = build_qwen2vl(tmp_path / "seed1", seed=1)

    reference = load_file(tiny_model_dir / "model.safetensors")
    same = load_file(rebuilt / "model.safetensors")
    different = load_file(other_seed / "model.safetensors")
    assert reference.keys() == same.keys() == different.keys()
    assert all(torch.equal(reference[name], same[name]) for name in reference)
    # Every randomly drawn tensor (everything but norms and biases) changes with the seed.
    drawn = [name for name in reference if reference[name].ndim >= 2]
    assert len(drawn) > 10 and not any(torch.equal(reference[name], different[name]) for name in drawn)
    # The trained tokenizer is deterministic too.
    assert (tiny_model_dir / "tokenizer.json").read_bytes() == (rebuilt / "tokenizer.json").read_bytes()


def test_full_size_config_matches_the_real_2b_model():
    config = build_config(full_size=True)
    text, vision = config.text_config, config.vision_config

    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        1536,
        28,
        12,
        2,
    )
    assert (text.intermediate_size, text.max_position_embeddings, text.vocab_size) == (8960, 32768, 151936)
    assert text.rope_parameters["rope_theta"] == 1_000_000.0
    assert text.rope_parameters["mrope_section"] == [16, 24, 24]
    assert config.tie_word_embeddings is True
    assert str(config.dtype).removeprefix("torch.") == "bfloat16"
    assert (vision.depth, vision.embed_dim, vision.num_heads, vision.mlp_ratio, vision.hidden_size) == (
        32,
        1280,
        16,
        4,
        1536,
    )
    assert (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) == (14, 2, 2)
    # Counted on the meta device: no memory allocated. Qwen2-VL-2B-Instruct has 2,208,985,600 parameters.
    assert count_parameters(config) == 2_208_985_600


def test_tiny_config_and_overrides(tmp_path):
    config = build_config()
    assert config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]  # head_dim 16
    assert config.vision_config.hidden_size == config.text_config.hidden_size
    assert build_config(hidden_size=128, vision_depth=1).vision_config.depth == 1
    with pytest.raises(TypeError, match="unknown overrides"):
        build_config(hiden_size=128)
    with pytest.raises(TypeError, match="vision_dept"):
        build_config(vision_dept=1)
    with pytest.raises(ValueError, match="mrope_section"):
        build_config(mrope_section=[4, 4, 4])

    out_dir = build_qwen2vl(tmp_path / "small_images", min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    processor = AutoProcessor.from_pretrained(out_dir)
    assert processor.image_processor.size["longest_edge"] == 28 * 28 * 16
    grid = processor.image_processor(random_image(), return_tensors="pt")["image_grid_thw"]
    assert grid.prod() // 4 <= 16


def test_cli_rebuilds_its_own_checkpoint_atomically(tmp_path):
    out_dir = tmp_path / "checkpoint"
    assert main(["--out", str(out_dir), "--seed", "3"]) == 0
    first = (out_dir / "model.safetensors").read_bytes()
    assert main(["--out", str(out_dir), "--seed", "4"]) == 0  # its own earlier build: replaced without a flag
    assert (out_dir / "model.safetensors").read_bytes() != first
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "tiny_model.json"} <= {
        path.name for path in out_dir.iterdir()
    }
    assert [path.name for path in tmp_path.iterdir()] == ["checkpoint"]  # no temp or old dirs left behind


@pytest.mark.parametrize("content", ["stale.txt", "trainer_state.json"], ids=["foreign-files", "trained"])
def test_cli_refuses_to_replace_a_dir_it_did_not_build_unless_overwrite(tmp_path, capsys, content):
    out_dir = tmp_path / "checkpoint"
    assert main(["--out", str(out_dir)]) == 0
    if content == "stale.txt":
        (out_dir / "tiny_model.json").unlink()  # not (any longer) this builder's dir
    (out_dir / content).write_text("{}")
    assert main(["--out", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "refusing to replace" in err and "--overwrite" in err and "Traceback" not in err
    assert (out_dir / content).exists()  # untouched
    assert main(["--out", str(out_dir), "--overwrite"]) == 0
    assert not (out_dir / content).exists()


# ---- the other families ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, length", [("qwen2_vl", 151657), ("qwen2_5_vl", 151665), ("qwen3_vl", 151669)])
def test_each_family_has_its_real_added_token_ids(tiny_model_dirs, family, length):
    from open_r1.tiny_models import ADDED_TOKENS

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs[family])
    assert len(tokenizer) == length
    for token, token_id in ADDED_TOKENS[family].items():
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id], token
    think = tokenizer.encode("<think>\nthree</think>", add_special_tokens=False)
    if family == "qwen3_vl":  # Qwen3 adds the think tags as single (non-special) tokens: decode keeps them
        assert (think[0], think[-1]) == (151667, 151668)
        assert tokenizer.decode(think, skip_special_tokens=True) == "<think>\nthree</think>"
    else:
        assert 151667 not in think and 151668 not in think
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (151645, 151643)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_each_family_renders_its_chat_template(tiny_model_dirs, family):
    processor = AutoProcessor.from_pretrained(tiny_model_dirs[family])
    rendered = processor.apply_chat_template(IMAGE_TEXT_MESSAGES, tokenize=False, add_generation_prompt=True)
    user_turn = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>" + COUNTING_PROMPT + "<|im_end|>\n"
    if family == "qwen3_vl":  # Qwen3-VL Thinking: no default system turn, the generation prompt opens the think block
        assert rendered == user_turn + "<|im_start|>assistant\n<think>\n"
    else:  # Qwen2.5-VL ships Qwen2-VL's template
        assert rendered == EXPECTED_RENDERING
    answer = {"role": "assistant", "content": "<think>\nthree\n</think>\n\n<answer>3</answer>"}
    with_answer = processor.apply_chat_template([*IMAGE_TEXT_MESSAGES, answer], tokenize=False)
    assert with_answer.endswith("<|im_start|>assistant\n<think>\nthree\n</think>\n\n<answer>3</answer><|im_end|>\n")
    follow_up = processor.apply_chat_template(
        [*IMAGE_TEXT_MESSAGES, answer, {"role": "user", "content": "Sure?"}], tokenize=False
    )
    if family == "qwen3_vl":  # the reasoning of a turn before the last user turn is dropped, as in the real template
        assert "<|im_start|>assistant\n<answer>3</answer><|im_end|>\n<|im_start|>user\nSure?" in follow_up
    else:
        assert "</think>\n\n<answer>3</answer><|im_end|>\n<|im_start|>user\nSure?" in follow_up


def test_qwen3_vl_instruct_template_and_processor_geometry(tmp_path):
    from open_r1.tiny_models import build_tiny

    out = build_tiny("qwen3_vl", tmp_path / "instruct", thinking=False, max_pixels=32 * 32 * 16)
    processor = AutoProcessor.from_pretrained(out)
    assert type(processor).__name__ == "Qwen3VLProcessor"
    rendered = processor.apply_chat_template(IMAGE_TEXT_MESSAGES, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and "<think>" not in rendered.split(COUNTING_PROMPT)[-1]
    image_processor = processor.image_processor
    assert (image_processor.patch_size, image_processor.merge_size) == (16, 2)
    assert list(image_processor.image_mean) == [0.5, 0.5, 0.5]
    batch = processor(text=[rendered], images=[random_image(480, 320)], return_tensors="pt")
    merged = int(batch["image_grid_thw"].prod()) // 4
    assert merged <= 16 and (batch["input_ids"] == IMAGE_PAD_ID).sum() == merged


def test_tiny_configs_of_the_other_families():
    qwen25 = build_config(family="qwen2_5_vl")
    assert qwen25.model_type == "qwen2_5_vl" and qwen25.vision_config.patch_size == 14
    assert set(qwen25.vision_config.fullatt_block_indexes) <= set(range(qwen25.vision_config.depth))
    assert qwen25.vision_config.out_hidden_size == qwen25.text_config.hidden_size
    qwen3 = build_config(family="qwen3_vl")
    text, vision = qwen3.text_config, qwen3.vision_config
    assert (text.vocab_size, text.hidden_size, text.num_hidden_layers, text.head_dim) == (151936, 64, 2, 16)
    assert (text.num_attention_heads, text.num_key_value_heads) == (4, 2)
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    assert text.rope_parameters["mrope_interleaved"] is True
    assert (vision.depth, vision.hidden_size, vision.patch_size, vision.spatial_merge_size) == (2, 32, 16, 2)
    assert vision.out_hidden_size == text.hidden_size and round(vision.num_position_embeddings**0.5) ** 2 == (
        vision.num_position_embeddings
    )
    assert set(vision.deepstack_visual_indexes) <= set(range(vision.depth))
    with pytest.raises(ValueError, match="deepstack"):
        build_config(family="qwen3_vl", vision_deepstack_visual_indexes=[2])
    with pytest.raises(ValueError, match="perfect square"):
        build_config(family="qwen3_vl", vision_num_position_embeddings=60)
    with pytest.raises(ValueError, match="fullatt"):
        build_config(family="qwen2_5_vl", vision_fullatt_block_indexes=[5])
    with pytest.raises(TypeError, match="vision_embed_dim"):  # a Qwen2-VL field name on Qwen3-VL
        build_config(family="qwen3_vl", vision_embed_dim=32)


def test_full_size_configs_have_the_public_dimensions():
    qwen25 = build_config(full_size=True, family="qwen2_5_vl")  # Qwen/Qwen2.5-VL-3B-Instruct
    text, vision = qwen25.text_config, qwen25.vision_config
    assert (
        text.hidden_size,
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.intermediate_size,
    ) == (2048, 36, 16, 2, 11008)
    assert (
        vision.depth,
        vision.hidden_size,
        vision.intermediate_size,
        vision.window_size,
        list(vision.fullatt_block_indexes),
        vision.out_hidden_size,
    ) == (32, 1280, 3420, 112, [7, 15, 23, 31], 2048)
    assert 3.7e9 < count_parameters(qwen25) < 3.8e9  # "3B": 3.75B with the tied embedding counted once
    qwen3 = build_config(full_size=True, family="qwen3_vl")  # Qwen/Qwen3-VL-2B-{Instruct,Thinking}
    text, vision = qwen3.text_config, qwen3.vision_config
    assert (
        text.hidden_size,
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.head_dim,
        text.intermediate_size,
    ) == (2048, 28, 16, 8, 128, 6144)
    assert text.rope_parameters["mrope_section"] == [24, 20, 20] and text.rope_parameters["rope_theta"] == 5e6
    assert (
        vision.depth,
        vision.hidden_size,
        vision.num_position_embeddings,
        list(vision.deepstack_visual_indexes),
        vision.patch_size,
    ) == (24, 1024, 2304, [5, 11, 17], 16)
    assert 2.0e9 < count_parameters(qwen3) < 2.2e9  # "2B"


def test_cli_builds_a_qwen3_vl_checkpoint(tmp_path, capsys):
    out = tmp_path / "tiny-qwen3vl"
    assert main(["--family", "qwen3_vl", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_vl" and config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert json.loads((out / "tiny_model.json").read_text())["family"] == "qwen3_vl"
    with pytest.raises(SystemExit):
        main(["--family", "llava", "--out", str(tmp_path / "x")])


def test_suppress_unused_makes_generation_skip_exactly_the_ids_no_text_encodes_to(tmp_path):
    """The placeholders and the embedding rows past the tokenizer are suppressed; nothing a text encodes to is;
    without the option the generation config is the real file's."""
    from transformers import AutoConfig, GenerationConfig

    from open_r1.tasks.captioning import protocol
    from open_r1.tiny_models import ADDED_TOKENS, build_tiny

    family = "qwen3_vl"
    path = tmp_path / "policy"
    assert main(["--family", family, "--out", str(path), "--suppress-unused"]) == 0
    assert GenerationConfig.from_pretrained(build_tiny(family, tmp_path / "plain")).suppress_tokens is None
    tokenizer = AutoTokenizer.from_pretrained(path)
    vocab_size = AutoConfig.from_pretrained(path).get_text_config().vocab_size
    suppressed = GenerationConfig.from_pretrained(path).suppress_tokens
    names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    expected = [i for i, name in enumerate(names) if name.startswith(PLACEHOLDER_TOKEN_FORMAT.split("{")[0])]
    assert suppressed == expected + list(range(len(tokenizer), vocab_size))
    assert len(expected) > 140_000 and 151642 in suppressed
    assert not set(ADDED_TOKENS[family].values()) & set(suppressed)
    text = (
        COUNTING_PROMPT
        + " <think>\nI count 3 red cubes.</think> <answer> 3 </answer> "
        + protocol.format_target("Most of the objects are gray ones.", "The green cube insists, again!")
    )
    rng = np.random.default_rng(0)
    noise = "".join(chr(c) for c in rng.integers(32, 0x2FFF, 400))  # any text, not only the corpus's words
    ids = tokenizer.encode(text + noise, add_special_tokens=False)
    assert not set(ids) & set(suppressed)
