"""Whole-image numpy ray caster: an object-id buffer, shading, shadows and edge anti-aliasing, all as array
operations over many pixels (no Python loop per pixel).

Each part is intersected only with the rays of its projected screen rectangle, against a z-buffer; the winning
part per pixel gives the object-id buffer the visibility check counts. Each renderer paints its own background
(ground, sky). Key-light shadows trace the screen rectangle of each caster's shadow volume: blurred on the
ground (a cheap penumbra) with contact shadows at object feet, hard on objects. Shading: Lambert key/fill/back
lights, a sky/ground hemisphere, Blinn-Phong highlights and an environment reflection (what makes metal look
like metal). Pixels where the part or face changes are re-traced with 4 sub-samples. Colours are linear while
lit and go to display space with gamma 2 (a square root).
"""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from PIL import Image, ImageFilter

from .geometry import Camera, Part

_EPS = 1e-4
# Rotated-grid sub-pixel offsets for edge anti-aliasing.
_AA_OFFSETS = np.array([[0.125, 0.375], [-0.375, 0.125], [0.375, -0.125], [-0.125, -0.375]])

# Per material kind: diffuse weight, tinted env reflection, untinted env reflection (scaled by Fresnel),
# Fresnel F0, sharp highlight strength, its shininess, highlight tint by albedo (0 = white, 1 = coloured),
# broad glossy lobe strength (tinted): what makes flat metal faces and cylinder sides read as metal.
_MATERIALS = {
    "rubber": (1.00, 0.00, 0.00, 0.04, 0.06, 10.0, 0.0, 0.0),
    "metal": (0.10, 1.00, 0.00, 1.00, 1.40, 70.0, 0.45, 0.6),
    "paint": (0.85, 0.00, 0.55, 0.05, 0.70, 60.0, 0.0, 0.0),
    "glass": (0.30, 0.00, 0.90, 0.10, 1.20, 90.0, 0.0, 0.0),
    "tire": (1.00, 0.00, 0.00, 0.04, 0.05, 8.0, 0.0, 0.0),
}
_BROAD_SHININESS = 6.0


@dataclass
class Lighting:
    """Directions point *towards* the light; colours are linear intensities."""

    key_dir: np.ndarray
    key_color: np.ndarray
    fill_dir: np.ndarray
    fill_color: np.ndarray
    back_dir: np.ndarray
    back_color: np.ndarray
    sky_ambient: np.ndarray
    ground_ambient: np.ndarray
    # Environment seen in reflections: floor colour below the horizon, sky from horizon to zenith.
    env_floor: np.ndarray
    env_horizon: np.ndarray
    env_zenith: np.ndarray
    ground_shadow_strength: float = 0.55  # fraction of display brightness removed in full ground shadow
    shadow_blur: float = 0.006  # penumbra, as a fraction of image width (Gaussian radius)
    contact_shadow: float = 0.35  # darkening at object feet


@dataclass
class SceneSpec:
    """Everything the ray caster needs for one image."""

    camera: Camera
    parts: list[Part]
    n_objects: int
    lighting: Lighting
    # background(camera) -> (3, H, W) or (1, H, W) float32 display-space ground and sky, without shadows.
    background: Callable[[Camera], np.ndarray]
    # Per object: (x, y, footprint radius), used for contact shadows; None for objects off the ground.
    footprints: list[tuple[float, float, float] | None] = field(default_factory=list)


@dataclass
class Trace:
    depth: np.ndarray  # (H, W) ray parameter of the nearest hit, inf on the ground
    part: np.ndarray  # (H, W) index into spec.parts, -1 where the ray reaches the ground or sky
    object_ids: np.ndarray  # (H, W) object id buffer, -1 = background


def _in_rect(rows: np.ndarray, cols: np.ndarray, rect) -> np.ndarray:
    """Indices of the pixels inside a rectangle. ``rows`` must be sorted (pixels in row-major order), so only
    the band of rows the rectangle spans is examined."""
    x0, y0, x1, y1 = rect
    lo, hi = np.searchsorted(rows, (y0, y1))
    band = cols[lo:hi]
    return np.flatnonzero((band >= x0) & (band < x1)) + lo


class RayCaster:
    """Renders one SceneSpec: :meth:`trace`, check visibility, then :meth:`render`. Per-ray arrays are (3, N):
    numpy then works on contiguous rows, several times faster than (N, 3) with broadcasting at these sizes."""

    def __init__(self, spec: SceneSpec):
        self.spec = spec
        self.cam = spec.camera
        self.parts = spec.parts
        self.part_object = np.array([p.object_id for p in self.parts], dtype=np.int32)
        self.part_rects = [self.cam.screen_rect(p.corners) for p in self.parts]
        key = spec.lighting.key_dir
        self.object_parts: list[list[int]] = [[] for _ in range(spec.n_objects)]
        for k, part in enumerate(self.parts):
            self.object_parts[part.object_id].append(k)
        # Shadow volume of each caster: its corners plus their projection onto the ground along the key light.
        self.shadow_rects = []
        for part_ids in self.object_parts:
            corners = np.concatenate([self.parts[k].corners for k in part_ids])
            on_ground = corners - key[None, :] * (np.maximum(corners[:, 2], 0.0) / max(key[2], 0.05))[:, None]
            self.shadow_rects.append(self.cam.screen_rect(np.concatenate([corners, on_ground]), pad=3))
        # Material tables, gathered per pixel by part index: albedo (3, P) and coefficients (8, P).
        self.albedo = np.array([p.material.albedo for p in self.parts], dtype=np.float64).reshape(-1, 3).T.copy()
        self.coeffs = (
            np.array([_MATERIALS[p.material.kind] for p in self.parts], dtype=np.float64).reshape(-1, 8).T.copy()
        )
        self.textured = [p.material.texture != "plain" and p.material.texture_color is not None for p in self.parts]
        # Shading order of parts: matte materials first, then those with an environment reflection.
        mirror = (self.coeffs[1] + self.coeffs[2]) > 0
        self.shading_order = np.concatenate([np.flatnonzero(~mirror), np.flatnonzero(mirror)])
        self.shading_rank = np.argsort(self.shading_order)  # the inverse permutation
        self.n_matte_parts = int((~mirror).sum())
        light = spec.lighting
        # Irradiance = light colours (3, 5) @ per-pixel terms (5, N): key, fill, back, ambient base, ambient slope.
        ambient = (0.5 * (light.sky_ambient + light.ground_ambient), 0.5 * (light.sky_ambient - light.ground_ambient))
        self.light_matrix = np.stack([light.key_color, light.fill_color, light.back_color, *ambient], axis=1)
        self._trace: Trace | None = None

    # -- visibility -------------------------------------------------------------------------------------------
    def trace(self) -> Trace:
        """Primary rays at pixel centres: depth (along the *unnormalised* Camera.rect_dirs), part and id buffers."""
        cam = self.cam
        w, h = cam.width, cam.height
        depth = np.full((h, w), np.inf)
        part = np.full((h, w), -1, dtype=np.int32)
        for k, (p, rect) in enumerate(zip(self.parts, self.part_rects)):
            if rect is None:
                continue
            x0, y0, x1, y1 = rect
            t_in, t_out = p.interval(cam.position, cam.rect_dirs(rect))
            t_in = t_in.reshape(y1 - y0, x1 - x0)
            t_out = t_out.reshape(y1 - y0, x1 - x0)
            region = depth[y0:y1, x0:x1]
            closer = (t_in <= t_out) & (t_in > _EPS) & (t_in < region)
            region[closer] = t_in[closer]
            part[y0:y1, x0:x1][closer] = k
        object_ids = np.where(part >= 0, self.part_object[np.maximum(part, 0)], -1).astype(np.int32)
        self._trace = Trace(depth=depth, part=part, object_ids=object_ids)
        return self._trace

    def _nearest(self, px: np.ndarray, py: np.ndarray, rows: np.ndarray, cols: np.ndarray):
        """Nearest part along sparse rays through (px, py), which lie in pixels (rows, cols) sorted row-major:
        (depth, part index or -1, unnormalised dirs (3, N))."""
        cam = self.cam
        depth = np.full(px.shape, np.inf)
        part = np.full(px.shape, -1, dtype=np.int32)
        dirs = cam.ray_dirs(px, py, normalized=False)
        for k, (p, rect) in enumerate(zip(self.parts, self.part_rects)):
            if rect is None:
                continue
            sel = _in_rect(rows, cols, rect)
            if len(sel) == 0:
                continue
            t_in, t_out = p.interval(cam.position, dirs[:, sel])
            closer = (t_in <= t_out) & (t_in > _EPS) & (t_in < depth[sel])
            hit = sel[closer]
            depth[hit] = t_in[closer]
            part[hit] = k
        return depth, part, dirs

    # -- shading ----------------------------------------------------------------------------------------------
    def _environment(self, r: np.ndarray) -> np.ndarray:
        """What a mirror sees along unit directions r (3, N): floor below the horizon, sky above, brighter towards
        the key lamp's side, and the key lamp itself as a tall softbox (vertical streaks on metal cylinders)."""
        light = self.spec.lighting
        rz = r[2]
        above = rz >= 0
        up = np.sqrt(np.where(above, rz, 0.0))
        down = np.sqrt(np.where(above, 0.0, -rz))
        sky = light.env_horizon[:, None] + (light.env_zenith - light.env_horizon)[:, None] * up
        floor = light.env_floor[:, None] * (0.55 + 0.45 * down)  # darker towards the horizon: far and grazing
        env = np.where(above, sky, floor)
        key = light.key_dir
        key_h = key[:2] / max(float(np.hypot(key[0], key[1])), 1e-6)
        facing = (r[0] * key_h[0] + r[1] * key_h[1]) / np.maximum(np.sqrt(r[0] * r[0] + r[1] * r[1]), 1e-6)
        gain = 0.5 + 0.5 * facing
        gain = 0.76 + 0.6 * gain * gain
        band = (rz + 0.4) * (1 / 0.35)  # reflections of the floor-level part of the softbox: cylinder sides
        band *= band
        streak = 1.4 * np.exp((facing - 1.0) * 40.0 - band * band)
        return env * gain + light.key_color[:, None] * streak

    def _key_blocked(self, points, normals, part_idx, rows, cols) -> np.ndarray:
        """Whether the key light is blocked by another part (hard shadows on objects)."""
        key = self.spec.lighting.key_dir
        blocked = np.zeros(points.shape[1], dtype=bool)
        facing = (key @ normals) > 0
        for obj, rect in enumerate(self.shadow_rects):
            if rect is None:
                continue
            sel = _in_rect(rows, cols, rect)
            sel = sel[facing[sel]]
            if len(sel) == 0:
                continue
            origins = points[:, sel] + normals[:, sel] * 2e-3
            for k in self.object_parts[obj]:
                t_in, t_out = self.parts[k].interval(origins, key)
                hit = (t_out > 1e-3) & (t_in <= t_out) & (part_idx[sel] != k)
                blocked[sel[hit]] = True
        return blocked

    def _shade_surface(self, points, view, part_idx, rows, cols) -> tuple[np.ndarray, np.ndarray]:
        """Display-space colours (3, N) and face codes of surface points (3, N) seen along unit ``-view`` from
        pixels (rows, cols) in row-major order. Pixels are permuted so that each part's form one slice, mirror-like
        materials last: per-part work and the costly environment term run on slices, not fancy-indexed subsets."""
        n_points = points.shape[1]
        order = np.argsort(self.shading_rank[part_idx], kind="stable")
        counts = np.bincount(part_idx, minlength=len(self.parts))[self.shading_order]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        pts = points[:, order]
        view = view[:, order]
        albedo = np.repeat(self.albedo[:, self.shading_order], counts, axis=1)
        kd, km_tint, km_white, f0, ks, shininess, spec_tint, broad = np.repeat(
            self.coeffs[:, self.shading_order], counts, axis=1
        )
        normals = np.empty((3, n_points))
        face = np.empty(n_points, dtype=np.int32)
        for j, k in enumerate(self.shading_order):
            a, b = bounds[j], bounds[j + 1]
            if a == b:
                continue
            normals[:, a:b], face[a:b], local = self.parts[k].surface(pts[:, a:b])
            if self.textured[k]:
                albedo[:, a:b] = _apply_texture(self.parts[k].material, local, albedo[:, a:b])
        # Shadow tests want pixels in row-major order: undo the permutation for them only.
        normals_by_pixel = np.empty_like(normals)
        normals_by_pixel[:, order] = normals
        lit = ~self._key_blocked(points, normals_by_pixel, part_idx, rows, cols)[order]

        light = self.spec.lighting
        nx, ny, nz = normals
        key_term = np.maximum(light.key_dir @ normals, 0.0) * lit
        terms = np.empty((5, n_points))
        terms[0] = key_term
        terms[1] = np.maximum(light.fill_dir @ normals, 0.0)
        terms[2] = np.maximum(light.back_dir @ normals, 0.0)
        terms[3] = 1.0
        terms[4] = nz
        diffuse = kd * (self.light_matrix @ terms)
        half = view + light.key_dir[:, None]
        n_dot_h = (nx * half[0] + ny * half[1] + nz * half[2]) / np.sqrt((half * half).sum(axis=0))
        n_dot_h = np.clip(n_dot_h, 0.0, 1.0) * (key_term > 0)
        highlight = light.key_color[:, None] * (n_dot_h**shininess * ks)
        spec_color = (1.0 - spec_tint) + spec_tint * albedo
        # Environment reflection (and metal's broad lobe) only on the trailing slice of mirror-like materials.
        m = bounds[self.n_matte_parts]
        if m < n_points:
            diffuse[:, m:] += light.key_color[:, None] * (n_dot_h[m:] ** _BROAD_SHININESS * broad[m:])
        color = albedo * diffuse + spec_color * highlight
        if m < n_points:
            nm, vm = normals[:, m:], view[:, m:]
            n_dot_v = np.clip(nm[0] * vm[0] + nm[1] * vm[1] + nm[2] * vm[2], 0.0, 1.0)
            reflected = 2.0 * n_dot_v * nm - vm
            grazing = 1.0 - n_dot_v
            grazing *= grazing
            fresnel = f0[m:] + (1.0 - f0[m:]) * (grazing * grazing * (1.0 - n_dot_v))
            weight = km_tint[m:] * albedo[:, m:] + km_white[m:] * fresnel
            color[:, m:] += self._environment(reflected) * weight
        np.clip(color, 0.0, 1.0, out=color)
        out_color = np.empty_like(color)
        out_color[:, order] = np.sqrt(color)
        out_face = np.empty_like(face)
        out_face[order] = face
        return out_color, out_face

    def _ground_shading(self) -> np.ndarray:
        """(H, W) display-space multiplier for the ground: blurred key-light shadows and contact shadows, at half
        resolution (the mask is blurred anyway, and this is the most expensive full-frame step)."""
        cam, light = self.cam, self.spec.lighting
        half_cam = Camera(cam.position, cam.target, cam.hfov_deg, max(cam.width // 2, 1), max(cam.height // 2, 1))
        hx, hy, _, half_below = half_cam.ground_map()
        shadow = np.zeros((half_cam.height, half_cam.width), dtype=np.float32)
        for obj, rect in enumerate(self.shadow_rects):
            if rect is None:
                continue
            x0, y0, x1, y1 = rect[0] // 2, rect[1] // 2, (rect[2] + 1) // 2, (rect[3] + 1) // 2
            rows = np.flatnonzero(half_below[y0:y1])
            if len(rows) == 0 or x1 <= x0:
                continue
            y0, y1 = y0 + rows[0], y0 + rows[-1] + 1
            sx = hx[y0:y1, x0:x1].ravel()
            ground = np.stack([sx, hy[y0:y1, x0:x1].ravel(), np.zeros_like(sx)])
            blocked = np.zeros(len(sx), dtype=bool)
            for k in self.object_parts[obj]:
                t_in, t_out = self.parts[k].interval(ground, light.key_dir)
                blocked |= (t_out > 1e-4) & (t_in <= t_out)
            region = shadow[y0:y1, x0:x1]
            region[blocked.reshape(y1 - y0, x1 - x0)] = 1.0
        if shadow.any():
            mask = Image.fromarray((shadow * 255).astype(np.uint8))
            radius = light.shadow_blur * half_cam.width
            if radius > 0.3:
                mask = mask.filter(ImageFilter.GaussianBlur(radius))
            factor = np.asarray(mask, dtype=np.float32) * np.float32(-light.ground_shadow_strength / 255.0)
            factor += np.float32(1.0)
        else:
            factor = np.ones_like(shadow)
        if light.contact_shadow > 0:
            self._contact_shadows(half_cam, factor)
        # Both terms are smooth, so half resolution upsampled bilinearly loses nothing visible.
        full = Image.fromarray(factor).resize((cam.width, cam.height), Image.Resampling.BILINEAR)
        return np.asarray(full, dtype=np.float32)

    def _contact_shadows(self, cam: Camera, factor: np.ndarray) -> None:
        """Darken ``factor`` (camera-sized) around each grounded object's footprint (ambient occlusion)."""
        gx, gy, _, below = cam.ground_map()
        strength = self.spec.lighting.contact_shadow
        for footprint in self.spec.footprints:
            if footprint is None:
                continue
            fx, fy, fr = footprint
            reach = 2.2 * fr
            square = np.array([[fx + sx * reach, fy + sy * reach, 0.0] for sx in (-1, 1) for sy in (-1, 1)])
            rect = cam.screen_rect(square, pad=1)
            if rect is None:
                continue
            x0, y0, x1, y1 = rect
            rows = np.flatnonzero(below[y0:y1])
            if len(rows) == 0:
                continue
            y0, y1 = y0 + rows[0], y0 + rows[-1] + 1
            dist = np.hypot(gx[y0:y1, x0:x1] - fx, gy[y0:y1, x0:x1] - fy)
            dist = np.maximum(dist - 0.55 * fr, 0.0) * (1.0 / (0.6 * fr))
            factor[y0:y1, x0:x1] *= 1.0 - strength * np.exp(-dist * dist)

    def render(self, anti_alias: bool = True) -> np.ndarray:
        """(H, W, 3) uint8 image. Calls :meth:`trace` first if it has not run."""
        trace = self._trace or self.trace()
        cam = self.cam
        w, h = cam.width, cam.height
        ground = self.spec.background(cam) * self._ground_shading()[None]
        ground = ground.reshape(-1, h * w)  # (1 or 3, H*W); a gray floor stays a single plane until the end
        out = np.empty((h * w, 3), dtype=np.uint8)
        out[:] = _to_uint8(ground).T

        flat_part = trace.part.reshape(-1)
        obj_pix = np.flatnonzero(flat_part >= 0)
        if len(obj_pix) == 0:
            return out.reshape(h, w, 3)
        part_idx = flat_part[obj_pix]
        rows, cols = np.divmod(obj_pix, w)
        dirs = cam.ray_dirs(cols + 0.5, rows + 0.5, normalized=False)
        points = cam.position[:, None] + dirs * trace.depth.reshape(-1)[obj_pix]
        view = dirs * (-1.0 / np.sqrt((dirs * dirs).sum(axis=0)))
        colors, faces = self._shade_surface(points, view, part_idx, rows, cols)
        out[obj_pix] = _to_uint8(colors).T

        if anti_alias:
            code = np.full(w * h, -1, dtype=np.int32)
            code[obj_pix] = part_idx * 8 + faces
            code = code.reshape(h, w)
            part = trace.part
            changed_h = code[:, 1:] != code[:, :-1]
            changed_v = code[1:, :] != code[:-1, :]
            edge = _both_sides(changed_h, changed_v)
            # Face boundaries inside one part (a cube's edges): sub-samples there must be shaded, not reused.
            face_edge = _both_sides(
                changed_h & (part[:, 1:] == part[:, :-1]), changed_v & (part[1:, :] == part[:-1, :])
            )
            edge_pix = np.flatnonzero(edge)
            ground_at_edges = np.broadcast_to(ground[:, edge_pix], (3, len(edge_pix)))
            center = np.array(ground_at_edges, dtype=np.float64)
            slot = np.minimum(np.searchsorted(obj_pix, edge_pix), len(obj_pix) - 1)
            on_object = obj_pix[slot] == edge_pix
            center[:, on_object] = colors[:, slot[on_object]]
            smooth = _to_uint8(
                self._supersample(
                    edge_pix, ground_at_edges, center, flat_part[edge_pix], face_edge.reshape(-1)[edge_pix]
                )
            )
            out[edge_pix] = smooth.T
        return out.reshape(h, w, 3)

    def _supersample(self, pixels, ground, center, center_part, face_edge) -> np.ndarray:
        """Mean display colour (3, N) of 4 sub-samples in each (sorted) edge pixel; ``ground`` where they miss.
        A sub-sample on its pixel centre's part (``center_part``) reuses the centre's colour (``center``), except
        on a face boundary inside a part, where the face, and so the colour, changes."""
        w = self.cam.width
        n_sub = len(_AA_OFFSETS)
        # Pixel-major order keeps rows sorted; offsets stay inside their pixel, so rect tests use pixel rows.
        rows, cols = np.divmod(np.repeat(pixels, n_sub), w)
        px = cols + 0.5 + np.tile(_AA_OFFSETS[:, 0], len(pixels))
        py = rows + 0.5 + np.tile(_AA_OFFSETS[:, 1], len(pixels))
        depth, part, dirs = self._nearest(px, py, rows, cols)
        colors = np.repeat(ground, n_sub, axis=1)
        reuse = (part >= 0) & (part == np.repeat(center_part, n_sub)) & ~np.repeat(face_edge, n_sub)
        colors[:, reuse] = np.repeat(center, n_sub, axis=1)[:, reuse]
        shade = np.flatnonzero((part >= 0) & ~reuse)
        if len(shade):
            d = dirs[:, shade]
            points = self.cam.position[:, None] + d * depth[shade]
            view = d * (-1.0 / np.sqrt((d * d).sum(axis=0)))
            colors[:, shade], _ = self._shade_surface(points, view, part[shade], rows[shade], cols[shade])
        return colors.reshape(3, len(pixels), n_sub).mean(axis=2)


def _both_sides(horizontal: np.ndarray, vertical: np.ndarray) -> np.ndarray:
    """Mark both pixels of every neighbouring pair that differs (horizontal: (H, W-1), vertical: (H-1, W))."""
    mask = np.zeros((vertical.shape[0] + 1, horizontal.shape[1] + 1), dtype=bool)
    mask[:, 1:] |= horizontal
    mask[:, :-1] |= horizontal
    mask[1:, :] |= vertical
    mask[:-1, :] |= vertical
    return mask


def _to_uint8(display: np.ndarray) -> np.ndarray:
    return np.clip(display * 255.0 + 0.5, 0.0, 255.0).astype(np.uint8)


def _apply_texture(material, local: np.ndarray, albedo: np.ndarray) -> np.ndarray:
    """Stripes or checks in the part's local coordinates (3, N) (OOD objects)."""
    scale = material.texture_scale
    if material.texture == "stripes":
        on = np.sin(local[0] * scale * np.pi) > 0.3
    else:  # checker
        cells = np.floor(local * scale).astype(np.int64)
        on = (cells.sum(axis=0) & 1) == 1
    return np.where(on, np.asarray(material.texture_color)[:, None], albedo)
