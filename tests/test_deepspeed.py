"""GRPO under DeepSpeed, run for real on CPU (DeepSpeed's CPU accelerator), one process per run: skipped where
DeepSpeed is not installed (CI; `pip install -e '.[gpu]'` brings it). ZeRO-3 (train.sh's zero3.json) and ZeRO-2
(experiments/bench/zero2.json) must train every parameter as the run without DeepSpeed does (ZeRO-3 once dropped the
vision tower's gradients), and keep, through their fp32 master weights, the small updates that bf16 weights round away.
"""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_grpo import FAST_RECIPE

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs DeepSpeed")
ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"zero3": "zero3.json", "zero2": "experiments/bench/zero2.json"}
RUN = """
import sys, zlib
import torch
torch.Tensor.record_stream = lambda self, stream=None: None  # DeepSpeed's zero_grad calls it, a no-op on CPU
from open_r1 import grpo, rewards
from open_r1.tasks.counting.protocol import completion_text
def varied(completions, **kwargs):  # distinct texts, distinct rewards: every parameter gets a gradient
    return [float(zlib.crc32(completion_text(c).encode()) % 97) for c in completions]
rewards.get_reward_funcs = lambda names, kwargs=None: [varied]
raise SystemExit(grpo.cli(sys.argv[1:]))
"""


def train(tiny_model_dir, scene_data_dir, out: Path, config: str | None, *extra) -> dict:
    """open_r1.grpo in its own process (DeepSpeed's state is process-wide); the saved weights by name."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OPEN_R1_ALLOW_CPU": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    argv = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_name",
        os.path.join(scene_data_dir, "train"),
        "--output_dir",
        str(out),
        *FAST_RECIPE,
        "--learning_rate",
        "0.01",
        "--bf16",
        "false",
        *extra,
        *(["--deepspeed", CONFIGS[config]] if config else []),
    ]
    done = subprocess.run(
        [sys.executable, "-c", RUN, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return weights(out)


BF16 = (
    "--dtype",
    "bfloat16",
    "--bf16",
    "true",
    "--max_steps",
    "16",
    "--learning_rate",
    "1e-3",
    "--lr_scheduler_type",
    "constant",
    "--warmup_steps",
    "0",
)


@pytest.fixture(scope="module")
def without_deepspeed(tiny_model_dir, scene_data_dir, tmp_path_factory) -> dict:
    """The runs without DeepSpeed that each config is held against, trained once: fp32 one step, bf16 16 steps."""
    out = tmp_path_factory.mktemp("plain")
    return {
        "fp32": train(tiny_model_dir, scene_data_dir, out / "fp32", None),
        "bf16": train(tiny_model_dir, scene_data_dir, out / "bf16", None, *BF16),
    }


def weights(path) -> dict:
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("config", ["zero3", "zero2"])
def test_one_step_trains_every_parameter_as_without_deepspeed(
    tiny_model_dir, scene_data_dir, tmp_path, config, without_deepspeed
):
    start, plain = weights(tiny_model_dir), without_deepspeed["fp32"]
    zero = train(tiny_model_dir, scene_data_dir, tmp_path / config, config)
    assert not [n for n in start if torch.equal(start[n], zero[n])], "parameters that did not change"
    for name in start:
        step, step_zero = plain[name] - start[name], zero[name] - start[name]
        assert float((step_zero - step).norm()) <= 1e-4 * float(step.norm()) + 1e-9, name


@pytest.mark.parametrize("config", ["zero3", "zero2"])
def test_fp32_master_weights_keep_the_updates_bf16_rounds_away(
    tiny_model_dir, scene_data_dir, tmp_path, config, without_deepspeed
):
    """Steps of 1e-3 on a weight of 1.0 (the RMSNorm's, bf16 spacing 2**-7): each rounds away in bf16 weights, so
    only an fp32 master copy adds them up into a change."""
    plain = without_deepspeed["bf16"]
    zero = train(tiny_model_dir, scene_data_dir, tmp_path / config, config, *BF16)
    norm = "model.language_model.norm.weight"
    start = weights(tiny_model_dir)[norm].to(torch.bfloat16).float()
    assert torch.equal(plain[norm], start)  # the bf16 run lost every one of its 16 steps
    assert not torch.equal(zero[norm], start)
