"""GRPO training on the tiny Qwen2-VL: every trainable parameter moves, batching is exact, bad recipes fail clearly."""

import os

import pytest
import torch

from open_r1 import grpo
from open_r1.modeling import load_model, load_processor

FAST_RECIPE = [
    "--num_generations",
    "2",
    "--per_device_train_batch_size",
    "4",
    "--max_completion_length",
    "8",
    "--max_steps",
    "1",
    "--learning_rate",
    "0.1",  # large, so a single step moves every parameter measurably
    "--beta",
    "0.0",
    "--logging_steps",
    "1",
    "--save_strategy",
    "no",
    "--report_to",
    "none",
    "--dtype",
    "float32",
    "--use_cpu",
    "true",
    "--max_pixels",
    "12544",
    "--max_train_samples",
    "8",
    "--seed",
    "0",
]


def recipe_args(tiny_model_dir, scene_data_dir, tmp_path, *extra):
    return [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_name",
        os.path.join(scene_data_dir, "train"),
        "--output_dir",
        str(tmp_path / "run"),
        *FAST_RECIPE,
        *extra,
    ]


def use_varied_reward(monkeypatch):
    """Rewards that differ within a group, so advantages are non-zero and every parameter gets a gradient."""
    import zlib

    from open_r1 import rewards
    from open_r1.tasks.counting.protocol import completion_text

    def varied(completions, **kwargs):  # distinct sampled texts get distinct rewards
        return [float(zlib.crc32(completion_text(c).encode()) % 97) for c in completions]

    varied.__name__ = "varied"
    monkeypatch.setattr(rewards, "get_reward_funcs", lambda names, kwargs=None: [varied])


@pytest.mark.parametrize("use_peft", [False, True], ids=["full", "lora"])
def test_one_step_changes_every_trainable_parameter(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch, use_peft):
    use_varied_reward(monkeypatch)
    # LoRA's B starts at zero, so A gets no gradient on the first step: LoRA needs two steps to move both.
    extra = ["--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--max_steps", "2"] if use_peft else []
    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, *extra)
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert before, "nothing is trainable"
    if use_peft:
        assert all("lora_" in n for n in before)
        assert not any("visual" in n for n in before), "LoRA must stay off the vision tower by default"
    trainer.train()
    assert any("loss" in entry for entry in trainer.state.log_history)
    unchanged = [n for n, p in trainer.model.named_parameters() if p.requires_grad and torch.equal(p, before[n])]
    assert not unchanged, f"parameters that did not change: {unchanged[:5]}"


def test_lora_vision_option_targets_the_vision_tower(tiny_model_dir, scene_data_dir, tmp_path):
    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--use_peft", "true", "--lora_vision", "true")
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("visual" in n for n in names) and any("language_model" in n for n in names)


def test_batched_logprobs_equal_single_sample_for_mixed_image_sizes(tiny_model_dir, scene_data_dir, tmp_path):
    """Per-device batch > 1 is exact: left-padded batches of different image sizes give each sample's log-probs."""
    import numpy as np
    from PIL import Image

    script_args, training_args, model_args, task = grpo.parse_args(
        recipe_args(tiny_model_dir, scene_data_dir, tmp_path)
    )
    trainer = grpo.build_trainer(script_args, training_args, model_args, task)
    processor = trainer.processing_class
    rng = np.random.default_rng(0)
    sizes = [(64, 96), (112, 56), (84, 140)]
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    questions = ["How many items are there in the image?", "How many red cubes are there?", "How many?"]
    completion = torch.tensor([[11, 12, 13, 14, 15]])

    def logps(batch_images, batch_questions):
        from open_r1.tasks.counting.protocol import build_messages

        texts = [
            processor.apply_chat_template(build_messages(q), tokenize=False, add_generation_prompt=True)
            for q in batch_questions
        ]
        inputs = processor(text=texts, images=batch_images, padding=True, return_tensors="pt")
        n = len(texts)
        input_ids = torch.cat([inputs["input_ids"], completion.repeat(n, 1)], dim=1)
        mask = torch.cat([inputs["attention_mask"], torch.ones(n, completion.shape[1], dtype=torch.long)], dim=1)
        mm_types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(n, completion.shape[1], dtype=torch.long)], 1)
        with torch.no_grad():
            out, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model,
                input_ids,
                mask,
                completion.shape[1],
                batch_size=n,
                pixel_values=inputs["pixel_values"],
                image_grid_thw=inputs["image_grid_thw"],
                num_images=[1] * n,
                mm_token_type_ids=mm_types,
            )
        return out

    batched = logps(images, questions)
    single = torch.cat([logps([img], [q]) for img, q in zip(images, questions)])
    assert len({i.size for i in images}) == 3
    torch.testing.assert_close(batched, single, rtol=1e-4, atol=1e-4)


def test_batch_not_divisible_by_group_size_is_one_clear_error(tiny_model_dir, scene_data_dir, tmp_path, capsys):
    code = grpo.cli(recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--num_generations", "3"))
    err = capsys.readouterr().err
    assert code == 2
    assert "num_generations (3)" in err and "counts completions, not prompts" in err and "Traceback" not in err


def test_unknown_reward_lists_valid_names(tiny_model_dir, scene_data_dir, tmp_path, capsys):
    code = grpo.cli(recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--reward_funcs", "exact_count", "acuracy"))
    err = capsys.readouterr().err
    assert code == 2 and "acuracy" in err and "exact_count" in err


def test_missing_model_dir_is_one_clear_error(scene_data_dir, tmp_path, capsys):
    code = grpo.cli(recipe_args(tmp_path / "no-model", scene_data_dir, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and "python -m open_r1.tiny_models" in err


def test_wrong_architecture_is_one_clear_error(scene_data_dir, tmp_path, capsys):
    wrong = tmp_path / "llama"
    wrong.mkdir()
    (wrong / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    code = grpo.cli(recipe_args(wrong, scene_data_dir, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and "model_type='llama'" in err and "Qwen2VLForConditionalGeneration" in err
    assert "tokenizer" not in err  # one problem for the model: its architecture, not the files beside it


def test_reward_weights_must_match_rewards(tiny_model_dir, scene_data_dir, tmp_path, capsys):
    code = grpo.cli(recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--reward_weights", "1.0", "0.5", "0.2"))
    assert code == 2 and "one weight per reward" in capsys.readouterr().err


def test_unknown_loss_type_is_one_clear_error_before_the_model_loads(
    tiny_model_dir, scene_data_dir, tmp_path, capsys, monkeypatch
):
    """TRL refuses a misspelt loss_type only inside its loss, after the model loaded and the first rollouts ran."""
    monkeypatch.setattr(grpo, "build_trainer", lambda *a, **k: pytest.fail("the model was loaded"))
    code = grpo.cli(recipe_args(tiny_model_dir, scene_data_dir, tmp_path, "--loss_type", "dapp"))
    err = capsys.readouterr().err
    assert code == 2 and "loss_type 'dapp' is not one of TRL's grpo, dr_grpo, dapo" in err and "Traceback" not in err


def test_processor_is_left_padded_with_recipe_pixel_budget(tiny_model_dir):
    processor = load_processor(str(tiny_model_dir), min_pixels=3136, max_pixels=12544)
    assert processor.tokenizer.padding_side == "left"
    assert processor.image_processor.size["longest_edge"] == 12544
    model = load_model(str(tiny_model_dir), dtype="float32")
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"


def test_one_run_builds_its_task_once_and_loads_each_set_once(tiny_model_dir, scene_data_dir, tmp_path, monkeypatch):
    """Parse and check once: the recipe's parse builds the task once (one get_task call) and grpo.main hands it down
    (validation, the run's callbacks, the trainer, training_meta.json); every set is read from disk once."""
    import collections

    import datasets

    from open_r1.tasks import get_task
    from open_r1.tasks.counting.task import CountingTask
    from open_r1.trainer import VLMGRPOTrainer

    built, loads = [], collections.Counter()
    real_init, real_load = CountingTask.__init__, datasets.load_from_disk
    monkeypatch.setattr(CountingTask, "__init__", lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(
        datasets,
        "load_from_disk",
        lambda path, *a, **k: loads.update([os.path.basename(path)]) or real_load(path, *a, **k),
    )
    monkeypatch.setattr(VLMGRPOTrainer, "train", lambda self, **kwargs: None)  # the counts, not the step
    looked_up = []
    monkeypatch.setattr(grpo, "get_task", lambda *a, **k: looked_up.append(a[0]) or get_task(*a, **k))
    eval_sets = [os.path.join(scene_data_dir, name) for name in ("ood_val", "val")]
    args = recipe_args(
        tiny_model_dir, scene_data_dir, tmp_path, "--eval_sets", *eval_sets, "--eval_steps_protocol", "1"
    )
    grpo.main(*grpo.parse_args(args))
    assert len(built) == 1 and looked_up == ["counting"]
    assert loads == {"train": 1, "ood_val": 1, "val": 1}


def test_counting_keys_are_the_counting_tasks_settings(tmp_path):
    """The engine's own keys are task-neutral: prompt_templates is parsed into the counting task's typed settings,
    which the task built once from the recipe holds (no copy onto the engine's arguments)."""
    import dataclasses

    from open_r1.tasks.counting import CountingSettings

    assert "prompt_templates" not in {f.name for f in dataclasses.fields(grpo.GRPOScriptArguments)}
    assert "prompt_templates" in {f.name for f in dataclasses.fields(CountingSettings)}
    assert "prompt_templates" in grpo.recipe_keys() and "--prompt_templates" in grpo.short_help()
    script_args, training_args, _, task = grpo.parse_args(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--prompt_templates", "eval:1", "--learning_rate", "0.5"]
    )
    assert isinstance(task.settings, CountingSettings) and not hasattr(script_args, "prompt_templates")
    assert task.settings.prompt_templates == ["eval:1"] and training_args.learning_rate == 0.5
    assert script_args.eval_primary is None and script_args.eval_secondary is None  # the task's, at build time


def test_the_captioning_eval_keys_its_task_reads_are_recipe_keys(tmp_path):
    """The captioning task's evaluation reads caption_eval_* from its settings: a recipe can set them."""
    _, _, _, task = grpo.parse_args(
        [
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "true",
            "--task",
            "captioning",
            "--caption_eval_samples",
            "4",
            "--caption_eval_temperature",
            "0.7",
            "--caption_eval_reward_model",
            "rm_dir",
        ]
    )
    settings = task.settings
    assert (settings.caption_eval_samples, settings.caption_eval_temperature) == (4, 0.7)
    assert settings.caption_eval_reward_model == "rm_dir" and settings.caption_eval_max_new_tokens is None
