"""Shared pytest fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-VL checkpoint (open_r1.tiny_models, seed 0), built once per test session (~1 s).

    Laid out like Qwen/Qwen2-VL-2B-Instruct: load it with AutoProcessor / Qwen2VLForConditionalGeneration
    `.from_pretrained`. Shared by all tests, so treat it as read-only.
    """
    from open_r1.tiny_models import build_qwen2vl

    return build_qwen2vl(tmp_path_factory.mktemp("tiny_qwen2vl") / "model", seed=0)


@pytest.fixture(scope="session")
def scene_data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Small generated splits (train/val/compositional/ood_val, and ood_train for the warm start's exposure rows;
    save_to_disk layout) shared by the tests."""
    from open_r1.tasks.counting.scenes import write_splits

    out = tmp_path_factory.mktemp("scenes") / "data"
    write_splits(str(out), {"train": 8, "val": 6, "compositional": 4, "ood_val": 6, "ood_train": 4}, seed=0, workers=1)
    return str(out)
