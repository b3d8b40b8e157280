"""The Bradley-Terry VLM reward model (open_r1/reward_model.py) on a tiny Qwen-VL backbone, on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from open_r1 import reward_model as rm_lib


def _image(seed: int, size=(64, 64)):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))


def _messages(caption: str) -> list[dict]:
    return [
        {"role": "system", "content": [{"type": "text", "text": "Judge cartoon captions."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Write a funny caption."}]},
        {"role": "assistant", "content": [{"type": "text", "text": f"<caption>{caption}</caption>"}]},
    ]


PIXELS = 64 * 64  # one image budget that fits the 28 px (Qwen2/2.5-VL) and 32 px (Qwen3-VL) grids


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    """Tiny checkpoints of the three families (open_r1.tiny_models.build_tiny), built once for this module."""
    from open_r1.tiny_models import build_tiny

    root = tmp_path_factory.mktemp("rm_backbones")
    return {family: str(build_tiny(family, root / family, seed=0)) for family in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")}


def _rm(path: str, **kwargs):
    torch.manual_seed(0)
    model = rm_lib.build_reward_model(
        path, min_pixels=PIXELS, max_pixels=PIXELS, dtype="float32", attn_implementation="sdpa", **kwargs
    )
    with torch.no_grad():  # a non-zero head, so scores differ between rows
        model.head.weight.normal_(0, 1.0)
    return model.eval()


@pytest.fixture(scope="module")
def rm(backbones):
    return _rm(backbones["qwen2_5_vl"])  # the stand-in's RM family


def test_last_real_index_any_padding_side():
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert rm_lib.last_real_index(right).tolist() == [2, 4]
    assert rm_lib.last_real_index(left).tolist() == [4, 4]
    with pytest.raises(ValueError):
        rm_lib.last_real_index(torch.tensor([[0, 0, 0]]))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_pooling_same_score_left_and_right_padding(backbones, family):
    rm = _rm(backbones[family])
    images = [_image(0), _image(1), _image(2)]
    # very different lengths, so padding really happens on one side or the other
    messages = [
        _messages("Hi."),
        _messages("A much longer caption with many many more words in it than the first"),
        _messages("Mid length caption here"),
    ]
    left = rm.score(images, messages, padding_side="left")
    right = rm.score(images, messages, padding_side="right")
    alone = [rm.score([image], [m])[0] for image, m in zip(images, messages)]  # no padding at all
    assert len({round(s, 4) for s in left}) == 3, "scores should differ between rows"
    for a, b, c in zip(left, right, alone):
        assert a == pytest.approx(c, abs=1e-4)
        assert b == pytest.approx(c, abs=1e-4)
    # the pooled token is the final <|im_end|>, not the template's trailing newline
    text = rm_lib.chat_text(rm.processor, messages[0])
    assert text.endswith("<|im_end|>")


def test_pooling_ignores_tokens_after_last_real_one(rm):
    batch = rm_lib.encode(rm.processor, [_image(0)], [_messages("Hello there")], padding_side="right")
    score = rm(**batch)
    longer = {k: v for k, v in batch.items()}
    # two extra pad positions with mask 0 on the right: the score must not move
    pad = rm.processor.tokenizer.pad_token_id
    longer["input_ids"] = torch.cat([batch["input_ids"], torch.full((1, 2), pad)], dim=1)
    longer["attention_mask"] = torch.cat([batch["attention_mask"], torch.zeros(1, 2, dtype=torch.long)], dim=1)
    if "mm_token_type_ids" in batch:
        longer["mm_token_type_ids"] = torch.cat([batch["mm_token_type_ids"], torch.zeros(1, 2, dtype=torch.long)], 1)
    with torch.no_grad():
        assert float(rm(**longer)) == pytest.approx(float(score), abs=1e-4)


def test_initial_bt_loss_is_log2(backbones):
    fresh = rm_lib.build_reward_model(backbones["qwen2_5_vl"], min_pixels=PIXELS, max_pixels=PIXELS, dtype="float32")
    collator = rm_lib.PairCollator(fresh.processor)
    rows = [
        {"image": _image(i), "chosen": _messages(f"good {i}"), "rejected": _messages(f"bad caption {i} x")}
        for i in range(3)
    ]
    batch = collator(rows)
    scores = fresh(**batch)
    assert scores.shape == (6,)
    assert torch.all(scores == 0)  # zero-initialised head
    loss = rm_lib.bradley_terry_loss(scores[:3], scores[3:])
    assert float(loss.detach()) == pytest.approx(math.log(2), abs=1e-7)


def test_collator_puts_the_rejected_image_on_the_rejected_side(rm):
    """A pair row may carry its own ``rejected_image`` (the captioning RM's image negatives: one conversation under
    two cartoons); the collated batch must score each side with its own image, as scoring the rows one by one."""
    collator = rm_lib.PairCollator(rm.processor)
    same = _messages("the same caption")
    rows = [
        {"image": _image(5), "chosen": same, "rejected": same, "rejected_image": _image(6)},
        {"image": _image(7), "chosen": _messages("good"), "rejected": _messages("bad one")},
    ]
    with torch.no_grad():
        scores = rm(**collator(rows)).tolist()
    expected = rm.score(
        [_image(5), _image(7), _image(6), _image(7)], [same, _messages("good"), same, _messages("bad one")]
    )
    assert scores == pytest.approx(expected, abs=1e-4)
    assert abs(scores[0] - scores[2]) > 1e-4  # the same text: only the image tells the two sides apart


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_vision_dedupe_gives_the_plain_scores_and_gradients(backbones, family):
    """The RM's vision tower encodes a pair's shared cartoon once (`open_r1.vision_dedupe`); the scores and every
    parameter's gradient must be those of the plain forward, which encodes each copy."""
    from open_r1.families import vision_tower

    rows = [
        {"image": _image(i), "chosen": _messages(f"good {i}"), "rejected": _messages(f"a bad caption {i}")}
        for i in range(3)
    ]
    rows.append(
        {"image": _image(0), "chosen": _messages("same"), "rejected": _messages("same"), "rejected_image": _image(9)}
    )  # an image negative: its other cartoon is one more distinct image
    results = {}
    for dedupe in (False, True):
        model = _rm(backbones[family], dedupe_vision=dedupe)
        scores = model(**rm_lib.PairCollator(model.processor)(rows))
        rm_lib.bradley_terry_loss(scores[:4], scores[4:]).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        visual = vision_tower(model.backbone)
        results[dedupe] = (
            scores.detach(),
            grads,
            (getattr(visual, "images_seen", None), getattr(visual, "images_encoded", None)),
        )
    (plain, plain_grads, plain_counts), (fast, fast_grads, counts) = results[False], results[True]
    assert plain_counts == (None, None) and counts == (8, 4)  # 8 images in the batch, 4 distinct
    assert torch.allclose(fast, plain, atol=1e-5)
    assert plain_grads.keys() == fast_grads.keys() and any("visual" in n for n in fast_grads)
    for name, grad in plain_grads.items():
        assert torch.allclose(fast_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_bt_loss_margin_and_centring():
    chosen, rejected = torch.tensor([2.0, 1.0]), torch.tensor([0.0, 1.0])
    plain = rm_lib.bradley_terry_loss(chosen, rejected)
    expected = (
        -(torch.nn.functional.logsigmoid(torch.tensor(2.0)) + torch.nn.functional.logsigmoid(torch.tensor(0.0))) / 2
    )
    assert float(plain) == pytest.approx(float(expected))
    assert float(rm_lib.bradley_terry_loss(chosen, rejected, margin=torch.tensor([1.0, 0.0]))) > float(plain)
    centred = rm_lib.bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.1)
    assert float(centred) == pytest.approx(float(plain) + 0.1 * ((2**2 + 2**2) / 2))


def test_save_load_round_trip(rm, tmp_path):
    images = [_image(3), _image(4)]
    messages = [_messages("one"), _messages("two words")]
    before = rm.score(images, messages)
    path = rm.save(str(tmp_path / "rm"), extra_meta={"note": "test"})
    loaded = rm_lib.load_reward_model(path, device="cpu", dtype="float32", attn_implementation="sdpa")
    assert loaded.meta["note"] == "test" and loaded.meta["pooling"] == rm_lib.POOLING
    assert loaded.meta["max_pixels"] == PIXELS  # the image budget travels with the model
    assert rm_lib.modeling.pixel_budget(loaded.processor) == (PIXELS, PIXELS)
    after = loaded.score(images, messages)
    assert after == pytest.approx(before, abs=1e-5)
    with pytest.raises(rm_lib.ModelError):
        rm_lib.load_reward_model(str(tmp_path))  # not an RM dir


def test_rm_vision_tower_runs_grouped_attention_with_the_loops_scores(rm, tmp_path):
    """The RM's backbone takes the engine's grouped vision attention (built and loaded alike), which scores as
    transformers' per-image loop does: the loop was 1796 SDPA calls per forward of a 64-pair batch."""
    from open_r1 import vision_attention

    assert vision_attention.vision_implementation(rm.backbone) == vision_attention.NAME
    images = [_image(5), _image(6), _image(7)]
    messages = [_messages("one"), _messages("two words"), _messages("three words here")]
    grouped = rm.score(images, messages)
    vision_attention.use_grouped_vision_attention(rm.backbone, "per_image")
    try:
        assert vision_attention.vision_implementation(rm.backbone) == "sdpa"
        assert rm.score(images, messages) == pytest.approx(grouped, abs=1e-5)
    finally:
        vision_attention.use_grouped_vision_attention(rm.backbone, "grouped")
    path = rm.save(str(tmp_path / "rm"))
    loaded = rm_lib.load_reward_model(path, device="cpu", dtype="float32", attn_implementation="sdpa")
    assert vision_attention.vision_implementation(loaded.backbone) == vision_attention.NAME
    assert loaded.score(images, messages) == pytest.approx(grouped, abs=1e-5)


def test_lora_rm_saves_merged(backbones, tmp_path):
    model = rm_lib.build_reward_model(
        backbones["qwen2_5_vl"], min_pixels=PIXELS, max_pixels=PIXELS, dtype="float32", lora={"r": 4, "alpha": 8}
    )
    assert any("lora_A" in name for name, _ in model.backbone.named_parameters())
    with torch.no_grad():
        for name, param in model.backbone.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a non-trivial adapter
        model.head.weight.normal_(0, 1.0)
    images, messages = [_image(5)], [_messages("lora")]
    before = model.score(images, messages)
    path = model.save(str(tmp_path / "rm_lora"))
    import os

    assert not os.path.exists(os.path.join(path, "adapter_config.json"))  # merged: one plain model dir
    after = rm_lib.load_reward_model(path, device="cpu", dtype="float32").score(images, messages)
    assert after == pytest.approx(before, abs=1e-4)


def test_pairwise_accuracy_bootstrap_by_group():
    chosen = [1.0, 1.0, 1.0, 0.0, 2.0, 2.0]
    rejected = [0.0, 0.0, 0.0, 1.0, 2.0, 0.0]
    groups = ["a", "a", "a", "b", "c", "c"]
    result = rm_lib.pairwise_accuracy(chosen, rejected, groups, n_boot=500)
    assert result["accuracy"] == pytest.approx((3 + 0 + 0.5 + 1) / 6)
    assert result["n_groups"] == 3 and result["ci_unit"] == "group"
    assert result["ci_low"] <= result["accuracy"] <= result["ci_high"]
    perfect = rm_lib.pairwise_accuracy([1.0] * 4, [0.0] * 4, ["a", "a", "b", "b"], n_boot=200)
    assert perfect["ci_low"] == perfect["ci_high"] == 1.0


def test_rm_loss_falls_on_toy_set(backbones, tmp_path):
    """Chosen captions carry a word the rejected ones lack; a few steps of the Trainer subclass must lower the
    BT loss from log 2 and rank the training pairs."""
    from transformers import TrainingArguments

    torch.manual_seed(0)
    model = rm_lib.build_reward_model(
        backbones["qwen2_5_vl"], min_pixels=PIXELS, max_pixels=PIXELS, dtype="float32", attn_implementation="sdpa"
    )
    pairs = [
        {
            "image": _image(i),
            "chosen": _messages(f"the cat sat {i}"),
            "rejected": _messages(f"a dog ran {i}"),
            "group": i % 3,
        }
        for i in range(8)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path / "t"),
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        max_steps=12,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = rm_lib.train_reward_model(model, pairs, args)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)
    assert min(losses[-3:]) < 0.5 * math.log(2)
    seen = []
    result = rm_lib.evaluate_pairs(model, pairs, batch_size=3, n_boot=200, progress=lambda *a: seen.append(a))
    assert result["accuracy"] == 1.0
    assert seen == [(3, 16), (6, 16), (8, 16), (11, 16), (14, 16), (16, 16)]  # both sides, batch by batch


def test_the_rm_stage_runs_with_the_shipped_real_recipes_rm_settings(backbones, tmp_path):
    """configs/captioning/real_qwen3vl2b.yaml's rm section as shipped (activation checkpointing, its LoRA, its dtype)
    through the real pipeline's RM stage on a tiny backbone; only the sizes are cut. transformers >= 5.23's Trainer
    passes `every_n_layers` to the checkpointing call, which crashed the stage with a TypeError."""
    from open_r1.tasks.captioning import config, pipeline, stage_rm
    from standin.captioning import cartoons

    cartoons.write_standin(
        tmp_path / "data",
        cartoons.StandinConfig(
            contests=4, ood_contests=0, val_frac=0.25, test_frac=0.25, captions=12, image_size=(96, 64)
        ),
    )
    sizes = ["max_steps=1", "blind=false", "eval_image_swaps=0", "per_device_batch_size=2", "eval_cap_per_contest=4"]
    recipe = config.parse_recipe(
        "configs/captioning/real_qwen3vl2b.yaml",
        [
            f"work_dir={tmp_path / 'work'}",
            f"data_dir={tmp_path / 'data'}",
            f"models.reward_backbone={backbones['qwen2_5_vl']}",
            *(f"rm.{size}" for size in sizes),
        ],
        pipeline.STAGES,
    )
    cfg = recipe.section("rm")
    assert cfg.gradient_checkpointing and cfg.lora == {"r": 16, "alpha": 32, "dropout": 0.05} and cfg.dtype is None
    report = stage_rm.run(*recipe.args(stage_rm))["rm"]
    assert report["steps"] == 1 and set(report["held_out"]) == {"val", "test"}
    assert rm_lib.load_reward_model(recipe.paths.rm, device="cpu").meta["lora"] == cfg.lora
