"""Synthetic CLEVR-style counting data: a numpy ray caster, two renderers, questions and dataset splits.

Renderers: "clevr" (clevr.py: CLEVR look-alikes, CoGenT conditions A and B, 480x320) and "ood" (ood.py: toy
vehicles on textured ground under a sky, 640x480). Public names are imported lazily so that importing the package
loads no numpy before the command line (``main``, cli.py) has set its BLAS thread limits.
"""

import importlib
from typing import Any

from open_r1.errors import SceneArgumentError, SceneGenerationError

_LAZY = {
    "render_scene": "render",
    "scene_fingerprint": "render",
    "build_split": "dataset",
    "write_splits": "dataset",
    "assert_disjoint": "dataset",
    "example_seeds": "dataset",
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
