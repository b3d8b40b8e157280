"""Counting data in the forms researchers have it (R1-V's): a local hub snapshot folder, single .parquet / .jsonl files,
R1-V's eval jsonl with its image paths, a hub id offline, other column names mapped with --columns."""

import json
import logging
import os
import shutil
import subprocess
import sys

import datasets
import pytest

from open_r1.errors import DataError
from open_r1.tasks import get_task
from open_r1.tasks.counting import CountingSettings, protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTION = "How many different items are there in the image?"  # R1-V's SuperCLEVR-200 question


def r1v_rows(scene_data_dir, split, yes_no_row=None):
    """A scene split with R1-V's columns only (image, problem, solution); `yes_no_row` gets a CoGenT-B style
    yes/no question."""
    rows = datasets.load_from_disk(os.path.join(scene_data_dir, split)).select_columns(["image", "problem", "solution"])
    if yes_no_row is None:
        return rows
    problems, solutions = list(rows["problem"]), list(rows["solution"])
    problems[yes_no_row] = "Is the number of cubes greater than the number of spheres?"
    solutions[yes_no_row] = "<answer> yes </answer>"
    return (
        rows.remove_columns(["problem", "solution"]).add_column("problem", problems).add_column("solution", solutions)
    )


def hub_snapshot(rows, root, shards=2) -> str:
    """`rows` as `hf download --repo-type dataset REPO --local-dir root` leaves a pushed data set: README.md with its
    YAML header, data/train-0000N-of-0000M.parquet (the Image column a struct {bytes, path}), .gitattributes and
    .cache/huggingface/ (the download's metadata)."""
    os.makedirs(os.path.join(root, "data"))
    os.makedirs(os.path.join(root, ".cache", "huggingface", "download", "data"))
    size = -(-len(rows) // shards)
    for k in range(shards):
        name = f"data/train-{k:05d}-of-{shards:05d}.parquet"
        rows.select(range(k * size, min(len(rows), (k + 1) * size))).to_parquet(os.path.join(root, name))
        with open(os.path.join(root, ".cache", "huggingface", "download", name + ".metadata"), "w") as handle:
            handle.write("d5a8da6f0c1e2b3a4d5c6b7a8f9e0d1c2b3a4f5e\n0123456789abcdef\n1738000000.0\n")
    with open(os.path.join(root, ".cache", "huggingface", ".gitignore"), "w") as handle:
        handle.write("*\n")
    with open(os.path.join(root, ".gitattributes"), "w") as handle:
        handle.write("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    with open(os.path.join(root, "README.md"), "w") as handle:
        handle.write(
            "---\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: problem\n    dtype: string\n"
            f"  - name: solution\n    dtype: string\n  splits:\n  - name: train\n    num_bytes: 1000\n"
            f"    num_examples: {len(rows)}\n  download_size: 1000\n  dataset_size: 1000\n"
            "configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n"
        )
    return str(root)


def superclevr_jsonl(rows, root) -> tuple[str, list[dict]]:
    """R1-V's src/eval layout: prompts/superclevr_test200_counting_problems.jsonl with `./images/...` paths and
    integer ground truths, the images unzipped beside it in images/."""
    os.makedirs(os.path.join(root, "images"))
    os.makedirs(os.path.join(root, "prompts"))
    lines = []
    for i, row in enumerate(rows):
        image_path = f"./images/superCLEVR_new_{25000 + i:06d}.png"
        row["image"].save(os.path.join(root, image_path))
        lines.append(
            {"image_path": image_path, "question": QUESTION, "ground_truth": protocol.parse_gold(row["solution"])}
        )
    path = os.path.join(root, "prompts", "superclevr_test200_counting_problems.jsonl")
    with open(path, "w") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    return path, lines


def py(*argv, env=None, cwd=ROOT, timeout=600):
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": ROOT, **(env or {})},
    )
    return result.returncode, result.stdout, result.stderr


def test_a_snapshot_and_single_files_load_every_shard_in_file_order(scene_data_dir, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))  # a fresh read, no cached one
    rows = r1v_rows(scene_data_dir, "train")
    snapshot = hub_snapshot(rows, tmp_path / "clevr_cogen_a_train")
    task = get_task("counting")
    loaded = task.load_split(snapshot)
    assert list(loaded["problem"]) == list(rows["problem"]) and list(loaded["solution"]) == list(rows["solution"])
    assert isinstance(loaded.features["image"], datasets.Image) and loaded[5]["image"].size == rows[5]["image"].size
    shard = os.path.join(snapshot, "data", "train-00001-of-00002.parquet")
    assert list(task.load_split(shard)["solution"]) == list(rows["solution"])[4:]
    partial = shutil.copytree(snapshot, tmp_path / "partial")  # the published card's row count over fewer rows
    card = (partial / "README.md").read_text().replace(f"num_examples: {len(rows)}", "num_examples: 70000")
    (partial / "README.md").write_text(card)
    assert len(get_task("counting").load_split(str(partial))) == len(rows)
    assert "README.md counts other rows than its shards hold" in caplog.text
    path, lines = superclevr_jsonl(rows, tmp_path / "eval")
    r1v_eval = get_task("counting", settings=CountingSettings(image_root=str(tmp_path / "eval"))).load_split(path)
    assert list(r1v_eval["solution"]) == [line["ground_truth"] for line in lines]
    assert r1v_eval[0]["image"].size == rows[0]["image"].size


def test_other_column_names_are_mapped_with_columns_or_refused_naming_the_fix(scene_data_dir, tmp_path):
    rows = r1v_rows(scene_data_dir, "val").rename_columns({"image": "img", "problem": "q", "solution": "count"})
    rows.to_parquet(str(tmp_path / "mine.parquet"))
    with pytest.raises(DataError, match=r"mine.parquet has no image \(image / image_path\), no question .*--columns"):
        get_task("counting").load_split(str(tmp_path / "mine.parquet"))
    from open_r1 import grpo

    task = grpo.parse_args(
        ["--config", os.path.join(ROOT, "configs", "demo.yaml"), "--columns", "image=img,question=q,answer=count"]
    )[3]
    mapped = task.load_split(str(tmp_path / "mine.parquet"))  # the recipe key's way
    assert mapped.column_names[:3] == ["image", "problem", "solution"] and mapped["solution"][0] == rows["count"][0]
    with pytest.raises(DataError, match="--columns entry 'picture=img'"):
        get_task("counting", settings=CountingSettings(columns="picture=img")).load_split(
            str(tmp_path / "mine.parquet")
        )


def test_eval_sets_leave_out_yes_no_rows_with_a_notice(scene_data_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="open_r1")
    snapshot = hub_snapshot(r1v_rows(scene_data_dir, "val", yes_no_row=2), tmp_path / "Clevr_CoGenT_ValB")
    task = get_task("counting")
    assert len(task.load_eval_set(snapshot)) == 5
    assert f"[data] {snapshot}: 1 of 6 rows left out, their gold is not a count (row 2:" in caplog.text


def test_a_training_row_without_an_integer_answer_is_one_error_before_the_model(
    tiny_model_dir, scene_data_dir, tmp_path
):
    rows = r1v_rows(scene_data_dir, "train", yes_no_row=3)
    rows.to_parquet(str(tmp_path / "train.parquet"))
    argv = ["--config", "configs/demo.yaml", "--model_name_or_path", str(tiny_model_dir), "--use_cpu", "true"]
    rc, _, err = py(
        "-m",
        "open_r1.grpo",
        *argv,
        "--dataset_name",
        str(tmp_path / "train.parquet"),
        "--output_dir",
        str(tmp_path / "run"),
    )
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    assert (
        f"{tmp_path / 'train.parquet'} row 3: cannot parse a gold count from solution '<answer> yes </answer>'" in err
    )
    assert "--columns" in err and not (tmp_path / "run").exists()


def test_a_hub_id_offline_says_to_download_it(tiny_model_dir):
    rc, _, err = py(
        "selfcheck.py",
        "--model",
        str(tiny_model_dir),
        "--sets",
        "leonardPKU/clevr_cogen_a_train",
        env={"HF_HUB_OFFLINE": "1"},
    )
    assert rc == 2 and "Traceback" not in err, err[-3000:]
    assert "the Hugging Face hub is unreachable" in err
    assert "hf download --repo-type dataset leonardPKU/clevr_cogen_a_train --local-dir DIR" in err
    from open_r1.validate import dataset_problems

    assert dataset_problems("superclevr.jsonl", "--sets")[0] == ["data set superclevr.jsonl does not exist (--sets)"]


def test_a_missing_image_of_r1v_jsonl_is_one_clear_error(tiny_model_dir, scene_data_dir, tmp_path):
    path, _ = superclevr_jsonl(r1v_rows(scene_data_dir, "val"), tmp_path / "eval")
    rc, _, err = py("selfcheck.py", "--model", str(tiny_model_dir), "--sets", path)  # run from the repo, not eval/
    assert rc == 2 and "Traceback" not in err and err.count("error:") == 1, err[-3000:]
    assert f"row 0: image {ROOT}/images/superCLEVR_new_025000.png does not exist" in err and "--image-root" in err


def test_selfcheck_scores_a_snapshot_and_r1v_jsonl_row_by_row(tiny_model_dir, scene_data_dir, tmp_path):
    cogent = r1v_rows(scene_data_dir, "val", yes_no_row=2)
    snapshot = hub_snapshot(cogent, tmp_path / "Clevr_CoGenT_ValB")
    path, lines = superclevr_jsonl(r1v_rows(scene_data_dir, "ood_val"), tmp_path / "eval")
    report = tmp_path / "report.json"
    rc, out, err = py(
        "selfcheck.py",
        "--model",
        str(tiny_model_dir),
        "--sets",
        snapshot,
        path,
        "--image-root",
        str(tmp_path / "eval"),
        "--out",
        str(report),
        "--quiet",
        "--batch-size",
        "16",
    )
    assert rc == 0, err[-3000:]
    assert "1 of 6 rows left out, their gold is not a count" in err  # a log record: stderr
    sets = json.loads(report.read_text())["sets"]
    kept = [i for i in range(len(cogent)) if i != 2]
    assert sets["Clevr_CoGenT_ValB"]["n"] == 5 and sets["Clevr_CoGenT_ValB"]["skipped_non_count"] == 1
    assert [(r["question"], r["gold"]) for r in sets["Clevr_CoGenT_ValB"]["records"]] == [
        (cogent[i]["problem"], protocol.parse_gold(cogent[i]["solution"])) for i in kept
    ]
    jsonl = sets["superclevr_test200_counting_problems.jsonl"]
    assert jsonl["n"] == len(lines) and jsonl["skipped_non_count"] == 0
    assert [(r["index"], r["question"], r["gold"]) for r in jsonl["records"]] == [
        (i, line["question"], line["ground_truth"]) for i, line in enumerate(lines)
    ]
    assert all("prediction" in r for r in jsonl["records"])


@pytest.mark.slow
def test_train_sh_trains_from_a_snapshot_evaluates_one_and_exports(tiny_model_dir, scene_data_dir, tmp_path):
    train = hub_snapshot(r1v_rows(scene_data_dir, "train"), tmp_path / "clevr_cogen_a_train")
    valb = hub_snapshot(r1v_rows(scene_data_dir, "val", yes_no_row=2), tmp_path / "Clevr_CoGenT_ValB")
    env = {
        **os.environ,
        "MODEL_PATH": str(tiny_model_dir),
        "DATA": train,
        "SUBMISSION": str(tmp_path / "submission"),
        "OUTPUT_DIR": str(tmp_path / "run"),
        "NUM_GPUS": "0",
        "PYTHON": sys.executable,
        "PYTHONPATH": ROOT,
    }
    extra = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "8"]
    result = subprocess.run(
        ["bash", "train.sh", "configs/demo.yaml", "--max_steps", "1", *extra, "--eval_sets", valb, "--eval_limit", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"data={train}" in result.stdout and "submission ready" in result.stdout
    assert "1 of 6 rows left out, their gold is not a count" in result.stderr
    assert os.path.isfile(tmp_path / "submission" / "model.safetensors")
    entries = json.loads((tmp_path / "run" / "eval_history.json").read_text())["entries"]
    assert entries[0]["step"] == 1 and "Clevr_CoGenT_ValB" in entries[0]["scores"]
