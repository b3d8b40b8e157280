"""Faults injected where users meet them (issue 42): a read-only file system that os.access calls writable (root),
a full disk during export, Ctrl-C during a swap. Each ends in one true line saying where the models are, and no
model is lost."""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import signal

import pytest

from tests.test_bad_input import fake_report, tree_digest


@pytest.fixture()
def read_only(monkeypatch):
    """`add(dir)` makes dir behave as a read-only mount: creating anything under it fails with EROFS. (chmod does
    not stop root, and os.access answers from the mode bits alone: the fault this guards against.)"""
    roots = []

    def blocked(path) -> bool:
        path = os.path.abspath(os.fsdecode(path))
        return any(path == root or path.startswith(root + os.sep) for root in roots)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

    def fake_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+") and blocked(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and blocked(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if blocked(path):
            refuse(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    return lambda path: roots.append(os.path.abspath(path))


@pytest.fixture()
def submission(tiny_model_dir, tmp_path):
    """A current submission at tmp/app/submission (the tiny model, exported without the generation check)."""
    from open_r1.submission.export import export_submission

    path = tmp_path / "app" / "submission"
    export_submission(str(tiny_model_dir), str(path), verify=False)
    return path


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- a read-only target --------------------------------------------------------------------------------------------


def test_read_only_submission_fails_before_the_model_loads(
    tiny_model_dir, scene_data_dir, tmp_path, read_only, monkeypatch, capsys
):
    from open_r1 import grpo, modeling

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the read-only submission dir was refused")

    monkeypatch.setattr(modeling, "load_model", no_load)
    (tmp_path / "ro").mkdir()
    read_only(tmp_path / "ro")
    monkeypatch.setenv("SUBMISSION", str(tmp_path / "ro" / "submission"))
    rc = grpo.cli(
        [
            "--config",
            "configs/demo.yaml",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_name",
            os.path.join(scene_data_dir, "train"),
            "--output_dir",
            str(tmp_path / "run"),
            "--use_cpu",
            "true",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"submission dir: {tmp_path / 'ro'} is not writable: Read-only file system" in one_error_line(err)


def test_export_promote_and_scenes_into_a_read_only_place_are_one_line(
    tiny_model_dir, submission, tmp_path, read_only, capsys
):
    from open_r1.submission import export, promote
    from open_r1.tasks.counting.scenes import cli as scenes

    (tmp_path / "ro").mkdir()
    read_only(tmp_path / "ro")
    target = tmp_path / "ro" / "submission"
    assert export.main(["--checkpoint", str(tiny_model_dir), "--out", str(target), "--no-verify-generate"]) == 2
    assert "cannot write the submission" in one_error_line(capsys.readouterr().err)
    report = fake_report(tmp_path / "r.json", submission, {"val": 90.0})
    assert (
        promote.main(
            ["--candidate", str(submission), "--report", report, "--submission", str(target), "--no-verify-generate"]
        )
        == 2
    )
    assert "cannot write the submission" in one_error_line(capsys.readouterr().err)
    assert scenes.main(["--out", str(tmp_path / "ro" / "data"), "--splits", "train", "--train", "2"]) == 2
    assert "cannot write --out" in one_error_line(capsys.readouterr().err)
    assert os.listdir(tmp_path / "ro") == []


# ---- a full disk during export -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["oserror", "safetensors"])
def test_full_disk_during_export_keeps_the_old_submission(tiny_model_dir, submission, monkeypatch, capsys, fault):
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    from open_r1.submission import export

    def full_disk(self, directory, *args, **kwargs):
        with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
            handle.write(b"\0" * 64)  # part of the file made it to disk
        if fault == "oserror":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(directory, "model.safetensors"))
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    before = tree_digest(submission)
    assert (
        export.main(
            ["--checkpoint", str(tiny_model_dir), "--out", str(submission), "--no-verify-generate", "--replace"]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert "writing the new model failed" in line and "No space left on device" in line
    assert f"{submission} is unchanged" in line
    assert tree_digest(submission) == before
    assert sorted(os.listdir(submission.parent)) == ["submission"]  # no partial staging dir left


# ---- Ctrl-C during a swap ------------------------------------------------------------------------------------------


@pytest.fixture()
def ctrl_c_during_swap(monkeypatch):
    """SIGINT sent to this process in the middle of the swap (signals are held there, so it arrives as it ends)."""
    from open_r1.submission import install

    real = install._exchange

    def exchange(a, b):
        os.kill(os.getpid(), signal.SIGINT)
        return real(a, b)

    monkeypatch.setattr(install, "_exchange", exchange)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_export_swap_says_the_new_model_is_in_place(
    tiny_model_dir, submission, ctrl_c_during_swap, capsys
):
    """The swap finishes (signals are held there); the Ctrl-C then has nothing left to stop: one note, status 0."""
    from open_r1.submission import export

    before = tree_digest(submission)
    rc = export.main(
        ["--checkpoint", str(tiny_model_dir), "--out", str(submission), "--no-verify-generate", "--replace"]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "Traceback" not in captured.err and "unchanged" not in captured.err
    assert f"note: SIGINT after the new model was in place at {submission}" in captured.err
    kept = [p for p in submission.parent.iterdir() if p.name.startswith("submission.prev-")]
    assert len(kept) == 1 and tree_digest(kept[0]) == before
    assert f"previous model kept at {kept[0]}" in captured.err and (submission / "model.safetensors").is_file()


def test_ctrl_c_during_promote_swap_finishes_and_says_so(submission, tmp_path, ctrl_c_during_swap, capsys):
    from open_r1.submission import promote

    fake_report(submission / "selfcheck.json", submission, {"val": 40.0})
    before = tree_digest(submission)
    candidate = tmp_path / "candidate"
    shutil.copytree(submission, candidate)
    os.remove(candidate / "selfcheck.json")
    report = fake_report(tmp_path / "new.json", candidate, {"val": 90.0})
    rc = promote.main(
        ["--candidate", str(candidate), "--report", report, "--submission", str(submission), "--no-verify-generate"]
    )
    captured = capsys.readouterr()
    assert rc == 0 and "Traceback" not in captured.err, captured.err
    assert f"note: SIGINT after the new model was in place at {submission}" in captured.err
    assert f"promoted {candidate} -> {submission}" in captured.out
    assert json.loads((submission / "selfcheck.json").read_text())["mean_accuracy_pct"] == 90.0
    kept = [p for p in submission.parent.iterdir() if p.name.startswith("submission.replaced-")]
    assert len(kept) == 1 and tree_digest(kept[0]) == before


def test_promote_of_an_unmerged_adapter_names_the_users_dir(submission, tmp_path, capsys):
    from open_r1.submission import promote

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(submission)}))
    report = fake_report(tmp_path / "r.json", adapter, {"val": 90.0})
    assert (
        promote.main(
            [
                "--candidate",
                str(adapter),
                "--report",
                report,
                "--submission",
                str(tmp_path / "new"),
                "--no-verify-generate",
            ]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"merge it with python -m open_r1.submission.export --checkpoint {adapter} --out" in line
        and ".tmp-" not in line
    )


# ---- an error raised in a worker process ---------------------------------------------------------------------------


def test_scenes_too_small_for_their_objects_are_one_line_from_the_workers(tmp_path):
    from tests.test_bad_input import assert_clean_error, py

    rc, _, err = py(
        "-m",
        "open_r1.tasks.counting.scenes",
        "--out",
        str(tmp_path / "data"),
        "--splits",
        "train",
        "--train",
        "40",
        "--image-size",
        "32x32",
        "--workers",
        "2",
        "--no-progress",
    )
    assert_clean_error(rc, err, "error: could not lay out", "use a larger image")
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "data").exists()


class _BadRows:
    def __len__(self):
        return 2

    def __getitem__(self, index):
        from open_r1.errors import DataError

        raise DataError(f"row {index}: unreadable image; fix or drop that row")


def _bad_map(row):
    from open_r1.errors import DataError

    raise DataError("row 0: no gold count; fix that row")


def test_worker_errors_of_dataloader_and_dataset_map_unwrap_to_our_line():
    import datasets
    import torch

    from open_r1.errors import DataError, user_error

    with pytest.raises(DataError) as wrapped:  # torch re-raises the type with the worker's traceback as message
        list(torch.utils.data.DataLoader(_BadRows(), num_workers=1))
    assert "Traceback" in str(wrapped.value)
    found = user_error(wrapped.value)
    assert isinstance(found, DataError) and str(found) == "row 0: unreadable image; fix or drop that row"
    with pytest.raises(Exception) as mapped:
        datasets.Dataset.from_dict({"a": [1, 2, 3, 4]}).map(_bad_map, num_proc=2)
    assert str(user_error(mapped.value)) == "row 0: no gold count; fix that row"
    assert user_error(RuntimeError("a bug")) is None  # anything else stays a traceback


def test_a_full_disk_while_training_ends_in_one_line_naming_the_fix(monkeypatch, capsys):
    """The disk filling during a save (safetensors' Rust writer, or an OSError ENOSPC from Python, wrapped by the
    trainer) ends `open_r1.grpo` with one `error:` line and exit 2, not a traceback."""
    from safetensors import SafetensorError

    from open_r1 import grpo
    from open_r1.errors import user_error

    for cause in (
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/run/checkpoint-6/model.safetensors"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
    ):  # torch.save

        def full(*args, cause=cause):
            try:
                raise cause
            except Exception as exc:
                raise RuntimeError("saving failed") from exc

        monkeypatch.setattr(grpo, "parse_args", lambda argv: (None, None, None, None))
        monkeypatch.setattr(grpo, "main", full)
        assert grpo.cli(["--config", "x.yaml"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: writing failed, most likely on a full disk (")
        assert str(cause).splitlines()[0] in err[0] and "re-run the same command" in err[0]
    shm = RuntimeError("unable to write to file </torch_41_2_0>: No space left on device (28)")  # /dev/shm, not a disk
    assert user_error(shm) is None


def test_full_disk_during_promote_keeps_the_submission_and_the_candidate(submission, tmp_path, monkeypatch, capsys):
    from open_r1.submission import promote

    fake_report(submission / "selfcheck.json", submission, {"val": 40.0})
    before = tree_digest(submission)
    candidate = tmp_path / "candidate"
    shutil.copytree(submission, candidate)
    report = fake_report(tmp_path / "new.json", candidate, {"val": 90.0})

    def full_disk(src, dst, **kwargs):
        with open(os.path.join(dst, "config.json"), "w") as handle:
            handle.write("{")  # part of the copy made it to disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(dst, "model.safetensors"))

    monkeypatch.setattr(shutil, "copytree", full_disk)
    assert (
        promote.main(
            ["--candidate", str(candidate), "--report", report, "--submission", str(submission), "--no-verify-generate"]
        )
        == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and f"{submission} is unchanged" in line and str(candidate) in line
    assert tree_digest(submission) == before and sorted(os.listdir(submission.parent)) == ["submission"]
