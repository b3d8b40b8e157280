"""Bad input and faults, as a hostile user tries them (issue #15): every entry point answers one clear error naming
the fix (exit status 2, no traceback) or does the right thing, and no case loses or silently replaces a model.

Entry points run as subprocesses where `python -m` matters (an error class imported under two module names is
not caught); each test asserts the exit code, the message, and that the user's files are intact.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_GPU = torch.cuda.is_available()


# ---- helpers --------------------------------------------------------------------------------------------------------


def run(*argv, env=None, timeout=600):
    """A command from the repo root; returns (rc, stdout, stderr)."""
    result = subprocess.run(
        list(argv),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    return result.returncode, result.stdout, result.stderr


def py(*argv, **kwargs):
    return run(sys.executable, *argv, **kwargs)


def tree_digest(path) -> dict:
    """{relative path: sha256} of every file under path (to prove a model dir was not touched)."""
    digest = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as handle:
                digest[os.path.relpath(full, path)] = hashlib.sha256(handle.read()).hexdigest()
    return digest


def assert_clean_error(rc, err, *needles, code=2):
    assert rc == code, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err[-3000:]}"


def grpo_args(model, data, out, *extra):
    return [
        "-m",
        "open_r1.grpo",
        "--config",
        "configs/demo.yaml",
        "--model_name_or_path",
        str(model),
        "--dataset_name",
        str(data),
        "--output_dir",
        str(out),
        "--use_cpu",
        "true",
        *extra,
    ]


def fake_checkpoint(model_dir, path, step: int, optimizer=True, scheduler=True):
    """A checkpoint-N dir as the trainer writes it (weights of the tiny model, small state files)."""
    os.makedirs(path)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(model_dir, name), path)
    with open(os.path.join(path, "trainer_state.json"), "w") as handle:
        json.dump({"global_step": step, "max_steps": 4, "log_history": []}, handle)
    if optimizer:
        torch.save({"state": {}, "param_groups": []}, os.path.join(path, "optimizer.pt"))
    if scheduler:
        torch.save({"last_epoch": step}, os.path.join(path, "scheduler.pt"))
    torch.save({"python": 0}, os.path.join(path, "rng_state.pth"))
    return path


def fake_report(path, model_dir, accuracies: dict, n=4, sets_paths=None, protocol=True):
    from open_r1.tasks.counting.evaluate import SetReport, write_report

    reports = [
        SetReport(
            name=k, n=n, accuracy_pct=v, format_pct=100.0, mean_completion_tokens=20.0, truncated_pct=0.0, seconds=1.0
        )
        for k, v in accuracies.items()
    ]
    write_report(str(path), reports, str(model_dir), {"sets_paths": sets_paths} if sets_paths else None)
    if not protocol:
        data = json.loads(open(path).read())
        data.pop("protocol")
        with open(path, "w") as handle:
            json.dump(data, handle)
    return str(path)


# ---- fixtures (module scope: built once) ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    """The tiny model exported once as a submission (static verification only)."""
    from open_r1.submission.export import export_submission

    out = tmp_path_factory.mktemp("bad_input_export") / "model"
    export_submission(str(tiny_model_dir), str(out), verify=False)
    return out


@pytest.fixture(scope="module")
def broken_models(exported, tmp_path_factory):
    """Model dirs broken the ways users break them, each with the message it must produce."""
    root = tmp_path_factory.mktemp("broken_models")
    cases = {}

    def copy(name):
        path = root / name
        shutil.copytree(exported, path)
        return path

    path = copy("truncated")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    cases["truncated"] = (path, "truncated")

    path = copy("missing_shard")
    os.rename(path / "model.safetensors", path / "model-00001-of-00002.safetensors")
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    cases["missing_shard"] = (path, "model-00002-of-00002.safetensors named in the index is missing")

    path = copy("index_not_json")
    os.rename(path / "model.safetensors", path / "model-00001-of-00001.safetensors")
    (path / "model.safetensors.index.json").write_text("{not json")
    cases["index_not_json"] = (path, "model.safetensors.index.json is not")

    path = copy("no_tokenizer")
    os.remove(path / "tokenizer.json")
    cases["no_tokenizer"] = (path, "tokenizer file tokenizer.json is missing")

    path = copy("no_chat_template")
    for name in ("chat_template.jinja", "chat_template.json"):
        if (path / name).exists():
            os.remove(path / name)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    cases["no_chat_template"] = (path, "chat template is missing")

    path = root / "adapter"
    path.mkdir()
    (path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(exported), "peft_type": "LORA"})
    )
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    cases["adapter"] = (path, "merge it with python -m open_r1.submission.export")
    return cases


@pytest.fixture(scope="module")
def corrupt_data(scene_data_dir, tmp_path_factory):
    """A 14-row split (train + val) whose image at row 10 is garbage: past the 8 rows checked before."""
    import datasets

    rows = datasets.concatenate_datasets(
        [
            datasets.load_from_disk(os.path.join(scene_data_dir, "train")),
            datasets.load_from_disk(os.path.join(scene_data_dir, "val")),
        ]
    )
    raw = rows.cast_column("image", datasets.Image(decode=False))

    def damage(example, index):
        if index == 10:
            example["image"] = {"bytes": example["image"]["bytes"][:40] + b"garbage" * 20, "path": None}
        return example

    broken = raw.map(damage, with_indices=True).cast_column("image", datasets.Image())
    out = tmp_path_factory.mktemp("corrupt") / "train"
    broken.save_to_disk(str(out))
    return out


@pytest.fixture()
def file_in_the_way(tmp_path):
    """A regular file: any dir 'under' it cannot be created, even by root."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a dir")
    return blocker


# ---- recipe values, paths, devices: one message, before the model loads ----------------------------------------


def test_grpo_lists_every_bad_value_and_path_at_once(tiny_model_dir, scene_data_dir, tmp_path, file_in_the_way):
    before = tree_digest(tiny_model_dir)
    rc, _, err = py(
        *grpo_args(
            tmp_path / "no_model",
            tmp_path / "no_data",
            file_in_the_way / "run",
            "--reward_weights",
            "1",
            "nan",
            "0.5",
            "0.5",
            "--time_budget",
            "abc",
            "--eval_sets",
            str(tmp_path / "no_eval"),
            os.path.join(scene_data_dir, "val"),
            "--eval_steps_protocol",
            "0",
            "--eval_limit",
            "0",
        ),
        env={"SUBMISSION": str(file_in_the_way / "submission")},
    )
    assert_clean_error(
        rc,
        err,
        "error: cannot start, 9 problems",
        "reward_weights[1] (reward format) is nan",
        "time_budget 'abc'",
        "eval_steps_protocol must be >= 1",
        "eval_limit must be >= 1",
        f"model {tmp_path / 'no_model'} does not exist (MODEL_PATH",
        f"{tmp_path / 'no_data'} does not exist (DATA",
        f"{tmp_path / 'no_eval'} does not exist (--eval_sets",
        "output dir:",
        "(OUTPUT_DIR",
        "submission dir:",
        "(SUBMISSION",
    )
    assert err.index("model ") < err.index("data set")  # the model first: the most common mistake
    assert "point DATA / --dataset_name" not in err  # a missing eval set is not fixed with DATA
    assert tree_digest(tiny_model_dir) == before and file_in_the_way.read_text() == "a file, not a dir"


def test_grpo_negative_budget_and_keep_best_without_eval_sets(tiny_model_dir, scene_data_dir, tmp_path):
    rc, _, err = py(
        *grpo_args(
            tiny_model_dir,
            os.path.join(scene_data_dir, "train"),
            tmp_path / "run",
            "--time_budget=-5m",
            "--keep_best",
            "true",
            "--max_train_samples",
            "0",
            "--min_pixels",
            "50000",
            "--max_pixels",
            "12544",
        )
    )
    assert_clean_error(
        rc,
        err,
        "time_budget '-5m'",
        "keep_best needs eval_sets",
        "--eval_sets",
        "max_train_samples must be >= 1",
        "min_pixels 50000 > max_pixels 12544",
    )
    assert not (tmp_path / "run").exists()  # nothing written before validation passed


def test_time_budget_zero_or_off_means_no_budget():
    from open_r1 import validate
    from open_r1.run.safety import TimeBudgetCallback, build_run_callbacks

    for value in ("0", "off", "none"):
        training_args = types.SimpleNamespace(output_dir="/nonexistent", resume_from_checkpoint=None, process_index=0)
        for validated in (True, False):  # build_run_callbacks is safe on its own too
            script_args = types.SimpleNamespace(
                time_budget=value, eval_sets=[], keep_best=None, auto_resume=False, eval_steps_protocol=50
            )
            if validated:
                assert validate.normalise_time_budget(script_args) == []
                assert script_args.time_budget is None
            run_safety = build_run_callbacks(script_args, training_args, None)  # no eval sets: no task needed
            assert not any(isinstance(c, TimeBudgetCallback) for c in run_safety.callbacks)


@pytest.mark.skipif(HAS_GPU, reason="checks the refusal on a machine without a GPU")
def test_gpu_recipe_on_a_cpu_machine_is_refused(tiny_model_dir, scene_data_dir, tmp_path):
    rc, _, err = py(
        "-m",
        "open_r1.grpo",
        "--config",
        "configs/qwen2vl_2b_counting.yaml",
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_name",
        os.path.join(scene_data_dir, "train"),
        "--eval_sets",
        os.path.join(scene_data_dir, "ood_val"),
        os.path.join(scene_data_dir, "val"),
        "--output_dir",
        str(tmp_path / "run"),
        "--use_cpu",
        "true",
    )
    assert_clean_error(rc, err, "this recipe needs GPUs (512 completions per generation round)", "configs/demo.yaml")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="checks the error without DeepSpeed")
def test_deepspeed_without_deepspeed_installed_is_one_error():
    """train.sh passes --deepspeed zero3.json by default; transformers checks for the package while parsing."""
    rc, _, err = py("-m", "open_r1.grpo", "--config", "configs/demo.yaml", "--deepspeed", "zero3.json")
    assert_clean_error(rc, err, "--deepspeed needs DeepSpeed, which is not installed: pip install -e '.[gpu]'")


def test_corrupt_image_past_the_first_rows_fails_with_its_row(tiny_model_dir, corrupt_data, tmp_path):
    rc, _, err = py(*grpo_args(tiny_model_dir, corrupt_data, tmp_path / "run"))
    assert_clean_error(rc, err, f"{corrupt_data} row 10: unreadable image")
    assert not (tmp_path / "run").exists()


def test_selfcheck_set_with_a_corrupt_image_fails_with_its_row(exported, corrupt_data, scene_data_dir):
    rc, _, err = py(
        "selfcheck.py",
        "--model",
        str(exported),
        "--sets",
        os.path.join(scene_data_dir, "val"),
        str(corrupt_data),
        "--quiet",
    )
    assert_clean_error(rc, err, f"{corrupt_data} row 10: unreadable image")
    assert not (exported / "selfcheck.json").exists()


def test_check_images_streams_every_row_of_an_eval_set(corrupt_data):
    import datasets

    from open_r1.errors import DataError
    from open_r1.validate import check_images

    dataset = datasets.load_from_disk(str(corrupt_data))
    check_images(dataset, "eval", rows=10)  # rows 0-9 are fine: the limit is respected
    with pytest.raises(DataError, match="eval row 10: unreadable image"):
        check_images(dataset, "eval", batch_size=3)  # across batch boundaries the index stays right


def test_empty_data_sets_are_called_empty(scene_data_dir, tmp_path):
    import datasets

    from open_r1.validate import dataset_problems

    datasets.load_from_disk(os.path.join(scene_data_dir, "val")).select([]).save_to_disk(str(tmp_path / "zero"))
    (tmp_path / "blank").mkdir()
    assert dataset_problems(str(tmp_path / "zero"), "--sets")[0] == [
        f"data set {tmp_path / 'zero'} has no rows: an empty data set (--sets)"
    ]
    assert "is an empty directory" in dataset_problems(str(tmp_path / "blank"), "--eval_sets")[0][0]


def test_a_set_holding_only_a_validation_split_names_the_split_dir(scene_data_dir, tmp_path):
    import datasets

    from open_r1.validate import dataset_problems

    whole = tmp_path / "hub_copy"
    datasets.DatasetDict({"validation": datasets.load_from_disk(os.path.join(scene_data_dir, "val"))}).save_to_disk(
        str(whole)
    )
    found, dataset = dataset_problems(str(whole), "--sets")
    assert dataset is None and len(found) == 1 and f"--sets {whole / 'validation'}" in found[0], found
    assert dataset_problems(str(whole / "validation"), "--sets")[0] == []  # the named fix works


def test_data_sets_are_checked_the_way_their_task_loads_them(scene_data_dir, tmp_path):
    from open_r1.validate import dataset_problems

    counting_val = os.path.join(scene_data_dir, "val")
    assert dataset_problems(counting_val, "--eval_sets")[0] == []  # task counting (the default)
    found, dataset = dataset_problems(counting_val, "--eval_sets", task="captioning")
    assert dataset is None and len(found) == 1 and "caption" in found[0] and "--eval_sets" in found[0]
    # each task's loader names the command that makes its embedded default data
    from open_r1.errors import DataError
    from open_r1.tasks import get_task

    missing = str(tmp_path / "nope" / "train")
    for task, hint in (("counting", "open_r1.tasks.counting.scenes"), ("captioning", "standin.captioning.cartoons")):
        with pytest.raises(DataError, match=hint.replace(".", r"\.")):
            get_task(task).load_split(missing)


def test_an_error_raised_deep_in_another_module_is_caught_under_dash_m(tiny_model_dir, scene_data_dir, tmp_path):
    """The data module raises after validation, while the trainer is built: under `python -m open_r1.grpo` the
    module runs as __main__, so only the package-level family (open_r1.errors) can catch it."""
    rc, _, err = py(
        *grpo_args(
            tiny_model_dir, os.path.join(scene_data_dir, "train"), tmp_path / "run", "--prompt_templates", "bogus:1"
        )
    )
    assert_clean_error(rc, err, "error: unknown prompt template 'bogus'")


def test_unknown_recipe_key_is_a_recipe_error(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1.0e-6\nreward_wieghts: [1.0]\n")
    rc, _, err = py("-m", "open_r1.grpo", "--config", str(recipe), "--use_cpu", "true")
    assert_clean_error(rc, err, "error: unknown recipe key 'reward_wieghts' (did you mean reward_weights?)")
    assert len(err.strip().splitlines()) <= 3 and "fail_with_unknown_args" not in err
    if not HAS_GPU:  # TRL's bf16 default on a CPU machine: the fix is named
        rc, _, err = py("-m", "open_r1.grpo", "--config", "configs/demo.yaml", "--bf16", "true")
        assert_clean_error(rc, err, "no GPU is visible: pass --use_cpu true")


def test_misspelt_abbreviated_or_mistyped_flags_are_one_short_error():
    """argparse would take `--learning_rat` as an abbreviation of --learning_rate, and print the usage of every key
    (220 lines) before a bad value's message."""
    for argv, needle in (
        (["--learning_rat", "1"], "unknown command-line flag 'learning_rat' (did you mean learning_rate?)"),
        (["--num_generaton=3"], "unknown command-line flag 'num_generaton' (did you mean num_generations?)"),
        (["--learning_rate", "abc"], "--learning_rate/--learning-rate: invalid float value: 'abc'"),
    ):
        rc, _, err = py("-m", "open_r1.grpo", "--config", "configs/demo.yaml", "--use_cpu", "true", *argv)
        assert_clean_error(rc, err, needle)
        assert len(err.strip().splitlines()) <= 3, err


def test_invalid_yaml_and_missing_config(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward_funcs: [exact_count\nbeta: :\n")
    rc, _, err = py("-m", "open_r1.grpo", "--config", str(bad))
    assert_clean_error(rc, err, "the recipe is not valid YAML", "(--config)")
    rc, _, err = py("-m", "open_r1.grpo", "--config", str(tmp_path / "nope.yaml"))
    assert_clean_error(rc, err, f"recipe file {tmp_path / 'nope.yaml'} does not exist (--config)")
    rc, _, err = py("-m", "open_r1.grpo", "--config")
    assert_clean_error(rc, err, "--config needs a recipe file")


# ---- model dirs --------------------------------------------------------------------------------------------------


def test_broken_model_dirs_are_named_before_loading(broken_models, scene_data_dir):
    """selfcheck without --verify (the subprocess covers the entry point; the rest run in-process)."""
    from open_r1.validate import model_dir_problems

    path, needle = broken_models["truncated"]
    before = tree_digest(path)
    rc, _, err = py("selfcheck.py", "--model", str(path), "--sets", os.path.join(scene_data_dir, "val"), "--quiet")
    assert_clean_error(rc, err, needle, "(--model / SUBMISSION)")
    assert tree_digest(path) == before
    for name, (path, needle) in broken_models.items():
        problems = model_dir_problems(str(path), "--model")
        assert problems and any(needle in p for p in problems), (name, problems)


def test_verify_names_an_unmerged_adapter(broken_models):
    path, _ = broken_models["adapter"]
    rc, out, err = py("selfcheck.py", "--verify", "--model", str(path))
    assert rc == 1 and "Traceback" not in err
    assert "is a LoRA adapter" in err and f"python -m open_r1.submission.export --checkpoint {path}" in err


# ---- selfcheck arguments ---------------------------------------------------------------------------------------


def test_selfcheck_bad_arguments_are_one_error(exported, tmp_path):
    argv = ["selfcheck.py", "--model", str(exported), "--limit", "0", "--batch-size", "0"]
    needles = ["--limit must be >= 1", "--batch-size must be >= 1"]
    if not HAS_GPU:
        argv += ["--device", "cuda"]
        needles.append("--device cuda: no GPU is visible")
    rc, _, err = py(*argv)
    assert_clean_error(rc, err, *needles)
    assert not (exported / "selfcheck.json").exists()


def test_selfcheck_unknown_sets_name_the_right_option(exported, tmp_path):
    rc, _, err = py("selfcheck.py", "--model", str(exported), "--sets", str(tmp_path / "a"), str(tmp_path / "b"))
    assert_clean_error(rc, err, f"{tmp_path / 'a'} does not exist (--sets)", f"{tmp_path / 'b'} does not exist")
    assert "DATA" not in err and "--dataset_name" not in err  # selfcheck has no such options
    rc, _, err = py("selfcheck.py", "--model", str(exported), "--val", str(tmp_path / "v"))
    assert_clean_error(rc, err, "(--sets (or --val / --ood-val))")


def test_selfcheck_report_keeps_sets_that_share_a_basename():
    import importlib.util

    spec = importlib.util.spec_from_file_location("selfcheck_module", os.path.join(ROOT, "selfcheck.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.unique_set_names(["/d/a/val", "/d/b/val", "/d/ood_val"]) == ["a/val", "b/val", "ood_val"]


# ---- the submission is sacred ------------------------------------------------------------------------------------


def test_export_is_readable_by_others_whatever_the_umask(tiny_model_dir, tmp_path):
    from open_r1.submission.export import export_submission

    old = os.umask(0o077)
    try:
        export_submission(str(tiny_model_dir), str(tmp_path / "sub"), verify=False)
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "sub").st_mode & 0o777 == 0o755
    for name in os.listdir(tmp_path / "sub"):
        assert os.stat(tmp_path / "sub" / name).st_mode & 0o777 == 0o644, name


def test_export_never_replaces_a_scored_submission_unless_told(tiny_model_dir, exported, tmp_path):
    submission = tmp_path / "app" / "submission"
    shutil.copytree(exported, submission)
    fake_report(
        submission / "selfcheck.json",
        submission,
        {"val": 55.0, "ood_val": 55.0},
        sets_paths=["/data/val", "/data/ood_val"],
    )
    before = tree_digest(submission)
    rc, out, err = py(
        "-m",
        "open_r1.submission.export",
        "--checkpoint",
        str(tiny_model_dir),
        "--out",
        str(submission),
        "--no-verify-generate",
    )
    assert rc == 0, err[-3000:]
    assert tree_digest(submission) == before
    beside = [p for p in submission.parent.iterdir() if p.name.startswith("submission.candidate-")]
    assert len(beside) == 1 and (beside[0] / "model.safetensors").is_file()
    assert "holds a scored submission (55.0% mean accuracy" in out
    assert f"python selfcheck.py --model {beside[0]} --sets /data/val /data/ood_val" in out
    assert f"python -m open_r1.submission.promote --candidate {beside[0]} --submission {submission}" in out

    rc, out, err = py(
        "-m",
        "open_r1.submission.export",
        "--checkpoint",
        str(tiny_model_dir),
        "--out",
        str(submission),
        "--no-verify-generate",
        "--replace",
    )
    assert rc == 0, err[-3000:]
    assert not (submission / "selfcheck.json").exists()
    kept = [p for p in submission.parent.iterdir() if p.name.startswith("submission.prev-")]
    assert len(kept) == 1 and tree_digest(kept[0]) == before


def test_export_errors_before_loading_leave_the_submission(
    tiny_model_dir, exported, broken_models, tmp_path, file_in_the_way
):
    submission = tmp_path / "submission"
    shutil.copytree(exported, submission)
    before = tree_digest(submission)
    broken, _ = broken_models["truncated"]
    rc, _, err = py("-m", "open_r1.submission.export", "--checkpoint", str(broken), "--out", str(submission))
    assert_clean_error(rc, err, f"checkpoint {broken} does not load", "truncated")
    rc, _, err = py(
        "-m", "open_r1.submission.export", "--checkpoint", str(tiny_model_dir), "--out", str(file_in_the_way / "sub")
    )
    assert_clean_error(rc, err, "cannot write the submission", "(--out / SUBMISSION)")
    assert tree_digest(submission) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "submission"]


def test_export_of_a_broken_keep_best_choice_names_a_checkpoint_that_loads(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    good = fake_checkpoint(tiny_model_dir, run_dir / "checkpoint-2", 2)
    best = fake_checkpoint(tiny_model_dir, run_dir / "checkpoint-4", 4)
    weights = os.path.join(best, "model.safetensors")
    data = open(weights, "rb").read()
    open(weights, "wb").write(data[:100])
    (run_dir / "training_meta.json").write_text(json.dumps({"base_model": str(tiny_model_dir)}))
    (run_dir / "eval_history.json").write_text(
        json.dumps(
            {
                "primary": "ood_val",
                "secondary": "val",
                "entries": [
                    {"step": 2, "checkpoint": "checkpoint-2", "scores": {"ood_val": 10.0}},
                    {"step": 4, "checkpoint": "checkpoint-4", "scores": {"ood_val": 50.0}},
                ],
            }
        )
    )
    rc, _, err = py("-m", "open_r1.submission.export", "--checkpoint", str(run_dir), "--out", str(tmp_path / "sub"))
    assert_clean_error(rc, err, f"checkpoint {best} does not load", f"--checkpoint {good}")
    assert not (tmp_path / "sub").exists() and os.path.getsize(weights) == 100


def test_sigterm_during_export_restores_never_deletes(tiny_model_dir, exported, tmp_path):
    submission = tmp_path / "submission"
    shutil.copytree(exported, submission)
    before = tree_digest(submission)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "open_r1.submission.export",
            "--checkpoint",
            str(tiny_model_dir),
            "--out",
            str(submission),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while proc.poll() is None and not any(".submission.tmp-" in p.name for p in tmp_path.iterdir()):
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(".tmp-" in n for n in names), names
    if proc.returncode == 143 and "the new model is in place" not in err:  # stopped: the old one as it was
        assert "export interrupted (SIGTERM)" in err and "Traceback" not in err
        assert tree_digest(submission) == before
        assert all(n == "submission" or n.startswith("submission.candidate-") for n in names), names
    else:  # the signal came during or after the swap: a complete new model at the path, the old kept beside it
        assert proc.returncode in (0, 143), err[-3000:]
        assert (submission / "model.safetensors").is_file()
        assert any(tree_digest(tmp_path / n) == before for n in names if n.startswith("submission.prev-"))


@pytest.mark.parametrize("when", ["before the swap", "during the swap", "after the swap"])
def test_a_signal_stops_the_command_only_until_the_new_model_is_in_place(tmp_path, monkeypatch, capsys, when):
    """Under run_cli a SIGTERM unwinds the command (143, 'unchanged') until install() has put the model in place;
    after that (held during the swap, or in the messages that follow) there is nothing left to stop: status 0."""
    from open_r1.submission import install

    target = tmp_path / "sub"
    target.mkdir()
    (target / "weights").write_text("old")
    exchange = install._exchange

    def exchange_with_signal(a, b):
        signal.raise_signal(signal.SIGTERM)  # recorded: the swap is never cut in the middle
        return exchange(a, b)

    def work():
        if when == "during the swap":
            monkeypatch.setattr(install, "_exchange", exchange_with_signal)
        with install.installing(target, str(tmp_path / "sub.prev")) as staging:
            (tmp_path / staging / "weights").write_text("new")
            if when == "before the swap":
                signal.raise_signal(signal.SIGTERM)
        if when == "after the swap":
            signal.raise_signal(signal.SIGTERM)
        return 0

    before = signal.getsignal(signal.SIGTERM)
    rc = install.run_cli("export", str(target), work)
    err = capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before
    if when == "before the swap":
        assert rc == 143 and "export interrupted (SIGTERM)" in err and "unchanged" in err
        assert (target / "weights").read_text() == "old" and os.listdir(tmp_path) == ["sub"]
    else:
        assert rc == 0 and "interrupted" not in err
        assert (target / "weights").read_text() == "new" and (tmp_path / "sub.prev" / "weights").read_text() == "old"


def test_a_signal_as_the_swap_puts_the_handlers_back_is_delivered_after_both(monkeypatch):
    """A Ctrl-C that reaches the restored SIGINT handler while SIGTERM's is being put back: both handlers are back,
    then the KeyboardInterrupt is raised (before, SIGTERM's recorder stayed and the held signals were dropped)."""
    from open_r1.submission import install

    real = signal.signal
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def signal_with_pending_sigint(signum, handler):
        if signum == signal.SIGTERM and getattr(handler, "__name__", "") != "<lambda>" and not fired:
            fired.append(1)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # SIGINT's handler is already the restored one
        return real(signum, handler)

    fired: list = []
    monkeypatch.setattr(signal, "signal", signal_with_pending_sigint)
    with pytest.raises(KeyboardInterrupt), install._signals_held():
        pass
    assert fired and {s: signal.getsignal(s) for s in before} == before


def test_a_sigterm_after_the_work_is_dropped_not_raised(monkeypatch):
    """CPython runs a pending handler inside signal.signal before swapping it: a SIGTERM arriving as run_cli restores
    the old handler raised KeyboardInterrupt out of its `finally` (a traceback and exit -2 after 'submission ready')."""
    from open_r1.submission import install

    real, before = signal.signal, signal.getsignal(signal.SIGTERM)

    def signal_with_pending_sigterm(signum, handler):
        if signum == signal.SIGTERM and handler is not install._raise_interrupt and not restores:
            restores.append(handler)
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the pending SIGTERM's handler runs first
        return real(signum, handler)

    restores: list = []
    monkeypatch.setattr(signal, "signal", signal_with_pending_sigterm)
    assert install.run_cli("export", "submission", lambda: 0) == 0
    assert restores == [before] and signal.getsignal(signal.SIGTERM) == before


def test_a_sigterm_as_the_swap_holds_signals_leaves_no_recorder_behind(monkeypatch):
    """The same pending check while _signals_held installs its recorders: SIGINT's was installed, SIGTERM's raised;
    SIGINT must get its handler back (else every later Ctrl-C of the process is swallowed)."""
    from open_r1.submission import install

    real = signal.signal
    sigint_before, sigterm_before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def signal_with_pending_sigterm(signum, handler):
        if signum == signal.SIGTERM and getattr(handler, "__name__", "") == "<lambda>":  # the recorder
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        return real(signum, handler)

    real(signal.SIGTERM, install._raise_interrupt)
    try:
        monkeypatch.setattr(signal, "signal", signal_with_pending_sigterm)
        with pytest.raises(KeyboardInterrupt), install._signals_held():
            pytest.fail("the block must not run")
        assert signal.getsignal(signal.SIGINT) == sigint_before
        assert signal.getsignal(signal.SIGTERM) is install._raise_interrupt
    finally:
        real(signal.SIGTERM, sigterm_before)


def test_a_signal_during_the_interpreters_exit_keeps_the_status():
    """After main() returns, the interpreter's exit takes ~1 s with torch loaded; a SIGTERM there killed a finished
    export (-15). atexit handlers run inside that exit, so this one sends the signal at the right moment."""
    code = (
        "import atexit, os, signal, time\n"
        "from open_r1.submission.install import exit_cli\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))\n"
        "exit_cli(lambda argv: 0)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


# ---- promote compares like with like ---------------------------------------------------------------------------


@pytest.fixture()
def current_and_candidate(exported, tmp_path):
    submission, candidate = tmp_path / "app" / "submission", tmp_path / "candidate"
    shutil.copytree(exported, submission)
    shutil.copytree(exported, candidate)
    fake_report(
        submission / "selfcheck.json",
        submission,
        {"val": 60.0, "ood_val": 40.0},
        sets_paths=["/data/val", "/data/ood_val"],
    )
    return submission, candidate


def promote_cli(*argv):
    from open_r1.submission import promote

    return promote.main([*argv, "--no-verify-generate"])


def test_promote_refuses_other_set_paths_and_other_protocol(current_and_candidate, tmp_path, capsys):
    submission, candidate = current_and_candidate
    before = tree_digest(submission)
    other = fake_report(
        tmp_path / "a.json", candidate, {"val": 90.0, "ood_val": 90.0}, sets_paths=["/elsewhere/val", "/data/ood_val"]
    )
    assert promote_cli("--candidate", str(candidate), "--report", other, "--submission", str(submission)) == 1
    assert "set val: measured on /elsewhere/val (new) vs /data/val (current)" in capsys.readouterr().err
    no_protocol = fake_report(
        tmp_path / "b.json",
        candidate,
        {"val": 90.0, "ood_val": 90.0},
        sets_paths=["/data/val", "/data/ood_val"],
        protocol=False,
    )
    assert promote_cli("--candidate", str(candidate), "--report", no_protocol, "--submission", str(submission)) == 1
    assert "different protocol" in capsys.readouterr().err
    assert tree_digest(submission) == before


def test_promote_into_an_unwritable_place_fails_before_copying(exported, tmp_path, file_in_the_way, capsys):
    report = fake_report(tmp_path / "r.json", exported, {"val": 90.0})
    before = tree_digest(exported)
    assert (
        promote_cli(
            "--candidate", str(exported), "--report", report, "--submission", str(file_in_the_way / "submission")
        )
        == 2
    )
    assert "cannot write the submission" in capsys.readouterr().err
    assert tree_digest(exported) == before


def test_a_corrupt_current_report_refuses_but_never_blocks_force(current_and_candidate, tmp_path, capsys):
    submission, candidate = current_and_candidate
    (submission / "selfcheck.json").write_text("{truncated")
    before = tree_digest(submission)
    better = fake_report(tmp_path / "new.json", candidate, {"val": 90.0, "ood_val": 90.0})
    rc, _, err = py(
        "-m",
        "open_r1.submission.promote",
        "--candidate",
        str(candidate),
        "--report",
        better,
        "--submission",
        str(submission),
        "--no-verify-generate",
    )
    assert_clean_error(rc, err, "is not readable JSON", "or pass --force")
    assert tree_digest(submission) == before
    assert (
        promote_cli("--candidate", str(candidate), "--report", better, "--submission", str(submission), "--force") == 0
    )
    assert json.loads((submission / "selfcheck.json").read_text())["mean_accuracy_pct"] == 90.0
    assert os.stat(submission).st_mode & 0o777 == 0o755
    kept = [p for p in submission.parent.iterdir() if p.name.startswith("submission.replaced-")]
    assert len(kept) == 1 and tree_digest(kept[0]) == before


# ---- resume tells the truth --------------------------------------------------------------------------------------


def test_resume_skips_a_truncated_newest_checkpoint(tiny_model_dir, tmp_path, caplog):
    from open_r1.run.resume import find_resume_checkpoint

    good = fake_checkpoint(tiny_model_dir, tmp_path / "checkpoint-2", 2)
    bad = fake_checkpoint(tiny_model_dir, tmp_path / "checkpoint-4", 4)
    weights = os.path.join(bad, "model.safetensors")
    data = open(weights, "rb").read()
    with open(weights, "wb") as handle:
        handle.write(data[: len(data) // 3])
    caplog.set_level(logging.INFO, logger="open_r1")
    assert find_resume_checkpoint(str(tmp_path), verbose=True) == str(good)
    assert any("skipping checkpoint-4: incomplete" in line and "truncated" in line for line in caplog.messages)
    assert os.path.getsize(weights) == len(data) // 3  # nothing deleted: the user decides


def test_resume_log_says_what_started_fresh(tiny_model_dir, tmp_path, caplog):
    from open_r1.run.resume import resolve_resume

    fake_checkpoint(tiny_model_dir, tmp_path / "checkpoint-3", 3, optimizer=False)
    caplog.set_level(logging.INFO, logger="open_r1")
    args = types.SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=None, process_index=0, max_steps=8)
    assert resolve_resume(args, True) == str(tmp_path / "checkpoint-3")
    line = caplog.messages[-1]
    assert "started fresh: optimizer and scheduler (optimizer.pt missing" in line
    assert "restored weights, trainer state (step, logs), RNG" in line
    assert "restored weights, trainer state (step, logs), optimizer" not in line


def test_lr_after_a_longer_max_steps_continues_the_new_schedule(caplog):
    from transformers import get_linear_schedule_with_warmup

    from open_r1.run.resume import ResumeWeightsCallback

    def make(total):
        params = [torch.nn.Parameter(torch.zeros(1))]
        optimizer = torch.optim.AdamW(params, lr=1.0)
        return optimizer, get_linear_schedule_with_warmup(optimizer, 0, total)

    old_opt, old_sched = make(4)
    for _ in range(4):
        old_opt.step()
        old_sched.step()
    assert old_opt.param_groups[0]["lr"] == 0.0  # the end of the old schedule
    new_opt, new_sched = make(8)
    new_opt.load_state_dict(old_opt.state_dict())
    new_sched.load_state_dict(old_sched.state_dict())
    state = types.SimpleNamespace(global_step=4, max_steps=8, is_world_process_zero=True)
    caplog.set_level(logging.INFO, logger="open_r1")
    ResumeWeightsCallback("unused").align_schedule(state, new_opt, new_sched)
    assert new_opt.param_groups[0]["lr"] == pytest.approx(0.5)  # step 4 of 8, linear decay from 1.0
    assert any("learning rate at step 4" in line for line in caplog.messages)

    fresh_opt, fresh_sched = make(8)  # scheduler.pt missing: transformers starts it at step 0 (peak)
    ResumeWeightsCallback("unused").align_schedule(state, fresh_opt, fresh_sched)
    assert fresh_sched.last_epoch == 4 and fresh_opt.param_groups[0]["lr"] == pytest.approx(0.5)


FAST = [
    "--num_generations",
    "2",
    "--per_device_train_batch_size",
    "4",
    "--max_completion_length",
    "8",
    "--max_pixels",
    "12544",
    "--max_train_samples",
    "8",
    "--learning_rate",
    "0.1",
    "--beta",
    "0.0",
    "--logging_steps",
    "1",
    "--report_to",
    "none",
    "--dtype",
    "float32",
    "--use_cpu",
    "true",
    "--seed",
    "0",
]  # the tiny CPU run's settings; tests/test_resume.py's runs use them too


def test_resumed_run_with_a_longer_max_steps_trains_at_the_new_schedule(
    tiny_model_dir, scene_data_dir, tmp_path, capfd
):
    """End to end: 2 steps (the linear schedule ends at lr 0), then resume with max_steps 4: the first resumed step
    must use the new schedule's rate at step 2, not the 0 stored in optimizer.pt."""
    from transformers import TrainerCallback

    from open_r1 import grpo
    from open_r1.errors import setup_logging

    class LearningRateAtStepBegin(TrainerCallback):
        def __init__(self):
            self.seen = []

        def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            expected = lr_scheduler.base_lrs[0] * lr_scheduler.lr_lambdas[0](state.global_step)
            self.seen.append((state.global_step, optimizer.param_groups[0]["lr"], expected))

    def train(max_steps, probe=None):
        argv = [
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_name",
            os.path.join(scene_data_dir, "train"),
            "--output_dir",
            str(tmp_path / "run"),
            *FAST,
            *["--lr_scheduler_type", "linear", "--warmup_steps", "0", "--save_strategy", "steps", "--save_steps", "2"],
            "--max_steps",
            str(max_steps),
        ]
        setup_logging()  # as the CLI does: the log onto the captured stderr
        script_args, training_args, model_args, task = grpo.parse_args(argv)
        return grpo.main(script_args, training_args, model_args, task, callbacks=[probe] if probe else None)

    train(2)
    probe = LearningRateAtStepBegin()
    trainer = train(4, probe)
    assert trainer.state.global_step == 4
    step, used, expected = probe.seen[0]
    assert step == 2 and expected == pytest.approx(0.05) and used == pytest.approx(expected)
    err = capfd.readouterr().err
    assert "this run's max_steps is 4" in err and "learning rate at step 2 set from this run's schedule" in err


@pytest.mark.parametrize("finished", [False, True], ids=["checkpoints", "final_model"])
def test_a_run_dir_of_another_base_model_is_refused(tiny_model_dir, scene_data_dir, tmp_path, finished):
    run_dir = tmp_path / "run"
    fake_checkpoint(tiny_model_dir, run_dir / "checkpoint-2", 2)
    if finished:  # a finished run's final model beside its checkpoints: starting fresh there is refused too
        for name in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tiny_model_dir, name), run_dir)
    meta = {"base_model": "/models/another-base", "use_peft": False, "reward_funcs": ["exact_count", "format"]}
    (run_dir / "training_meta.json").write_text(json.dumps(meta))
    before = tree_digest(run_dir)
    rc, _, err = py(*grpo_args(tiny_model_dir, os.path.join(scene_data_dir, "train"), run_dir))
    assert_clean_error(
        rc, err, "holds a run trained with another base model /models/another-base", "--resume_mismatch_ok true"
    )
    # the fresh start is offered only where it would be accepted
    assert ("--auto_resume false" in err) is not finished
    assert tree_digest(run_dir) == before  # training_meta.json still names the run's real base


# ---- train.sh ------------------------------------------------------------------------------------------------------


def test_train_sh_help_and_gpu_count():
    rc, out, err = run("bash", "train.sh", "--help")
    assert rc == 0 and "bash train.sh [RECIPE.yaml]" in out and "SUBMISSION" in out
    assert "MAIN_ADDR" in out and out.endswith("(re-run the same command to resume, then export).\n")  # whole
    if not HAS_GPU:
        rc, out, err = run("bash", "train.sh", "configs/demo.yaml", env={"NUM_GPUS": "2"})
        assert_clean_error(rc, err, "NUM_GPUS=2 but this machine shows 0 GPU(s)", "set NUM_GPUS=0")
        assert "mpi4py" not in err


def test_sigterm_to_train_sh_reaches_the_trainer_and_skips_export(tiny_model_dir, scene_data_dir, tmp_path):
    env = {
        **os.environ,
        "MODEL_PATH": str(tiny_model_dir),
        "DATA": os.path.join(scene_data_dir, "train"),
        "SUBMISSION": str(tmp_path / "submission"),
        "OUTPUT_DIR": str(tmp_path / "run"),
        "NUM_GPUS": "0",
        "PYTHON": sys.executable,
        "PYTHONWARNINGS": "ignore",
    }
    log = open(tmp_path / "log.txt", "w+")
    proc = subprocess.Popen(
        [
            "bash",
            "train.sh",
            "configs/demo.yaml",
            "--max_steps",
            "200",
            "--max_pixels",
            "12544",
            "--max_completion_length",
            "8",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        while proc.poll() is None and "[run] training in" not in open(tmp_path / "log.txt").read():
            time.sleep(0.2)
        assert proc.poll() is None, open(tmp_path / "log.txt").read()[-3000:]
        proc.send_signal(signal.SIGTERM)  # to the shell only, as a job scheduler does
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = open(tmp_path / "log.txt").read()
    assert rc == 143, text[-3000:]
    assert "SIGTERM received: asking the trainer to save a checkpoint" in text
    assert "no export" in text and "[export]" not in text
    assert not (tmp_path / "submission").exists()
    checkpoints = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint-")]
    assert checkpoints and all((p / "trainer_state.json").is_file() for p in checkpoints)
    with pytest.raises(ProcessLookupError):  # the trainer did not run on orphaned
        os.killpg(proc.pid, 0)


# ---- the other entry points --------------------------------------------------------------------------------------


def test_scene_generator_and_run_plot_errors_are_clean(tmp_path, file_in_the_way):
    rc, _, err = py(
        "-m",
        "open_r1.tasks.counting.scenes",
        "--out",
        str(file_in_the_way / "data"),
        "--splits",
        "train",
        "--train",
        "2",
    )
    assert_clean_error(rc, err, "cannot write --out", "is not a directory")
    rc, _, err = py("-m", "open_r1.run.keep_best", str(tmp_path / "no_run"))
    assert_clean_error(rc, err, f"run dir {tmp_path / 'no_run'} does not exist")
    rc, _, err = py(
        "-m", "open_r1.submission.promote", "--candidate", str(tmp_path / "none"), "--submission", str(tmp_path / "sub")
    )
    assert_clean_error(rc, err, f"candidate {tmp_path / 'none'} does not exist")


def test_every_console_script_resolves_and_its_help_shows_the_defaults(monkeypatch, capsys):
    """[project.scripts] of pyproject.toml (the captioning ones are checked by their own tests): each resolves to
    its function, and its --help shows the defaults a user would otherwise have to read the code for."""
    import importlib

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    monkeypatch.delenv("SUBMISSION", raising=False)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    shown = {
        "open-r1-grpo": "--task (default: 'counting')",
        "open-r1-promote": "/app/submission where /app exists",
        "open-r1-scenes": "(default: 2000)",
        "open-r1-selfcheck": "(default: /app/data/val)",
        "open-r1-tiny-model": "(default: qwen2_vl)",
        "open-r1-export": "--no-verify-generate",
        "open-r1-plot-run": "run_dir",
    }
    assert set(shown) <= set(scripts), sorted(scripts)
    for name, needle in shown.items():
        module, function = scripts[name].split(":")
        with pytest.raises(SystemExit) as done:
            raise SystemExit(getattr(importlib.import_module(module), function)(["--help"]))
        out = capsys.readouterr().out
        assert done.value.code in (0, None) and needle in " ".join(out.split()), (name, out[-2000:])


@pytest.mark.parametrize(
    "script, entry, abbreviated",
    [
        ("open-r1-selfcheck", "open_r1.tasks.counting.selfcheck:main", ["--lim", "3"]),
        ("open-r1-scenes", "open_r1.tasks.counting.scenes.cli:main", ["--out", "x", "--see", "3"]),
        ("open-r1-plot-run", "open_r1.run.keep_best:main", ["x", "--ou", "3"]),
        ("open-r1-tiny-model", "open_r1.tiny_models:main", ["--out", "x", "--fam", "3"]),
        (
            "open-r1-caption-prepare",
            "open_r1.tasks.captioning.prepare:main",
            ["--hub", "x", "--out", "x", "--min-vote", "3"],
        ),
    ],
)
def test_console_script_help_answers_before_torch_loads_and_refuses_abbreviated_flags(script, entry, abbreviated):
    """--help is argparse's alone (torch takes seconds to import), names the console script, and a prefix of a flag
    is an error, never silently the longer flag (`--min-vote 3` would have meant --min-votes 3)."""
    module, function = entry.split(":")
    probe = (
        f"import sys\nfrom {module} import {function} as main\n"
        "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as done:\n    code = done.code\n"
        "print('torch loaded' if 'torch' in sys.modules else 'no torch', code)"
    )
    rc, out, err = py("-c", probe, "--help")
    assert rc == 0 and out.startswith(f"usage: {script} ") and "scripts/" not in out, out[-2000:] + err[-2000:]
    assert out.rstrip().endswith("no torch 0"), out[-300:]
    rc, out, err = py("-c", probe, *abbreviated)
    assert f"unrecognized arguments: {' '.join(abbreviated[-2:])}" in err and out.rstrip().endswith(" 2"), (
        out[-300:] + err[-2000:]
    )
