"""The demo recipe end to end through train.sh (CPU): GRPO -> export -> selfcheck."""

import fcntl
import json
import os
import re
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


def fake_launch(tmp_path, gpus: str, *args, **env):
    """train.sh run with a stand-in PYTHON that reports `gpus` GPUs and records each command it is given (the
    accelerate launch, then the export) instead of running it; returns (result, recorded command lines)."""
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
    names = ("NUM_GPUS", "ZERO3", "GPU_MEMORY_CAP_GIB", "NUM_MACHINES", "MACHINE_RANK", "MAIN_ADDR", "MAIN_PORT")
    base = {key: value for key, value in os.environ.items() if key not in names}
    base.update(
        PYTHON=str(fake),
        MODEL_PATH=str(tmp_path),
        DATA=str(tmp_path),
        SUBMISSION=str(tmp_path / "sub"),
        OUTPUT_DIR=str(tmp_path / "run"),
    )
    result = subprocess.run(["bash", "train.sh", *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True)
    return result, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    "gpus, zero3, deepspeed, cap",
    [("1", None, True, None), ("2", None, True, "48"), ("1", "0", False, None), ("2", "0", False, None)],
)
def test_zero3_by_default_on_any_gpu_count(tmp_path, gpus, zero3, deepspeed, cap):
    """ZeRO-3 by default, one GPU included (its fp32 master weights keep updates that bf16 weights round away);
    ZERO3=0 gives plain DDP. GPU_MEMORY_CAP_GIB launches the same entry under the bench's cap
    (experiments.bench.capped_grpo)."""
    env = {**({"ZERO3": zero3} if zero3 else {}), **({"GPU_MEMORY_CAP_GIB": cap} if cap else {})}
    result, calls = fake_launch(tmp_path, gpus, **env)
    launch = calls[0]
    assert result.returncode == 0 and "accelerate.commands.launch" in launch, result.stderr
    assert f"--num_processes {gpus}" in launch and "launch --quiet" in launch  # no launcher traceback on a failure
    assert ("--deepspeed zero3.json" in launch) == deepspeed
    entry = "experiments.bench.capped_grpo" if cap else "open_r1.grpo"
    assert f"--num_machines 1 --machine_rank 0 --main_process_port 29500 -m {entry} " in launch


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
    result, calls = fake_launch(tmp_path, "2", **{name: value})
    assert result.returncode == 2 and not calls, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {name}={value} is not") and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("rank", ["0", "1"])
def test_several_machines_launch_one_run_and_rank_0_exports(tmp_path, rank):
    """NUM_MACHINES / MACHINE_RANK / MAIN_ADDR / MAIN_PORT reach accelerate (NUM_GPUS per machine); only rank 0
    exports (every rank would write the same submission)."""
    result, calls = fake_launch(
        tmp_path, "4", NUM_MACHINES="2", MACHINE_RANK=rank, MAIN_ADDR="node-a", MAIN_PORT="29611"
    )
    assert result.returncode == 0, result.stderr
    assert (
        f"--num_processes 8 --num_machines 2 --machine_rank {rank} --main_process_port 29611 "
        "--main_process_ip node-a -m open_r1.grpo" in calls[0]
    )
    assert [line for line in calls if "open_r1.submission.export" in line] == ([] if rank == "1" else calls[1:])
    assert len(calls) == (2 if rank == "0" else 1)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"NUM_MACHINES": "2"}, "needs GPUs (NUM_GPUS=4) and MAIN_ADDR"),
        ({"NUM_MACHINES": "2", "MACHINE_RANK": "2", "MAIN_ADDR": "a"}, "MACHINE_RANK to this machine's rank, 0 .."),
        ({"NUM_MACHINES": "two"}, "set NUM_MACHINES >= 1"),
    ],
)
def test_bad_machine_settings_are_one_clear_error_before_launch(tmp_path, env, needle):
    result, calls = fake_launch(tmp_path, "4", **env)
    assert result.returncode == 2 and needle in result.stderr and not calls, result.stderr


def test_the_recipes_eval_sets_follow_data_when_its_folder_holds_them(tmp_path):
    """The recipe names /app/data/{ood_val,val}: DATA=<dir>/train takes <dir>/ood_val and <dir>/val where <dir>
    holds both (README's GPU block on a machine without /app); otherwise, or with --eval_sets, the recipe's stand."""
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split).mkdir(parents=True)
    result, calls = fake_launch(tmp_path, "1", DATA=str(data / "train"))
    assert result.returncode == 0 and "--eval_sets" not in calls[0], calls  # ood_val missing: the recipe's sets
    (data / "ood_val").mkdir()
    (tmp_path / "calls").unlink()
    result, calls = fake_launch(tmp_path, "1", DATA=str(data / "train"))
    assert f"--output_dir {tmp_path / 'run'} --eval_sets {data / 'ood_val'} {data / 'val'} --deepspeed" in calls[0]
    assert f"eval_sets from DATA's folder: {data / 'ood_val'} {data / 'val'}" in result.stdout
    (tmp_path / "calls").unlink()
    result, calls = fake_launch(
        tmp_path, "1", "configs/qwen2vl_2b_counting.yaml", "--eval_sets", "x", DATA=str(data / "train")
    )
    assert calls[0].count("--eval_sets") == 1 and "--eval_sets x" in calls[0]


def readme_block(heading: str) -> list[str]:
    """The commands of README's first bash block under `heading`, continuation lines joined."""
    text = open(os.path.join(ROOT, "README.md")).read().split(heading, 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ").splitlines()


@pytest.mark.slow
def test_readme_gpu_block_runs_verbatim_on_a_clean_clone_without_app(tiny_model_dir, tmp_path):
    """README's "On GPUs, from scratch" block, each line as written in a clean clone, but: no installs, the tiny
    model where `hf download` puts the real one, a few scenes per split and a 1-step run (CPU here). Its eval sets
    come from data/ (the recipe names /app/data/...), and its last line, selfcheck, scores the submission."""
    clone = clean_clone(tmp_path / "clone")
    lines = readme_block("## On GPUs, from scratch")
    assert lines[0].startswith("pip install") and lines[1].startswith("hf download"), lines
    shutil.copytree(tiny_model_dir, os.path.join(clone, lines[1].split("--local-dir ")[1].split()[0]))
    small = {"open-r1-scenes": lambda line: re.sub(r"(--[a-z-]+) \d+", r"\1 4", line)}
    small["MODEL_PATH="] = lambda line: line.replace(
        ".yaml",
        ".yaml --max_steps 1 --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --num_generations 4 "
        "--max_completion_length 8 --max_pixels 12544 --eval_limit 2 --eval_batch_size 4",
        1,
    )
    commands = []
    for line in lines[2:]:
        for start, shrink in small.items():
            line = shrink(line) if line.startswith(start) else line
        commands.append(line)
    assert commands[0] != lines[2] and commands[1] != lines[3]  # both shrunk
    env = {
        k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA", "OUTPUT_DIR", "SUBMISSION", "NUM_GPUS")
    }
    env.update(
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=clone,  # the clone's code, also behind the console scripts
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(commands)],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = os.path.join(clone, "data")  # train.sh cds to the clone: DATA=data/train is relative to it
    assert "eval_sets from DATA's folder: data/ood_val data/val" in result.stdout
    report = json.loads(open(os.path.join(clone, "submission", "selfcheck.json")).read())
    assert sorted(report["sets"]) == ["compositional", "ood_val", "val"] and os.path.isdir(data)
    assert json.loads(open(os.path.join(clone, "runs", "qwen2vl_2b_counting", "eval_history.json")).read())


def test_a_second_run_on_one_output_dir_is_refused_while_the_first_trains(tmp_path):
    """Two train.sh on one OUTPUT_DIR would interleave their checkpoints: while one holds OUTPUT_DIR/.train.lock
    (its processes inherit it), a second is one error naming its pid, before the launch; other machines of a run
    don't lock, and the lock goes with the run."""
    lock = tmp_path / "run" / ".train.lock"
    lock.parent.mkdir()
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write_text("4242\n")
        result, calls = fake_launch(tmp_path, "1")
        assert result.returncode == 2 and not calls, result.stdout + result.stderr
        assert result.stderr == (
            f"error: another train.sh (pid 4242) is training into OUTPUT_DIR={tmp_path / 'run'}; wait for it to end, "
            "or use another OUTPUT_DIR\n"
        )
        machines = {"NUM_MACHINES": "2", "MACHINE_RANK": "1", "MAIN_ADDR": "10.0.0.1"}
        result, calls = fake_launch(tmp_path, "1", **machines)
        assert result.returncode == 0 and calls, result.stderr
    (tmp_path / "calls").unlink()
    result, calls = fake_launch(tmp_path, "1")
    assert result.returncode == 0 and "accelerate.commands.launch" in calls[0], result.stderr
