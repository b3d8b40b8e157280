"""An offline stand-in for the caption-contest data: rendered "cartoons", many captions each, a hidden funniness rule.

No hub is reachable here, and users want to try the whole pipeline on any machine, so this module generates data in
exactly the real layout (``open_r1/tasks/captioning/data.py``) from the counting task's ray-tracing renderers
(``open_r1.tasks.counting.scenes``: the CLEVR-like renderer for train/val/test, the OOD vehicle renderer for the
``ood`` split).

The cartoon
-----------
Each contest is one rendered scene with 3-7 objects (``--min-objects/--max-objects``) of which exactly one is
*odd*: all objects share one value of an attribute dimension and the odd one has another (CLEVR renderer:
colour or shape, with the other objects also sharing shape, colour and material; OOD renderer: colour, all
vehicles sharing one colour and pattern). Which object is odd, and how, is visible only in the image: the text
description says "one of
them does not fit in", never which one.

The hidden rule (``oracle_score``), a function of (caption text, scene) only, so it can score any caption a policy
writes, not just the generated candidates:

* +2.0 when the caption names the odd value (e.g. "blue" when one cube of five is blue), +0.5 more when it also
  names the odd object's noun (the shape / vehicle);
* +1.0 for a pun on the odd value from ``PUNS`` (e.g. blue -> "feeling blue"), +0.25 for a pun on another value
  present in the scene, -1.25 for a pun on an absent value of this renderer's palette (so a pun's expected
  score is about zero whatever its words: a pun is no text-only cue);
* -1.5 per colour or shape named that is *absent* from the scene (at most two counted);
* -0.05 per word beyond 12 (length is the rule's main text-only cue; kept small, see ``P_LONG``);
* a small deterministic per-caption "wit" term in [-0.2, 0.2] (hash of the caption), so candidate means are not
  all ties. Nothing here is learnable from text alone: the same caption scores high on one image and low on another.

Candidates are built from joke frames with a referent (the odd object, a majority object, an absent object, or a
vague one), an optional pun and an optional long tail. Votes are simulated: each of ``votes ~ max(min_votes,
Poisson(mean_votes))`` raters gives 1, 2 or 3 (unfunny / somewhat / funny: thresholds on ``oracle + N(0,
vote_noise)``); ``mean`` is their mean, ``precision`` the **standard error** of that mean (std / sqrt(votes)), so
``data.pair_indices(..., se_from="precision")`` is right for this data. ``oracle`` is written for analysis only
(no engine row builder reads it); ``scene_meta`` (JSON) says what was rendered.

The descriptions (``describe``) never say which object is odd. ``pretrain_rows`` and ``templated_thinking`` give the
stand-in's tiny base models their pre-training rows and templated thinking traces (tiny models cannot write real
explanations).

CLI::

    python -m standin.captioning.cartoons --out data/humor --contests 40 --ood-contests 10 \\
        --captions 24 --image-size 128x96 --workers 2

writes ``train/ val/ test/ ood/`` (``save_to_disk``, contests split with ``data.split_by_contest``), with
``--pretrain-ood-contests`` / ``--pretrain-main-contests`` the exposure scenes' ``ood_pretrain/ main_pretrain/``, and
``standin.json`` (the settings, `StandinConfig`, and the splits' sizes). The flags are `StandinConfig`'s fields, which
are also the ``data`` section of the stand-in recipes.
"""

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
from typing import Any

import numpy as np
from PIL import Image

from open_r1.errors import (
    DataError,
    OpenR1Error,
    RecipeError,
    SceneArgumentError,
    SceneGenerationError,
    cli_parser,
    error_exit,
    help_field,
    setup_logging,
)
from open_r1.jsonio import write_json
from open_r1.tasks.captioning import data as cdata
from open_r1.tasks.captioning import protocol
from open_r1.tasks.captioning.config import at_least, require
from open_r1.tasks.counting.scenes import clevr, ood
from open_r1.tasks.counting.scenes.dataset import _limit_blas_threads, _pool_context
from open_r1.tasks.counting.scenes.png import encode_png
from open_r1.tasks.counting.scenes.raytrace import RayCaster
from open_r1.tasks.counting.scenes.render import (
    RENDERERS,
    as_generator,
    default_min_visible_pixels,
    parse_image_size,
    validate_scene_args,
)

# Attribute dimensions that can make the odd object odd, per renderer.
# OOD: colour only (sizes read ambiguously under its perspective camera, textures blur at small image sizes).
# Size is not an odd dimension: the layout only allows shrinking, so the odd one would always be "large" and the
# word alone would mark the funny caption (a text-only leak: measured, runs 1-3 in experiments/captioning/LOG.md).
ODD_DIMENSIONS = {"clevr": ("color", "shape"), "ood": ("color",)}
# What every object of a scene shares before one is made odd (drawn in this order), with the palettes the odd value
# comes from; and each renderer's nouns ("shape": CLEVR's shapes, the vehicle kinds).
SHARED = {
    "clevr": {"shape": clevr.SHAPES, "color": list(clevr.COLORS), "material": clevr.MATERIALS},
    "ood": {"color": list(ood.COLORS), "texture": ood.TEXTURES},
}
SHAPES = {"clevr": clevr.SHAPES, "ood": ood.CATEGORIES}
MAX_LAYOUT_ATTEMPTS = 300
# The scene streams: (spawn key, renderer, contest id of scene i minus i)
STREAMS = {"main": (0, "clevr", 0), "ood": (1, "ood", 100_000)}

# --- Vocabulary: words a caption may use for an attribute value (the oracle reads these), and the pun table. ----------
COLOR_WORDS = {c: (c,) for c in sorted(set(clevr.COLORS) | set(ood.COLORS))}
COLOR_WORDS["gray"] = ("gray", "grey")
SHAPE_WORDS = {
    "cube": ("cube", "cubes", "box", "boxes", "block", "blocks"),
    "sphere": ("sphere", "spheres", "ball", "balls"),
    "cylinder": ("cylinder", "cylinders", "can", "cans"),
    "car": ("car", "cars"),
    "bus": ("bus", "buses"),
    "truck": ("truck", "trucks"),
    "bike": ("bike", "bikes", "bicycle", "bicycles"),
    "plane": ("plane", "planes", "airplane", "airplanes"),
}
SIZE_WORDS = {"large": ("large", "big", "huge", "giant"), "small": ("small", "tiny", "little")}
TEXTURE_WORDS = {"striped": ("striped", "stripy"), "checkered": ("checkered", "checked"), "plain": ("plain",)}
VOCAB = {"color": COLOR_WORDS, "shape": SHAPE_WORDS, "size": SIZE_WORDS, "texture": TEXTURE_WORDS}
WORD_TO_VALUE = {w: (dim, value) for dim, table in VOCAB.items() for value, words in table.items() for w in words}
PUNS = {
    "red": "seeing red",
    "blue": "feeling blue",
    "green": "green with envy",
    "yellow": "mellow yellow",
    "gray": "a gray area",
    "brown": "brownie points",
    "purple": "purple prose",
    "cyan": "cyan you believe it",
    "orange": "orange you glad",
    "white": "a white lie",
    "black": "back in the black",
    "pink": "tickled pink",
    "cube": "thinking outside the box",
    "sphere": "on the ball",
    "cylinder": "firing on all cylinders",
    "car": "driven to distraction",
    "bus": "missed the bus",
    "truck": "keep on trucking",
    "bike": "on your bike",
    "plane": "plane as day",
    "large": "a big deal",
    "small": "small talk",
    "striped": "earned its stripes",
    "checkered": "a checkered past",
    "plain": "plain and simple",
}
FRAMES = (  # whole sentences, capitalised
    "Nobody tell the {ref} it was adopted.",
    "I told you the {ref} would make a scene.",
    "Honestly, the {ref} is only here for the snacks.",
    "We agreed on a dress code, and then the {ref} showed up.",
    "The {ref} insists this is a business meeting.",
    "Act natural, the {ref} is watching.",
    "Every family has a {ref}.",
    "Relax, the {ref} always stands like that.",
    "Who invited the {ref}?",
    "It's not a phase, Mom, I'm a {ref}.",
    "The {ref} heard about the layoffs first.",
    "Somebody has to be the {ref}.",
)
VAGUE_REFS = ("new guy", "one in the corner", "odd one out", "intern", "guest of honor")
LONG_TAIL = " and frankly I have been meaning to say this to all of you for quite some time now"

W_ODD, W_ODD_NOUN, W_PUN_ODD, W_PUN_PRESENT, W_PUN_ABSENT = 2.0, 0.5, 1.0, 0.25, -1.25
W_ABSENT, MAX_ABSENT, FREE_WORDS, W_LENGTH, WIT = -1.5, 2, 12, -0.05, 0.2
# Share of candidates with the long tail (length: a deliberate, small text-only cue). The text-only ceiling, a
# bag-of-words pairwise model on the RM's pairs (`git show 7454d52:experiments/captioning/text_only_probe.py`), reads
# 0.58 on held-out
# test pairs and 0.50 on OOD (the oracle: > 0.99); before size left ODD_DIMENSIONS and absent puns were confined to
# the renderer's palette it read 0.665 (experiments/captioning/results/; experiments/captioning/LOG.md, runs 1-3).
P_LONG = 0.1


# --- Rendering a scene with one odd object ----------------------------------------------------------------------------
def _make_odd(rng: np.random.Generator, renderer: str, objects: list[dict]) -> dict:
    """Rewrite sampled objects so all share a value of one dimension and one object differs."""
    dim = str(rng.choice(ODD_DIMENSIONS[renderer]))
    odd = int(rng.integers(len(objects)))
    shared = {key: str(rng.choice(values)) for key, values in SHARED[renderer].items()}
    for o in objects:
        o.update(shared)
    majority = shared[dim]
    odd_value = str(rng.choice([value for value in SHARED[renderer][dim] if value != majority]))
    objects[odd][dim] = odd_value
    if renderer == "clevr":  # resting height depends on shape and size (as clevr.sample_objects sets it)
        for o in objects:
            radius = clevr.SIZES[o["size"]]
            o["_radius"] = radius
            o["position"][2] = radius if o["shape"] != "cube" else radius / math.sqrt(2.0)
    return {"dimension": dim, "odd_index": odd, "odd_value": odd_value, "majority_value": majority}


def render_odd_scene(
    rng_or_seed: Any, renderer: str = "clevr", image_size: Any = (128, 96), min_objects: int = 3, max_objects: int = 7
):
    """Render one scene with exactly one odd object: (PIL image, scene_meta dict).

    The counting renderers sample the layout, camera and lights (``build_spec``); the objects' attributes are then
    rewritten (``_make_odd``) and the parts rebuilt with the renderer's own ``object_parts``. Layouts are redrawn
    until every object has enough visible pixels, as ``render_scene`` does.
    """
    validate_scene_args(renderer, "A", min_objects, max_objects)
    if min_objects < 2:  # one odd object and at least one of the majority
        raise SceneArgumentError(f"a scene with an odd object needs min_objects >= 2, got {min_objects}")
    width, height = parse_image_size(image_size, renderer)
    min_pixels = default_min_visible_pixels(width, height)
    rng = as_generator(rng_or_seed)
    module = RENDERERS[renderer]
    n_objects = int(rng.integers(min_objects, max_objects + 1))
    for _ in range(MAX_LAYOUT_ATTEMPTS):
        spec, objects, environment = module.build_spec(rng, n_objects, "A", width, height)
        odd = _make_odd(rng, renderer, objects)
        parts = [part for i, obj in enumerate(objects) for part in module.object_parts(obj, i)]
        spec = dataclasses.replace(spec, parts=parts, footprints=[module.footprint(o) for o in objects])
        caster = RayCaster(spec)
        ids = caster.trace().object_ids
        visible = np.bincount(ids[ids >= 0], minlength=n_objects)
        if visible.min() >= min_pixels:
            break
    else:
        raise SceneGenerationError(
            f"could not lay out {n_objects} visible objects at {width}x{height} in "
            f"{MAX_LAYOUT_ATTEMPTS} attempts; use a larger --image-size or fewer --max-objects"
        )
    image = Image.fromarray(caster.render(anti_alias=True))
    keys = ("shape", "color", "size", "material", "texture")
    kept = [{k: o[k] for k in keys if k in o} | {"visible_pixels": int(v)} for o, v in zip(objects, visible)]
    return image, {
        "renderer": renderer,
        "image_size": [width, height],
        "environment": environment,
        "objects": kept,
        **odd,
    }


# --- The hidden rule --------------------------------------------------------------------------------------------------
def _scene(meta: dict | str) -> dict:
    """A scene's ``scene_meta``, parsed where it is the JSON text."""
    return json.loads(meta) if isinstance(meta, str) else meta


def _present(meta: dict) -> dict[str, set]:
    return {dim: {obj[dim] for obj in meta["objects"] if dim in obj} for dim in VOCAB}


def _caption_puns(text: str) -> tuple[list[str], str]:
    """Pun values found in a lower-cased caption, and the text with those phrases removed."""
    found = []
    for value, phrase in PUNS.items():
        if phrase in text:
            found.append(value)
            text = text.replace(phrase, " ")
    return found, text


def _reading(text: str) -> tuple[list[str], dict[str, set]]:
    """The pun values of a text and the attribute values its other words name, per dimension (one pass)."""
    puns, rest = _caption_puns(" ".join(text.lower().split()))
    mentioned: dict[str, set] = {dim: set() for dim in VOCAB}
    for token in re.findall(r"[a-z]+", rest):
        if token in WORD_TO_VALUE:
            dim, value = WORD_TO_VALUE[token]
            mentioned[dim].add(value)
    return puns, mentioned


def oracle_details(caption: str, meta: dict | str) -> dict:
    """The hidden score's parts for one caption on one scene (a dict or the ``scene_meta`` JSON; see the module
    docstring), and their sum as ``score``."""
    meta = _scene(meta)
    text = " ".join(caption.lower().split())
    puns, mentioned = _reading(text)
    present = _present(meta)
    dim, odd_value = meta["dimension"], meta["odd_value"]
    names_odd = odd_value in mentioned[dim]
    names_noun = names_odd and dim != "shape" and meta["objects"][meta["odd_index"]]["shape"] in mentioned["shape"]
    absent = sum(len(mentioned[d] - present[d]) for d in ("color", "shape"))
    pun_score = 0.0
    for value in puns:
        if value == odd_value:
            pun_score += W_PUN_ODD
        elif any(value in v for v in present.values()):  # values are unique across dimensions
            pun_score += W_PUN_PRESENT
        else:
            pun_score += W_PUN_ABSENT
    words = protocol.count_words(caption)
    wit = (int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF * 2.0 - 1.0) * WIT
    parts = {
        "names_odd": W_ODD * names_odd,
        "names_odd_noun": W_ODD_NOUN * names_noun,
        "puns": pun_score,
        "absent": W_ABSENT * min(absent, MAX_ABSENT),
        "length": W_LENGTH * max(0, words - FREE_WORDS),
        "wit": wit,
    }
    parts["score"] = float(sum(parts.values()))
    return parts


def oracle_score(caption: str, meta: dict | str) -> float:
    """The hidden funniness of ``caption`` on the scene ``meta`` (a dict or the ``scene_meta`` JSON)."""
    return oracle_details(caption, meta)["score"]


# --- Candidates, votes, descriptions ----------------------------------------------------------------------------------
def _absent(meta: dict) -> tuple[list[str], list[str]]:
    """The renderer's colours and shapes (vehicle kinds) that the scene lacks."""
    present, renderer = _present(meta), meta["renderer"]
    return (
        [c for c in RENDERERS[renderer].COLORS if c not in present["color"]],
        [s for s in SHAPES[renderer] if s not in present["shape"]],
    )


def _object_name(meta: dict, index: int) -> str:
    """ "blue cube": an object by its value of the odd dimension (its colour where that is the shape) and its noun;
    ``index``: the odd one's, or the next one's (a majority object)."""
    obj = meta["objects"][index % len(meta["objects"])]
    return f"{obj['color' if meta['dimension'] == 'shape' else meta['dimension']]} {obj['shape']}"


def _referents(rng: np.random.Generator, meta: dict) -> dict[str, str]:
    absent_colors, absent_shapes = _absent(meta)
    absent_ref = (
        f"{rng.choice(absent_colors)} {rng.choice(absent_shapes)}" if absent_colors and absent_shapes else "unicorn"
    )
    return {
        "odd": _object_name(meta, meta["odd_index"]),
        "majority": _object_name(meta, meta["odd_index"] + 1),
        "absent": absent_ref,
        "vague": str(rng.choice(VAGUE_REFS)),
    }


def renderer_values(renderer: str) -> list[str]:
    """The attribute values a renderer can draw (colours, shapes or vehicle kinds, sizes, textures)."""
    module = RENDERERS[renderer]
    return [*module.COLORS, *SHAPES[renderer], *module.SIZES, *getattr(module, "TEXTURES", ())]


def candidate_captions(rng: np.random.Generator, meta: dict, n: int) -> list[dict]:
    """``n`` distinct candidate captions for a scene, each with its referent kind, pun kind and length kind."""
    present = _present(meta)
    # absent puns come from this renderer's own palette (a bus pun on a CLEVR scene would be absent by the
    # description alone: a text-only cue)
    own = set(renderer_values(meta["renderer"]))
    pun_values = {
        "odd": [meta["odd_value"]],
        # sorted: a set of strings iterates in an order set by the process's hash seed (PYTHONHASHSEED), and the
        # rng picks from this list by position, so unsorted the captions differed between processes
        "present": [v for d in VOCAB for v in sorted(present[d]) if v in PUNS and v != meta["odd_value"]],
        "absent": [v for v in PUNS if v in own and not any(v in present[d] for d in VOCAB)],
    }
    out, seen = [], set()
    for _ in range(n * 20):
        if len(out) == n:
            break
        refs = _referents(rng, meta)
        ref_kind = str(rng.choice(["odd", "majority", "absent", "vague"], p=[0.3, 0.25, 0.2, 0.25]))
        pun_kind = str(rng.choice(["none", "odd", "present", "absent"], p=[0.55, 0.15, 0.15, 0.15]))
        if pun_kind != "none" and not pun_values[pun_kind]:
            pun_kind = "none"
        long = bool(rng.random() < P_LONG)
        text = str(rng.choice(FRAMES)).format(ref=refs[ref_kind])
        if pun_kind != "none":
            text = text[:-1] + f", talk about {PUNS[str(rng.choice(pun_values[pun_kind]))]}" + text[-1]
        if long:
            text = text[:-1] + LONG_TAIL + text[-1]
        if text in seen:
            continue
        seen.add(text)
        out.append({"caption": text, "ref_kind": ref_kind, "pun_kind": pun_kind, "long": long})
    if len(out) < n:
        raise SceneGenerationError(f"could only make {len(out)} distinct captions of {n}; ask for fewer --captions")
    return out


def simulate_votes(rng: np.random.Generator, oracle: float, config: "StandinConfig") -> dict:
    """Simulated ratings 1/2/3 (thresholds 0.5 and 2.0 on ``oracle + N(0, vote_noise)``) of ``max(min_votes,
    Poisson(mean_votes))`` readers (the config's): mean, SE, votes."""
    votes = max(config.min_votes, int(rng.poisson(config.mean_votes)))
    latent = oracle + rng.normal(0.0, config.vote_noise, size=votes)
    ratings = 1.0 + (latent > 0.5) + (latent > 2.0)
    std = float(ratings.std(ddof=1)) if votes > 1 else 0.0
    return {"mean": float(ratings.mean()), "precision": std / math.sqrt(votes), "votes": votes}


def describe(meta: dict) -> dict:
    """The text description fields; they never say which object is odd (that is only in the image)."""
    env = meta["environment"]
    # Entities name the kind of thing only: listing shapes or colours would let a text-only model see what is absent.
    if meta["renderer"] == "clevr":
        kind, location = "shapes", "a bare studio floor"
    else:
        kind, location = "toy vehicles", f"{env.get('ground', 'the ground')} under a {env.get('sky', 'plain')} sky"
    return {
        "scene": f"{len(meta['objects'])} {kind} stand around together.",
        "twist": "One of them does not quite fit in.",
        "location": location,
        "entities": [kind],
    }


# --- Contests and splits ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class StandinConfig:
    """What the stand-in generates: the flags of this module's command line and the ``data`` section of the stand-in
    recipes (``stage_data``, where ``seed`` defaults to the recipe's)."""

    contests: int = help_field(40, "CLEVR-like contests, split train/val/test by contest")
    ood_contests: int | None = help_field(None, "OOD-renderer contests (split ood; null: contests // 4, 0: none)")
    val_frac: float = help_field(0.15, "share of the contests in val")
    test_frac: float = help_field(0.15, "share of the contests in test")
    pretrain_ood_contests: int = help_field(0, "OOD-renderer exposure scenes for pre-training only")
    pretrain_main_contests: int = help_field(0, "CLEVR-like exposure scenes for pre-training only")
    captions: int = help_field(24, "candidate captions per contest")
    image_size: str = help_field("128x96", "WIDTHxHEIGHT")
    min_objects: int = help_field(3, "objects per scene, at least")
    max_objects: int = help_field(7, "objects per scene, at most")
    mean_votes: float = help_field(30.0, "simulated raters per caption, on average")
    min_votes: int = help_field(10, "simulated raters per caption, at least")
    vote_noise: float = help_field(1.5, "the raters' noise around the hidden rule")
    seed: int = help_field(0, "the generator's seed")
    workers: int | None = help_field(None, "render processes (null: the cores - 1, at most 16)")
    overwrite: bool = help_field(False, "render again over an existing stand-in")

    def __post_init__(self):
        try:  # "WxH" or (width, height), held as "WxH"
            self.image_size = "{}x{}".format(*parse_image_size(self.image_size))
        except SceneArgumentError as exc:
            raise RecipeError(f"data.image_size: {exc}") from None
        require(
            self.min_objects <= self.max_objects,
            f"data.min_objects ({self.min_objects}) is above data.max_objects ({self.max_objects})",
        )
        require(
            0 <= self.val_frac < 1 and 0 <= self.test_frac < 1, "data.val_frac and data.test_frac must be in [0, 1)"
        )
        at_least("data", self, 1, "contests", "min_votes")
        at_least("data", self, 2, "captions", "min_objects")  # min_objects: the odd one and one of the majority
        at_least("data", self, 0, "ood_contests", "pretrain_ood_contests", "pretrain_main_contests")
        if self.ood_contests is None:
            self.ood_contests = max(1, self.contests // 4)

    def splits(self) -> list[str]:
        """The splits `write_standin` writes."""
        return ["train", "val", "test", *(split for split, _, count, *_ in MORE_SPLITS if getattr(self, count))]


PRETRAIN_OFFSET = 50_000  # scene indices of the exposure splits start here (the contests use 0..n-1)
# The splits beside train/val/test: (split, renderer stream, its StandinConfig count, first scene index, caption rows
# kept: none of the exposure scenes', whose images pre-training sees)
MORE_SPLITS = (
    ("ood", "ood", "ood_contests", 0, None),
    ("ood_pretrain", "ood", "pretrain_ood_contests", PRETRAIN_OFFSET, 1),
    ("main_pretrain", "main", "pretrain_main_contests", PRETRAIN_OFFSET, 1),
)


def make_contest(config: StandinConfig, stream: str, index: int, keep: int | None = None) -> list[dict]:
    """The caption rows of one contest (deterministic in (seed, stream, index)), the first ``keep`` of them."""
    key, renderer, offset = STREAMS[stream]
    # spawn keys (stream, index, 0) for the scene and (stream, index, 1) for the text
    scene_seed, text_seed = np.random.SeedSequence(config.seed, spawn_key=(key, index)).spawn(2)
    text_rng = np.random.default_rng(text_seed)
    # the OOD stream keeps the pixel budget: its shift is the renderer, not the resolution
    image, meta = render_odd_scene(scene_seed, renderer, config.image_size, config.min_objects, config.max_objects)
    png = {"bytes": encode_png(np.asarray(image), 3), "path": None}
    desc = describe(meta)
    meta_json = json.dumps(meta, separators=(",", ":"))
    rows = []
    for cand in candidate_captions(text_rng, meta, config.captions):
        oracle = oracle_score(cand["caption"], meta)
        votes = simulate_votes(text_rng, oracle, config)
        rows.append(
            {
                "contest": index + offset,
                "image": png,
                **desc,
                "caption": cand["caption"],
                **votes,
                "oracle": oracle,
                "scene_meta": meta_json,
                "renderer": renderer,
            }
        )
    return rows[:keep]


def rate_captions(dataset, samples, seed: int = 0, config: StandinConfig = StandinConfig()):
    """A new round of *simulated* ratings (the stand-in's human ratings of a policy's outputs): ``(caption rows in
    dataset's columns, counts)`` for the ``samples`` ({contest, caption}), rated as the contests' own candidates were.
    Skipped and counted: captions already in their contest or repeated, contests not in ``dataset``."""
    import datasets

    if "scene_meta" not in dataset.column_names:
        raise DataError("rate_captions simulates readers from the stand-in's scene_meta; real data needs real raters")
    groups = cdata._contest_groups(dataset)
    table = dataset.cast_column("image", datasets.Image(decode=False))  # a new row keeps its contest's stored image
    captions = list(table["caption"])
    seen = {contest: {captions[i] for i in idx} for contest, idx in groups.items()}
    rng = np.random.default_rng(seed)
    rows, counts = [], {"samples": 0, "rated": 0, "known_caption": 0, "unknown_contest": 0}
    for sample in samples:
        counts["samples"] += 1
        contest, caption = sample["contest"], str(sample["caption"]).strip()
        if contest not in groups:
            counts["unknown_contest"] += 1
            continue
        if caption in seen[contest]:
            counts["known_caption"] += 1
            continue
        seen[contest].add(caption)
        row = {**table[groups[contest][0]], "caption": caption}
        oracle = oracle_score(caption, row["scene_meta"])
        if "oracle" in row:  # kept only where the dataset keeps it (analysis); the votes are what training reads
            row["oracle"] = oracle
        row.update(simulate_votes(rng, oracle, config))
        rows.append(row)
        counts["rated"] += 1
    return (
        datasets.Dataset.from_list(rows, features=dataset.features).select_columns(dataset.column_names)
        if rows
        else dataset.select([])
    ), counts


def build_contests(
    n: int,
    config: StandinConfig = StandinConfig(),
    stream: str = "main",
    workers: int = 1,
    start: int = 0,
    rows_per_contest: int | None = None,
):
    """A ``datasets.Dataset`` of ``n`` contests (one row per caption) from the CLEVR-like (``main``) or OOD stream:
    contest indices ``start .. start + n - 1`` (deterministic per index); ``rows_per_contest`` keeps only that many
    caption rows of each (pre-training exposure scenes need the image, not the captions)."""
    import datasets

    if stream not in STREAMS:
        raise SceneArgumentError(f"stream must be one of {sorted(STREAMS)}, got {stream!r}")
    if n < 1:
        raise SceneArgumentError(f"need at least one contest, got {n}")
    make = functools.partial(make_contest, config, stream, keep=rows_per_contest)
    indices = range(start, start + n)
    if workers > 1 and n > 1:
        with _pool_context().Pool(min(workers, n), initializer=_limit_blas_threads) as pool:
            contests = pool.map(make, indices, chunksize=max(1, n // (workers * 4)))
    else:
        contests = list(map(make, indices))
    rows = [row for contest in contests for row in contest]
    # the PNG bytes as an image column; every other type as inferred (int64, float64, string, a list of strings)
    return datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())


def write_standin(out_dir: str | os.PathLike, config: StandinConfig = StandinConfig()) -> dict[str, str]:
    """Write ``train/ val/ test/`` (CLEVR-like contests split by contest), ``ood/`` (OOD renderer) and the exposure
    scenes' ``ood_pretrain/ main_pretrain/`` (images only: one caption row a scene, indices disjoint from every
    contest) under out_dir, with ``standin.json`` (the config and the splits' sizes)."""
    out_dir = os.fspath(out_dir)
    if os.path.exists(os.path.join(out_dir, "standin.json")) and not config.overwrite:
        raise SceneArgumentError(
            f"{out_dir} already holds a stand-in; pass --overwrite (or overwrite=True) to replace it"
        )
    workers = config.workers or max(1, min(16, (os.cpu_count() or 2) - 1))
    main = build_contests(config.contests, config, "main", workers)
    splits = dict(cdata.split_by_contest(main, config.val_frac, config.test_frac, seed=config.seed))
    for split, stream, count, start, keep in MORE_SPLITS:
        if getattr(config, count):
            splits[split] = build_contests(getattr(config, count), config, stream, workers, start, keep)
    paths, counts = {}, {}
    for name, ds in splits.items():
        path = os.path.join(out_dir, name)
        ds.save_to_disk(path)
        paths[name] = path
        counts[name] = {"rows": len(ds), "contests": len(set(ds["contest"]))}
    write_json(os.path.join(out_dir, "standin.json"), {"config": dataclasses.asdict(config), "splits": counts})
    return paths


# --- Templated thinking and pre-training corpora ----------------------------------------------------------------------
def _meta(row: dict) -> dict:
    if "scene_meta" not in row:
        raise DataError("the stand-in helpers need the 'scene_meta' column; it is in every stand-in split")
    return _scene(row["scene_meta"])


def _majority_phrase(meta: dict) -> str:
    other = meta["objects"][(meta["odd_index"] + 1) % len(meta["objects"])]
    if meta["renderer"] == "clevr":
        return f"{other['color']} {SHAPE_WORDS[other['shape']][1]}"  # [1]: the plural
    return f"{meta['majority_value']} vehicles"


def odd_object_phrase(meta: dict) -> str:
    """ "the blue cube": the odd object by its odd value and noun."""
    return "the " + _object_name(meta, meta["odd_index"])


TRACE_WORDINGS = ("caption", "joke")
# `full`: what is odd, then that a good caption plays on it; `first_sentence`: only what is odd
TRACE_TEMPLATES = ("full", "first_sentence")


def templated_thinking(row: dict, wording: str = "caption", template: str = "full") -> str:
    """A TEMPLATED thinking trace for a stand-in caption row (from ``scene_meta``, not from a model): what is odd in
    the picture and (``template="full"``) that the caption plays on it, never quoting the caption. ``wording``: the
    noun of "A good ... points at" (``joke`` keeps the trace off the sub-words of the ``<caption>`` tag)."""
    if wording not in TRACE_WORDINGS:
        raise DataError(f"templated_thinking wording must be one of {TRACE_WORDINGS}, got {wording!r}")
    if template not in TRACE_TEMPLATES:
        raise DataError(f"templated_thinking template must be one of {TRACE_TEMPLATES}, got {template!r}")
    meta = _meta(row)
    dim_word = {"color": "colour", "texture": "pattern"}.get(meta["dimension"], meta["dimension"])
    odd = odd_object_phrase(meta)
    first = f"Most of the objects are {meta['majority_value']} ones, but {odd} differs in {dim_word}."
    if template == "first_sentence":
        return first
    return f"{first} A good {wording} points at {odd} and plays on it being {meta['odd_value']}."


def add_templated_thinking(dataset, wording: str = "caption", template: str = "full"):
    """``dataset`` with a ``thinking`` column from ``templated_thinking`` (for ``data.sft_rows`` on the stand-in)."""
    table = dataset.select_columns(["scene_meta"])
    return dataset.add_column(cdata.THINKING_COLUMN, [templated_thinking(r, wording, template) for r in table])


def _qa_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


PROBE_QUESTION = "Which object is different from the others?"


def scene_questions(rng: np.random.Generator, meta: dict) -> list[tuple[str, str]]:
    """Plain questions about a scene with their answers (no captions, no funniness)."""
    present, (absent_colors, absent_shapes) = _present(meta), _absent(meta)
    odd = odd_object_phrase(meta)
    qa = [
        ("How many objects are there?", str(len(meta["objects"]))),
        (PROBE_QUESTION, odd[0].upper() + odd[1:] + "."),
        (
            f"In what way is {odd} different?",
            f"Its {meta['dimension']}: it is {meta['odd_value']}, the others are {meta['majority_value']}.",
        ),
    ]
    if absent_colors:
        qa.append((f"Is there anything {rng.choice(absent_colors)} in the picture?", "No."))
    qa.append((f"Is there anything {rng.choice(sorted(present['color']))} in the picture?", "Yes."))
    if absent_shapes:
        qa.append((f"Is there a {rng.choice(absent_shapes)} in the picture?", "No."))
    return qa


def perceives_odd(answer: str, meta: dict | str) -> bool:
    """Whether an answer to ``PROBE_QUESTION`` names the odd object's odd value and no other value of that dimension
    ("The blue cube." when one cube of five is blue; "blue or red" is wrong)."""
    meta = _scene(meta)
    return _reading(answer)[1][meta["dimension"]] == {meta["odd_value"]}  # the oracle's reading, puns removed


def perception_probe_rows(dataset, limit: int | None = None) -> list[dict]:
    """One ``PROBE_QUESTION`` row per contest ({messages, image, scene_meta}), in the pre-training rows' format:
    held-out splits measure whether a pre-trained base sees which object is odd (what an RM needs to read)."""
    groups = cdata._contest_groups(dataset)
    firsts = [rows[0] for rows in groups.values()][: limit or None]
    table = dataset.select(firsts)
    return [
        {"messages": _qa_messages(PROBE_QUESTION), "image": row["image"], "scene_meta": row["scene_meta"]}
        for row in table
    ]


def scene_description(meta: dict) -> str:
    """A one-sentence literal description: what is there, and which one is odd."""
    return (
        f"There are {len(meta['objects'])} objects. Most are {_majority_phrase(meta)}; {odd_object_phrase(meta)} is "
        f"the odd one out, being {meta['odd_value']}."
    )


PRETRAIN_KINDS = ("describe", "question", "fluency")  # the kinds of pre-training row `pretrain_rows` writes


def pretrain_rows(
    dataset,
    kinds: tuple[str, ...] = PRETRAIN_KINDS,
    per_contest: int = 4,
    think_prefix: bool | None = None,
    seed: int = 0,
    processor=None,
):
    """Prompt-completion rows that teach a tiny base model (policy or RM backbone) to see the stand-in's scenes:
    ``describe`` (``scene_description``), ``question`` (``scene_questions``) and ``fluency`` (the task prompt -> a
    caption drawn *uniformly* from the contest's candidates: the format without the rule), ``per_contest`` of each
    kind per contest. ``think_prefix``: describe/question completions start with an empty think block (default: True,
    or whether the ``processor``'s generation prompt opens ``<think>``). ``processor``: text rows (Thinking templates
    rewrite conversational assistant turns). Never reads ``oracle``, ``mean`` or ``votes``."""
    unknown = sorted(set(kinds) - set(PRETRAIN_KINDS))
    if unknown:
        raise DataError(f"unknown pretrain kind(s) {unknown}; choose from describe, question, fluency")
    rng = np.random.default_rng(seed)
    groups = cdata._contest_groups(dataset)
    table = dataset.select_columns(["contest", "caption", "scene_meta", *cdata._description_columns(dataset)])
    if think_prefix is None:
        think_prefix = True if processor is None else cdata.generation_prompt_opens_think(processor)
    prefix = f"{protocol.THINK_CLOSE}\n\n" if think_prefix else ""
    out: dict[str, list] = {"prompt": [], "completion": [], "images": [], "kind": [], "contest": []}
    image_rows = []
    end_of_turn = cdata._end_of_turn(processor) if processor is not None else None

    def add(prompt, text, kind, contest, row):
        if processor is None:
            out["prompt"].append(prompt)
            out["completion"].append([{"role": "assistant", "content": [{"type": "text", "text": text}]}])
        else:
            out["prompt"].append(processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
            out["completion"].append(text + end_of_turn)
        out["kind"].append(kind)
        out["contest"].append(contest)
        image_rows.append(row)

    for contest, rows in groups.items():
        first = table[rows[0]]
        meta = _meta(first)
        if "describe" in kinds:
            for _ in range(per_contest):
                add(
                    _qa_messages("Describe the picture."),
                    prefix + scene_description(meta),
                    "describe",
                    contest,
                    rows[0],
                )
        if "question" in kinds:
            qa = scene_questions(rng, meta)
            for i in rng.permutation(len(qa))[:per_contest]:
                add(_qa_messages(qa[i][0]), prefix + qa[i][1], "question", contest, rows[0])
        if "fluency" in kinds:
            desc = protocol.description_from_row(first)
            for r in rng.choice(rows, size=min(per_contest, len(rows)), replace=False):
                caption = table[int(r)]["caption"]
                target = protocol.format_target("Let me look at the picture and write a caption.", caption)
                if not think_prefix:  # a backbone without thinking: the caption in its tags only
                    target = f"{protocol.CAPTION_OPEN}{caption}{protocol.CAPTION_CLOSE}"
                add(protocol.build_messages(desc), target, "fluency", contest, int(r))
    return cdata.with_images(out, dataset, image_rows)


# --- Command line ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from transformers import HfArgumentParser  # deferred: heavy

    setup_logging()
    parser = cli_parser(
        "python -m standin.captioning.cartoons",
        __doc__.split("\n\n")[0],
        HfArgumentParser,
        dataclass_types=StandinConfig,
    )
    parser.add_argument("--out", required=True, help="output directory (the splits and standin.json)")
    try:
        config, args = parser.parse_args_into_dataclasses(argv)
        paths = write_standin(args.out, config)
    except OpenR1Error as exc:
        return error_exit(exc)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
