"""The captioning recipe's keys: every key of a section is one its stage reads, so a typo (``--set
rm.max_second=300``) is an error before any stage runs instead of a setting silently ignored on a long GPU chain."""
from __future__ import annotations

import re

import pytest

from open_r1.errors import RecipeError
from open_r1.tasks.captioning import stage_common as common

H200 = "configs/captioning/standin_h200.yaml"


def test_the_error_names_every_unknown_key_the_section_and_its_valid_keys_sorted():
    with pytest.raises(RecipeError) as info:
        common.check_keys("rm", {"k": 3.0, "max_second": 1, "zzz": 2}, ("seeds", "max_seconds", "k"), "a hint")
    assert str(info.value) == ("unknown key(s) rm.max_second (did you mean rm.max_seconds?), rm.zzz in section rm; "
                               "valid keys in section rm: k, max_seconds, seeds; a hint")
    common.check_keys("rm", {"k": 3.0}, ("seeds", "k"))  # nothing unknown: no error


def test_time_budget_s_is_no_longer_a_recipe_key(tmp_path):
    """Nothing read it: a recipe that sets it fails (in the file or from --set) instead of seeming to cap the run."""
    path = tmp_path / "recipe.yaml"
    path.write_text("name: t\ntime_budget_s: 1500\nrm: {k: 3.0}\n")
    with pytest.raises(RecipeError, match=r"unknown key\(s\) time_budget_s at the top level.*in the recipe "
                       + re.escape(str(path))):
        common.load_recipe(str(path))
    with pytest.raises(RecipeError, match=r"time_budget_s at the top level.*from --set time_budget_s=1500"):
        common.load_recipe(H200, ["time_budget_s=1500"])


def test_a_misspelt_section_from_set_fails_naming_the_override():
    with pytest.raises(RecipeError, match=re.escape("unknown key(s) rmm (did you mean rm?) at the top level")) as info:
        common.load_recipe(H200, ["rm.max_seconds=60", "rmm.seeds=[0]"])
    assert str(info.value).endswith("; from --set rmm.seeds=[0]")
    assert "start_early" in str(info.value) and "work_dir" in str(info.value)
