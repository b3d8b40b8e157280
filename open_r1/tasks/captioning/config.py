"""The captioning recipe: one YAML file (``configs/captioning/*.yaml``), parsed once into typed settings.

Top-level keys (`RunConfig`) and one section per stage, each a dataclass (the stage's ``Config``) parsed strictly by
`parse_section`: an unknown key is one RecipeError naming the closest valid one, a value its field cannot hold
another, and ``__post_init__`` checks the rest. ``--set section.key=value`` overrides any key (value read as YAML).
"""

import dataclasses
import os
import types
import typing
from operator import attrgetter
from typing import Any, NamedTuple

import yaml
from tqdm import tqdm

from open_r1.checks import closest_key
from open_r1.errors import RecipeError, help_field
from open_r1.jsonio import read_recipe


def check_keys(where: str, mapping: dict, valid) -> None:
    """One RecipeError naming every key of `mapping` that is not in `valid`, each with the closest valid key."""
    valid = sorted(str(v) for v in valid)
    unknown = sorted(str(key) for key in mapping if str(key) not in valid)
    if unknown:
        prefix = f"{where}." if where else ""
        named = [
            prefix + key + (f" (did you mean {prefix}{match}?)" if (match := closest_key(key, valid)) else "")
            for key in unknown
        ]
        listed = ", ".join(valid) if len(valid) <= 40 else "open-r1-grpo --help-all lists them"
        raise RecipeError(
            f"unknown key(s) {', '.join(named)} in {f'section {where}' if where else 'the recipe'}; valid: {listed}"
        )


def _fits(value, kind) -> tuple[bool, Any]:
    """(does `value` fit the annotation `kind`, the value as the field holds it): YAML leaves ``1e-4`` a string."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        fits = [_fits(value, option) for option in typing.get_args(kind)]
        return next((fit for fit in fits if fit[0]), (False, value))
    if kind is float and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False, value
    if typing.get_origin(kind) is list:
        held = [_fits(v, typing.get_args(kind)[0]) for v in value] if isinstance(value, list) else [(False, value)]
        return all(ok for ok, _ in held), [v for _, v in held] if isinstance(value, list) else value
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {
        type(None): value is None,
        bool: isinstance(value, bool),
        int: number and isinstance(value, int),
        float: number and abs(value) != float("inf") and value == value,
        dict: isinstance(value, dict),
        str: isinstance(value, str) and bool(value.strip()),
    }.get(typing.get_origin(kind) or kind, True)
    return ok, float(value) if kind is float and ok else value


def _describe(kind) -> str:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return " or ".join(_describe(k) for k in typing.get_args(kind))
    if typing.get_origin(kind) is list:
        return f"a list of ({_describe(typing.get_args(kind)[0])})"
    return {
        bool: "true or false",
        int: "a whole number",
        float: "a number",
        str: "a non-empty string",
        type(None): "null",
    }.get(kind, "a mapping")


def parse_section(where: str, cls, mapping) -> Any:
    """`cls` (a dataclass) from the recipe section `where`: unknown keys and values of the wrong kind refused in one
    RecipeError each, then the dataclass's own ``__post_init__`` checks."""
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise RecipeError(f"recipe section {where} must be a mapping, got {mapping!r}")
    check_keys(where, mapping, [f.name for f in dataclasses.fields(cls) if f.init])
    hints = typing.get_type_hints(cls)
    values, bad = {}, []
    for key, value in mapping.items():
        ok, held = _fits(value, hints[key])
        if not ok:
            bad.append(f"{where}.{key} must be {_describe(hints[key])}, got {value!r}")
        values[key] = held
    if bad:
        raise RecipeError("; ".join(bad))
    return cls(**values)


def require(ok: bool, message: str) -> None:
    """A `__post_init__` check: RecipeError(`message`) unless `ok`."""
    if not ok:
        raise RecipeError(message)


def at_least(where: str, cfg, minimum: float, *names: str) -> None:
    """A `__post_init__` check: each field `names` of `cfg` (null aside) is at least `minimum`."""
    for name in names:
        value = getattr(cfg, name)
        require(value is None or value >= minimum, f"{where}.{name} must be >= {minimum}, got {value!r}")


def seed_list(key: str, seeds: list[int]) -> None:
    require(
        bool(seeds) and len(set(seeds)) == len(seeds),
        f"{key} must be a list of distinct integers, e.g. [0, 1, 2]; got {seeds!r}",
    )


@dataclasses.dataclass
class Models:
    """The base models (the real ones: Qwen3-VL-2B-Thinking and Qwen2.5-VL-3B-Instruct dirs)."""

    policy: str | None = help_field(
        None,
        "the base policy dir (synthesis, SFT, the base row of the eval); default "
        "<work_dir>/models/policy-base (where the stand-in pre-trains one)",
    )
    reward_backbone: str | None = help_field(
        None, "the reward model's backbone dir; default <work_dir>/models/rm-backbone"
    )


@dataclasses.dataclass
class RunConfig:
    """The recipe's top-level keys."""

    name: str | None = help_field(None, "a name for the recipe")
    notes: str | None = help_field(None, "free text")
    work_dir: str = help_field("runs/humor", "every stage's outputs: models/, traces/, grpo/, results/")
    seed: int = help_field(0, "the data order and sampling seed of every stage")
    data_dir: str | None = help_field(
        None, "train/ val/ test/ caption splits (open-r1-caption-prepare writes them); default <work_dir>/data"
    )
    models: dict | None = help_field(None, "{policy: DIR, reward_backbone: DIR}: the base models")

    def __post_init__(self):
        self.models = parse_section("models", Models, self.models)


def load_yaml(path: str, overrides: list[str] | None = None) -> dict:
    """The recipe file as a mapping, with the ``--set section.key=value`` overrides applied."""
    recipe = read_recipe(path, hint="see configs/captioning/*.yaml")
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RecipeError(f"--set {item!r} is not section.key=value")
        node, (*sections, leaf) = recipe, key.split(".")
        for part in sections:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"--set {item!r}: {part} is not a section")
        node[leaf] = yaml.safe_load(value)
    return recipe


class Recipe:
    """A parsed recipe: `run` (the top-level `RunConfig`), one parsed section per stage (``recipe.section("rm")``),
    the paths, and where it came from (``path``, ``overrides``: a parallel job re-reads it)."""

    def __init__(self, path: str, overrides: list[str], run: RunConfig):
        self.path, self.overrides, self.run = os.path.abspath(path), list(overrides), run
        self.seed, self.sections = run.seed, {}
        self.paths = Paths(self)

    def section(self, name: str):
        return self.sections[name]

    def args(self, stage) -> tuple:
        """A stage's arguments: its section, the paths, the seed, then what ``stage.TAKES`` names (section[.key])."""
        named = types.SimpleNamespace(**self.sections)
        return (
            self.sections[stage.NAME],
            self.paths,
            self.seed,
            *(attrgetter(k)(named) for k in getattr(stage, "TAKES", ())),
        )


def parse_recipe(path: str, overrides: list[str] | None, stages, run_config: type = RunConfig) -> Recipe:
    """Parse the recipe at `path` for the ordered `stages` (modules with ``NAME`` and ``Config``, or ``parse(mapping,
    paths)`` where a section needs more): top-level keys (`run_config`: the stand-in adds its own), then every
    stage's section in order, each once."""
    raw = load_yaml(path, overrides)
    top = [f.name for f in dataclasses.fields(run_config)]
    check_keys("", raw, [*top, *(stage.NAME for stage in stages)])
    recipe = Recipe(path, overrides or [], parse_section("recipe", run_config, {k: raw[k] for k in top if k in raw}))
    for stage in stages:
        mapping = raw.get(stage.NAME)
        parse = getattr(stage, "parse", None)
        recipe.sections[stage.NAME] = (
            parse(mapping, recipe.paths) if parse else parse_section(stage.NAME, stage.Config, mapping)
        )
    return recipe


class Paths:
    """Where the stages read and write, under the recipe's work_dir."""

    def __init__(self, recipe: Recipe):
        run = recipe.run
        self.root = os.path.abspath(run.work_dir)
        self.data = os.path.abspath(run.data_dir or os.path.join(self.root, "data"))
        self.models = os.path.join(self.root, "models")
        self.results = os.path.join(self.root, "results")
        self.traces = os.path.join(self.root, "traces", "train_top_k")
        self.policy_base = os.path.abspath(run.models.policy or os.path.join(self.models, "policy-base"))
        self.rm_base = os.path.abspath(run.models.reward_backbone or os.path.join(self.models, "rm-backbone"))
        self.policy_sft = os.path.join(self.models, "policy-sft")
        self.rm = os.path.join(self.models, "rm")
        self.rm_blind = os.path.join(self.models, "rm-blind")
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
    """A stage's input: where, what it is, how a user makes or names another one, the file that shows it complete."""

    path: str
    what: str
    fix: str
    marker: str = MODEL_MARKER


def split_input(paths: Paths, split: str) -> Input:
    return Input(
        paths.split(split),
        f"the {split} split",
        "prepare the data with open-r1-caption-prepare and set data_dir to its output",
        DATASET_MARKER,
    )


def check_inputs(inputs: dict[str, Input], produced=(), makers: dict[str, str] | None = None) -> dict[str, str]:
    """Each input's path, after checking that it is complete or among the `produced` paths (of stages that run
    first); else one error naming the stage that makes it (`makers`: path -> stage) or the input's fix."""
    for item in inputs.values():
        if item.path in produced or os.path.isfile(os.path.join(item.path, item.marker)):
            continue
        state = "does not exist" if not os.path.exists(item.path) else f"has no {item.marker}"
        maker = (makers or {}).get(item.path)
        fix = (
            f"run the {maker} stage first with the same recipe and work_dir (--stages {maker} ...), or {item.fix}"
            if maker
            else item.fix
        )
        raise RecipeError(f"{item.what} {item.path} {state}: {fix}")
    return {name: item.path for name, item in inputs.items()}


def progress_bar(label: str, unit: str):
    """A `progress(done, total)` callback drawing a tqdm bar on stderr (when it is a terminal)."""
    bar = tqdm(desc=label, unit=unit, disable=None)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return progress


def device() -> str:
    import torch  # deferred: heavy

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(key: str, value) -> None:
    """A RecipeError, before any model loads, unless `value` ('cpu', 'cuda', 'cuda:N') is a device of this machine."""
    import torch  # deferred: heavy

    try:
        found = torch.device(value)
    except (RuntimeError, TypeError):
        raise RecipeError(f"{key} {value!r} is not a device; use cpu, cuda or cuda:N (--set {key}=...)") from None
    count = torch.cuda.device_count()
    if found.type == "cuda" and (found.index or 0) >= count:
        have = f"cuda:0 .. cuda:{count - 1}" if count else "no CUDA device: use cpu"
        raise RecipeError(f"{key} {value!r} is not on this machine ({have}); --set {key}=... to one that is")
