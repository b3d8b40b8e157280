"""The one installer (`open_r1.submission.install`) under hostile use (issue 54): wrong paths refused before anything
is written, two installers on one target, a rename that fails, a kill between the renames, reports that score
impossible numbers. Each case ends in one error line or the user's data and models intact, byte for byte."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_bad_input import ROOT, fake_report, tree_digest


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def dir_with(path, text="old"):
    path.mkdir(parents=True)
    (path / "weights").write_text(text)
    return path


# ---- the path guard ------------------------------------------------------------------------------------------------


@pytest.fixture()
def ratings(tmp_path):
    from tests.test_prepare import fixture_contests, write_ratings

    contests, _ = fixture_contests()
    return write_ratings(str(tmp_path / "data" / "ratings"), {c: contests[c] for c in (500, 510, 700)})


def test_prepare_overwrite_never_removes_its_source_a_parent_or_a_foreign_dir(ratings, tmp_path, capsys):
    from open_r1.tasks.captioning import prepare

    before = tree_digest(tmp_path / "data")
    foreign = dir_with(tmp_path / "notes", "a year of work")
    for out, needle in (
        (ratings, f"it is an input {ratings}"),
        (os.path.dirname(ratings), f"it contains an input {ratings}"),
        (str(foreign), "it holds something other than a prepared data set"),
    ):
        assert prepare.main(["--ratings", ratings, "--out", out, "--overwrite"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert needle in line and out in line, line
    assert tree_digest(tmp_path / "data") == before and (foreign / "weights").read_text() == "a year of work"
    args = ["--ratings", ratings, "--out", str(foreign), "--overwrite", "--val-frac", "0.34", "--test-frac", "0.34"]
    assert prepare.main([*args, "--force"]) == 0
    assert (foreign / "prepare_report.json").is_file() and not (foreign / "weights").exists()
    assert prepare.main(args) == 0  # now a prepared set: --overwrite is enough
    assert sorted(os.listdir(tmp_path)) == ["data", "notes"]  # no staging, old dir or lock left


def test_export_and_promote_refuse_their_inputs_the_run_dir_the_repo_and_home(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from open_r1.submission import export, promote

    run = tmp_path / "work" / "run"
    shutil.copytree(tiny_model_dir, run)
    (run / "training_meta.json").write_text(json.dumps({"base_model": str(tiny_model_dir)}))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home")
    before = tree_digest(tmp_path)
    for out, needle in (
        (run, "it is the run dir"),
        (run.parent, "it contains the run dir"),
        (tiny_model_dir, "it is an input"),  # the base model
        (ROOT, f"it is the protected dir {ROOT}"),
        (tmp_path / "home", "it is the protected dir"),
        ("/", "it is the protected dir /"),
    ):
        argv = ["--checkpoint", str(run), "--out", str(out), "--base-model", str(tiny_model_dir)]
        assert export.main([*argv, "--no-verify-generate", "--force"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert needle in line and f"--out / SUBMISSION {out}" in line, line
    report = fake_report(tmp_path / "r.json", run, {"val": 90.0})
    for submission, needle in ((run, "it is an input"), (run.parent, "it contains an input"), (ROOT, "protected")):
        argv = ["--candidate", str(run), "--report", report, "--submission", str(submission), "--force"]
        assert promote.main([*argv, "--no-verify-generate"]) == 2
        assert needle in one_error_line(capsys.readouterr().err)
    os.remove(report)
    assert tree_digest(tmp_path) == before


def test_tiny_model_and_scenes_refuse_home_and_the_repo(tmp_path, monkeypatch, capsys):
    from open_r1.tasks.counting.scenes import cli as scenes
    from open_r1.tiny_models import main as tiny

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "notes").write_text("mine")
    before = tree_digest(tmp_path)
    assert tiny(["--out", str(tmp_path), "--overwrite"]) == 2
    assert f"--out {tmp_path}: it is the protected dir {tmp_path}" in one_error_line(capsys.readouterr().err)
    assert scenes.main(["--out", ROOT, "--overwrite", "--splits", "train", "--train", "2", "--no-progress"]) == 2
    assert f"--out {ROOT}: it is the protected dir {ROOT}" in one_error_line(capsys.readouterr().err)
    assert tree_digest(tmp_path) == before and not os.path.exists(os.path.join(ROOT, "train"))


def test_export_replaces_a_dir_that_holds_no_model_only_with_force(tiny_model_dir, tmp_path, capsys):
    from open_r1.submission import export

    out = dir_with(tmp_path / "photos", "holiday")
    argv = ["--checkpoint", str(tiny_model_dir), "--out", str(out), "--no-verify-generate"]
    assert export.main(argv) == 2
    assert "holds something other than the submission" in one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == ["photos"] and (out / "weights").read_text() == "holiday"
    assert export.main([*argv, "--force"]) == 0  # kept beside it all the same
    assert [(p / "weights").read_text() for p in tmp_path.iterdir() if p.name.startswith("photos.prev-")] == ["holiday"]


@pytest.mark.parametrize("layout", ["equal", "output inside submission"])
def test_train_sh_refuses_a_submission_that_is_or_holds_the_run_dir_before_training(tmp_path, layout):
    calls, fake = tmp_path / "calls", tmp_path / "python"
    fake.write_text(
        f'#!/usr/bin/env bash\ncase "$*" in -c*) exec {sys.executable} "$@" ;; *) echo "$*" >> {calls} ;; esac\n'
    )
    fake.chmod(0o755)
    run = tmp_path / "runs" / "r1"
    submission = run if layout == "equal" else tmp_path / "runs"
    env = {**os.environ, "PYTHON": str(fake), "MODEL_PATH": str(tmp_path), "DATA": str(tmp_path), "NUM_GPUS": "0"}
    env.update(OUTPUT_DIR=str(run), SUBMISSION=str(submission) + "/")
    result = subprocess.run(["bash", "train.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and not calls.exists(), result.stdout + result.stderr
    assert f"SUBMISSION={submission}/ is or contains OUTPUT_DIR={run}" in one_error_line(result.stderr)


# ---- the lock ------------------------------------------------------------------------------------------------------

HOLD = """
import os, sys, time
from open_r1.submission.install import locked
with locked(sys.argv[1]):
    open(sys.argv[2], "w").close()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.05)
"""


def test_a_second_installer_on_one_target_is_refused_never_racing(tiny_model_dir, tmp_path, capsys):
    """A first promote (90 %) holds the submission's lock (here paused in a child process); a second, worse one (30 %)
    is refused naming it; once the first is done the worse one is compared with 90 %, never with the stale 20 %."""
    from open_r1.submission import export, promote

    submission = tmp_path / "submission"
    export.export_submission(str(tiny_model_dir), str(submission), verify=False)
    fake_report(submission / "selfcheck.json", submission, {"val": 20.0})
    better, worse = tmp_path / "better", tmp_path / "worse"
    for candidate in (better, worse):
        shutil.copytree(submission, candidate)
        os.remove(candidate / "selfcheck.json")
    better_report = fake_report(tmp_path / "better.json", better, {"val": 90.0})
    worse_report = fake_report(tmp_path / "worse.json", worse, {"val": 30.0})
    started, go = tmp_path / "started", tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(submission), str(started), str(go)], cwd=ROOT)
    try:
        while not started.exists() and holder.poll() is None:
            time.sleep(0.05)
        before = tree_digest(submission)
        argv = ["--candidate", str(worse), "--report", worse_report, "--submission", str(submission)]
        assert promote.main([*argv, "--no-verify-generate"]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"another command (pid {holder.pid}) is writing {submission}" in line
        assert tree_digest(submission) == before
    finally:
        go.touch()
        holder.wait(timeout=60)
    first = ["--candidate", str(better), "--report", better_report, "--submission", str(submission)]
    assert promote.main([*first, "--no-verify-generate"]) == 0
    assert "(was 20.00%)" in capsys.readouterr().out
    assert promote.main([*argv, "--no-verify-generate"]) == 1
    assert "the current submission 90.00%" in capsys.readouterr().err
    assert json.loads((submission / "selfcheck.json").read_text())["mean_accuracy_pct"] == 90.0


# ---- a rename that fails, a kill between the renames -----------------------------------------------------------------


def test_an_install_whose_second_rename_fails_puts_the_old_one_back(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from open_r1.submission import export, install, promote

    submission = tmp_path / "submission"
    export.export_submission(str(tiny_model_dir), str(submission), verify=False)
    fake_report(submission / "selfcheck.json", submission, {"val": 20.0})
    candidate = tmp_path / "candidate"
    shutil.copytree(submission, candidate)
    report = fake_report(tmp_path / "new.json", candidate, {"val": 90.0})
    before, rename = tree_digest(submission), os.rename

    def failing_rename(src, dst):
        if os.fspath(dst) == str(submission) and ".submission.tmp-" in os.fspath(src):
            raise OSError(errno.EIO, os.strerror(errno.EIO), os.fspath(dst))
        rename(src, dst)

    monkeypatch.setattr(install, "_exchange", lambda a, b: False)  # the two-rename path
    monkeypatch.setattr(os, "rename", failing_rename)
    argv = ["--candidate", str(candidate), "--report", report, "--submission", str(submission)]
    assert promote.main([*argv, "--no-verify-generate"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "copying the candidate failed: Input/output error" in line and f"{submission} (unchanged)" in line
    assert tree_digest(submission) == before and tree_digest(candidate) != {}
    assert sorted(os.listdir(tmp_path)) == ["candidate", "new.json", "submission"]


KILL_BETWEEN_RENAMES = """
import os, signal, sys
from open_r1.submission import install
install._exchange = lambda a, b: False
rename = os.rename
def rename_then_die(src, dst):
    if os.fspath(dst) == sys.argv[1]:
        os.kill(os.getpid(), signal.SIGKILL)  # the old dir is aside, the new one not yet in place
    rename(src, dst)
os.rename = rename_then_die
with install.installing(sys.argv[1]) as staging:
    open(os.path.join(staging, "weights"), "w").write("new")
"""


@pytest.mark.parametrize("keep_old", [False, True])
def test_a_kill_between_the_renames_is_recovered_on_the_next_run(tmp_path, keep_old, caplog):
    """prepare's --out and every stage output (old dir deleted) and the submission (old dir kept): the next command
    on the path puts the complete new dir in place and says so."""
    from open_r1.submission import install

    target = dir_with(tmp_path / "out")
    code = KILL_BETWEEN_RENAMES.replace(
        "installing(sys.argv[1])", f"installing(sys.argv[1], {keep_old!r} and sys.argv[1] + '.prev')"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(target)], cwd=ROOT)
    assert killed.returncode == -9 and not target.exists()
    caplog.set_level(logging.INFO, logger="open_r1")
    install.settle(str(target))
    assert (target / "weights").read_text() == "new" and "completed an interrupted install" in caplog.messages[0]
    assert sorted(os.listdir(tmp_path)) == (["out", "out.prev"] if keep_old else ["out"])
    with install.installing(target) as staging:  # and the next install just works
        (tmp_path / staging / "weights").write_text("newer")
    assert (target / "weights").read_text() == "newer"


@pytest.mark.parametrize("fault", ["none", "in_the_build", "partial staging of a dead run"])
def test_an_install_replaces_the_old_dir_whole_or_leaves_it(tmp_path, fault):
    """`installing` (model dirs, the RM, tiny checkpoints, the prepared captions): a fault while building leaves the
    old dir as it was; the staging dirs of an install that died are removed by the next one; nothing is left beside."""
    from open_r1.submission import install

    out = dir_with(tmp_path / "model")
    if fault == "partial staging of a dead run":
        dir_with(tmp_path / ".model.tmp-dead", "half")
    with pytest.raises(KeyboardInterrupt) if fault == "in_the_build" else contextlib.nullcontext():
        with install.installing(out) as staging:
            (tmp_path / staging / "weights").write_text("new")
            if fault == "in_the_build":
                raise KeyboardInterrupt
    assert (out / "weights").read_text() == ("old" if fault == "in_the_build" else "new")
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_a_swap_a_kill_left_is_finished_or_undone_by_its_journal(tmp_path):
    """The states a SIGKILL or power loss can leave, journaled in the lock file (signals are held in the swap)."""
    from open_r1.submission import install

    target, staging, aside = tmp_path / "sub", tmp_path / ".sub.tmp-x", tmp_path / "sub.prev-1"

    def journal():
        record = {"staging": str(staging), "aside": str(aside), "new_inode": os.stat(staging).st_ino}
        (tmp_path / ".sub.lock").write_text(json.dumps({**record, "keep_old": True, "keep_new": True}))

    # 1. killed after moving the old one aside (two-rename fallback): the new one is put in place
    dir_with(aside, "old"), dir_with(staging, "new"), journal()
    install.settle(str(target))
    assert (target / "weights").read_text() == "new" and (aside / "weights").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["sub", "sub.prev-1"]
    shutil.rmtree(target), shutil.rmtree(aside)
    # 2. killed right after the atomic exchange: the old one (now at the staging path) is moved aside, kept
    dir_with(staging, "new"), journal()
    os.rename(staging, target)
    dir_with(staging, "old")
    install.settle(str(target))
    assert (target / "weights").read_text() == "new" and (aside / "weights").read_text() == "old"
    shutil.rmtree(target), shutil.rmtree(aside)
    # 3. killed before anything moved: the old one stays, the verified new one is kept beside it
    dir_with(target, "old"), dir_with(staging, "new"), journal()
    install.settle(str(target))
    assert (target / "weights").read_text() == "old" and not staging.exists()
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("sub.candidate-")]
    assert len(kept) == 1 and (kept[0] / "weights").read_text() == "new"
    assert not (tmp_path / ".sub.lock").exists()


# ---- reports that score impossible numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("score", [float("inf"), float("nan"), 150.0, -5.0])
def test_promote_refuses_a_report_that_scores_no_percentage_even_with_force(tiny_model_dir, tmp_path, capsys, score):
    from open_r1.submission import export, promote

    submission, candidate = tmp_path / "submission", tmp_path / "candidate"
    export.export_submission(str(tiny_model_dir), str(submission), verify=False)
    shutil.copytree(submission, candidate)
    fake_report(submission / "selfcheck.json", submission, {"val": 20.0})
    report = fake_report(tmp_path / "bogus.json", candidate, {"val": score})
    before = tree_digest(submission)
    argv = ["--candidate", str(candidate), "--report", report, "--submission", str(submission)]
    for force in ([], ["--force"]):
        assert promote.main([*argv, *force, "--no-verify-generate"]) == 2
        assert "not percentages from 0 to 100" in one_error_line(capsys.readouterr().err)
    assert tree_digest(submission) == before
    # a bogus current score blocks no real improvement: it is named, and --force replaces it
    os.replace(report, submission / "selfcheck.json")
    better = fake_report(tmp_path / "new.json", candidate, {"val": 90.0})
    argv = ["--candidate", str(candidate), "--report", better, "--submission", str(submission)]
    assert promote.main([*argv, "--no-verify-generate"]) == 2
    assert "Re-score the current submission" in one_error_line(capsys.readouterr().err)
    assert promote.main([*argv, "--force", "--no-verify-generate"]) == 0


def test_promote_on_a_full_disk_is_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """copytree collects its files' errors into one shutil.Error: the line gives the first, not the list's repr."""
    from open_r1.submission import export, promote

    submission, candidate = tmp_path / "submission", tmp_path / "candidate"
    export.export_submission(str(tiny_model_dir), str(submission), verify=False)
    shutil.copytree(submission, candidate)
    report = fake_report(tmp_path / "new.json", candidate, {"val": 90.0})
    before = tree_digest(submission)

    def full(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)

    monkeypatch.setattr(shutil, "copyfile", full)
    argv = ["--candidate", str(candidate), "--report", report, "--submission", str(submission), "--force"]
    assert promote.main([*argv, "--no-verify-generate"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "copying the candidate failed: [Errno 28] No space left on device" in line
    assert "[(" not in line and f"{submission} is unchanged" in line
    assert tree_digest(submission) == before


def test_ctrl_c_in_prepare_is_one_line_and_keeps_the_old_set(ratings, tmp_path, monkeypatch, capsys):
    from open_r1.tasks.captioning import prepare

    out = str(tmp_path / "prepared")
    args = ["--ratings", ratings, "--out", out, "--val-frac", "0.34", "--test-frac", "0.34"]
    assert prepare.main(args) == 0
    before = tree_digest(out)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "place_cartoon", interrupted)
    assert prepare.main([*args, "--overwrite"]) == 130
    assert f"{out} is unchanged" in one_error_line(capsys.readouterr().err)
    assert tree_digest(out) == before and sorted(os.listdir(tmp_path)) == ["data", "prepared"]
