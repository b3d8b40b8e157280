"""Export (merge + atomic write + verify) and selfcheck on the tiny Qwen2-VL."""

import json
import os
import shutil

import pytest
import torch

from open_r1.modeling import load_model, load_processor
from open_r1.submission import export as export_lib
from open_r1.tasks import Task
from open_r1.tasks.counting.evaluate import evaluate_dataset
from open_r1.tasks.counting.protocol import EVAL_TEMPLATE


def greedy(model, processor, image, question="How many items are there in the image?", tokens=12):
    from open_r1.tasks.counting.evaluate import generate_batch

    texts, _, _ = generate_batch(model, processor, [image], [question], EVAL_TEMPLATE, tokens)
    return texts[0]


def probe_image():
    return Task().probe_image()  # the engine's default probe image


def make_lora_checkpoint(tiny_model_dir, out):
    """A LoRA adapter with non-zero weights (as after training) saved like the trainer saves it."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), dtype="float32")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(out)
    processor = load_processor(str(tiny_model_dir), max_pixels=12544)
    processor.save_pretrained(out)
    with open(os.path.join(out, "training_meta.json"), "w") as handle:
        json.dump(
            {"base_model": str(tiny_model_dir), "use_peft": True, "min_pixels": 3136, "max_pixels": 12544}, handle
        )
    return peft_model.merge_and_unload(), processor


def test_lora_export_roundtrip_matches_in_memory_merge(tiny_model_dir, tmp_path):
    checkpoint = tmp_path / "run"
    merged, processor = make_lora_checkpoint(tiny_model_dir, str(checkpoint))
    expected = greedy(merged.eval(), processor, probe_image())
    out = tmp_path / "submission"
    report = export_lib.export_submission(str(checkpoint), str(out))
    assert report.ok and report.path == str(out)
    assert not os.path.exists(out / "adapter_config.json")
    reloaded = load_model(str(out), dtype="float32").eval()
    reloaded_processor = load_processor(str(out))
    assert reloaded_processor.image_processor.size["longest_edge"] == 12544  # training budget travels along
    assert greedy(reloaded, reloaded_processor, probe_image()) == expected
    base = load_model(str(tiny_model_dir), dtype="float32").state_dict()
    merged_weights = reloaded.state_dict()
    q_proj = next(k for k in base if "language_model" in k and k.endswith("q_proj.weight"))
    assert not torch.equal(merged_weights[q_proj], base[q_proj]), "the merged LoRA delta is missing"


def test_export_keeps_previous_submission_and_leaves_no_temp(tiny_model_dir, tmp_path):
    out = tmp_path / "submission"
    export_lib.export_submission(str(tiny_model_dir), str(out))
    export_lib.export_submission(str(tiny_model_dir), str(out))
    siblings = sorted(p.name for p in tmp_path.iterdir())
    assert "submission" in siblings
    assert any(name.startswith("submission.prev-") for name in siblings)
    assert not any(".tmp-" in name for name in siblings)


def test_failed_verification_never_touches_the_submission(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "submission"
    export_lib.export_submission(str(tiny_model_dir), str(out))
    before = sorted(os.listdir(out))
    monkeypatch.setattr(
        export_lib,
        "verify_submission",
        lambda path, generate=True, **kwargs: export_lib.VerifyReport(path, problems=["boom"]),
    )
    with pytest.raises(export_lib.ExportError, match="boom"):
        export_lib.export_submission(str(tiny_model_dir), str(out))
    assert sorted(os.listdir(out)) == before
    assert [p.name for p in tmp_path.iterdir()] == ["submission"]


def test_scored_submission_hint_passes_the_set_paths_selfcheck_records(tiny_model_dir, tmp_path, capsys):
    """selfcheck records sets_paths as {name: path}: the printed command scores the candidate on those paths."""
    from tests.test_bad_input import fake_report

    out = tmp_path / "submission"
    export_lib.export_submission(str(tiny_model_dir), str(out), verify=False)
    fake_report(
        out / "selfcheck.json",
        out,
        {"val": 50.0, "ood_val": 50.0},
        sets_paths={"val": "/data/val", "ood_val": "/data/ood_val"},
    )
    capsys.readouterr()
    report = export_lib.export_submission(str(tiny_model_dir), str(out), verify=False)
    assert report.path != str(out)
    assert f"python selfcheck.py --model {report.path} --sets /data/val /data/ood_val" in capsys.readouterr().out


@pytest.fixture(scope="module")
def exported_once(tiny_model_dir, tmp_path_factory):
    """One export (merge + save + verify with a generation) of the tiny model for the whole module."""
    out = tmp_path_factory.mktemp("exported") / "submission"
    export_lib.export_submission(str(tiny_model_dir), str(out))
    return out


@pytest.fixture()
def exported(exported_once, tmp_path):
    """A private copy of the module's export: tests may damage it (delete files, rewrite the config)."""
    out = tmp_path / "submission"
    shutil.copytree(exported_once, out)
    return out


def test_verify_catches_missing_processor_file(exported):
    os.remove(exported / "preprocessor_config.json")
    report = export_lib.verify_submission(str(exported))
    assert not report.ok and any("preprocessor_config.json is missing" in p for p in report.problems)


def test_verify_catches_wrong_architecture(exported):
    config = json.loads((exported / "config.json").read_text())
    config.update(model_type="llava", architectures=["LlavaForConditionalGeneration"])
    (exported / "config.json").write_text(json.dumps(config))
    report = export_lib.verify_submission(str(exported))
    assert not report.ok and any(p.startswith("wrong architecture") for p in report.problems)


def test_verify_catches_truncated_weights(exported):
    weights = exported / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    report = export_lib.verify_submission(str(exported))
    assert not report.ok and any("truncated" in p for p in report.problems)


def test_verify_passes_a_good_export(exported):
    report = export_lib.verify_submission(str(exported))
    assert report.ok, report.problems
    assert isinstance(report.sample_completion, str)


def test_verify_generates_under_the_tasks_protocol(tiny_model_dirs, tmp_path, monkeypatch):
    import open_r1.generation as generation_lib
    from open_r1.errors import RecipeError
    from open_r1.tasks import get_task
    from open_r1.tasks.captioning import protocol as caption_protocol
    from open_r1.tasks.counting import protocol as counting_protocol

    qwen3 = str(tmp_path / "qwen3")  # saved as the export saves (both processor config layouts)
    source = str(tiny_model_dirs["qwen3_vl"])
    export_lib.modeling.save_model_dir(
        export_lib.modeling.load_model(source, dtype="float32"), export_lib.modeling.load_processor(source), qwen3
    )
    prompts = []
    real_prepare = generation_lib.prepare_inputs

    def recording_prepare(processor, prompt_texts, images, **kwargs):  # the probe's prompt as the model sees it
        prompts.append(list(prompt_texts)[0])
        return real_prepare(processor, prompt_texts, images, **kwargs)

    monkeypatch.setattr(generation_lib, "prepare_inputs", recording_prepare)
    counting = export_lib.verify_submission(qwen3, expected_class=None)
    captioning = export_lib.verify_submission(qwen3, expected_class=None, task="captioning")
    assert "How many items are there in the image?" in prompts[0]
    assert counting_protocol.EVAL_TEMPLATE.split("}")[-1].strip()[:40] in prompts[0]
    assert caption_protocol.SYSTEM_PROMPT in prompts[-1]
    # a random model follows neither format: a warning naming each task's parser, a problem when strict
    assert counting.ok and any("<answer>N</answer>" in w for w in counting.warnings)
    assert captioning.ok and any("no parseable caption" in w for w in captioning.warnings)
    strict = export_lib.verify_submission(qwen3, expected_class=None, task="captioning", strict_answer=True)
    assert not strict.ok and any("no parseable caption" in p for p in strict.problems)
    # the probe passes what the task's parser accepts
    good = "It is odd.</think>\n\n<caption>Who invited the blue cube?</caption>"
    monkeypatch.setattr(generation_lib, "generate_texts", lambda *a, **k: ([good], [12], [False]))
    processor = export_lib.modeling.load_processor(qwen3)
    assert get_task("captioning").probe(None, processor) == (good, None)
    # counting probes a rendered training-like scene: a trained model answered the synthetic image off-format
    from open_r1.tasks.counting import evaluate as counting_eval

    seen = []
    answer = (["<answer>3</answer>"], [5], [False])
    monkeypatch.setattr(counting_eval, "generate_batch", lambda model, proc, images, q: seen.extend(images) or answer)
    assert get_task("counting").probe(None, None) == ("<answer>3</answer>", None)
    assert seen[0].size == (480, 320) and seen[0].tobytes() != Task().probe_image().tobytes()
    loads = []
    monkeypatch.setattr(export_lib.modeling, "load_model", lambda *a, **k: loads.append(a))
    with pytest.raises(RecipeError, match="unknown task"):
        export_lib.verify_submission(qwen3, expected_class=None, task="poetry")
    assert loads == []  # refused before the model loads


def test_selfcheck_batched_equals_one_by_one(tiny_model_dir, scene_data_dir):
    from open_r1.tasks.counting.data import load_counting_dataset

    model = load_model(str(tiny_model_dir), dtype="float32").eval()
    processor = load_processor(str(tiny_model_dir), max_pixels=12544)
    dataset = load_counting_dataset(os.path.join(scene_data_dir, "ood_val"))
    batched = evaluate_dataset(model, processor, dataset, batch_size=4, limit=6, max_new_tokens=16, progress=False)
    single = evaluate_dataset(model, processor, dataset, batch_size=1, limit=6, max_new_tokens=16, progress=False)
    assert [r["completion"] for r in batched.records] == [r["completion"] for r in single.records]
    assert [r["index"] for r in batched.records] == list(range(6))

    # a diagnostic swaps template and parser (the demo's plain-question probe); the grader's stay the default
    from open_r1.tasks.counting import sft

    calls = []

    def spy(text):
        calls.append(text)
        return sft.plain_count(text)

    plain = evaluate_dataset(
        model,
        processor,
        dataset,
        batch_size=4,
        limit=6,
        max_new_tokens=16,
        progress=False,
        template=sft.PLAIN_PROMPT,
        extract=spy,
    )
    assert sorted(calls) == sorted(r["completion"] for r in plain.records)
    assert [r["prediction"] for r in plain.records] == [sft.plain_count(r["completion"]) for r in plain.records]


def test_selfcheck_cli_prints_table_and_json(exported, scene_data_dir, tmp_path, capsys):
    import selfcheck

    out = tmp_path / "report.json"
    sets = [os.path.join(scene_data_dir, "val"), os.path.join(scene_data_dir, "ood_val")]
    assert (
        selfcheck.main(["--model", str(exported), "--sets", *sets, "--limit", "3", "--out", str(out), "--quiet"]) == 0
    )
    printed = capsys.readouterr().out
    assert "| val | 3 |" in printed and "| ood_val | 3 |" in printed and "**mean**" in printed
    report = json.loads(out.read_text())
    assert set(report["sets"]) == {"val", "ood_val"}
    assert len(report["sets"]["val"]["records"]) == 3
    record = report["sets"]["val"]["records"][0]
    assert {"gold", "prediction", "correct", "completion", "completion_tokens", "truncated"} <= set(record)


def test_selfcheck_verify_flags(exported, capsys):
    import selfcheck

    assert selfcheck.main(["--verify", "--model", str(exported)]) == 0
    shutil.rmtree(exported)
    assert selfcheck.main(["--verify", "--model", str(exported)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_selfcheck_missing_set_is_one_clear_error(exported, tmp_path, capsys):
    import selfcheck

    assert selfcheck.main(["--model", str(exported), "--sets", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
