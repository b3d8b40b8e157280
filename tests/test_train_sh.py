"""The demo recipe end to end through train.sh (CPU): GRPO -> export -> selfcheck."""
import json
import os
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
        ["bash", "train.sh", "configs/demo.yaml", "--max_steps", "2", "--max_pixels", "12544",
         "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "16"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "submission ready" in result.stdout
    meta = json.loads((tmp_path / "run" / "training_meta.json").read_text())
    assert meta["max_pixels"] == 12544 and meta["reward_funcs"][0] == "exact_count"

    report = tmp_path / "selfcheck.json"
    check = subprocess.run(
        [sys.executable, "selfcheck.py", "--model", str(tmp_path / "submission"), "--sets",
         os.path.join(scene_data_dir, "val"), os.path.join(scene_data_dir, "ood_val"), "--limit", "4",
         "--out", str(report), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert "| ood_val | 4 |" in check.stdout
    assert json.loads(report.read_text())["sets"]["val"]["n"] == 4


def test_train_sh_unknown_recipe_is_one_clear_error():
    result = subprocess.run(["bash", "train.sh", "configs/nope.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2 and "error: recipe configs/nope.yaml not found" in result.stderr
