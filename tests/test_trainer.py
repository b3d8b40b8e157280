"""The speed levers of open_r1.trainer: lazy image decoding, frozen vision tower, ViT de-duplication, noisy rollouts."""

import logging
import os

import numpy as np
import pytest
import torch
from datasets import Dataset, Image
from PIL import Image as PILImage

from open_r1 import families, grpo, vision_dedupe
from open_r1 import trainer as trainer_lib
from tests.test_grpo import recipe_args, use_varied_reward


def _trainer(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, *extra):
    """open_r1.grpo's trainer on the tiny model with rewards that vary within a group (every parameter gets a
    gradient)."""
    use_varied_reward(monkeypatch)
    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, *extra)
    )
    return grpo.build_trainer(script_args, training_args, model_args, task)


def _png_dataset(n=3):
    rng = np.random.default_rng(0)
    images = [PILImage.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)) for i in range(n)]
    return Dataset.from_dict({"image": images, "problem": ["q"] * n}).cast_column("image", Image())


def test_lazy_column_keeps_bytes_and_decodes_to_the_same_pixels():
    dataset = _png_dataset()
    lazy = trainer_lib.lazy_image_column(dataset)
    assert lazy.features["image"].decode is False
    rows = [dict(row) for row in lazy]
    assert all(isinstance(row["image"], dict) and row["image"]["bytes"] for row in rows)
    trainer_lib.decode_images(rows, max_workers=2)
    for row, eager in zip(rows, dataset):
        assert isinstance(row["image"], PILImage.Image)
        assert np.array_equal(np.asarray(row["image"]), np.asarray(eager["image"]))


def test_lazy_column_leaves_other_columns_and_decoded_values_alone():
    plain = Dataset.from_dict({"image": ["not an image feature"], "problem": ["q"]})
    assert trainer_lib.lazy_image_column(plain) is plain
    already = PILImage.new("RGB", (4, 4))
    rows = [{"image": already}, {"problem": "no image"}]
    assert trainer_lib.decode_images(rows) == [{"image": already}, {"problem": "no image"}]


def _count_decodes(monkeypatch):
    calls = {"n": 0}
    original = Image.decode_example

    def counting(self, value, token_per_repo_id=None):
        calls["n"] += 1
        return original(self, value, token_per_repo_id)

    monkeypatch.setattr(Image, "decode_example", counting)
    return calls


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_images_are_decoded_once_per_round_not_per_micro_step(
    lazy, tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """TRL's dataloader yields the whole generation batch at every micro-step; lazy decoding pays for it once."""
    accumulation, per_device = 4, 2  # generation batch 8 rows, yielded 4 times per optimizer step
    trainer = _trainer(
        tiny_model_dir,
        scene_data_dir,
        tmp_path,
        monkeypatch,
        "--per_device_train_batch_size",
        str(per_device),
        "--gradient_accumulation_steps",
        str(accumulation),
        "--lazy_images",
        str(lazy).lower(),
    )
    calls = _count_decodes(monkeypatch)
    trainer.train()
    generation_batch = per_device * accumulation
    rounds = trainer.state.global_step  # one generation round per optimizer step here
    if lazy:  # once per distinct image: a prompt's G rows hold the same bytes
        distinct = rounds * generation_batch // trainer.num_generations
        assert calls["n"] == distinct
        # and the processor preprocessed each distinct image once per round, not G copies twice
        from open_r1.image_dedupe import dedupe_state

        state = dedupe_state(trainer.processing_class)
        assert state.images_seen == 2 * rounds * generation_batch
        assert state.images_processed == distinct
    else:  # TRL decodes the batch at each micro-step (accelerate also prefetches one batch ahead)
        assert calls["n"] >= generation_batch * accumulation


def test_cache_length_buckets():
    from open_r1.generation import cache_length_bucket

    assert cache_length_bucket(200, 256) == 640  # 200 + 256 + 64 margin = 520 -> 5 x 128
    assert cache_length_bucket(320, 256) == 640 and cache_length_bucket(321, 256) == 768


def test_freeze_vision_trains_language_model_and_merger_only(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch):
    trainer = _trainer(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, "--freeze_vision", "true")
    params = dict(trainer.model.named_parameters())
    frozen = {n for n, p in params.items() if not p.requires_grad}
    assert frozen and all(".visual." in n and ".merger." not in n for n in frozen)
    assert any(".merger." in n and p.requires_grad for n, p in params.items())
    before = {n: p.detach().clone() for n, p in params.items()}
    trainer.train()
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param, before[name]) == (name in frozen), name


def test_freeze_vision_with_lora_is_one_clear_error(tiny_model_dir, scene_data_dir, tmp_path, capsys):
    code = grpo.cli(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--freeze_vision", "true", "--use_peft", "true")
    )
    assert code == 2
    assert "freeze_vision" in capsys.readouterr().err


def test_selfcheck_static_cache_gives_the_same_answers(tiny_model_dir, scene_data_dir):
    """The evaluation's static-cache path (open_r1.generation) changes the KV cache, not a single generated token."""
    from open_r1.modeling import load_model, load_processor
    from open_r1.tasks.counting.data import load_counting_dataset
    from open_r1.tasks.counting.evaluate import evaluate_dataset

    model = load_model(str(tiny_model_dir), dtype="float32").eval()
    processor = load_processor(str(tiny_model_dir), None, 12544)
    dataset = load_counting_dataset(os.path.join(scene_data_dir, "val"))
    kwargs = dict(batch_size=4, max_new_tokens=12, progress=False)
    eager = evaluate_dataset(model, processor, dataset, **kwargs)
    caches, generate = [], model.generate
    model.generate = lambda **kw: caches.append(kw.get("cache_implementation")) or generate(**kw)
    static = evaluate_dataset(model, processor, dataset, compile_generation=True, **kwargs)
    assert caches and set(caches) == {"static"}  # the static-cache path really ran
    assert [r["completion"] for r in static.records] == [r["completion"] for r in eager.records]
    assert static.n == eager.n == len(dataset)


def test_evaluation_halves_the_batch_on_out_of_memory(tiny_model_dir, scene_data_dir, monkeypatch, caplog):
    """A batch size too large for the card costs a retry, not the evaluation: same records as a fitting batch size."""
    from open_r1.modeling import load_model, load_processor
    from open_r1.tasks.counting import evaluate as evaluate_lib
    from open_r1.tasks.counting.data import load_counting_dataset

    model = load_model(str(tiny_model_dir), dtype="float32").eval()
    processor = load_processor(str(tiny_model_dir), None, 12544)
    dataset = load_counting_dataset(os.path.join(scene_data_dir, "val"))
    reference = evaluate_lib.evaluate_dataset(model, processor, dataset, batch_size=2, max_new_tokens=6, progress=False)
    real, sizes = evaluate_lib.generate_texts, []

    def tight_memory(model, processor, texts, images, *args, inputs=None, **kwargs):
        sizes.append(inputs["input_ids"].shape[0])
        if sizes[-1] > 2:  # the card fits 2 at a time
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, processor, texts, images, *args, inputs=inputs, **kwargs)

    monkeypatch.setattr(evaluate_lib, "generate_texts", tight_memory)
    report = evaluate_lib.evaluate_dataset(model, processor, dataset, batch_size=6, max_new_tokens=6, progress=False)
    assert sizes == [6, 3, 2, 2, 2]  # 6 rows: 6 fails, 3 fails, then the set runs in batches of 2
    assert [r["completion"] for r in report.records] == [r["completion"] for r in reference.records]
    assert "out of GPU memory at batch 6" in caplog.text


@pytest.mark.parametrize("batch_size", [1, 4])
def test_prefetching_evaluation_gives_the_same_records(tiny_model_dir, scene_data_dir, batch_size):
    """The next batch built in a thread while this one generates: the same inputs, so the same completions."""
    from open_r1.modeling import load_model, load_processor
    from open_r1.tasks.counting import evaluate as evaluate_lib
    from open_r1.tasks.counting.data import load_counting_dataset

    model = load_model(str(tiny_model_dir), dtype="float32").eval()
    processor = load_processor(str(tiny_model_dir), None, 12544)
    dataset = load_counting_dataset(os.path.join(scene_data_dir, "val"))
    kwargs = dict(batch_size=batch_size, limit=6, max_new_tokens=6, progress=False)
    serial = evaluate_lib.evaluate_dataset(model, processor, dataset, prefetch=False, **kwargs)
    ahead = evaluate_lib.evaluate_dataset(model, processor, dataset, prefetch=True, **kwargs)
    assert [r["completion"] for r in ahead.records] == [r["completion"] for r in serial.records]
    assert [r["index"] for r in ahead.records] == list(range(6))


def _mixed_counting_dataset(scene_data_dir):
    """val (480x320, one question) + ood_val (640x480, a longer question) + three odd-sized random images with a
    third, longest question: sorted by question length, batches hold several prompt lengths (left padding) and
    image sizes (different patch counts) at once."""
    import datasets

    from open_r1.tasks.counting.data import load_counting_dataset

    columns = ["image", "problem", "solution"]
    parts = [
        load_counting_dataset(os.path.join(scene_data_dir, split)).select_columns(columns)
        for split in ("val", "ood_val")
    ]
    rng = np.random.default_rng(1)
    odd = [
        PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        for h, w in ((150, 90), (60, 200), (97, 131))
    ]
    extra = datasets.Dataset.from_dict(
        {
            "image": odd,
            "problem": ["How many objects can you count in this picture, all of them together?"] * 3,
            "solution": ["<answer> 3 </answer>"] * 3,
        },
        features=parts[0].features,
    )
    return datasets.concatenate_datasets([*parts, extra])


@pytest.mark.parametrize("batch_size", [5, 8])
def test_prefetched_evaluation_gets_the_same_model_inputs_and_times_every_batch(
    tiny_model_dir, scene_data_dir, monkeypatch, batch_size
):
    """Images of several sizes and mixed prompt lengths: what reaches generate_texts, batch by batch, and the records
    are identical with and without prefetch; `timings` gets one entry per batch (the bench's per-batch split)."""
    from open_r1.modeling import load_model, load_processor
    from open_r1.tasks.counting import evaluate as evaluate_lib

    model = load_model(str(tiny_model_dir), dtype="float32").eval()
    processor = load_processor(str(tiny_model_dir), None, 12544)
    dataset = _mixed_counting_dataset(scene_data_dir)
    real = evaluate_lib.generate_texts
    runs = {}

    def recording(batches):  # generate_texts that keeps a copy of every batch's inputs
        def spy(model, processor, texts, images, *args, inputs=None, **kwargs):
            batches.append({key: value.clone() for key, value in inputs.items()})
            return real(model, processor, texts, images, *args, inputs=inputs, **kwargs)

        return spy

    for prefetch in (False, True):
        batches = []
        monkeypatch.setattr(evaluate_lib, "generate_texts", recording(batches))
        timings = []
        report = evaluate_lib.evaluate_dataset(
            model,
            processor,
            dataset,
            batch_size=batch_size,
            max_new_tokens=6,
            progress=False,
            prefetch=prefetch,
            timings=timings,
        )
        runs[prefetch] = (report, batches, timings)
    (serial, serial_batches, _), (ahead, ahead_batches, _) = runs[False], runs[True]
    n_batches = -(-len(dataset) // batch_size)
    assert len(serial_batches) == len(ahead_batches) == n_batches
    assert ahead.records == serial.records
    assert [r["index"] for r in serial.records] == list(range(len(dataset)))
    for got, expected in zip(ahead_batches, serial_batches):
        assert set(got) == set(expected)
        for key in got:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key
    # a batch held several image sizes and several prompt lengths
    assert any(
        len(set(b["image_grid_thw"][:, 1:].prod(-1).tolist())) > 1 and bool((b["attention_mask"] == 0).any())
        for b in serial_batches
    )
    for prefetch, (_, batches, timings) in runs.items():
        assert [t["rows"] for t in timings] == [len(b["input_ids"]) for b in batches]
        assert [t["built"] for t in timings] == ["here"] + ["ahead" if prefetch else "here"] * (n_batches - 1)
        assert all(t["wait_s"] >= 0 and t["generate_s"] > 0 and t["post_s"] >= 0 for t in timings)


def test_noisy_positions_take_the_tail_of_every_group():
    assert trainer_lib.noisy_positions(8, 4, 0.5) == [2, 3, 6, 7]
    assert trainer_lib.noisy_positions(8, 4, 0.25) == [3, 7]
    assert trainer_lib.noisy_positions(8, 4, 0.0) == []


def test_image_noise_is_seeded_bounded_and_changes_pixels():
    image = PILImage.fromarray(np.full((10, 12, 3), 128, dtype=np.uint8))
    a, b = (trainer_lib.add_image_noise(image, 0.1, seed=7) for _ in range(2))
    pixels = np.asarray(a).astype(int)
    assert np.array_equal(pixels, np.asarray(b)) and a.size == image.size
    assert 0 < np.abs(pixels - 128).mean() < 0.2 * 255  # about std 0.1 x 255 x sqrt(2/pi) ~ 20
    assert not np.array_equal(np.asarray(trainer_lib.add_image_noise(image, 0.1, seed=8)), pixels)


def test_noisy_rollouts_distort_half_of_each_group_in_training_only(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    trainer = _trainer(
        tiny_model_dir,
        scene_data_dir,
        tmp_path,
        monkeypatch,
        "--num_generations",
        "4",
        "--noisy_rollouts",
        "0.5",
        "--noise_std",
        "0.2",
    )
    noised, real = [], trainer_lib.add_image_noise

    def spy(image, std, seed):
        noised.append((image.size, std))
        return real(image, std, seed)

    monkeypatch.setattr(trainer_lib, "add_image_noise", spy)
    trainer.train()
    assert len(noised) == 2 and {std for _, std in noised} == {0.2}  # 4 rows = one group of 4: its last 2
    trainer.model.eval()
    rows = [dict(trainer.train_dataset[i]) for i in range(4)]
    trainer._generate_and_score_completions(rows)
    assert len(noised) == 2  # evaluation-mode rounds see clean images


def test_noisy_rollouts_out_of_range_is_one_clear_error(tiny_model_dir, scene_data_dir, tmp_path, capsys):
    assert grpo.cli(recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--noisy_rollouts", "1.5")) == 2
    assert "noisy_rollouts must be a fraction" in capsys.readouterr().err


# Vision de-duplication ----------------------------------------------------------------------------------------------
def _vision_batch(processor, images):
    out = processor.image_processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def test_duplicate_map_finds_exact_copies_only(tiny_model_dir):
    from open_r1.modeling import load_processor

    processor = load_processor(str(tiny_model_dir), None, 12544)
    rng = np.random.default_rng(0)
    a, b = (PILImage.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)) for _ in range(2))
    almost_a = np.asarray(a).copy()
    almost_a[0, 0, 0] ^= 1  # one pixel differs by one level
    pixels, grid = _vision_batch(processor, [a, b, a, PILImage.fromarray(almost_a), b, a])
    assert vision_dedupe.duplicate_map(pixels, grid) == [0, 1, 0, 3, 1, 0]


def test_deduplicated_vision_tower_gives_the_same_features_and_gradients(tiny_model_dir):
    from open_r1.modeling import load_model, load_processor

    processor = load_processor(str(tiny_model_dir), None, 12544)
    rng = np.random.default_rng(1)
    images = [PILImage.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)) for _ in range(2)]
    pixels, grid = _vision_batch(processor, [images[0], images[1], images[0], images[0]])

    def features_and_grads(dedupe):
        model = load_model(str(tiny_model_dir), dtype="float32")
        if dedupe:
            assert vision_dedupe.enable_vision_dedupe(model)
        visual = families.vision_tower(model)
        calls = []
        visual.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
        features = model.model.get_image_features(pixels, grid).pooler_output
        features = torch.cat(features)
        weights = torch.linspace(-1, 1, features.numel()).reshape(features.shape)
        (features * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in visual.named_parameters() if p.grad is not None}
        return features.detach(), grads, calls

    plain, plain_grads, plain_calls = features_and_grads(False)
    deduped, dedupe_grads, _ = features_and_grads(True)
    torch.testing.assert_close(deduped, plain, rtol=1e-5, atol=1e-5)
    assert plain_grads.keys() == dedupe_grads.keys() and plain_grads
    for name in plain_grads:
        torch.testing.assert_close(dedupe_grads[name], plain_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_regroup_restores_generation_order_in_equal_micro_batches():
    grid = torch.tensor([[1, 2, 2]] * 4)
    rows = torch.arange(4)
    batch = {
        "prompt_ids": rows[:, None].repeat(1, 3),
        "advantages": rows.float(),
        "num_items_in_batch": torch.tensor(12),
        "pixel_values": rows.repeat_interleave(4)[:, None].float().repeat(1, 5),
        "image_grid_thw": grid,
        "num_images": [1, 1, 1, 1],
        trainer_lib.ROW_ID: rows,
    }
    shuffled = [2, 0, 3, 1]
    from trl.trainer.utils import (
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )

    parts = split_pixel_values_by_grid(batch)
    parts = {
        k: (
            v[shuffled]
            if isinstance(v, torch.Tensor) and v.ndim
            else [v[i] for i in shuffled]
            if isinstance(v, list)
            else v
        )
        for k, v in parts.items()
    }
    micro = [unsplit_pixel_values_by_grid(c) for c in split_tensor_dict(parts, 2)]
    regrouped = trainer_lib.regroup_micro_batches(micro)
    assert [m["prompt_ids"][:, 0].tolist() for m in regrouped] == [[0, 1], [2, 3]]
    assert [m["pixel_values"][:, 0].tolist() for m in regrouped] == [[0.0] * 4 + [1.0] * 4, [2.0] * 4 + [3.0] * 4]
    assert all(trainer_lib.ROW_ID not in m and int(m["num_items_in_batch"]) == 12 for m in regrouped)


def test_dedupe_vision_trains_whole_groups_per_micro_batch_with_the_same_update(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """G=2, micro-batches of 2, 4 micro-batches per step. With regrouping the micro-batches are exactly the round's
    rows in generation order (every key), every training forward sees one distinct image, and the step's update
    (plain SGD: the update is the gradient) matches TRL's shuffled micro-batches. Both runs de-duplicate, so their
    rollouts are the same samples; "matches" is within 1 % of the largest update entry, because TRL's own update moves
    by ~0.1 % when only the micro-batch order changes (float summation order)."""
    geometry = [
        "--num_generations",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--gradient_accumulation_steps",
        "4",
        "--optim",
        "sgd",
        "--learning_rate",
        "1.0",
        "--max_grad_norm",
        "0",
        "--lr_scheduler_type",
        "constant",
    ]
    from open_r1 import vision_dedupe

    real = vision_dedupe.duplicate_map

    def one_step(regroup):
        trainer = _trainer(
            tiny_model_dir, scene_data_dir, tmp_path / str(regroup), monkeypatch, *geometry, "--dedupe_vision", "true"
        )
        assert trainer.regroup_rounds  # this geometry and loss allow it
        trainer.regroup_rounds = regroup
        rounds, micro_batches = [], []
        generate, prepare = trainer._generate_and_score_completions, trainer._prepare_inputs
        trainer._generate_and_score_completions = lambda rows: rounds.append(generate(rows)) or rounds[-1]
        trainer._prepare_inputs = lambda batch: micro_batches.append(prepare(batch)) or micro_batches[-1]
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        distinct = []
        monkeypatch.setattr(
            vision_dedupe, "duplicate_map", lambda *a: distinct.append(len(set(mapping := real(*a)))) or mapping
        )
        trainer.train()
        visual = families.vision_tower(trainer.model)
        counts.append((visual.images_seen, visual.images_encoded))
        return {n: p.detach() - before[n] for n, p in trainer.model.named_parameters()}, distinct, rounds, micro_batches

    counts = []
    shuffled, _, _, _ = one_step(False)
    regrouped, distinct, rounds, micro_batches = one_step(True)
    assert counts[1] == (16, 8)  # the counters the bench reports: 8 prefill + 4 x 2 training rows, 4 + 4 x 1 encoded
    (round_,) = rounds
    for key in ("prompt_ids", "completion_ids", "advantages", "pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert torch.equal(torch.cat([m[key] for m in micro_batches]), round_[key]), key
    # the generation prefill encodes 8 rows = 4 prompts; each of the 4 training forwards holds one whole group
    assert distinct == [4, 1, 1, 1, 1]
    scale = max(float(delta.abs().max()) for delta in shuffled.values())
    assert scale > 0
    for name, delta in shuffled.items():
        torch.testing.assert_close(regrouped[name], delta, rtol=0, atol=0.01 * scale, msg=name)


def test_rollouts_never_sample_what_the_model_suppresses(scene_data_dir, tmp_path, monkeypatch):
    """TRL's rollout config sets suppress_tokens to the image token, hiding the model's own list (a stand-in
    policy's: the ids no text encodes to, ~98 % of the vocabulary, which its near-uniform random head would mostly
    sample)."""
    from transformers import AutoConfig, GenerationConfig

    from open_r1 import rewards
    from open_r1.tiny_models import build_tiny

    tiny_model_dir = build_tiny("qwen2_vl", tmp_path / "policy", suppress_unused=True)
    suppressed = set(GenerationConfig.from_pretrained(tiny_model_dir).suppress_tokens)
    assert len(suppressed) > 100_000
    sampled = []

    def record(completions, completion_ids, **kwargs):
        sampled.extend(int(t) for ids in completion_ids for t in ids)
        return [float(i) for i in range(len(completions))]

    record.__name__ = "record"
    monkeypatch.setattr(rewards, "get_reward_funcs", lambda names, kwargs=None: [record])
    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--fast_decode", "hf")
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    image_token = AutoConfig.from_pretrained(tiny_model_dir).image_token_id
    assert set(trainer.generation_config.suppress_tokens) == suppressed | {image_token}  # TRL's and the model's
    trainer.train()
    assert len(sampled) >= 8 and not suppressed & set(sampled)


def test_zero3_rollouts_decode_from_a_copy_refreshed_once_per_optimizer_step(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """Under ZeRO-3 (simulated: DeepSpeed cannot run on a CPU) the decoder reads the whole-weight copy of the LoRA
    policy: one gather per optimizer step, the copy's tensors at the same addresses every round, its forward equal
    to the merged policy's, the refresh cost in the logged metrics."""
    import contextlib
    import copy

    from open_r1 import rollout_weights
    from open_r1.decoding import GraphDecoder

    gathers = []

    def counting_gather(params):
        gathers.append(len(params))
        return contextlib.nullcontext()

    monkeypatch.setattr(rollout_weights, "deepspeed_gather", counting_gather)
    seen = []
    original = GraphDecoder.generate

    def spy(self, *args, **kwargs):
        seen.append((self.model, [p.data_ptr() for p in self.model.parameters()]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GraphDecoder, "generate", spy)
    trainer = _trainer(
        tiny_model_dir,
        scene_data_dir,
        tmp_path,
        monkeypatch,
        "--fast_decode",
        "eager",
        "--use_peft",
        "true",
        "--lora_r",
        "4",
        "--lora_alpha",
        "8",
        "--max_steps",
        "3",
    )

    class Plugin:
        zero_stage = 3

    with monkeypatch.context() as patch:  # what accelerate's DeepSpeed state shows under ZeRO-3
        patch.setattr(type(trainer.accelerator.state), "deepspeed_plugin", Plugin(), raising=False)
        assert trainer_lib.uses_zero3(trainer)
        assert trainer_lib.resolve_fast_decode(True, trainer) == "eager"  # accepted: no longer refused
    trainer.copy_for_rollouts = True  # what __init__ sets under ZeRO-3
    trainer.train()
    weights = trainer.rollout_weights
    assert len(seen) == 3 and all(model is weights.model for model, _ in seen)
    assert all(ptrs == seen[0][1] for _, ptrs in seen)  # refreshed in place: the captured graph's addresses hold
    assert weights.refreshes == 3 and len(gathers) == 3  # rounds at steps 0, 1, 2: one gather each
    assert any("rollout_copy/refresh_s" in row for row in trainer.state.log_history)
    assert weights.refresh(trainer.state.global_step) and len(gathers) == 4
    assert not weights.refresh(trainer.state.global_step) and len(gathers) == 4
    # the copy holds the policy's weights with LoRA merged (its forward: tests/test_rollout_weights.py; the policy's
    # own forward here runs under accelerate's autocast, the copy's does not)
    merged = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).merge_and_unload().state_dict()
    copied = weights.model.state_dict()
    assert set(copied) == set(merged)
    for name, value in copied.items():
        torch.testing.assert_close(value, merged[name], msg=name)


def test_zero3_auto_falls_back_to_hf_generate_when_the_rollout_copy_cannot_be_built(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, caplog
):
    """fast_decode 'auto' under ZeRO-3 takes HF generate (TRL's gathered weights) when the rollout copy fails to build,
    with one line saying why; an explicit fast_decode still fails."""
    caplog.set_level(logging.INFO, logger="open_r1")
    from open_r1 import rollout_weights
    from open_r1.decoding import GraphDecoder
    from open_r1.errors import RecipeError

    def broken_copy(*args, **kwargs):
        raise RecipeError("the rollout copy came out partitioned by DeepSpeed ZeRO-3")

    monkeypatch.setattr(rollout_weights, "RolloutWeights", broken_copy)
    decoded = []
    monkeypatch.setattr(GraphDecoder, "generate", lambda self, *a, **k: decoded.append(1))
    trainer = _trainer(
        tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, "--fast_decode", "eager", "--max_steps", "1"
    )
    trainer.copy_for_rollouts, trainer.args.ds3_gather_for_generation = True, False  # what __init__ sets under ZeRO-3
    with pytest.raises(RecipeError, match="partitioned"):
        trainer.rollout_generator()  # asked for explicitly: the error stands
    trainer.fast_decode_asked = "auto"
    trainer.train()
    assert not decoded and not trainer.copy_for_rollouts and trainer.fast_decode is None
    assert trainer.args.ds3_gather_for_generation
    assert "fast_decode auto: HF generate for the rollouts (the rollout copy came out partitioned" in caplog.text


def test_gpu_memory_cap_env_is_checked_and_capped(monkeypatch):
    from experiments.bench import capped_grpo as grpo  # the cap is a bench hook: train.sh runs this entry with it

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 80 * 2**30}))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    assert grpo.apply_memory_cap({}) is None and calls == []
    with pytest.raises(grpo.RecipeError, match="GPU_MEMORY_CAP_GIB='lots' is not a positive number"):
        grpo.apply_memory_cap({"GPU_MEMORY_CAP_GIB": "lots"})
    with pytest.raises(grpo.RecipeError, match="GPU_MEMORY_CAP_GIB='-4' is not a positive number"):
        grpo.apply_memory_cap({"GPU_MEMORY_CAP_GIB": "-4"})
    with pytest.raises(grpo.RecipeError, match="GPU_MEMORY_CAP_GIB='inf' is not a positive number"):
        grpo.apply_memory_cap({"GPU_MEMORY_CAP_GIB": "inf"})
    assert grpo.apply_memory_cap({"GPU_MEMORY_CAP_GIB": "48", "LOCAL_RANK": "1"}) == 48
    assert calls == [(0.6, 1)]


def test_under_zero3_the_trainer_hooks_each_block_not_the_vision_tower(
    tiny_model_dir, scene_data_dir, tmp_path, monkeypatch
):
    """Under ZeRO-3 (simulated: DeepSpeed cannot run on a CPU) the trainer marks each decoder layer and vision block as
    a DeepSpeed leaf, before deepspeed.initialize; never the vision tower, whose gradients DeepSpeed would drop."""
    import importlib.machinery
    import sys
    import types

    from open_r1 import families

    marked = []

    def mark(model, classes):
        marked.append((model, classes))

    try:  # where DeepSpeed is installed (.[gpu]), accelerate imports more of it than a stand-in would hold
        import deepspeed.utils

        monkeypatch.setattr(deepspeed.utils, "set_z3_leaf_modules", mark)
    except ImportError:
        fake = types.ModuleType("deepspeed")
        fake.__spec__ = importlib.machinery.ModuleSpec("deepspeed", None)
        fake.utils = types.SimpleNamespace(set_z3_leaf_modules=mark)
        monkeypatch.setitem(sys.modules, "deepspeed", fake)
    monkeypatch.setattr(trainer_lib, "uses_zero3", lambda trainer: True)
    trainer = _trainer(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, "--fast_decode", "hf")
    ((model, classes),) = marked
    assert model is trainer.model
    assert sorted(c.__name__ for c in classes) == ["Qwen2VLDecoderLayer", "Qwen2VLVisionBlock"]
    assert not isinstance(families.vision_tower(model), tuple(classes))
    monkeypatch.setattr(trainer_lib, "uses_zero3", lambda trainer: False)
    _trainer(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, "--fast_decode", "hf")
    assert len(marked) == 1  # DDP: nothing marked
