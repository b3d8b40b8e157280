"""JSON files, one helper pair for the whole repo: `write_json` (and `write_text`, for reports) writes through a temp
file + rename, so a kill mid-write never leaves a truncated record; `read_json` returns `default` for a missing or
unreadable file when one is given (and raises otherwise). `read_recipe` reads a YAML recipe."""

import json
import os
from typing import Any

from open_r1.errors import RecipeError

_RAISE = object()


def write_text(path: str | os.PathLike, text: str) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return path


def write_json(path: str | os.PathLike, value: Any) -> str:
    return write_text(path, json.dumps(value, indent=1, default=str))


def read_json(path: str | os.PathLike, default: Any = _RAISE) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        if default is _RAISE:
            raise
        return default


def read_recipe(path: str | os.PathLike, hint: str = "see configs/*.yaml") -> dict:
    """A YAML recipe as a mapping (`open_r1.grpo` parses the same files with TRL's parser); a missing file, bad YAML
    or a non-mapping is one RecipeError (`hint`: where the recipes are)."""
    import yaml  # deferred: only recipe readers need it

    if not os.path.isfile(path):
        raise RecipeError(f"recipe {path} does not exist; {hint}")
    with open(path) as handle:
        try:
            recipe = yaml.safe_load(handle) or {}
        except yaml.YAMLError as exc:
            raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from None
    if not isinstance(recipe, dict):
        raise RecipeError(f"recipe {path} is not a YAML mapping of key: value")
    return recipe
