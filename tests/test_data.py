"""Data loading, validation and prompt building (no model needed)."""

import collections

import datasets
import numpy as np
import pytest
from PIL import Image

from open_r1.tasks.counting import data as data_lib
from open_r1.tasks.counting import protocol


def make_rows(n=4, solutions=None, problems=None):
    images = [Image.fromarray(np.full((32, 48, 3), 40 * i, dtype=np.uint8)) for i in range(n)]
    return datasets.Dataset.from_dict(
        {
            "image": images,
            "problem": problems or ["How many items are there in the image?"] * n,
            "solution": solutions or [f"<answer> {i + 3} </answer>" for i in range(n)],
        },
        features=datasets.Features(
            {"image": datasets.Image(), "problem": datasets.Value("string"), "solution": datasets.Value("string")}
        ),
    )


def test_validate_returns_every_gold():
    assert data_lib.validate_counting_dataset(make_rows(4)) == [3, 4, 5, 6]


def test_missing_column_is_named():
    dataset = make_rows(2).remove_columns("solution")
    with pytest.raises(data_lib.DataError, match=r"lacks column\(s\) \['solution'\]"):
        data_lib.validate_counting_dataset(dataset)


def test_unparseable_solution_names_the_row():
    dataset = make_rows(3, solutions=["<answer> 3 </answer>", "<answer> 4 </answer>", "three"])
    with pytest.raises(data_lib.DataError, match="row 2: cannot parse a gold count from solution 'three'"):
        data_lib.validate_counting_dataset(dataset)


def test_empty_question_is_rejected():
    dataset = make_rows(2, problems=["How many?", "  "])
    with pytest.raises(data_lib.DataError, match="row 1: problem"):
        data_lib.validate_counting_dataset(dataset)


def test_unreadable_image_names_the_row():
    good = make_rows(2)
    rows = {
        "image": [{"bytes": b"not a png", "path": None}, {"bytes": b"\x89PNG broken", "path": None}],
        "problem": good["problem"],
        "solution": good["solution"],
    }
    dataset = datasets.Dataset.from_dict(rows, features=good.features)
    with pytest.raises(data_lib.DataError, match="row 0: unreadable image"):
        data_lib.validate_counting_dataset(dataset)


def test_non_image_column_type_is_rejected():
    dataset = datasets.Dataset.from_dict(
        {"image": ["a.png"], "problem": ["How many?"], "solution": ["<answer> 1 </answer>"]}
    )
    with pytest.raises(data_lib.DataError, match="expected datasets.Image"):
        data_lib.validate_counting_dataset(dataset)


def test_load_missing_dir_says_how_to_generate(tmp_path):
    with pytest.raises(data_lib.DataError, match="python -m open_r1.tasks.counting.scenes"):
        data_lib.load_counting_dataset(str(tmp_path / "nope" / "train"))


def test_load_from_disk_roundtrip(tmp_path):
    make_rows(3).save_to_disk(str(tmp_path / "train"))
    assert len(data_lib.load_counting_dataset(str(tmp_path / "train"))) == 3


def test_template_mix_parse_and_errors():
    mix = data_lib.TemplateMix.parse(["eval:0.75", "train:0.25"])
    assert mix.names == ("eval", "train") and mix.weights == (0.75, 0.25)
    with pytest.raises(data_lib.DataError, match="unknown prompt template 'evil'"):
        data_lib.TemplateMix.parse(["evil:1"])
    with pytest.raises(data_lib.DataError, match="weight must be a number"):
        data_lib.TemplateMix.parse(["eval:lots"])
    with pytest.raises(data_lib.DataError, match="sum to 0"):
        data_lib.TemplateMix.parse(["eval:0"])


def test_template_assignment_follows_weights_and_seed():
    mix = data_lib.TemplateMix.parse(["eval:0.75", "train:0.25"])
    names = mix.assign(4000, seed=1)
    share = collections.Counter(names)["eval"] / len(names)
    assert 0.72 < share < 0.78
    assert names == mix.assign(4000, seed=1)
    assert names != mix.assign(4000, seed=2)


def test_grpo_prompts_use_the_assigned_template():
    dataset = data_lib.to_grpo_dataset(make_rows(6), data_lib.TemplateMix.parse(["eval:0.5", "train:0.5"]), seed=0)
    assert {"prompt", "template", "image", "solution"} <= set(dataset.column_names)
    for row in dataset:
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"] == protocol.format_prompt(row["problem"], protocol.TEMPLATES[row["template"]])
    assert set(dataset["template"]) == {"eval", "train"}


def test_eval_template_is_the_graders_wording():
    text = protocol.format_prompt("How many items are there in the image?", protocol.EVAL_TEMPLATE)
    assert text == (
        "How many items are there in the image? First output the thinking process in <think> </think> and final "
        "answer (number) in <answer> </answer> tags."
    )
