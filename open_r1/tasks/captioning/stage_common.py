"""What the captioning stage drivers share: one YAML recipe per pipeline, its paths, logging, and the CLI shell.

A recipe (``configs/captioning/*.yaml``) has one section per stage (``data``, ``pretrain``, ``synthesize``, ``sft``,
the optional ``ratings``, ``rm``, ``grpo``, ``eval``) plus ``work_dir`` and ``seed``; every stage reads its section and the shared paths
below, so the stages can run one by one (``python -m open_r1.tasks.captioning.stage_<name> --config R``) or all in
one process (``python -m open_r1.tasks.captioning.pipeline --config R``). ``--set section.key=value`` overrides any
key (the value is parsed as YAML). ``stage: {...}`` blocks may also name explicit paths (``model``, ``data``, ...)
so a stage can run on the real data and models without the rest of the chain. A key that nothing reads (a typo such
as ``--set rm.max_second=300``) is an error before anything runs: at the top level in `load_recipe`, in a section
in its stage's ``check_recipe`` (the stage module's ``SECTION_KEYS``, through `check_section`), and so is a value its
stage could not use (``--set eval.n=sixteen``, which would otherwise fail at the chain's last stage): each section's
keys map to the `Kind` of value the stage reads.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from open_r1.errors import OpenR1Error, RecipeError
from open_r1.validate import is_number

STAGES = ("data", "pretrain", "synthesize", "sft", "ratings", "rm", "grpo", "eval")
TOP_LEVEL_KEYS = ("work_dir", "seed", "name", "notes", "start_early")  # besides the stage sections


def load_recipe(path: str, overrides: list[str] | None = None) -> dict:
    """The recipe at `path` with the ``--set`` `overrides` applied; an unknown top-level key (a misspelt section)
    is an error, in the file and after the overrides (a stage's own keys: its ``check_recipe``)."""
    import yaml

    if not os.path.isfile(path):
        raise RecipeError(f"recipe {path} does not exist; see configs/captioning/*.yaml")
    with open(path) as handle:
        try:
            recipe = yaml.safe_load(handle) or {}
        except yaml.YAMLError as exc:
            raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(recipe, dict):
        raise RecipeError(f"recipe {path} must be a mapping of stage sections")
    valid = (*TOP_LEVEL_KEYS, *STAGES)
    check_keys("", recipe, valid, f"in the recipe {path}")
    for item in overrides or []:
        apply_override(recipe, item)
    added = [item for item in overrides or [] if item.partition("=")[0].split(".")[0] not in valid]
    check_keys("", recipe, valid, "from " + " ".join(f"--set {item}" for item in added))
    recipe.setdefault("work_dir", "runs/humor")
    recipe.setdefault("seed", 0)
    check_values("", recipe, {"work_dir": TEXT, "seed": whole()})
    recipe["_recipe_path"] = os.path.abspath(path)
    return recipe


def check_keys(name: str, cfg: dict, valid, hint: str = "", listed: str | None = None) -> None:
    """Refuse the keys of recipe section `name` ("" for the top level) that are not in `valid`, the keys that its
    stage reads: a misspelt key would otherwise be ignored without a word (``--set rm.max_second=300``). One
    RecipeError names every unknown key (with the closest valid key where one is close), the section and its valid
    keys, sorted (`listed`: the text that stands for them instead, where they are too many to list), then `hint`."""
    valid = [str(key) for key in valid]
    unknown = sorted(str(key) for key in cfg if str(key) not in valid)
    if not unknown:
        return
    prefix, where = (f"{name}.", f"in section {name}") if name else ("", "at the top level")
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, valid, n=1)
        named.append(prefix + key + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
    raise RecipeError(f"unknown key(s) {', '.join(named)} {where}; valid keys {where}: "
                      f"{listed or ', '.join(sorted(valid))}" + (f"; {hint}" if hint else ""))


class Kind(NamedTuple):
    """The kind of value a stage reads from one recipe key: `ok` says whether it can use `value`, `what` names it."""

    what: str
    ok: Callable[[Any], bool]


def _as_float(value) -> float | None:
    """`value` as the stages read a number (``float(value)``: YAML leaves ``1e-4`` a string), None if it is none."""
    if isinstance(value, bool) or not (is_number(value) or isinstance(value, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if number == number and abs(number) != float("inf") else None


def whole(minimum: int | None = None) -> Kind:
    """A whole number (``int(value)``), at least `minimum`."""
    def ok(value) -> bool:
        if isinstance(value, str):  # int("2.0") fails where float("2.0") does not
            try:
                int(value)
            except ValueError:
                return False
        number = _as_float(value)
        return number is not None and number.is_integer() and (minimum is None or number >= minimum)

    return Kind("a whole number" + (f" >= {minimum}" if minimum is not None else ""), ok)


def number(minimum: float | None = None, maximum: float | None = None, above: bool = False,
           below: bool = False) -> Kind:
    """A finite number (``float(value)``) in [minimum, maximum] (`above` / `below`: the bound itself excluded)."""
    def ok(value) -> bool:
        x = _as_float(value)
        return (x is not None and (minimum is None or (x > minimum if above else x >= minimum))
                and (maximum is None or (x < maximum if below else x <= maximum)))

    low = "" if minimum is None else f"{'>' if above else '>='} {minimum:g}"
    high = "" if maximum is None else f"{'<' if below else '<='} {maximum:g}"
    return Kind("a number" + (" " + " and ".join(b for b in (low, high) if b) if low or high else ""), ok)


def optional(kind: Kind) -> Kind:
    """`kind`, or null (the stage's default then)."""
    return Kind(kind.what + " or null", lambda value: value is None or kind.ok(value))


BOOL = Kind("true or false", lambda value: isinstance(value, bool))
TEXT = Kind("a non-empty string", lambda value: isinstance(value, str) and bool(value.strip()))
TEXTS = Kind("a list of non-empty strings", lambda value: isinstance(value, list)
             and all(isinstance(v, str) and v.strip() for v in value))
MAPPING = Kind("a mapping", lambda value: isinstance(value, dict))
ANY = Kind("anything", lambda value: True)  # a key whose value its stage checks itself


def choice(*values) -> Kind:
    """One of `values`."""
    return Kind("one of " + ", ".join(map(repr, values)), lambda value: value in values)


DTYPE = optional(choice("float32", "bfloat16", "float16", "auto"))
PIXELS = optional(whole(1))  # a processor's min_pixels / max_pixels (null: the saved processor's)


def check_values(name: str, cfg: dict, kinds: dict[str, Kind]) -> None:
    """Refuse the values of section `name` that its stage could not use: one RecipeError naming every such key, the
    kind of value it needs and the value given."""
    prefix = f"{name}." if name else ""
    bad = [f"{prefix}{key} must be {kinds[key].what}, got {value!r}" for key, value in cfg.items()
           if key in kinds and not kinds[key].ok(value)]
    if bad:
        raise RecipeError("; ".join(bad))


def check_decoder(name: str, cfg: dict) -> None:
    """``<name>.decoder``: null or one of `open_r1.decoding.DECODER_CHOICES` (the generation helper's check, made
    before the stage's model loads)."""
    decoder = cfg.get("decoder")
    if decoder is not None:
        from open_r1.decoding import DECODER_CHOICES

        if decoder not in DECODER_CHOICES:
            raise RecipeError(f"{name}.decoder must be one of {', '.join(DECODER_CHOICES)} or null, got {decoder!r}")


def seed_list(key: str, seeds) -> list[int]:
    """``<key>`` (rm.seeds, grpo.seeds): a non-empty list of distinct whole numbers, one run per seed."""
    from open_r1.validate import is_int

    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or not all(is_int(s) for s in seeds)):
        raise RecipeError(f"{key} must be a list of distinct integers, e.g. [0, 1, 2]; got {seeds!r}")
    return [int(s) for s in seeds]


def check_section(name: str, cfg: dict, kinds: dict[str, Kind], hint: str = "") -> None:
    """`check_keys` with the section's keys, then `check_values`."""
    check_keys(name, cfg, kinds, hint)
    check_values(name, cfg, kinds)


def apply_override(recipe: dict, item: str) -> None:
    import yaml

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise RecipeError(f"--set {item!r} is not section.key=value")
    parts = key.split(".")
    node = recipe
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise RecipeError(f"--set {item!r}: {part} is not a section")
    node[parts[-1]] = yaml.safe_load(value)


def section(recipe: dict, name: str) -> dict:
    value = recipe.get(name) or {}
    if not isinstance(value, dict):
        raise RecipeError(f"recipe section {name!r} must be a mapping, got {value!r}")
    return copy.deepcopy(value)


class Paths:
    """Where every stage reads and writes, under the recipe's work_dir (a stage's explicit path keys win)."""

    def __init__(self, recipe: dict):
        self.root = os.path.abspath(recipe["work_dir"])
        self.data = os.path.abspath(section(recipe, "data").get("dir") or os.path.join(self.root, "data"))
        self.models = os.path.join(self.root, "models")
        self.results = os.path.join(self.root, "results")
        pretrain = section(recipe, "pretrain")
        self.policy_base = os.path.abspath(pretrain.get("policy_out") or os.path.join(self.models, "policy-base"))
        self.rm_base = os.path.abspath(pretrain.get("rm_out") or os.path.join(self.models, "rm-backbone"))
        self.traces = os.path.join(self.root, "traces")
        self.policy_sft = os.path.abspath(section(recipe, "sft").get("out") or os.path.join(self.models, "policy-sft"))
        rm = section(recipe, "rm")
        self.rm = os.path.abspath(rm.get("out") or os.path.join(self.models, "rm"))
        self.rm_blind = os.path.abspath(rm.get("blind_out") or os.path.join(self.models, "rm-blind"))
        self.grpo = os.path.join(self.root, "grpo")

    def rm_seed(self, seed: int) -> str:
        """One seed's RM when ``rm.seeds`` lists several (the one chosen on val is then copied to ``rm``)."""
        return f"{self.rm}-s{int(seed)}"

    def split(self, name: str) -> str:
        return os.path.join(self.data, name)

    def grpo_run(self, seed: int) -> str:
        return os.path.join(self.grpo, f"seed{seed}")

    def grpo_model(self, seed: int) -> str:
        return os.path.join(self.models, f"policy-grpo-seed{seed}")


MODEL_MARKER = "config.json"
RM_MARKER = "reward_model.json"  # open_r1.reward_model.META_FILE (a test holds them equal; that module imports torch)
DATASET_MARKER = "state.json"  # what Dataset.save_to_disk writes


class Input(NamedTuple):
    """A stage's input that an earlier stage writes: where, what it is, the stage that makes it, the recipe key that
    names another one, and the file that shows it is complete."""
    path: str
    what: str
    made_by: str
    key: str
    marker: str = MODEL_MARKER


def split_input(paths: Paths, split: str, made_by: str = "data", key: str = "data.dir") -> Input:
    return Input(paths.split(split), f"the {split} split", made_by, key, DATASET_MARKER)


def check_inputs(inputs: dict[str, Input], produced=()) -> dict[str, str]:
    """Each input's path, after checking that it is there (those of the stages in `produced`, which run first, are
    not checked): checked before anything loads, with one error that names the stage to run (a work_dir lost with a
    machine, a stage skipped) instead of a loader's traceback."""
    for item in inputs.values():
        if item.made_by in produced or os.path.isfile(os.path.join(item.path, item.marker)):
            continue
        state = "does not exist" if not os.path.exists(item.path) else f"has no {item.marker}"
        fix = (f"run the {item.made_by} stage first with the same recipe and work_dir (--stages {item.made_by} ...), "
               f"or set {item.key} to an existing one" if item.made_by in STAGES else f"set {item.key} to an existing one")
        fix += "; real data: open-r1-caption-prepare --ratings REPO --out DIR, then data.dir=DIR" if item.key == "data.dir" else ""
        raise RecipeError(f"{item.what} {item.path} {state}: {fix}")
    return {name: item.path for name, item in inputs.items()}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: str, value: Any) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(value, handle, indent=1, default=str)
    os.replace(tmp, path)
    return path


def read_json(path: str) -> Any:
    with open(path) as handle:
        return json.load(handle)


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def stage_cli(name: str, run: Callable[[dict], dict], doc: str, argv: list[str] | None = None,
              check: Callable[[dict], Any] | None = None) -> int:
    """`python -m open_r1.tasks.captioning.stage_<name> --config R [--set k=v ...]`: check the recipe (`check`: the
    stage's ``check_recipe``, before anything loads), run one stage, print its summary JSON, exit 2 with one line on
    a user error."""
    parser = argparse.ArgumentParser(prog=f"python -m open_r1.tasks.captioning.stage_{name}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="pipeline recipe (configs/captioning/*.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a recipe key (repeatable), e.g. --set rm.max_seconds=60")
    parser.add_argument("--result", default=None, help="also write the stage's summary JSON to this file")
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.config, args.set)
        if check is not None:
            check(recipe)
        summary = run(recipe)
    except OpenR1Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.result:
        write_json(args.result, summary)
    text = json.dumps(summary, indent=1, default=str)
    print(text if len(text) < 3000 else text[:3000] + " ...")
    return 0


def time_cap(max_seconds: float | None):
    """A callback that ends training after `max_seconds` of steps (the first step's compile time not counted): the
    stand-in's stage-wise time budget. (The engine's `time_budget` is a deadline for a submission, with export and
    verification reserves; this is a plain training cap.)"""
    from transformers import TrainerCallback

    class TimeCap(TrainerCallback):
        t0 = None

        def on_step_end(self, args, state, control, **kwargs):
            self.t0 = self.t0 or time.time()
            if max_seconds and time.time() - self.t0 > float(max_seconds):
                control.should_training_stop = True
            return control

    return TimeCap()
