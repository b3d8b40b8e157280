"""Random non-overlapping placement of objects on the ground, vectorised over candidate positions."""

from typing import Callable

import numpy as np


def place_discs(
    rng: np.random.Generator,
    radii: list[float],
    sample_xy: Callable,
    min_gap: float,
    candidates: int = 24,
    rounds: int = 3,
) -> np.ndarray | None:
    """Centres (n, 2) for discs of the given radii, each at least ``min_gap`` from the others: each disc keeps the
    first fitting one of ``candidates`` positions ``sample_xy(rng, k)`` draws. None: stuck, redraw the objects."""
    centres = np.empty((0, 2))
    placed_radii = np.empty(0)
    for radius in radii:
        for _ in range(rounds):
            cand = sample_xy(rng, candidates)
            if len(centres):
                dx = cand[:, None, 0] - centres[None, :, 0]
                dy = cand[:, None, 1] - centres[None, :, 1]
                gaps = np.sqrt(dx * dx + dy * dy) - placed_radii[None, :] - radius
                fits = np.flatnonzero(gaps.min(axis=1) >= min_gap)
            else:
                fits = np.array([0])
            if len(fits):
                centres = np.vstack([centres, cand[fits[0]]])
                placed_radii = np.append(placed_radii, radius)
                break
        else:
            return None
    return centres
