"""Cameras and analytic primitives for the numpy ray caster.

An object is one or more *parts*: an oriented box, ellipsoid or capped cylinder given by a centre, a rotation
(columns: the local axes in world coordinates) and half extents (a cylinder's: radius, radius, half-height).
For a whole array of rays a part gives the interval ``[t_in, t_out]`` inside it (``t_in > t_out``: a miss); a
shadow test asks whether it reaches past the ray's origin, so a ground point *under* an object is shadowed too
(no light leak at the contact line). Normals come from the hit point alone.
"""

from dataclasses import dataclass, field

import numpy as np

BOX, ELLIPSOID, CYLINDER = "box", "ellipsoid", "cylinder"
_TINY = 1e-12


def rotation_z(angle_rad: float) -> np.ndarray:
    """Rotation about the vertical (world z) axis."""
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def rotation_y(angle_rad: float) -> np.ndarray:
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rotation_x(angle_rad: float) -> np.ndarray:
    c, s = np.cos(angle_rad), np.sin(angle_rad)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def normalize(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def srgb_to_linear(rgb) -> np.ndarray:
    """0-255 sRGB -> linear [0, 1] (gamma 2.2)."""
    return (np.asarray(rgb, dtype=np.float64) / 255.0) ** 2.2


@dataclass
class Material:
    """How a part reflects light. Colours are linear RGB in [0, 1]."""

    albedo: np.ndarray
    kind: str = "rubber"  # rubber (matte), metal (mirror-like, tinted), paint (glossy dielectric), glass, tire
    texture: str = "plain"  # plain | stripes | checker (OOD only), evaluated in the part's local coordinates
    texture_color: np.ndarray | None = None
    texture_scale: float = 4.0


@dataclass
class Part:
    kind: str
    center: np.ndarray
    rotation: np.ndarray
    half: np.ndarray
    object_id: int
    material: Material
    corners: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.center = np.asarray(self.center, dtype=np.float64)
        self.rotation = np.asarray(self.rotation, dtype=np.float64)
        self.half = np.asarray(self.half, dtype=np.float64)
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)
        # The 8 corners (8, 3) of the part's local bounding box in world coordinates, for screen-space culling.
        self.corners = self.center + (signs * self.half) @ self.rotation.T

    # -- ray intervals ---------------------------------------------------------------------------------------
    def interval(self, origins: np.ndarray, dirs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(t_in, t_out) for rays ``origins + t * dirs``, each (3, N) or one (3,) vector shared by all rays."""
        rot_t = self.rotation.T
        if origins.ndim == 1:
            o = (rot_t @ (origins - self.center))[:, None]
        else:
            o = rot_t @ (origins - self.center[:, None])
        d = rot_t @ dirs
        if d.ndim == 1:
            d = d[:, None]
        if self.kind == BOX:
            return _box_interval(o, d, self.half[:, None])
        if self.kind == ELLIPSOID:
            return _ellipsoid_interval(o, d, self.half[:, None])
        return _cylinder_interval(o, d, self.half[0], self.half[2])

    def surface(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World normals, a face code (one per flat face, for edge anti-aliasing) and local coordinates of surface
        points (3, N)."""
        p = self.rotation.T @ (points - self.center[:, None])  # local coordinates
        if self.kind == BOX:
            ratio = np.abs(p) / self.half[:, None]
            axis = np.argmax(ratio, axis=0)
            columns = np.arange(p.shape[1])
            sign = np.sign(p[axis, columns])
            n_local = np.zeros_like(p)
            n_local[axis, columns] = sign
            face = axis * 2 + (sign > 0)
            return self.rotation @ n_local, face, p  # already unit length
        if self.kind == ELLIPSOID:
            n_local = p / (self.half**2)[:, None]
            face = np.zeros(p.shape[1], dtype=np.int64)
        else:
            radial = np.sqrt(p[0] ** 2 + p[1] ** 2) / self.half[0]
            on_cap = np.abs(p[2]) / self.half[2] >= radial
            n_local = np.empty_like(p)
            n_local[0] = np.where(on_cap, 0.0, p[0])
            n_local[1] = np.where(on_cap, 0.0, p[1])
            n_local[2] = np.where(on_cap, np.sign(p[2]), 0.0)
            face = np.where(on_cap, 1 + (p[2] > 0), 0)
        normals = self.rotation @ n_local
        return normals / np.sqrt((normals * normals).sum(axis=0)), face, p


def _box_interval(o, d, half):
    inv = 1.0 / np.where(np.abs(d) < _TINY, _TINY, d)
    t1 = (-half - o) * inv
    t2 = (half - o) * inv
    t_in = np.minimum(t1, t2).max(axis=0)
    t_out = np.maximum(t1, t2).min(axis=0)
    return t_in, t_out


def _ellipsoid_interval(o, d, radii):
    o = o / radii
    d = d / radii
    a = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
    b = o[0] * d[0] + o[1] * d[1] + o[2] * d[2]
    c = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] - 1.0
    disc = b * b - a * c
    miss = disc < 0
    root = np.sqrt(np.where(miss, 0.0, disc))
    t_in = np.where(miss, np.inf, (-b - root) / a)
    t_out = np.where(miss, -np.inf, (-b + root) / a)
    return t_in, t_out


def _cylinder_interval(o, d, radius, half_height):
    ox, oy, oz = o[0], o[1], o[2]
    dx, dy, dz = d[0], d[1], d[2]
    a = dx * dx + dy * dy
    b = ox * dx + oy * dy
    c = ox * ox + oy * oy - radius * radius
    disc = b * b - a * c
    parallel = a < _TINY
    inside = c <= 0
    root = np.sqrt(np.maximum(disc, 0.0))
    safe_a = np.where(parallel, 1.0, a)
    # Rays parallel to the axis are inside the infinite cylinder for all t or for none.
    side_in = np.where(parallel, np.where(inside, -np.inf, np.inf), (-b - root) / safe_a)
    side_out = np.where(parallel, np.where(inside, np.inf, -np.inf), (-b + root) / safe_a)
    miss = (disc < 0) & ~parallel
    side_in[miss] = np.inf
    side_out[miss] = -np.inf
    inv_dz = 1.0 / np.where(np.abs(dz) < _TINY, _TINY, dz)
    z1 = (-half_height - oz) * inv_dz
    z2 = (half_height - oz) * inv_dz
    return np.maximum(side_in, np.minimum(z1, z2)), np.minimum(side_out, np.maximum(z1, z2))


class Camera:
    """A pinhole camera looking from ``position`` at ``target`` with world z up."""

    def __init__(self, position, target, hfov_deg: float, width: int, height: int):
        self.position = np.asarray(position, dtype=np.float64)
        self.target = np.asarray(target, dtype=np.float64)
        self.hfov_deg = float(hfov_deg)
        self.width, self.height = int(width), int(height)
        self.forward = normalize(self.target - self.position)
        self.right = normalize(np.cross(self.forward, [0.0, 0.0, 1.0]))
        self.up = np.cross(self.right, self.forward)
        self.focal_px = (self.width / 2.0) / np.tan(np.radians(self.hfov_deg) / 2.0)
        self._ground_map = None

    def ray_dirs(self, px: np.ndarray, py: np.ndarray, normalized: bool = True) -> np.ndarray:
        """Directions (3, N) through pixel coordinates (centres at integer + 0.5); unnormalised ones are cheaper and
        fine for intersection (a depth buffer compares parameters along one ray)."""
        x = (px - self.width / 2.0) / self.focal_px
        y = (self.height / 2.0 - py) / self.focal_px
        d = self.forward[:, None] + self.right[:, None] * x + self.up[:, None] * y
        if normalized:
            d /= np.sqrt((d * d).sum(axis=0))
        return d

    def rect_dirs(self, rect: tuple[int, int, int, int]) -> np.ndarray:
        """Unnormalised directions (3, h * w) through the pixel centres of a rectangle, row-major."""
        x0, y0, x1, y1 = rect
        x = (np.arange(x0, x1) + 0.5 - self.width / 2.0) / self.focal_px
        y = (self.height / 2.0 - np.arange(y0, y1) - 0.5) / self.focal_px
        rows = self.forward[:, None] + self.up[:, None] * y  # (3, h)
        cols = self.right[:, None] * x  # (3, w)
        return (rows[:, :, None] + cols[:, None, :]).reshape(3, -1)

    def ground_map(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Where each pixel-centre ray meets the ground z = 0: (H, W) gx, gy; per row the direction (H, 3) without
        its x * right part and ``below`` (False at or above the horizon, where gx, gy are meaningless). The camera
        has no roll, so a ray's height depends on its row only."""
        if self._ground_map is None:
            x = (np.arange(self.width) + 0.5 - self.width / 2.0) / self.focal_px
            y = (self.height / 2.0 - np.arange(self.height) - 0.5) / self.focal_px
            row_dir = self.forward + y[:, None] * self.up  # (H, 3); the full direction adds x * right
            below = row_dir[:, 2] < -1e-6
            t = -self.position[2] / np.where(below, row_dir[:, 2], -1.0)  # per row, unnormalised units
            gx = (self.position[0] + t * row_dir[:, 0])[:, None] + (t[:, None] * x[None, :]) * self.right[0]
            gy = (self.position[1] + t * row_dir[:, 1])[:, None] + (t[:, None] * x[None, :]) * self.right[1]
            self._ground_map = (gx, gy, row_dir, below)
        return self._ground_map

    def screen_rect(self, points: np.ndarray, pad: int = 2) -> tuple[int, int, int, int] | None:
        """Pixel rectangle (x0, y0, x1, y1), end-exclusive and clipped, covering the projection of a convex hull:
        the whole frame when a point (N, 3) lies behind the camera, None when empty."""
        q = np.asarray(points) - self.position
        depth = q @ self.forward  # along the view axis
        if np.any(depth <= 1e-3):
            return 0, 0, self.width, self.height
        px = self.width / 2.0 + self.focal_px * (q @ self.right) / depth
        py = self.height / 2.0 - self.focal_px * (q @ self.up) / depth
        x0 = max(int(np.floor(px.min())) - pad, 0)
        y0 = max(int(np.floor(py.min())) - pad, 0)
        x1 = min(int(np.ceil(px.max())) + pad, self.width)
        y1 = min(int(np.ceil(py.max())) + pad, self.height)
        if x0 >= x1 or y0 >= y1:
            return None
        return x0, y0, x1, y1

    def describe(self) -> dict:
        return {
            "position": [round(float(v), 4) for v in self.position],
            "target": [round(float(v), 4) for v in self.target],
            "hfov_deg": round(self.hfov_deg, 3),
        }
