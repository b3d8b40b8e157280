"""The "ood" renderer: a distribution unlike "clevr" on every axis, for out-of-distribution evaluation.

Objects: toy vehicles built from parts (car, bus, truck, bike; planes fly), glossy paint, plain, striped or
checkered, in another palette. Background: tiles, planks, grass or sand receding to a horizon under a day, sunset
or overcast sky, with haze. Camera: low (1.4-2.6 units) and wide (60-72 degrees) from any azimuth. Lighting: a
coloured sun with crisp shadows. Image size: 640x480 (CLEVR: 480x320).
"""

import numpy as np

from .geometry import (
    BOX,
    CYLINDER,
    ELLIPSOID,
    Camera,
    Material,
    Part,
    normalize,
    rotation_x,
    rotation_y,
    rotation_z,
    srgb_to_linear,
)
from .layout import place_discs
from .raytrace import Lighting, SceneSpec

DEFAULT_SIZE = (640, 480)
CATEGORIES = ("car", "bus", "truck", "bike", "plane")
PLURALS = {"car": "cars", "bus": "buses", "truck": "trucks", "bike": "bikes", "plane": "planes"}
COLORS = {
    "red": (200, 30, 35),
    "orange": (240, 120, 20),
    "yellow": (240, 205, 40),
    "green": (40, 150, 60),
    "blue": (30, 80, 200),
    "white": (235, 235, 235),
    "black": (38, 38, 44),
    "pink": (240, 120, 170),
}
TEXTURES = ("plain", "striped", "checkered")
SIZES = {"small": 0.8, "large": 1.15}
GROUNDS = ("tiles", "planks", "grass", "sand")
SKIES = ("day", "sunset", "overcast")

_TEXTURE_KIND = {"striped": "stripes", "checkered": "checker"}
_GLASS = (0.05, 0.07, 0.10)
_TIRE = (0.02, 0.02, 0.02)
_NEAR, _FAR = 5.0, 15.0  # placement distances from the camera
_MIN_GAP = 0.3
# Footprint radius (before the size scale) used for spacing, per category.
_RADIUS = {"car": 1.0, "bus": 1.6, "truck": 1.5, "bike": 0.75, "plane": 1.35}


def _rod(p0, p1, thickness: float):
    """(center, rotation, half) of a thin box from p0 to p1 in the local x-z plane (bike tubes)."""
    p0, p1 = np.asarray(p0, dtype=np.float64), np.asarray(p1, dtype=np.float64)
    delta = p1 - p0
    length = float(np.linalg.norm(delta))
    angle = -np.arctan2(delta[2], delta[0])
    return (p0 + p1) / 2.0, rotation_y(angle), np.array([length / 2.0, thickness, thickness])


def _wheel(x: float, y: float, radius: float, half_width: float):
    # A cylinder's axis is its local z; rotate it onto the vehicle's local y (the axle).
    return CYLINDER, (x, y, radius), (radius, radius, half_width), "tire", rotation_x(np.pi / 2.0)


def _layout(category: str) -> list[tuple]:
    """Parts in vehicle-local coordinates (x forward, z up): (kind, center, half, role[, rotation])."""
    if category == "car":
        parts = [
            (BOX, (0.0, 0.0, 0.42), (1.0, 0.45, 0.2), "body"),
            (BOX, (-0.12, 0.0, 0.77), (0.55, 0.4, 0.16), "glass"),
            (BOX, (-0.12, 0.0, 0.955), (0.5, 0.38, 0.03), "trim"),
            (BOX, (1.0, 0.28, 0.45), (0.02, 0.08, 0.05), "lamp"),
            (BOX, (1.0, -0.28, 0.45), (0.02, 0.08, 0.05), "lamp"),
        ]
        parts += [_wheel(x, y, 0.22, 0.08) for x in (0.6, -0.6) for y in (0.42, -0.42)]
    elif category == "bus":
        parts = [
            (BOX, (0.0, 0.0, 0.95), (1.6, 0.55, 0.62), "body"),
            (BOX, (-0.05, 0.0, 1.2), (1.45, 0.565, 0.2), "glass"),
            (BOX, (1.6, 0.0, 1.1), (0.02, 0.45, 0.28), "glass"),
        ]
        parts += [_wheel(x, y, 0.3, 0.1) for x in (1.0, -1.0) for y in (0.5, -0.5)]
    elif category == "truck":
        parts = [
            (BOX, (1.05, 0.0, 0.78), (0.45, 0.55, 0.48), "body"),
            (BOX, (1.5, 0.0, 1.0), (0.02, 0.47, 0.18), "glass"),
            (BOX, (-0.5, 0.0, 1.02), (1.05, 0.6, 0.68), "cargo"),
        ]
        parts += [_wheel(x, y, 0.3, 0.1) for x in (1.05, -0.25, -1.05) for y in (0.52, -0.52)]
    elif category == "bike":
        parts = [_wheel(x, 0.0, 0.34, 0.035) for x in (0.6, -0.6)]
        for p0, p1 in (
            ((-0.18, 0.0, 0.82), (0.45, 0.0, 0.82)),  # top tube
            ((0.45, 0.0, 0.82), (0.0, 0.0, 0.36)),  # down tube
            ((-0.18, 0.0, 0.86), (0.0, 0.0, 0.36)),  # seat tube
            ((0.0, 0.0, 0.36), (-0.6, 0.0, 0.36)),  # chain stay
            ((-0.18, 0.0, 0.82), (-0.6, 0.0, 0.36)),  # seat stay
            ((0.5, 0.0, 0.95), (0.6, 0.0, 0.36)),  # fork
        ):
            center, rot, half = _rod(p0, p1, 0.035)
            parts.append((BOX, tuple(center), tuple(half), "body", rot))
        parts += [
            (BOX, (0.5, 0.0, 0.96), (0.035, 0.26, 0.03), "trim"),  # handlebar
            (BOX, (-0.2, 0.0, 0.9), (0.13, 0.06, 0.035), "trim"),  # saddle
        ]
    else:  # plane
        parts = [
            (ELLIPSOID, (0.0, 0.0, 0.0), (1.3, 0.22, 0.22), "body"),
            (BOX, (0.1, 0.0, -0.02), (0.33, 1.3, 0.035), "body"),
            (BOX, (-1.1, 0.0, 0.3), (0.17, 0.025, 0.27), "trim"),
            (BOX, (-1.1, 0.0, 0.04), (0.15, 0.5, 0.025), "trim"),
            (ELLIPSOID, (0.55, 0.0, 0.15), (0.35, 0.13, 0.11), "glass"),
        ]
    return parts


def sample_objects(rng: np.random.Generator, n_objects: int, camera: Camera) -> list[dict]:
    """Vehicle attributes and non-overlapping positions inside the camera's view (redrawn when stuck)."""
    camera_xy = camera.position[:2]
    heading = np.arctan2(camera.forward[1], camera.forward[0])  # azimuth of the viewing direction
    half_fov = np.radians(camera.hfov_deg) / 2.0 * 0.8

    def in_view(generator: np.random.Generator, k: int) -> np.ndarray:
        # Uniform over the ground area of a wedge in front of the camera, 5 to 15 units away.
        distance = np.sqrt(generator.uniform(_NEAR**2, _FAR**2, size=k))
        bearing = heading + generator.uniform(-half_fov, half_fov, size=k)
        return camera_xy + np.stack([distance * np.cos(bearing), distance * np.sin(bearing)], axis=1)

    while True:
        categories = [str(rng.choice(CATEGORIES)) for _ in range(n_objects)]
        sizes = [str(rng.choice(list(SIZES))) for _ in range(n_objects)]
        radii = [_RADIUS[c] * SIZES[s] for c, s in zip(categories, sizes)]
        centres = place_discs(rng, radii, in_view, _MIN_GAP)
        if centres is not None:
            break
    objects = []
    for category, size, radius, (x, y) in zip(categories, sizes, radii, centres):
        altitude = float(rng.uniform(0.9, 1.7)) if category == "plane" else 0.0
        objects.append(
            {
                "shape": category,
                "color": str(rng.choice(list(COLORS))),
                "material": "paint",
                "texture": str(rng.choice(TEXTURES, p=[0.5, 0.25, 0.25])),
                "size": size,
                "position": [float(x), float(y), altitude],
                "rotation": float(rng.uniform(0.0, 360.0)),
                "_radius": radius,
                "_trim": str(rng.choice(["white", "black", "silver"])),
            }
        )
    return objects


def object_parts(obj: dict, object_id: int) -> list[Part]:
    scale = SIZES[obj["size"]]
    yaw = rotation_z(np.radians(obj["rotation"]))
    origin = np.array(obj["position"], dtype=np.float64)
    body_color = srgb_to_linear(COLORS[obj["color"]])
    texture = _TEXTURE_KIND.get(obj["texture"], "plain")
    trim_color = {"white": (0.85, 0.85, 0.85), "black": (0.02, 0.02, 0.025), "silver": (0.45, 0.47, 0.5)}[obj["_trim"]]
    # A second colour for stripes/checks that always contrasts with the body.
    accent = np.array((0.9, 0.9, 0.9)) if body_color.mean() < 0.35 else np.array((0.03, 0.03, 0.04))
    materials = {
        "body": Material(body_color, "paint", texture, accent, 3.0),
        "cargo": Material(np.array(trim_color), "paint", texture, body_color, 2.0),
        "trim": Material(np.array(trim_color), "paint"),
        "glass": Material(np.array(_GLASS), "glass"),
        "tire": Material(np.array(_TIRE), "tire"),
        "lamp": Material(np.array((1.0, 0.9, 0.55)), "paint"),
    }
    parts = []
    for kind, center, half, role, *rot in _layout(obj["shape"]):
        world_center = origin + yaw @ (np.asarray(center, dtype=np.float64) * scale)
        rotation = yaw @ rot[0] if rot else yaw @ np.eye(3)
        parts.append(
            Part(kind, world_center, rotation, np.asarray(half, dtype=np.float64) * scale, object_id, materials[role])
        )
    return parts


def footprint(obj: dict) -> tuple[float, float, float] | None:
    """(x, y, radius) on the ground, for contact shadows; None for a plane in the air."""
    return None if obj["shape"] == "plane" else (obj["position"][0], obj["position"][1], 0.5 * obj["_radius"])


_SKY = {
    # horizon, zenith (linear), sun colour, ambient sky, sun elevation range (deg)
    "day": ((0.75, 0.82, 0.9), (0.18, 0.35, 0.75), (1.0, 0.95, 0.85), (0.22, 0.27, 0.36), (35, 65)),
    "sunset": ((0.95, 0.55, 0.3), (0.25, 0.2, 0.45), (1.0, 0.68, 0.4), (0.25, 0.18, 0.24), (12, 25)),
    "overcast": ((0.7, 0.72, 0.74), (0.5, 0.52, 0.56), (0.6, 0.6, 0.62), (0.4, 0.41, 0.44), (45, 75)),
}
_GROUND_COLORS = {
    "tiles": ((0.55, 0.52, 0.48), (0.18, 0.2, 0.24)),
    "planks": ((0.42, 0.24, 0.11), (0.25, 0.13, 0.06)),
    "grass": ((0.12, 0.3, 0.06), (0.22, 0.4, 0.08)),
    "sand": ((0.62, 0.5, 0.33), (0.5, 0.4, 0.26)),
}


def ground_pattern(kind: str, gx: np.ndarray, gy: np.ndarray, footprint: np.ndarray, params: dict) -> np.ndarray:
    """Pattern mix in [0, 1] on the ground plane, fading to its mean where a pixel covers many periods (aliasing)."""
    angle, scale = params["angle"], params["scale"]
    u = gx * np.cos(angle) + gy * np.sin(angle)
    v = -gx * np.sin(angle) + gy * np.cos(angle)
    if kind == "tiles":
        s = np.sin(np.pi * u / scale) * np.sin(np.pi * v / scale)
        sharp = np.clip(s / np.maximum(footprint * (4.0 / scale), 0.05), -1.0, 1.0)
        return 0.5 + 0.5 * sharp
    if kind == "planks":
        plank = np.floor(v / (0.35 * scale))
        tone = np.sin(plank * 12.9898) * 43758.5453
        tone -= np.floor(tone)
        grain = 0.5 + 0.5 * np.sin(u * 9.0 / scale + 3.0 * np.sin(v * 2.1 + plank))
        fade = np.exp(-footprint * 6.0)
        return 0.5 + (0.55 * tone + 0.25 * grain - 0.4) * fade
    # grass / sand: a sum of sinusoids at random orientations, a cheap stand-in for noise
    total = np.zeros_like(gx)
    for freq, theta, phase in params["waves"]:
        total += np.sin(freq * (gx * np.cos(theta) + gy * np.sin(theta)) + phase)
    fade = np.exp(-footprint * 3.0)
    return 0.5 + 0.5 * np.tanh(total * 0.6) * fade


def make_background(camera: Camera, ground_kind: str, ground_params: dict, sky: str, sun_dir, sun_color):
    """Textured, sunlit ground hazing into a sky gradient above the horizon: (3, H, W) display-space float32."""
    horizon, zenith, _, ambient, _ = (np.asarray(c, dtype=np.float32) for c in _SKY[sky])
    gx, gy, row_dir, below = camera.ground_map()  # no roll: the ground is a band of rows
    h, w = gx.shape
    elevation = np.clip(row_dir[:, 2] / np.linalg.norm(row_dir, axis=1), 0.0, 1.0)
    sky_rows = np.sqrt(horizon[:, None] + (zenith - horizon)[:, None] * np.sqrt(elevation)[None, :])
    image = np.empty((3, h, w), dtype=np.float32)
    image[:] = sky_rows[:, :, None]
    ground_rows = np.flatnonzero(below)
    if len(ground_rows):
        top = ground_rows[0]
        gxs, gys = gx[top:].astype(np.float32), gy[top:].astype(np.float32)
        distance = np.hypot(gxs - camera.position[0], gys - camera.position[1])
        # Ground length covered by one pixel (grows with distance squared at grazing angles): fades the texture.
        footprint = distance * distance / np.float32(camera.position[2] * camera.focal_px)
        mix = ground_pattern(ground_kind, gxs, gys, footprint, ground_params).astype(np.float32)
        color_a, color_b = (np.asarray(c, dtype=np.float32) for c in _GROUND_COLORS[ground_kind])
        albedo = color_b[:, None, None] + (color_a - color_b)[:, None, None] * mix[None]
        irradiance = (np.asarray(sun_color) * max(float(sun_dir[2]), 0.0) + ambient * 1.3).astype(np.float32)
        lit = np.sqrt(np.clip(albedo * irradiance[:, None, None], 0.0, 1.0))
        haze = np.exp(-distance / np.float32(28.0))[None]
        image[:, top:] = lit * haze + np.sqrt(horizon)[:, None, None] * (1.0 - haze)
    return image


def build_spec(rng: np.random.Generator, n_objects: int, condition: str | None, width: int, height: int):
    """An OOD scene: (SceneSpec, objects metadata, environment). ``condition`` is ignored (no CoGenT here)."""
    azimuth = rng.uniform(0.0, 2.0 * np.pi)
    distance = rng.uniform(8.5, 11.0)
    target = np.array([0.0, 0.0, 0.4])
    position = np.array([distance * np.cos(azimuth), distance * np.sin(azimuth), rng.uniform(1.4, 2.6)])
    camera = Camera(position, target, rng.uniform(60.0, 72.0), width, height)

    sky = str(rng.choice(SKIES))
    horizon, zenith, sun_color, ambient, (el_lo, el_hi) = _SKY[sky]
    elevation = np.radians(rng.uniform(el_lo, el_hi))
    sun_azimuth = rng.uniform(0.0, 2.0 * np.pi)
    sun_dir = np.array(
        [np.cos(sun_azimuth) * np.cos(elevation), np.sin(sun_azimuth) * np.cos(elevation), np.sin(elevation)]
    )
    sun = np.asarray(sun_color) * rng.uniform(0.9, 1.1)
    ambient = np.asarray(ambient)
    lighting = Lighting(
        key_dir=sun_dir,
        key_color=sun,
        fill_dir=normalize(np.array([-sun_dir[0], -sun_dir[1], 0.6])),
        fill_color=ambient * 0.6,
        back_dir=np.array([0.0, 0.0, 1.0]),
        back_color=ambient * 0.5,
        sky_ambient=ambient * 1.2,
        ground_ambient=ambient * 0.4,
        env_floor=np.asarray(_GROUND_COLORS["sand"][1]) * 0.6,
        env_horizon=np.asarray(horizon),
        env_zenith=np.asarray(zenith),
        ground_shadow_strength=0.5 if sky != "overcast" else 0.3,
        shadow_blur=0.003 if sky != "overcast" else 0.008,
        contact_shadow=0.25,
    )
    objects = sample_objects(rng, n_objects, camera)
    parts = [part for i, obj in enumerate(objects) for part in object_parts(obj, i)]
    ground_kind = str(rng.choice(GROUNDS))
    ground_params = {
        "angle": float(rng.uniform(0.0, np.pi)),
        "scale": float(rng.uniform(0.8, 1.5)),
        "waves": [
            (float(rng.uniform(1.5, 7.0)), float(rng.uniform(0, np.pi)), float(rng.uniform(0, 6.3))) for _ in range(4)
        ],
    }
    background = lambda cam: make_background(cam, ground_kind, ground_params, sky, sun_dir, sun)  # noqa: E731
    spec = SceneSpec(camera, parts, n_objects, lighting, background, [footprint(obj) for obj in objects])
    return spec, objects, {"ground": ground_kind, "sky": sky}
