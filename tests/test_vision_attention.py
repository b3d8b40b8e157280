"""open_r1.vision_attention: the vision tower's SDPA attention once per image size, on tiny models of every family.

The contract it relies on (transformers hands `cu_seq_lens_q` to an attention implementation whose name contains
"flash") is checked by counting the calls the registered function gets: if transformers stopped passing the
boundaries, every forward here would raise the function's ModelError instead of silently attending across images.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from open_r1 import vision_attention
from open_r1.errors import ModelError
from open_r1.families import vision_tower


def _load(path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def _pixels(path, sizes, seed=0):
    from PIL import Image
    from transformers import AutoProcessor

    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    batch = AutoProcessor.from_pretrained(path).image_processor(images=images, return_tensors="pt")
    return batch["pixel_values"], batch["image_grid_thw"]


# sizes repeated and not: segments of equal and of different lengths in one batch (processors may resize some)
SIZES = [(64, 96), (96, 96), (64, 96), (128, 128), (64, 96)]


def _features(model, pixels, grid):
    out = model.model.get_image_features(pixels, grid)
    pooled = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.cat(list(pooled)) if isinstance(pooled, (list, tuple)) else pooled


def test_grouped_attention_equals_the_per_image_loop_and_gets_the_image_boundaries(family_model_dir):
    from transformers import AttentionInterface

    from open_r1.compat import attn_implementation

    model = _load(family_model_dir).eval()
    pixels, grid = _pixels(family_model_dir, SIZES)
    lengths = grid.prod(-1).tolist()
    assert 1 < len(set(lengths)) < len(lengths)  # equal and different segment lengths
    with torch.no_grad():
        reference = _features(model, pixels, grid)
    assert vision_attention.use_grouped_vision_attention(model) is True
    assert vision_attention.vision_implementation(model) == vision_attention.NAME
    assert attn_implementation(model.config.get_text_config()) == "sdpa"  # the language model keeps its own
    calls = []

    def spy(module, query, key, value, **kwargs):
        calls.append(kwargs["cu_seq_lens_q"].tolist())
        return vision_attention.grouped_sdpa(module, query, key, value, **kwargs)

    AttentionInterface.register(vision_attention.NAME, spy)
    try:
        with torch.no_grad():
            grouped = _features(model, pixels, grid)
    finally:
        vision_attention.register()  # grouped_sdpa again
    blocks = len(vision_tower(model).blocks)
    assert len(calls) == blocks  # one call per layer, each with the image (or window) boundaries
    assert calls[0][-1] == pixels.shape[0] and len(calls[0]) >= len(SIZES) + 1
    torch.testing.assert_close(grouped, reference, rtol=0, atol=1e-6)
    assert vision_attention.use_grouped_vision_attention(model, "per_image") is False
    assert vision_attention.vision_implementation(model) == "sdpa"


def test_grouped_attention_gives_the_same_gradients(tiny_model_dirs):
    """Training backpropagates through it (the GRPO pass runs the ViT with grad): Qwen2.5-VL's windows give
    segments of several lengths in every layer."""
    path = tiny_model_dirs["qwen2_5_vl"]
    grads = {}
    for choice in ("per_image", "grouped"):
        model = _load(path).train()
        vision_attention.use_grouped_vision_attention(model, choice)
        pixels, grid = _pixels(path, SIZES, seed=1)
        _features(model, pixels, grid).square().sum().backward()
        grads[choice] = {n: p.grad.clone() for n, p in vision_tower(model).named_parameters() if p.grad is not None}
    assert grads["grouped"].keys() == grads["per_image"].keys() and grads["grouped"]
    for name, grad in grads["per_image"].items():
        torch.testing.assert_close(grads["grouped"][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_load_model_sets_it_and_a_saved_model_loads_with_plain_transformers(tiny_model_dir, tmp_path):
    from open_r1 import modeling

    model = modeling.load_model(str(tiny_model_dir), dtype="float32", attn_implementation="sdpa")
    assert vision_attention.vision_implementation(model) == vision_attention.NAME
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert vision_attention.NAME not in json.dumps(config)  # never written: the grader's transformers lacks it
    plain = modeling.load_model(
        str(tiny_model_dir), dtype="float32", attn_implementation="sdpa", vision_attention="per_image"
    )
    assert vision_attention.vision_implementation(plain) == "sdpa"


def test_other_implementations_are_left_alone_and_bad_use_is_named(tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    eager = AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    assert vision_attention.use_grouped_vision_attention(eager) is False
    assert vision_attention.vision_implementation(eager) == "eager"
    with pytest.raises(ModelError, match="vision_attention must be one of"):
        vision_attention.use_grouped_vision_attention(eager, "fast")
    query = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ModelError, match="vision sub-config only"):  # e.g. set on a language model's config
        vision_attention.grouped_sdpa(torch.nn.Module(), query, query, query, attention_mask=torch.ones(1, 1, 4, 4))


def test_chunked_calls_give_the_same_result(tiny_model_dirs, monkeypatch):
    """With MAX_TOKENS_PER_CALL set, segments go to SDPA in chunks of at most that many tokens (bounded extra
    memory): the result does not depend on the chunk size, for equal and for mixed segment lengths."""
    model = _load(tiny_model_dirs["qwen2_5_vl"]).eval()
    vision_attention.use_grouped_vision_attention(model)
    for sizes in (SIZES, [(64, 96)] * 5):
        pixels, grid = _pixels(tiny_model_dirs["qwen2_5_vl"], sizes, seed=3)
        with torch.no_grad():
            whole = _features(model, pixels, grid)
            monkeypatch.setattr(vision_attention, "MAX_TOKENS_PER_CALL", 1)  # one segment per call
            single = _features(model, pixels, grid)
            monkeypatch.setattr(vision_attention, "MAX_TOKENS_PER_CALL", 40)  # a few segments per call
            few = _features(model, pixels, grid)
            monkeypatch.undo()
        torch.testing.assert_close(single, whole, rtol=0, atol=1e-6)
        torch.testing.assert_close(few, whole, rtol=0, atol=1e-6)
