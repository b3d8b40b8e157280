"""open_r1.image_dedupe: each distinct image preprocessed once per call, the last call's rows reused, outputs equal
to the library processor's, and nothing of it in a saved processor."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from open_r1.image_dedupe import dedupe_state, enable_image_dedupe
from open_r1.tiny_models import build_processor


def _images(n, size=(60, 40)):
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 255, (size[1], size[0] + 4 * i, 3), dtype=np.uint8)) for i in range(n)]


def _call(processor, images, copies=3):
    rows = [[image] for image in images for _ in range(copies)]
    text = ["<|vision_start|><|image_pad|><|vision_end|>how many?"] * len(rows)
    return processor(images=rows, text=text, padding=True, return_tensors="pt")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_outputs_equal_the_library_processor_and_each_image_is_preprocessed_once(family):
    images = _images(4)
    plain, ours = build_processor(family=family), build_processor(family=family)
    assert enable_image_dedupe(ours) and not enable_image_dedupe(ours)
    expected = _call(plain, images)
    got = _call(ours, images)
    assert set(got) == set(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    state = dedupe_state(ours)
    assert (state.images_seen, state.images_processed) == (12, 4)


def test_the_next_call_reuses_held_rows_and_other_settings_are_not_mixed_up():
    images = _images(3, size=(120, 80))
    ours = build_processor()
    enable_image_dedupe(ours)
    first = _call(ours, images)
    again = _call(ours, images, copies=2)  # the same image objects: nothing preprocessed
    state = dedupe_state(ours)
    assert state.images_processed == 3
    assert torch.equal(again["pixel_values"], _call(build_processor(), images, copies=2)["pixel_values"])
    # one new image object with equal pixels is a new image (identity is the key), the held two are reused
    copy = images[0].copy()
    _call(ours, [copy, images[1]], copies=1)
    assert state.images_processed == 4
    # other keyword arguments (a smaller pixel budget) are never served from rows made with the old ones
    budget = {"size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 2}, "return_tensors": "pt"}
    small = ours.image_processor(images=images, **budget)
    assert state.images_processed == 7
    expected = build_processor().image_processor(images=images, **budget)
    assert torch.equal(small["image_grid_thw"], expected["image_grid_thw"])
    assert small["pixel_values"].shape[0] < first["pixel_values"].shape[0] / 3


def test_a_saved_processor_names_the_library_class_and_holds_no_cache(tmp_path):
    from transformers import AutoProcessor

    ours = build_processor()
    enable_image_dedupe(ours)
    _call(ours, _images(2))
    ours.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "processor_config.json").read_text())
    assert set(config["image_processor"]) & {"held", "signature", "images_seen", "_dedupe_cache"} == set()
    assert config["image_processor"]["image_processor_type"] == "Qwen2VLImageProcessor"
    loaded = AutoProcessor.from_pretrained(tmp_path)
    assert type(loaded.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert not hasattr(loaded.image_processor, "_dedupe_cache")


def test_a_layout_it_does_not_know_is_left_to_the_library_from_then_on(monkeypatch):
    """Outputs it cannot split per image: the library's result on the whole list, and later calls are plain ones
    (not a wasted preprocessing of the distinct images first, every call)."""
    import open_r1.image_dedupe as dedupe_lib

    images = _images(2)
    ours = build_processor()
    enable_image_dedupe(ours)
    base = type(ours.image_processor).__mro__[2]  # (the swapped class, the mixin, the library's class)
    calls = []
    real = base.preprocess
    monkeypatch.setattr(base, "preprocess", lambda self, imgs, *a, **k: calls.append(1) or real(self, imgs, *a, **k))
    monkeypatch.setattr(dedupe_lib, "per_image_rows", lambda output, count: None)
    expected = _call(build_processor(), images)
    calls.clear()
    first = _call(ours, images)
    assert len(calls) == 2  # the distinct images, then (layout unknown) the whole list
    second = _call(ours, images)
    assert len(calls) == 3  # the plain call only
    assert dedupe_state(ours).unsupported
    for key in expected:
        assert torch.equal(first[key], expected[key]) and torch.equal(second[key], expected[key]), key
