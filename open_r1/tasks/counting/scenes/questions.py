"""Counting questions about a rendered scene, with gold answers from the scene metadata.

Kinds: ``total`` (every object), ``different`` (the OOD benchmark's wording, same answer) and ``filtered`` (an
attribute filter in CLEVR's word order, e.g. "How many small striped buses are there?", taken from a random object
85% of the time, else drawn at random, so the answer may be 0). A ``questions`` argument: "default" (the split's
total-count wording), "mixed" (half total, half filtered), one kind, or a list of kinds drawn uniformly.
"""

from typing import Any, Sequence

import numpy as np

from open_r1.errors import SceneArgumentError

from . import clevr, ood

TOTAL_QUESTION = "How many items are there in the image?"
DIFFERENT_QUESTION = "How many different items are there in the image?"
QUESTION_KINDS = ("total", "different", "filtered")

# Attribute vocabularies per renderer, in the order words appear in a question ("shape" is the noun; an OOD
# object's "plain" texture is no filter word).
VOCABULARY = {
    "clevr": {
        "size": tuple(clevr.SIZES),
        "color": tuple(clevr.COLORS),
        "material": clevr.MATERIALS,
        "shape": clevr.SHAPES,
    },
    "ood": {
        "size": tuple(ood.SIZES),
        "color": tuple(ood.COLORS),
        "texture": ("striped", "checkered"),
        "shape": ood.CATEGORIES,
    },
}
PLURALS = {"cube": "cubes", "sphere": "spheres", "cylinder": "cylinders", **ood.PLURALS}
_FROM_OBJECT_PROBABILITY = 0.85


def resolve_question_kinds(questions: str | Sequence[str], renderer: str) -> tuple[str, ...]:
    """The kinds to draw from, uniformly, for a ``questions`` argument."""
    default = "different" if renderer == "ood" else "total"
    if isinstance(questions, str):
        if questions == "default":
            return (default,)
        if questions == "mixed":
            return (default, "filtered")
        names = [questions]
    else:
        names = list(questions)
        if not names:
            raise SceneArgumentError(
                "questions list is empty; pass 'default', 'mixed' or kinds from: total, different, filtered"
            )
    for name in names:
        if name not in QUESTION_KINDS:
            raise SceneArgumentError(
                f"unknown questions {name!r}; use 'default', 'mixed', or kinds from: {', '.join(QUESTION_KINDS)}"
            )
    return tuple(names)


def count_matching(objects: list[dict], filters: dict[str, str]) -> int:
    return sum(all(obj.get(attribute) == value for attribute, value in filters.items()) for obj in objects)


def filtered_text(filters: dict[str, str], renderer: str) -> str:
    words = [filters[a] for a in VOCABULARY[renderer] if a in filters and a != "shape"]
    noun = PLURALS[filters["shape"]] if "shape" in filters else "things"
    return f"How many {' '.join(words + [noun])} are there?"


def _draw_filters(rng: np.random.Generator, objects: list[dict], renderer: str) -> dict[str, str]:
    vocabulary = VOCABULARY[renderer]
    n_attributes = int(rng.choice([1, 2, 3], p=[0.45, 0.4, 0.15]))
    if rng.uniform() < _FROM_OBJECT_PROBABILITY:
        reference = objects[int(rng.integers(len(objects)))]
        # Only attributes the reference has a filter word for (an OOD object's texture may be "plain").
        usable = [a for a in vocabulary if reference.get(a) in vocabulary[a]]
        chosen = rng.choice(usable, size=min(n_attributes, len(usable)), replace=False)
        return {str(a): reference[str(a)] for a in chosen}
    chosen = rng.choice(list(vocabulary), size=n_attributes, replace=False)
    return {str(a): str(rng.choice(vocabulary[str(a)])) for a in chosen}


def make_question(rng: np.random.Generator, scene: dict, kinds: Sequence[str]) -> tuple[str, int, dict[str, Any]]:
    """(question text, gold count, question metadata) for a scene dict from ``render_scene``."""
    kind = str(kinds[int(rng.integers(len(kinds)))]) if len(kinds) > 1 else str(kinds[0])
    objects = scene["objects"]
    if kind == "total":
        return TOTAL_QUESTION, len(objects), {"kind": kind}
    if kind == "different":
        return DIFFERENT_QUESTION, len(objects), {"kind": kind}
    filters = _draw_filters(rng, objects, scene["renderer"])
    return (
        filtered_text(filters, scene["renderer"]),
        count_matching(objects, filters),
        {"kind": kind, "filter": filters},
    )


def format_solution(count: int) -> str:
    """Gold answer in the format the grader parses (open_r1.tasks.counting.protocol.GOLD_RE)."""
    return f"<answer> {int(count)} </answer>"
