"""Tests for the synthetic CLEVR-style data generator (open_r1/scenes). CPU only, small images, a few seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from open_r1.tasks.counting.protocol import parse_gold
from open_r1.tasks.counting.scenes import (
    SceneArgumentError,
    assert_disjoint,
    build_split,
    clevr,
    example_seeds,
    render_scene,
    scene_fingerprint,
    write_splits,
)
from open_r1.tasks.counting.scenes.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
SMALL = "160x108"
SMALL_OOD = "192x144"

# Written out here, not imported, so a changed constant in the generator cannot make the test agree with itself.
PALETTE_1 = {"gray", "blue", "brown", "yellow"}
PALETTE_2 = {"red", "green", "purple", "cyan"}
CLEVR_SHAPES = {"cube", "sphere", "cylinder"}
VEHICLES = {"car", "bus", "truck", "bike", "plane"}


def _rows(dataset):
    return [dataset[i] for i in range(len(dataset))]


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- gold counts and the id buffer ----------------------------------------------------------------------------
@pytest.mark.parametrize("renderer,size,min_pixels", [("clevr", SMALL, 22), ("ood", SMALL_OOD, 36)])
def test_gold_count_is_number_of_visible_ids(renderer, size, min_pixels):
    # min_pixels: CLEVR's 200 visible pixels at 480x320, scaled by image area.
    for seed in range(6):
        image, scene, ids = render_scene(seed, renderer=renderer, image_size=size)
        assert image.size == tuple(int(v) for v in size.split("x"))
        assert ids.shape == (image.size[1], image.size[0])
        visible_ids = set(np.unique(ids).tolist()) - {-1}
        assert len(visible_ids) == scene["count"] == len(scene["objects"])
        assert visible_ids == set(range(scene["count"]))
        for obj in scene["objects"]:
            mask = ids == obj["id"]
            assert obj["visible_pixels"] == int(mask.sum()) >= min_pixels
            rows, cols = np.nonzero(mask)
            assert obj["bbox"] == [cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]


def test_layouts_with_hidden_objects_are_redrawn():
    threshold = 60  # at 160x108 some first layouts leave an object below this
    attempts = []
    for seed in range(8):
        _, scene, ids = render_scene(
            seed, image_size=SMALL, min_objects=8, max_objects=10, min_visible_pixels=threshold
        )
        counts = np.bincount(ids[ids >= 0], minlength=scene["count"])
        assert counts.min() >= threshold
        attempts.append(scene["layout_attempts"])
    assert max(attempts) > 1, "no layout was ever rejected: the visibility check is not exercised"


def test_split_gold_matches_id_buffer_of_its_scene(tmp_path):
    dataset = build_split("train", 5, seed=11, image_size=SMALL, progress=False, cache_dir=tmp_path)
    for index, row in enumerate(_rows(dataset)):
        scene_seed, _ = example_seeds(11, "train", index)
        image, scene, ids = render_scene(scene_seed, "clevr", "A", SMALL)
        assert row["problem"] == "How many items are there in the image?"
        assert re.fullmatch(r"<answer> \d+ </answer>", row["solution"])
        assert parse_gold(row["solution"]) == len(set(np.unique(ids).tolist()) - {-1})
        assert np.array_equal(np.asarray(row["image"]), np.asarray(image))


def _two_sphere_scene(with_near: bool):
    from open_r1.tasks.counting.scenes.geometry import ELLIPSOID, Camera, Material, Part
    from open_r1.tasks.counting.scenes.raytrace import RayCaster, SceneSpec

    _, lighting = clevr.sample_view(np.random.default_rng(0), 64, 64)
    camera = Camera([0.0, -10.0, 1.0], [0.0, 0.0, 1.0], 40.0, 64, 64)
    near = Part(ELLIPSOID, [0.0, -3.0, 1.0], np.eye(3), [1.0, 1.0, 1.0], 0, Material(np.array([0.5, 0.0, 0.0])))
    far = Part(
        ELLIPSOID,
        [0.0, 3.0, 1.0],
        np.eye(3),
        [0.5, 0.5, 0.5],
        1 if with_near else 0,
        Material(np.array([0.0, 0.0, 0.5])),
    )
    parts = [near, far] if with_near else [far]
    spec = SceneSpec(
        camera, parts, len(parts), lighting, lambda cam: np.full((1, cam.height, cam.width), 0.5, np.float32)
    )
    return RayCaster(spec).trace().object_ids


def test_occlusion_nearest_object_wins():
    alone = _two_sphere_scene(with_near=False)
    assert (alone == 0).sum() > 20  # the far sphere alone is visible...
    hidden = _two_sphere_scene(with_near=True)
    assert set(np.unique(hidden).tolist()) == {-1, 0}  # ...and fully hidden behind the near one
    assert (hidden == 0).sum() > (alone == 0).sum()


def test_image_colours_agree_with_object_metadata():
    expected_channel = {"red": 0, "green": 1, "blue": 2}
    checked = 0
    for seed in range(10):
        image, scene, ids = render_scene(seed, image_size=SMALL)
        pixels = np.asarray(image, dtype=np.float32)
        for obj in scene["objects"]:
            if obj["material"] == "rubber" and obj["color"] in expected_channel:
                mean = pixels[ids == obj["id"]].mean(axis=0)
                assert int(np.argmax(mean)) == expected_channel[obj["color"]], (seed, obj)
                checked += 1
    assert checked >= 5


def test_png_encoder_round_trips():
    import io

    from PIL import Image

    from open_r1.tasks.counting.scenes.png import encode_png

    pixels = np.random.default_rng(0).integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    decoded = Image.open(io.BytesIO(encode_png(pixels)))
    assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), pixels)


# -- CoGenT ------------------------------------------------------------------------------------------------------
def _colors_by_shape(condition: str, n_scenes: int = 60) -> dict[str, set]:
    seen: dict[str, set] = {shape: set() for shape in CLEVR_SHAPES}
    for seed in range(n_scenes):
        for obj in clevr.sample_objects(np.random.default_rng(seed), 10, condition):
            seen[obj["shape"]].add(obj["color"])
    return seen


def test_cogent_condition_a_and_b():
    a, b = _colors_by_shape("A"), _colors_by_shape("B")
    assert a["cube"] == PALETTE_1 and a["cylinder"] == PALETTE_2
    assert b["cube"] == PALETTE_2 and b["cylinder"] == PALETTE_1
    assert a["sphere"] == b["sphere"] == PALETTE_1 | PALETTE_2  # spheres are unconstrained


def test_splits_follow_their_condition(tmp_path):
    for split, cube_palette, cylinder_palette in (
        ("train", PALETTE_1, PALETTE_2),
        ("compositional", PALETTE_2, PALETTE_1),
    ):
        dataset = build_split(split, 8, seed=2, image_size=SMALL, progress=False, cache_dir=tmp_path / split)
        for row in _rows(dataset):
            scene = json.loads(row["scene"])
            for obj in scene["objects"]:
                if obj["shape"] == "cube":
                    assert obj["color"] in cube_palette
                elif obj["shape"] == "cylinder":
                    assert obj["color"] in cylinder_palette


# -- determinism --------------------------------------------------------------------------------------------
def test_same_seed_same_images_any_worker_count(tmp_path):
    first = build_split("val", 4, seed=5, image_size=SMALL, workers=1, progress=False, cache_dir=tmp_path / "a")
    second = build_split("val", 4, seed=5, image_size=SMALL, workers=2, progress=False, cache_dir=tmp_path / "b")
    other = build_split("val", 4, seed=6, image_size=SMALL, workers=1, progress=False, cache_dir=tmp_path / "c")
    raw = first.cast_column("image", datasets.Image(decode=False))
    raw2 = second.cast_column("image", datasets.Image(decode=False))
    raw3 = other.cast_column("image", datasets.Image(decode=False))
    for i in range(4):
        assert raw[i]["image"]["bytes"] == raw2[i]["image"]["bytes"]
        assert raw[i]["scene"] == raw2[i]["scene"]
        assert raw[i]["image"]["bytes"] != raw3[i]["image"]["bytes"]
    a1, _, _ = render_scene(123, renderer="ood", image_size=SMALL_OOD)
    a2, _, _ = render_scene(123, renderer="ood", image_size=SMALL_OOD)
    assert np.array_equal(np.asarray(a1), np.asarray(a2))


# -- questions ----------------------------------------------------------------------------------------------
_ADJECTIVES = {
    "size": {"small", "large"},
    "color": PALETTE_1 | PALETTE_2 | {"orange", "white", "black", "pink"},
    "material": {"rubber", "metal"},
    "texture": {"striped", "checkered"},
}
_NOUNS = {
    "cubes": "cube",
    "spheres": "sphere",
    "cylinders": "cylinder",
    "cars": "car",
    "buses": "bus",
    "trucks": "truck",
    "bikes": "bike",
    "planes": "plane",
}


def _count_from_text(question: str, objects: list[dict]) -> int | None:
    """Recount a filtered question from the scene's objects, parsing the words independently of the generator."""
    match = re.fullmatch(r"How many (.+) are there\?", question)
    if not match or question.endswith("in the image?"):
        return None
    *adjectives, noun = match.group(1).split()
    wanted = {} if noun == "things" else {"shape": _NOUNS[noun]}
    for word in adjectives:
        attribute = next(a for a, words in _ADJECTIVES.items() if word in words)
        wanted[attribute] = word
    return sum(all(obj.get(k) == v for k, v in wanted.items()) for obj in objects)


@pytest.mark.parametrize("split,size", [("train", SMALL), ("ood_val", SMALL_OOD)])
def test_filtered_answers_match_scene_metadata(split, size, tmp_path):
    dataset = build_split(split, 24, seed=1, questions="mixed", image_size=size, progress=False, cache_dir=tmp_path)
    totals = filtered = 0
    answers = set()
    for row in _rows(dataset):
        scene = json.loads(row["scene"])
        gold = parse_gold(row["solution"])
        recount = _count_from_text(row["problem"], scene["objects"])
        if recount is None:
            totals += 1
            assert gold == len(scene["objects"])
        else:
            filtered += 1
            assert gold == recount, row["problem"]
            answers.add(gold)
    assert totals > 0 and filtered > 0
    assert len(answers) > 1  # not a constant answer


# -- OOD is a different distribution --------------------------------------------------------------------------
def test_ood_differs_from_train(tmp_path):
    train = build_split("train", 6, seed=0, progress=False, cache_dir=tmp_path / "t")
    ood_val = build_split("ood_val", 3, seed=0, progress=False, cache_dir=tmp_path / "o")
    train_scenes = [json.loads(r["scene"]) for r in _rows(train)]
    ood_scenes = [json.loads(r["scene"]) for r in _rows(ood_val)]
    assert {tuple(r["image"].size) for r in _rows(train)} == {(480, 320)}
    assert {tuple(r["image"].size) for r in _rows(ood_val)} == {(640, 480)}
    train_shapes = {o["shape"] for s in train_scenes for o in s["objects"]}
    ood_shapes = {o["shape"] for s in ood_scenes for o in s["objects"]}
    assert train_shapes <= CLEVR_SHAPES and ood_shapes <= VEHICLES and len(ood_shapes) >= 3
    # Camera: CLEVR's is high with a 49 degree field of view; the OOD one is low and wide.
    assert min(s["camera"]["position"][2] for s in train_scenes) > 4.0
    assert max(s["camera"]["position"][2] for s in ood_scenes) < 3.0
    assert min(s["camera"]["hfov_deg"] for s in ood_scenes) > 55 > max(s["camera"]["hfov_deg"] for s in train_scenes)
    assert {r["problem"] for r in _rows(ood_val)} == {"How many different items are there in the image?"}

    # Pixels: OOD has a sky and textured ground, so colour statistics differ from the gray CLEVR floor.
    def saturation(rows):
        pixels = np.concatenate([np.asarray(r["image"], dtype=np.float32).reshape(-1, 3) for r in rows])
        return float(np.mean(pixels.max(axis=1) - pixels.min(axis=1)))

    assert saturation(_rows(ood_val)) > 2 * saturation(_rows(train))


# -- writing splits ---------------------------------------------------------------------------------------------
def test_write_splits_layout_and_disjoint_scenes(tmp_path):
    out = tmp_path / "data"
    sizes = {"train": 4, "val": 3, "compositional": 3, "ood_val": 2}
    paths = write_splits(out, sizes, seed=0, workers=1, image_size="96x64", ood_image_size="128x96", progress=False)
    assert set(paths) == set(sizes) and sorted(os.listdir(out)) == sorted(sizes)
    assert not [p for p in tmp_path.iterdir() if p.name != "data"]  # no staging left behind
    prints = {}
    for split, n in sizes.items():
        dataset = datasets.load_from_disk(str(out / split))
        assert len(dataset) == n
        assert set(dataset.column_names) == {"image", "problem", "solution", "scene"}
        assert isinstance(dataset.features["image"], datasets.Image)
        prints[split] = [scene_fingerprint(s) for s in dataset["scene"]]
    assert_disjoint(prints)
    with pytest.raises(AssertionError, match="share scenes"):
        assert_disjoint({**prints, "ood_val": prints["ood_val"] + [prints["train"][0]]})
    # overwrite replaces only the named split
    train_before = (out / "train" / "state.json").read_text()
    write_splits(out, {"val": 2}, seed=9, overwrite=True, workers=1, image_size="96x64", progress=False)
    assert len(datasets.load_from_disk(str(out / "val"))) == 2
    assert (out / "train" / "state.json").read_text() == train_before


# -- bad arguments ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--train", "0"], "--train must be at least 1"),
        (["--splits", "train,bogus"], "unknown split 'bogus'"),
        (["--min-objects", "6", "--max-objects", "4"], "min_objects (6) is greater than max_objects (4)"),
        (["--preview", "2", "--renderer", "bogus"], "unknown renderer 'bogus'"),
        (["--image-size", "12xq"], "not WIDTHxHEIGHT"),
        (["--questions", "bogus"], "unknown questions 'bogus'"),
        (["--train", "x"], "invalid int value"),
    ],
)
def test_bad_cli_arguments_give_one_error_line_and_write_nothing(tmp_path, capsys, extra, fragment):
    out = tmp_path / "out"
    code = main(["--out", str(out), "--train", "2", "--val", "1", "--compositional", "1", "--ood-val", "1", *extra])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], captured.err
    assert _tree(tmp_path) == []


def test_existing_output_dir_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code = main(["--out", str(out), "--splits", "val", "--val", "1", "--image-size", "96x64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "--overwrite" in err and len(err.splitlines()) == 1
    assert _tree(tmp_path) == ["data", "data/keep.txt"]
    with pytest.raises(SceneArgumentError, match="already exists"):
        write_splits(out, {"val": 1})
    assert _tree(tmp_path) == ["data", "data/keep.txt"]


def test_bad_api_arguments_raise_scene_argument_error(tmp_path):
    for call in (
        lambda: build_split("bogus", 2),
        lambda: build_split("train", 0),
        lambda: build_split("train", 2, questions=["bogus"]),
        lambda: render_scene(0, renderer="bogus"),
        lambda: render_scene(0, condition="C"),
        lambda: render_scene(0, min_objects=5, max_objects=3),
        lambda: write_splits(tmp_path / "x", {"train": -1}),
        lambda: write_splits(tmp_path / "y", {"nope": 1}),
    ):
        with pytest.raises(SceneArgumentError):
            call()
    assert _tree(tmp_path) == []


def test_module_cli_exit_code_and_no_traceback(tmp_path):
    out = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "-m", "open_r1.tasks.counting.scenes", "--out", str(out), "--train", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --train must be at least 1 (got 0); to skip the split, leave it out of --splits"
    ]
    assert "Traceback" not in result.stderr and not out.exists()


def test_ood_train_is_written_only_when_named_and_shares_no_scene_with_ood_val(tmp_path):
    out = tmp_path / "data"
    assert (
        main(
            [
                "--out",
                str(out),
                "--splits",
                "ood_val,ood_train",
                "--ood-val",
                "2",
                "--ood-train",
                "2",
                "--ood-image-size",
                "112x84",
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert sorted(os.listdir(out)) == ["ood_train", "ood_val"]
    prints = {}
    for split in ("ood_train", "ood_val"):
        dataset = datasets.load_from_disk(str(out / split))
        assert {json.loads(s)["renderer"] for s in dataset["scene"]} == {"ood"}
        prints[split] = [scene_fingerprint(s) for s in dataset["scene"]]
    assert not set(prints["ood_train"]) & set(prints["ood_val"])
    assert "ood_train" not in build_parser().parse_args(["--out", "x"]).splits.split(",")
