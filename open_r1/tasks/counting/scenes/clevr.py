"""The "clevr" renderer: CLEVR-like scenes (Johnson et al., 2017) for the numpy ray caster, following CLEVR's
generator where it matters for counting: cubes, spheres, cylinders in its 8 colours, rubber or metal, small or large
(cubes shrunk by 1/sqrt(2)), spaced on [-3, 3]^2; CoGenT palettes (B swaps A's cube and cylinder colours); its
camera (49 degrees) and key/fill/back lights, jittered per scene; a light-gray floor with a soft gradient.
"""

import numpy as np

from .geometry import BOX, CYLINDER, ELLIPSOID, Camera, Material, Part, normalize, rotation_z, srgb_to_linear
from .layout import place_discs
from .raytrace import Lighting, SceneSpec

DEFAULT_SIZE = (480, 320)
SHAPES = ("cube", "sphere", "cylinder")
# CLEVR's colour names and sRGB values (clevr-dataset-gen, data/properties.json).
COLORS = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
MATERIALS = ("rubber", "metal")
SIZES = {"large": 0.7, "small": 0.35}
COGENT_PALETTES = {
    "A": {"cube": ("gray", "blue", "brown", "yellow"), "cylinder": ("red", "green", "purple", "cyan")},
    "B": {"cube": ("red", "green", "purple", "cyan"), "cylinder": ("gray", "blue", "brown", "yellow")},
}
CONDITIONS = tuple(COGENT_PALETTES)

_CAMERA_BASE = np.array([7.36, -6.93, 4.96])
_KEY_BASE = np.array([5.5, 0.5, 7.0])
_FILL_BASE = np.array([-4.67, -4.01, 3.01])
_BACK_BASE = np.array([-1.19, 2.64, 5.79])
_AREA_HALF_WIDTH = 3.0
_MIN_GAP = 0.25
_FLOOR_ALBEDO = 0.30  # linear; a light gray floor, as in CLEVR


def _uniform_in_square(rng: np.random.Generator, k: int) -> np.ndarray:
    return rng.uniform(-_AREA_HALF_WIDTH, _AREA_HALF_WIDTH, size=(k, 2))


def sample_objects(rng: np.random.Generator, n_objects: int, condition: str) -> list[dict]:
    """Attributes and non-overlapping ground positions for n objects (redrawn when a layout gets stuck)."""
    while True:
        sizes = [str(rng.choice(list(SIZES))) for _ in range(n_objects)]
        shapes = [str(rng.choice(SHAPES)) for _ in range(n_objects)]
        centres = place_discs(rng, [SIZES[s] for s in sizes], _uniform_in_square, _MIN_GAP)
        if centres is not None:
            break
    objects = []
    for size, shape, (x, y) in zip(sizes, shapes, centres):
        radius = SIZES[size]
        objects.append(
            {
                "shape": shape,
                "color": str(rng.choice(COGENT_PALETTES[condition].get(shape, tuple(COLORS)))),  # spheres: any
                "material": str(rng.choice(MATERIALS)),
                "size": size,
                "position": [float(x), float(y), radius if shape != "cube" else radius / np.sqrt(2.0)],
                "rotation": float(rng.uniform(0.0, 360.0)),
                "_radius": radius,
            }
        )
    return objects


def object_parts(obj: dict, object_id: int) -> list[Part]:
    radius = obj["_radius"]
    material = Material(albedo=srgb_to_linear(COLORS[obj["color"]]), kind=obj["material"])
    rot = rotation_z(np.radians(obj["rotation"]))
    center = np.array(obj["position"], dtype=np.float64)
    shapes = {"cube": (BOX, radius / np.sqrt(2.0)), "sphere": (ELLIPSOID, radius), "cylinder": (CYLINDER, radius)}
    kind, half = shapes[obj["shape"]]
    return [Part(kind, center, rot, np.full(3, half), object_id, material)]


def footprint(obj: dict) -> tuple[float, float, float]:
    """(x, y, radius) on the floor, for contact shadows (a sphere touches it in a small patch)."""
    return obj["position"][0], obj["position"][1], obj["_radius"] if obj["shape"] != "sphere" else 0.55 * obj["_radius"]


def _jitter(rng: np.random.Generator, base: np.ndarray, amount: float) -> np.ndarray:
    return base + rng.uniform(-amount, amount, size=3)


def sample_view(rng: np.random.Generator, width: int, height: int) -> tuple[Camera, Lighting]:
    camera = Camera(_jitter(rng, _CAMERA_BASE, 0.5), [0.0, 0.0, 0.0], 49.13, width, height)
    key_strength = rng.uniform(0.85, 1.05)
    white = np.ones(3)
    lighting = Lighting(
        key_dir=normalize(_jitter(rng, _KEY_BASE, 1.0)),
        key_color=white * key_strength,
        fill_dir=normalize(_jitter(rng, _FILL_BASE, 1.0)),
        fill_color=white * 0.22,
        back_dir=normalize(_jitter(rng, _BACK_BASE, 1.0)),
        back_color=white * 0.18,
        sky_ambient=white * 0.20,
        ground_ambient=white * 0.10,
        env_floor=white * 0.30,
        env_horizon=white * 0.40,
        env_zenith=white * 0.12,
        ground_shadow_strength=0.42,
        shadow_blur=0.007,
        contact_shadow=0.30,
    )
    return camera, lighting


def floor_background(camera: Camera, key_dir: np.ndarray, key_strength: float) -> np.ndarray:
    """Gray floor lit by a distant key light with a soft falloff, computed on a coarse grid and upsampled."""
    from PIL import Image

    w, h = camera.width, camera.height
    gw, gh = max(w // 8, 2), max(h // 8, 2)
    gx = (np.arange(gw) + 0.5) * (w / gw)
    gy = (np.arange(gh) + 0.5) * (h / gh)
    px, py = np.meshgrid(gx, gy)
    dirs = camera.ray_dirs(px.ravel(), py.ravel())
    t = -camera.position[2] / np.minimum(dirs[2], -1e-3)
    ground = camera.position[:, None] + dirs * t
    # A key lamp at a finite distance: brighter where the floor is nearer to it (CLEVR's lamps are area lights).
    to_lamp = (key_dir * 12.0)[:, None] - ground
    dist2 = (to_lamp * to_lamp).sum(axis=0)
    cos = np.clip(to_lamp[2] / np.sqrt(dist2), 0.0, 1.0)
    irradiance = 0.30 + 0.95 * key_strength * cos * (144.0 / dist2) ** 0.6
    display = np.sqrt(np.clip(_FLOOR_ALBEDO * irradiance, 0.0, 1.0)).astype(np.float32).reshape(gh, gw)
    full = np.asarray(Image.fromarray(display).resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
    return full[None]  # gray: one plane, broadcast to three by the ray caster


def build_spec(rng: np.random.Generator, n_objects: int, condition: str, width: int, height: int):
    """A CLEVR scene: (SceneSpec, objects metadata, environment description)."""
    camera, lighting = sample_view(rng, width, height)
    objects = sample_objects(rng, n_objects, condition)
    parts = [part for i, obj in enumerate(objects) for part in object_parts(obj, i)]
    key_strength = float(lighting.key_color[0])
    background = lambda cam: floor_background(cam, lighting.key_dir, key_strength)  # noqa: E731
    spec = SceneSpec(camera, parts, n_objects, lighting, background, [footprint(obj) for obj in objects])
    return spec, objects, {"ground": "gray floor"}
