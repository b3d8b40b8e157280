"""``render_scene``: sample a scene from a renderer, redraw its layout until every object is visible enough to
count (as CLEVR's generator does), then shade it. The gold count is the number of ids in the object-id buffer.
"""

import hashlib
import json
import re
from typing import Any

import numpy as np
from PIL import Image

from open_r1.checks import is_int
from open_r1.errors import SceneArgumentError, SceneGenerationError

from . import clevr, ood
from .raytrace import RayCaster

RENDERERS = {"clevr": clevr, "ood": ood}
MAX_OBJECTS = 15
MAX_LAYOUT_ATTEMPTS = 300
_MIN_SIDE, _MAX_SIDE = 32, 4096


def default_min_visible_pixels(width: int, height: int) -> int:
    return max(16, round(200 * width * height / (480 * 320)))  # CLEVR's 200 pixels at 480x320, scaled by area


def parse_image_size(image_size: Any, renderer: str = "clevr") -> tuple[int, int]:
    """None (the renderer's default), (width, height), or a "WIDTHxHEIGHT" string -> (width, height)."""
    if image_size is None:
        return RENDERERS[renderer].DEFAULT_SIZE
    if isinstance(image_size, str):
        match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", image_size)
        if not match:
            raise SceneArgumentError(f"image size {image_size!r} is not WIDTHxHEIGHT; use e.g. 480x320")
        width, height = int(match.group(1)), int(match.group(2))
    else:
        try:
            width, height = (int(v) for v in image_size)
        except (TypeError, ValueError):
            raise SceneArgumentError(f"image size {image_size!r} is not (width, height); use e.g. (480, 320)") from None
    if not (_MIN_SIDE <= width <= _MAX_SIDE and _MIN_SIDE <= height <= _MAX_SIDE):
        raise SceneArgumentError(
            f"image size {width}x{height} is out of range; each side must be between {_MIN_SIDE} and {_MAX_SIDE}"
        )
    return width, height


def validate_scene_args(renderer: str, condition: str | None, min_objects: int, max_objects: int) -> None:
    if renderer not in RENDERERS:
        raise SceneArgumentError(f"unknown renderer {renderer!r}; choose one of: {', '.join(RENDERERS)}")
    if renderer == "clevr" and condition not in clevr.CONDITIONS:
        choices = ", ".join(clevr.CONDITIONS)
        raise SceneArgumentError(f"unknown CoGenT condition {condition!r}; choose one of: {choices}")
    for name, value in (("min_objects", min_objects), ("max_objects", max_objects)):
        if not is_int(value):
            raise SceneArgumentError(f"{name} must be an integer, got {value!r}")
    if min_objects < 1:
        raise SceneArgumentError(f"min_objects must be at least 1, got {min_objects}")
    if min_objects > max_objects:
        raise SceneArgumentError(
            f"min_objects ({min_objects}) is greater than max_objects ({max_objects}); "
            "lower min_objects or raise max_objects"
        )
    if max_objects > MAX_OBJECTS:
        raise SceneArgumentError(f"max_objects must be at most {MAX_OBJECTS}, got {max_objects}")


def as_generator(rng_or_seed: Any) -> np.random.Generator:
    """numpy's default_rng (a Generator comes back as it is) for the seeds the generator accepts."""
    if is_int(rng_or_seed) and rng_or_seed < 0:
        raise SceneArgumentError(f"seed must be a non-negative integer, got {rng_or_seed}")
    if is_int(rng_or_seed) or isinstance(rng_or_seed, (np.random.Generator, np.random.SeedSequence)):
        return np.random.default_rng(rng_or_seed)
    raise SceneArgumentError(
        f"expected an int seed, a SeedSequence or a numpy Generator, got {type(rng_or_seed).__name__}"
    )


def scene_fingerprint(scene: dict | str) -> str:
    """Hash of a scene's content (renderer, image size, camera, objects' attributes and poses): not its question or
    visibility statistics, so two examples of one scene collide."""
    if isinstance(scene, str):
        scene = json.loads(scene)
    keys = ("shape", "color", "material", "size", "texture", "position", "rotation")
    content = {k: scene[k] for k in ("renderer", "image_size", "camera")}
    content["objects"] = [{k: obj[k] for k in keys if k in obj} for obj in scene["objects"]]
    return hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _describe(renderer, condition, camera, key_dir, environment, objects, object_ids, attempts) -> dict:
    ids = object_ids.reshape(-1)
    visible = np.flatnonzero(ids >= 0)
    owner = ids[visible]
    counts = np.bincount(owner, minlength=len(objects))
    rows, cols = np.divmod(visible, camera.width)
    described = []
    for i, obj in enumerate(objects):
        x, y = cols[owner == i], rows[owner == i]
        described.append(
            {
                "id": i,
                **{k: v for k, v in obj.items() if not k.startswith("_")},
                "position": [round(float(v), 4) for v in obj["position"]],
                "rotation": round(float(obj["rotation"]), 2),
                # Visible extent in pixels: [x0, y0, x1, y1], x1/y1 exclusive.
                "bbox": [int(x.min()), int(y.min()), int(x.max()) + 1, int(y.max()) + 1],
                "visible_pixels": int(counts[i]),
            }
        )
    return {
        "renderer": renderer,
        "condition": condition if renderer == "clevr" else None,
        "image_size": [camera.width, camera.height],
        "camera": camera.describe(),
        "key_light_dir": [round(float(v), 4) for v in key_dir],
        "environment": environment,
        "count": len(objects),
        "layout_attempts": attempts,
        "objects": described,
    }


def render_scene(
    rng_or_seed: Any = 0,
    renderer: str = "clevr",
    condition: str | None = "A",
    image_size: Any = None,
    min_objects: int = 3,
    max_objects: int = 10,
    min_visible_pixels: int | None = None,
    anti_alias: bool = True,
) -> tuple[Image.Image, dict, np.ndarray]:
    """Render one scene: (RGB PIL image, scene dict, object-id buffer (H, W) int32 with -1 for background).

    The number of objects is uniform in [min_objects, max_objects]; layouts are redrawn (same count) until every
    object has at least ``min_visible_pixels`` visible pixels (default: CLEVR's 200 at 480x320, scaled by area).
    ``condition`` is the CoGenT condition ("A" or "B") for the clevr renderer and is ignored by "ood".
    """
    validate_scene_args(renderer, condition, min_objects, max_objects)
    width, height = parse_image_size(image_size, renderer)
    if min_visible_pixels is None:
        min_visible_pixels = default_min_visible_pixels(width, height)
    elif not is_int(min_visible_pixels) or min_visible_pixels < 1:
        raise SceneArgumentError(f"min_visible_pixels must be a positive integer, got {min_visible_pixels!r}")
    rng = as_generator(rng_or_seed)
    module = RENDERERS[renderer]
    n_objects = int(rng.integers(min_objects, max_objects + 1))
    for attempt in range(1, MAX_LAYOUT_ATTEMPTS + 1):
        spec, objects, environment = module.build_spec(rng, n_objects, condition, width, height)
        caster = RayCaster(spec)
        trace = caster.trace()
        visible = np.bincount(trace.object_ids[trace.object_ids >= 0], minlength=n_objects)
        if visible.min() >= min_visible_pixels:
            break
    else:
        raise SceneGenerationError(
            f"could not lay out {n_objects} objects with at least {min_visible_pixels} visible pixels each in "
            f"{MAX_LAYOUT_ATTEMPTS} attempts at {width}x{height}; lower min_visible_pixels or max_objects, or use a "
            f"larger image"
        )
    pixels = caster.render(anti_alias=anti_alias)
    scene = _describe(
        renderer, condition, spec.camera, spec.lighting.key_dir, environment, objects, trace.object_ids, attempt
    )
    return Image.fromarray(pixels), scene, trace.object_ids
