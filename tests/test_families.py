"""The three model families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) through one engine, on tiny models built here.

Each test is parametrised over `family` (tests/conftest.py); each family's tiny checkpoint is built once per session.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from open_r1 import families, grpo, modeling, vision_dedupe
from open_r1 import trainer as trainer_lib
from open_r1.errors import ModelError
from open_r1.submission import export as export_lib
from tests.test_grpo import FAST_RECIPE, use_varied_reward

EXPECTED = {  # family -> (class, pixels per merged token, vision tokens of an MLP-side Linear the regex must take)
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", 28 * 28, "mlp.fc1"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", 28 * 28, "mlp.gate_proj"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", 32 * 32, "mlp.linear_fc1"),
}
SMALL_PIXELS = 12544  # ~12-16 merged tokens per image: fast on CPU


def _images(n: int, seed: int = 0, size=(64, 96)):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)) for _ in range(n)]


def _processor(model_dir, family):
    minimum = modeling.pixels_for_tokens(family, 4)
    return modeling.load_processor(str(model_dir), minimum, SMALL_PIXELS)


# ---- the family table -------------------------------------------------------------------------------------------
def test_family_records_and_loading(family, family_model_dir):
    class_name, pixels_per_token, _ = EXPECTED[family]
    record = families.FAMILIES[family]
    assert record.class_name == class_name and record.pixels_per_token == pixels_per_token
    model = modeling.load_model(str(family_model_dir), dtype="float32")
    assert type(model).__name__ == class_name
    assert families.family_of(model) is record and modeling.family_of_dir(str(family_model_dir)) is record
    # the budget follows the family's patch x merge geometry: 4 .. 512 merged tokens
    assert modeling.default_pixel_budget(family) == (4 * pixels_per_token, 512 * pixels_per_token)
    assert families.vision_tower(model) is model.model.visual
    processor = _processor(family_model_dir, family)
    image_processor = processor.image_processor
    assert (image_processor.patch_size * image_processor.merge_size) ** 2 == pixels_per_token
    grid = image_processor(images=_images(1), return_tensors="pt")["image_grid_thw"]
    assert int(grid.prod()) // image_processor.merge_size**2 <= SMALL_PIXELS // pixels_per_token


def test_lora_targets_match_the_real_module_names(family, family_model_dir):
    """Every Linear of the ViT blocks (attention and MLP) is a vision target, no language-model module is; the
    language regex takes every attention/MLP projection of the decoder and nothing in the ViT."""
    model = modeling.load_model(str(family_model_dir), dtype="float32")
    record = families.FAMILIES[family]
    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    block_linears = [n for n in linears if re.search(r"visual\.blocks\.\d+\.", n)]
    vision = [n for n in linears if re.fullmatch(record.vision_lora_targets, n)]
    language = [n for n in linears if re.fullmatch(record.language_lora_targets, n)]
    assert vision == block_linears and any(n.endswith(EXPECTED[family][2]) for n in vision)
    assert language and not any("visual" in n for n in language)
    decoder = [n for n in linears if "language_model" in n]
    assert language == decoder  # q/k/v/o and gate/up/down of every layer
    both = [n for n in linears if re.fullmatch(record.lora_targets(vision=True), n)]
    assert both == sorted(set(vision + language), key=linears.index)


def test_unknown_model_type_names_the_supported_families(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "architectures": ["Llava"]}))
    with pytest.raises(ModelError, match="llava") as info:
        modeling.load_model(str(tmp_path))
    for record in families.FAMILIES.values():
        assert record.model_type in str(info.value) and record.class_name in str(info.value)


# ---- one GRPO step -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["full", "lora", "lora_vision"])
def test_one_grpo_step_changes_every_trainable_parameter(
    family, family_model_dir, scene_data_dir, tmp_path, monkeypatch, mode
):
    use_varied_reward(monkeypatch)
    extra = []
    if mode != "full":  # LoRA's B starts at zero, so A gets no gradient on the first step: two steps move both
        extra = [
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--max_steps",
            "2",
            "--lora_vision",
            str(mode == "lora_vision").lower(),
        ]
    args = [
        "--model_name_or_path",
        str(family_model_dir),
        "--dataset_name",
        os.path.join(scene_data_dir, "train"),
        "--output_dir",
        str(tmp_path / "run"),
        *FAST_RECIPE,
        *extra,
    ]
    script_args, training_args, model_args, task = grpo.parse_args(args)
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    assert trainer.dedupe_vision  # the recipe default: the de-duplicating tower trains too
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    if mode == "full":
        assert len(before) == len(list(trainer.model.parameters()))
    else:
        assert before and all("lora_" in n for n in before)
        on_vision = [n for n in before if ".visual." in n]
        assert bool(on_vision) == (mode == "lora_vision")
        if mode == "lora_vision":  # the family's MLP names are taken (e.g. Qwen3-VL's linear_fc1)
            assert any(EXPECTED[family][2] in n for n in on_vision)
    trainer.train()
    assert any("loss" in entry for entry in trainer.state.log_history)
    unchanged = [n for n, p in trainer.model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not change: {unchanged[:5]}"


# ---- ViT de-duplication --------------------------------------------------------------------------------------------
def test_deduplicated_vision_gives_the_same_loss_and_gradients(family, family_model_dir):
    """A full forward (images, text, loss) with repeated images: the de-duplicated tower encodes each distinct image
    once and gives the same loss and the same gradient on every parameter, the ViT's and (Qwen3-VL) the deepstack
    mergers' included."""
    processor = _processor(family_model_dir, family)
    distinct = _images(2, seed=1)
    images = [distinct[0], distinct[1], distinct[0], distinct[0]]
    texts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"How many? {i}"}]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        + "<answer> 3 </answer>"
        for i in range(len(images))
    ]
    batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)

    def loss_and_grads(dedupe):
        model = modeling.load_model(str(family_model_dir), dtype="float32")
        model.train()
        if dedupe:
            assert vision_dedupe.enable_vision_dedupe(model)
        visual = families.vision_tower(model)
        deepstack = []
        if families.FAMILIES[family].has_deepstack:
            visual.register_forward_hook(lambda m, a, out: deepstack.append(len(out.deepstack_features)))
        loss = model(**batch, labels=labels).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), grads, visual, deepstack

    plain_loss, plain_grads, _, plain_deepstack = loss_and_grads(False)
    loss, grads, visual, deepstack = loss_and_grads(True)
    assert (visual.images_seen, visual.images_encoded) == (4, 2)  # the copies really were skipped
    if families.FAMILIES[family].has_deepstack:
        assert deepstack == plain_deepstack == [len(visual.deepstack_visual_indexes)] and deepstack[0] >= 1
        assert any("deepstack_merger_list" in n for n in grads)
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == plain_grads.keys() and any(".visual.blocks." in n for n in grads)
    for name in plain_grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.filterwarnings("ignore:For backward hooks to be called")  # the vision tower's, on purpose
def test_zero3_blocks_are_the_layers_whose_full_backward_hooks_fire(family, family_model_dir):
    """Under ZeRO-3 the trainer hooks each decoder layer and vision block as one module (`zero3_block_classes`), and
    DeepSpeed reduces such a leaf's gradients from its full backward hook: with the recipe's checkpointing and
    de-duplicated ViT, every block's hook fires. The vision tower's does not (it returns a ModelOutput), which is
    why the tower itself must never be one: its gradients would be lost."""
    processor = _processor(family_model_dir, family)
    images = _images(2, seed=2) * 2
    texts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        + "<answer> 3 </answer>"
    ] * len(images)
    batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
    model = modeling.load_model(str(family_model_dir), dtype="float32")
    model.gradient_checkpointing_enable()
    model.train()
    assert vision_dedupe.enable_vision_dedupe(model)
    classes = trainer_lib.zero3_block_classes(model)
    assert sorted(c.__name__.endswith("DecoderLayer") + 2 * c.__name__.endswith("VisionBlock") for c in classes) == [
        1,
        2,
    ]
    fired = set()
    blocks = [m for m in model.modules() if isinstance(m, tuple(classes))]
    for module in [*blocks, families.vision_tower(model)]:
        module.register_full_backward_hook(lambda m, grad_in, grad_out: fired.add(id(m)))
    model(**batch, labels=batch["input_ids"]).loss.backward()
    assert len(blocks) >= 2 and all(id(m) in fired for m in blocks)
    assert id(families.vision_tower(model)) not in fired


def test_dedupe_with_all_distinct_images_runs_the_plain_tower(family, family_model_dir):
    processor = _processor(family_model_dir, family)
    out = processor.image_processor(images=_images(3, seed=2), return_tensors="pt")
    model = modeling.load_model(str(family_model_dir), dtype="float32")
    plain = model.model.get_image_features(out["pixel_values"], out["image_grid_thw"]).pooler_output
    vision_dedupe.enable_vision_dedupe(model)
    deduped = model.model.get_image_features(out["pixel_values"], out["image_grid_thw"]).pooler_output
    visual = families.vision_tower(model)
    assert (visual.images_seen, visual.images_encoded) == (3, 3)
    for a, b in zip(deduped, plain):
        torch.testing.assert_close(a, b)


# ---- export and --verify -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported_dirs(tiny_model_dirs, tmp_path_factory):
    """family -> the tiny model exported as a model of its own family (built on first use)."""

    class Exported(dict):
        def __missing__(self, family):
            out = tmp_path_factory.mktemp(f"export_{family}") / "submission"
            source = tiny_model_dirs[family]
            report = export_lib.export_submission(
                str(source),
                str(out),
                min_pixels=modeling.pixels_for_tokens(family, 4),
                max_pixels=SMALL_PIXELS,
                expected_class=None,
            )
            assert report.ok and report.loaded_class == EXPECTED[family][0], report.problems
            self[family] = out
            return out

    return Exported()


def _greedy(model_dir, family, tokens=10):
    from open_r1.tasks import Task
    from open_r1.tasks.counting.evaluate import generate_batch

    model = modeling.load_model(str(model_dir), dtype="float32").eval()
    processor = _processor(model_dir, family)
    texts, _, _ = generate_batch(
        model, processor, [Task().probe_image()], ["How many items are there?"], max_new_tokens=tokens
    )
    return texts[0]


def test_export_round_trip_gives_the_same_greedy_output(family, family_model_dir, exported_dirs):
    out = exported_dirs[family]
    assert not any(p.name.startswith(".") for p in out.parent.iterdir())  # no staging left
    assert json.loads((out / "config.json").read_text())["architectures"] == [EXPECTED[family][0]]
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    assert preprocessor["processor_class"] == families.FAMILIES[family].processor_class
    assert preprocessor["max_pixels"] == SMALL_PIXELS  # the training budget travels along
    expected = _greedy(family_model_dir, family)
    assert expected  # the tiny random model does produce text
    assert _greedy(out, family) == expected


def test_verify_passes_for_each_family_and_the_counting_check_names_the_grader_class(family, exported_dirs, capsys):
    import selfcheck

    out = str(exported_dirs[family])
    assert selfcheck.main(["--verify", "--any-family", "--model", out]) == 0
    printed = capsys.readouterr().out
    assert f"loads as {EXPECTED[family][0]}" in printed
    code = selfcheck.main(["--verify", "--model", out])  # the counting submission's check
    captured = capsys.readouterr()
    if family == "qwen2_vl":
        assert code == 0 and "loads as Qwen2VLForConditionalGeneration (the class the counting grader loads)" in (
            captured.out
        )
    else:
        assert code == 1
        assert "the counting grader loads Qwen2VLForConditionalGeneration" in captured.err
        assert families.FAMILIES[family].class_name in captured.err and "--any-family" in captured.err


@pytest.mark.parametrize("other", ["qwen2_5_vl", "qwen3_vl"])  # Qwen2-VL is the counting grader's own class
def test_counting_export_of_another_family_is_refused_before_it_replaces_anything(tiny_model_dirs, other, tmp_path):
    out = tmp_path / "submission"
    with pytest.raises(export_lib.ExportError, match="Qwen2VLForConditionalGeneration"):
        export_lib.export_submission(str(tiny_model_dirs[other]), str(out), verify=False)
    assert not out.exists()
