"""`open_r1.checks.is_int` / `is_number`: the one check behind every "a number from a recipe or data" test.

bool is an int subclass, so a YAML/JSON `true` must never pass as 1; numpy integers (and, for `is_number`, numpy
floats) pass, as data columns and generators hand them out. `is_number` says nothing about the value: nan and inf
are numbers (callers that need a finite one check `math.isfinite` too).
"""

from __future__ import annotations

import fractions
import subprocess
import sys

import numpy as np
import pytest

from open_r1.checks import is_int, is_number

# ---- is_int ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, -3, 2**70, np.int64(5), np.int32(-1), np.uint8(7)])
def test_is_int_accepts_integers(value):
    assert is_int(value) is True


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        np.True_,
        np.False_,
        1.0,
        0.0,
        float("nan"),
        float("inf"),
        np.float32(1.0),
        np.float64(2.0),
        fractions.Fraction(4, 2),
        "1",
        "",
        None,
        [1],
        1 + 0j,
    ],
)
def test_is_int_rejects_the_rest(value):
    assert is_int(value) is False


# ---- is_number ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        0,
        1,
        -3,
        1.0,
        -0.5,
        np.int64(5),
        np.uint8(7),
        np.float32(0.25),
        np.float64(2.0),
        np.float16(1.5),
        fractions.Fraction(1, 2),
    ],
)
def test_is_number_accepts_real_numbers(value):
    assert is_number(value) is True


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), np.float32("nan")])
def test_is_number_does_not_judge_the_value(value):
    """nan and inf are numbers: a caller that needs a finite one checks that itself (as validate_captions does)."""
    assert is_number(value) is True


@pytest.mark.parametrize(
    "value", [True, False, np.True_, np.False_, "1", "1.0", "nan", "", None, [1.0], {}, 1 + 0j, np.complex64(1)]
)
def test_is_number_rejects_the_rest(value):
    assert is_number(value) is False


def test_the_checks_do_not_import_numpy():
    """The helpers reach numpy through `numbers` (numpy registers its scalars); importing the checks stays light."""
    code = "import sys, open_r1.checks; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


# ---- a few sites that use them --------------------------------------------------------------------------------------


def test_reward_params_reject_bool_and_accept_numpy():
    from open_r1.errors import RewardConfigError
    from open_r1.rewards import _require_number

    _require_number("r", "p", np.int64(3), integer=True)
    _require_number("r", "p", np.float32(0.5))
    with pytest.raises(RewardConfigError, match="r: p must be an integer, got True"):
        _require_number("r", "p", True, integer=True)
    with pytest.raises(RewardConfigError, match="r: p must be an integer, got 2.0"):
        _require_number("r", "p", 2.0, integer=True)
    with pytest.raises(RewardConfigError, match="r: p must be a number, got False"):
        _require_number("r", "p", False)


def test_time_budget_takes_numpy_seconds_and_not_bools():
    from open_r1.errors import BudgetError
    from open_r1.run.budget import parse_time_budget

    assert parse_time_budget(np.int64(60), start=1000.0) == 1060.0
    assert parse_time_budget(np.float32(30.5), start=1000.0) == 1030.5
    with pytest.raises(BudgetError):
        parse_time_budget(True, start=1000.0)


def test_recipe_counts_reject_bool():
    from open_r1.errors import RecipeError
    from standin.captioning import demo

    H200 = "configs/captioning/standin_h200.yaml"
    with pytest.raises(RecipeError, match="rm.image_negative_top_k must be a whole number, got True"):
        demo.load_recipe(H200, ["rm.image_negative_top_k=true"])
    with pytest.raises(RecipeError, match=r"rm.seeds must be .*got \[0, True\]"):
        demo.load_recipe(H200, ["rm.seeds=[0, true]"])


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("num_generations", "0", "num_generations must be >= 2, got 0"),  # was a ZeroDivisionError in GRPOConfig
        ("max_steps", "0", "max_steps must be >= 1, or -1 to train num_train_epochs, got 0"),  # trained by epochs
        ("max_steps", "-5", "max_steps must be >= 1, or -1 to train num_train_epochs, got -5"),
        ("per_device_train_batch_size", "0", "per_device_train_batch_size must be >= 1, got 0"),
        ("steps_per_generation", "0", "steps_per_generation must be >= 1, got 0"),
        ("num_train_epochs", "0", "num_train_epochs must be > 0 when max_steps is -1, got 0.0"),  # no step trained
    ],
)
def test_group_sizes_and_step_counts_are_one_error_as_the_recipe_is_parsed(tmp_path, capsys, flag, value, message):
    """Before GRPOConfig is built (it divides by the group size) and before any path or model is looked at."""
    from open_r1 import grpo

    argv = ["--config", "configs/demo.yaml", "--model_name_or_path", str(tmp_path / "none")]
    by_epochs = ["--max_steps", "-1"] if flag == "num_train_epochs" else []
    assert grpo.cli([*argv, *by_epochs, f"--{flag}", value, "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {message} (--{flag})\n" and not (tmp_path / "run").exists()
    assert grpo.parse_args([*argv, "--max_steps", "-1"])[1].max_steps == -1  # HF's "by epochs" stays


def test_the_loss_types_are_trls():
    """`LOSS_TYPES` is the list TRL's GRPOConfig.loss_type help names (a TRL upgrade that adds or drops one fails
    here, not in a user's run)."""
    import dataclasses
    import re

    from trl import GRPOConfig

    from open_r1.checks import LOSS_TYPES, check_loss_type

    text = " ".join({f.name: f for f in dataclasses.fields(GRPOConfig)}["loss_type"].metadata["help"].split())
    listed = re.search(r"Supported values are (.*?)\.", text).group(1)
    assert set(re.findall(r"'([a-z_]+)'", listed)) == set(LOSS_TYPES)

    class Args:
        loss_type = "dapo"

    assert check_loss_type(Args) == []
    Args.loss_type = "DAPO"
    assert check_loss_type(Args) == ["loss_type 'DAPO' is not one of TRL's " + ", ".join(LOSS_TYPES) + " (--loss_type)"]


def test_lost_updates_warning_names_the_weights_adamw_cannot_move():
    """Full fine-tuning of bf16 weights without DeepSpeed warns with the magnitude above which torch's own AdamW
    (at the recipe's learning rate) leaves a bf16 weight unchanged; no warning under DeepSpeed, with LoRA, in fp32."""
    import re
    from types import SimpleNamespace

    import torch

    from open_r1 import modeling
    from open_r1.checks import lost_updates_warning

    args = SimpleNamespace(learning_rate=1e-6, deepspeed=None)
    for dtype in (torch.bfloat16, torch.float16):
        threshold = float(re.search(r"above ([0-9.e+-]+) in magnitude", lost_updates_warning(args, dtype)).group(1))
        weights = torch.logspace(-5, 0, 4000).to(dtype)
        param = torch.nn.Parameter(weights.clone())
        param.grad = torch.ones_like(param)
        torch.optim.AdamW([param], lr=args.learning_rate, weight_decay=0.0).step()
        moved = param.detach() != weights
        assert not moved[weights.float() >= threshold].any() and moved[weights.float() < threshold / 2].all(), dtype
    assert lost_updates_warning(SimpleNamespace(learning_rate=1e-6, deepspeed="zero3.json"), torch.bfloat16) is None
    assert lost_updates_warning(args, torch.bfloat16, use_peft=True) is None
    assert lost_updates_warning(args, torch.float32) is None
    # the recipe's dtype as load_model resolves it: the warning's input in validate_training
    assert lost_updates_warning(args, modeling.resolve_dtype("bfloat16")) is not None


def test_a_deepspeed_granularity_threshold_is_refused(tmp_path):
    """zero3.json passes; a config whose stage3_module_granularity_threshold could make the vision tower a ZeRO-3 leaf
    (its gradients would be dropped) is refused, as a file or a dict."""
    import json
    from pathlib import Path

    from open_r1.checks import granularity_problems

    zero3 = Path(__file__).resolve().parents[1] / "zero3.json"
    shipped = json.loads(zero3.read_text())
    assert granularity_problems(str(zero3)) == [] and granularity_problems(None) == []
    risky = {
        **shipped,
        "zero_optimization": {**shipped["zero_optimization"], "stage3_module_granularity_threshold": 5e6},
    }
    path = tmp_path / "z3.json"
    path.write_text(json.dumps(risky))
    for config in (str(path), risky):
        (problem,) = granularity_problems(config)
        assert problem.startswith("--deepspeed: remove stage3_module_granularity_threshold")
