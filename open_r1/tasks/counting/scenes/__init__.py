"""Synthetic CLEVR-style counting data: a numpy ray caster, two renderers, questions, and dataset splits.

Renderers:
  * ``"clevr"`` (open_r1/tasks/counting/scenes/clevr.py): CLEVR look-alike scenes (cubes, spheres, cylinders; 8 colours; rubber
    or metal; small or large; 3-10 objects on a gray floor; shadows; jittered camera and lights; 480x320), with
    CoGenT conditions A and B;
  * ``"ood"`` (open_r1/tasks/counting/scenes/ood.py): toy vehicles built from parts on textured ground under a sky, seen from a
    low wide-angle camera (640x480): a different distribution on every axis.

The ray caster (raytrace.py, geometry.py) intersects whole arrays of rays with analytic primitives, culled per
object by screen rectangles, and keeps an object-id buffer; a layout is redrawn until every object has enough
visible pixels, so the gold count is exactly the number of ids in that buffer.

Public API (imported lazily, so ``import open_r1.tasks.counting.scenes`` stays cheap):
  * ``render_scene(rng_or_seed, renderer="clevr", condition="A", image_size=None, min_objects=3, max_objects=10,
    min_visible_pixels=None) -> (PIL.Image, scene dict, id buffer)``;
  * ``build_split(split, n, seed=0, questions="default", image_size=None, workers=1, progress=True)
    -> datasets.Dataset`` for split in train / val / compositional / ood_val;
  * ``write_splits(out_dir, sizes, seed=0, overwrite=False, workers=None, questions="default", image_size=None,
    ood_image_size=None) -> {split: path}``;
  * ``SceneArgumentError`` for bad arguments; ``main`` is the command line (``python -m open_r1.tasks.counting.scenes``).
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import SceneArgumentError, SceneGenerationError

_LAZY = {
    "render_scene": "render",
    "scene_fingerprint": "render",
    "default_min_visible_pixels": "render",
    "RENDERERS": "render",
    "build_split": "dataset",
    "write_splits": "dataset",
    "assert_disjoint": "dataset",
    "example_seeds": "dataset",
    "SPLITS": "dataset",
    "TOTAL_QUESTION": "questions",
    "DIFFERENT_QUESTION": "questions",
    "count_matching": "questions",
    "main": "cli",
}
__all__ = ["SceneArgumentError", "SceneGenerationError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
