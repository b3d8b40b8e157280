"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One torch/OpenMP thread per test process (and the subprocesses tests start, which inherit it). The tiny models are
# overhead-bound, and on a shared 2-core machine two OpenMP threads wait for each other: tests/test_export.py +
# tests/test_tiny_model.py took 205 s with the default and 78 s with one thread there (2026-12-01, load ~4.5).
# Set OMP_NUM_THREADS yourself to override.
os.environ.setdefault("OMP_NUM_THREADS", "1")
try:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
except (ImportError, ValueError):
    pass


MODEL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """family -> a tiny checkpoint of that family (open_r1.tiny_models.build_tiny, seed 0), each built on first use
    and once per test session (~1 s each). Shared by all tests, so treat them as read-only."""
    from open_r1.tiny_models import build_tiny

    class TinyModelDirs(dict):
        def __missing__(self, family: str) -> Path:
            self[family] = build_tiny(family, tmp_path_factory.mktemp(f"tiny_{family}") / "model", seed=0)
            return self[family]

    return TinyModelDirs()


@pytest.fixture(scope="session", params=MODEL_FAMILIES)
def family(request) -> str:
    """Parametrises a test over the supported model families (open_r1.families)."""
    return request.param


@pytest.fixture(scope="session")
def family_model_dir(tiny_model_dirs, family) -> Path:
    """The tiny checkpoint of the `family` under test."""
    return tiny_model_dirs[family]


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_dirs) -> Path:
    """A tiny Qwen2-VL checkpoint (open_r1.tiny_models, seed 0), built once per test session (~1 s).

    Laid out like Qwen/Qwen2-VL-2B-Instruct: load it with AutoProcessor / Qwen2VLForConditionalGeneration
    `.from_pretrained`. Shared by all tests, so treat it as read-only.
    """
    return tiny_model_dirs["qwen2_vl"]


@pytest.fixture(scope="session")
def scene_data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Small generated splits (train/val/compositional/ood_val, and ood_train for the warm start's exposure rows;
    save_to_disk layout) shared by the tests."""
    from open_r1.tasks.counting.scenes import write_splits

    out = tmp_path_factory.mktemp("scenes") / "data"
    write_splits(str(out), {"train": 8, "val": 6, "compositional": 4, "ood_val": 6, "ood_train": 4}, seed=0, workers=1)
    return str(out)
