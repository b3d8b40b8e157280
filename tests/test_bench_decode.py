"""experiments/bench/bench_decode.py (the captioning-shape decode bench) in its --tiny CPU mode: the machinery, not
the speed (the GPU numbers are the lead's runs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(out, *args, timeout=900):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.bench.bench_decode",
            "--tiny",
            "--out",
            str(out),
            "--rows",
            "1",
            "--tokens",
            "2",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return proc.stdout, rows


@pytest.mark.slow
def test_tiny_decode_bench_measures_each_variant_in_its_own_process(tmp_path):
    stdout, rows = _run(tmp_path / "out", "--variants", "hf,graph_once_warm", "--scratch", str(tmp_path / "scratch"))
    measured = [r for r in rows if "sampling" in r]
    assert [(r["variant"], r["sampling"]) for r in measured] == [
        ("hf", "top-p 0.95"),
        ("graph_once_warm", "top-p 0.95"),
        ("graph_once_warm", "top-p 1.0"),
        ("graph_once_warm", "top-k 20 + top-p 0.95"),
    ]
    assert all(r["ms_per_step"] > 0 and "error" not in r for r in measured)
    assert all(r["first_call_s"] > 0 and r["steps"] == 2 for r in measured[1:])  # min_new_tokens forces the length
    assert (tmp_path / "scratch" / "inductor-once").is_dir()  # the compiled variant's own cache directory
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == rows
    assert all(r["layers_once"] for r in measured[1:])
    assert "| graph_once_warm | top-k 20 + top-p 0.95 |" in stdout


def test_a_spent_budget_records_every_variant_as_skipped(tmp_path):
    stdout, rows = _run(tmp_path, "--budget-s", "0", timeout=120)
    assert [(r["variant"], r["event"]) for r in rows] == [
        (v, "skipped") for v in ("hf", "eager", "graph_once", "graph_once_warm", "graph")
    ]
    assert "| variant | sampling |" in stdout
