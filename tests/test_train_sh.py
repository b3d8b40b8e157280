"""The demo recipe end to end through train.sh (CPU): GRPO -> export -> selfcheck."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_recipe_end_to_end_through_train_sh(tiny_model_dir, scene_data_dir, tmp_path):
    env = {
        **os.environ,
        "MODEL_PATH": str(tiny_model_dir),
        "DATA": os.path.join(scene_data_dir, "train"),
        "SUBMISSION": str(tmp_path / "submission"),
        "OUTPUT_DIR": str(tmp_path / "run"),
        "NUM_GPUS": "0",
        "PYTHON": sys.executable,
    }
    result = subprocess.run(
        [
            "bash",
            "train.sh",
            "configs/demo.yaml",
            "--max_steps",
            "2",
            "--max_pixels",
            "12544",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--max_completion_length",
            "16",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "submission ready" in result.stdout
    sets = " ".join(os.path.join(scene_data_dir, s) for s in ("val", "compositional", "ood_val"))
    assert f"Next: python selfcheck.py --model {tmp_path / 'submission'} --sets {sets}" in result.stdout
    meta = json.loads((tmp_path / "run" / "training_meta.json").read_text())
    assert meta["max_pixels"] == 12544 and meta["reward_funcs"][0] == "exact_count"

    report = tmp_path / "selfcheck.json"
    check = subprocess.run(
        [
            sys.executable,
            "selfcheck.py",
            "--model",
            str(tmp_path / "submission"),
            "--sets",
            os.path.join(scene_data_dir, "val"),
            os.path.join(scene_data_dir, "ood_val"),
            "--limit",
            "4",
            "--out",
            str(report),
            "--quiet",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert "| ood_val | 4 |" in check.stdout
    assert json.loads(report.read_text())["sets"]["val"]["n"] == 4


def test_train_sh_unknown_recipe_is_one_clear_error():
    result = subprocess.run(["bash", "train.sh", "configs/nope.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "error: recipe configs/nope.yaml not found" in result.stderr


def clean_clone(dest) -> str:
    """The repo's tracked files (as in the working tree) copied to dest: a clone without runs/, data or caches."""
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, text=True, check=True)
    for name in filter(None, listed.stdout.split("\0")):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(dest, name))
    return str(dest)


@pytest.mark.slow
def test_the_help_hint_runs_on_a_clean_clone_with_no_variables_set(tmp_path):
    """`bash train.sh configs/demo.yaml` (the hint in --help) trains from the recipe's model and data: the shipped
    warm start, and the demo's scenes rendered on first use; the submission goes into the run dir where there is
    no /app (where there is one, SUBMISSION is set: a test never writes /app/submission)."""
    clone = clean_clone(tmp_path / "clone")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("MODEL_PATH", "DATA", "OUTPUT_DIR", "SUBMISSION", "NUM_GPUS", "PYTHON", "ZERO3")
    }
    env.update(CUDA_VISIBLE_DEVICES="", PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    submission = os.path.join(clone, "runs", "demo", "grpo", "submission")
    if os.path.isdir("/app"):
        submission = env["SUBMISSION"] = str(tmp_path / "submission")
    result = subprocess.run(
        [
            "bash",
            "train.sh",
            "configs/demo.yaml",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "8",
            "--num_generations",
            "4",
            "--max_completion_length",
            "8",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"submission ready: {submission}" in result.stdout
    assert os.path.isfile(os.path.join(submission, "model.safetensors"))
    assert os.path.isdir(os.path.join(clone, "runs", "demo", "data", "train"))
    meta = json.loads(open(os.path.join(clone, "runs", "demo", "grpo", "training_meta.json")).read())
    assert meta["base_model"] == os.path.join(clone, "open_r1", "tasks", "counting", "demo_start")


def launch_with_a_stand_in_python(tmp_path, gpus, **env_values):
    """train.sh with a stand-in PYTHON that reports `gpus` GPUs and records the launch instead of training:
    (the finished process, the launch command line or None)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
case "$*" in
  *device_count*) echo {gpus} ;;
  -c*) exec {sys.executable} "$@" ;;
  *) echo "$*" >> {calls} ;;
esac
""")
    fake.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key not in ("NUM_GPUS", "ZERO3", "GPU_MEMORY_CAP_GIB")}
    env.update(
        PYTHON=str(fake),
        MODEL_PATH=str(tmp_path),
        DATA=str(tmp_path),
        SUBMISSION=str(tmp_path / "sub"),
        OUTPUT_DIR=str(tmp_path / "run"),
        **env_values,
    )
    result = subprocess.run(["bash", "train.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    return result, calls.read_text().splitlines()[0] if calls.exists() else None


@pytest.mark.parametrize(
    "gpus, zero3, deepspeed, cap",
    [("1", None, True, None), ("2", None, True, "48"), ("1", "0", False, None), ("2", "0", False, None)],
)
def test_zero3_by_default_on_any_gpu_count(tmp_path, gpus, zero3, deepspeed, cap):
    """ZeRO-3 by default, one GPU included (its fp32 master weights keep updates that bf16 weights round away);
    ZERO3=0 gives plain DDP. GPU_MEMORY_CAP_GIB launches the same entry under the bench's cap
    (experiments.bench.capped_grpo)."""
    env = {**({"ZERO3": zero3} if zero3 else {}), **({"GPU_MEMORY_CAP_GIB": cap} if cap else {})}
    result, launch = launch_with_a_stand_in_python(tmp_path, gpus, **env)
    assert result.returncode == 0 and "accelerate.commands.launch" in launch, result.stderr
    assert f"--num_processes {gpus}" in launch and "launch --quiet" in launch  # no launcher traceback on a failure
    assert ("--deepspeed zero3.json" in launch) == deepspeed
    assert f"-m {'experiments.bench.capped_grpo' if cap else 'open_r1.grpo'} " in launch


@pytest.mark.parametrize(
    "name, value",
    [
        ("ZERO3", "yes"),  # used to launch without DeepSpeed
        ("ZERO3", "2"),
        ("GPU_MEMORY_CAP_GIB", "lots"),  # used to fail in every rank after the data checks
        ("GPU_MEMORY_CAP_GIB", "0"),
        ("GPU_MEMORY_CAP_GIB", "inf"),
        ("NUM_GPUS", "-1"),
        ("NUM_GPUS", "1.5"),
    ],
)
def test_a_bad_environment_value_is_one_error_before_the_launch(tmp_path, name, value):
    result, launch = launch_with_a_stand_in_python(tmp_path, "2", **{name: value})
    assert result.returncode == 2 and launch is None, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {name}={value} is not") and len(result.stderr.splitlines()) == 1
