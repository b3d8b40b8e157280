"""The reward registry: a name -> factory map that recipes name rewards from (open-r1 style), for every task.

A reward has TRL's signature ``f(prompts, completions, completion_ids, **dataset_columns, log_metric=..., ...) ->
list[float]`` (each dataset column a list aligned with ``completions``); it takes what it needs by keyword and logs
sub-scores with ``log_metric(name, value)`` (``None`` outside training). Tasks register a *factory* taking the
reward's params as keyword arguments, in ``open_r1/tasks/<task>/rewards.py``::

    from open_r1.rewards import register_reward

    @register_reward("even_count")
    def even_count(bonus: float = 1.0):
        def reward(completions, solution, log_metric=None, **kwargs) -> list[float]:
            ...
        return reward

The built callables carry the registry name as ``__name__``, TRL's log key.
"""

import dataclasses
import functools
import importlib
import inspect
import json
from typing import Any, Callable, Iterable

from open_r1.checks import closest_key, is_int, is_number
from open_r1.errors import RecipeError, RewardConfigError, UnknownRewardError

RewardFunc = Callable[..., list[float]]
RewardFactory = Callable[..., RewardFunc]
LogMetric = Callable[[str, float], None] | None

REWARD_REGISTRY: dict[str, RewardFactory] = {}
# Each task's rewards register themselves on import; the registry loads them by name (no import cycle).
TASK_REWARD_MODULES = ("open_r1.tasks.counting.rewards", "open_r1.tasks.captioning.rewards")


def load_task_rewards() -> None:
    """Import every task's reward module so that its rewards are registered."""
    for module in TASK_REWARD_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not (exc.name and (module == exc.name or module.startswith(exc.name + "."))):
                raise  # a task module that exists but fails to import is a bug: say so


def register_reward(name: str, *, overwrite: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a reward factory (or a param-less reward function) under `name`."""

    def decorator(obj: Callable) -> Callable:
        if name in REWARD_REGISTRY and not overwrite:
            raise ValueError(f"reward {name!r} is already registered; pass overwrite=True to replace it")
        if "completions" in inspect.signature(obj).parameters:
            # A reward function itself: wrap it in a factory with no params.
            def factory() -> RewardFunc:
                return obj

            factory.__doc__ = obj.__doc__
        else:
            factory = obj
        REWARD_REGISTRY[name] = factory
        return obj

    return decorator


def reward_settings(name: str) -> type | None:
    """The dataclass of reward `name`'s parameters, made from its factory's keyword parameters and their defaults
    (one definition of each: the factory), or None when the factory takes **kwargs (anything goes)."""
    params = inspect.signature(REWARD_REGISTRY[name]).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    fields = [
        (p.name, Any, dataclasses.field() if p.default is p.empty else dataclasses.field(default=p.default))
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    return dataclasses.make_dataclass(f"{name}_params", fields)


def check_reward_kwargs(names: list[str], reward_kwargs: dict) -> None:
    """`reward_kwargs` ({reward: {param: value}}) against each listed reward's `reward_settings`: one
    RewardConfigError for a reward not in `names`, a param the reward does not take (with the closest one) or a
    required param left out. The values themselves are checked by the factories when the rewards are built."""
    for name, params in reward_kwargs.items():
        if name not in names:
            close = closest_key(name, names)
            raise RewardConfigError(
                f"reward_kwargs given for {name!r}, which is not in the reward list {names}"
                + (f" (did you mean {close}?)" if close else "")
            )
        if params is not None and not isinstance(params, dict):
            raise RewardConfigError(f"reward_kwargs[{name!r}] must be a mapping of param to value, got {params!r}")
    for name in names:
        settings, params = reward_settings(name), reward_kwargs.get(name) or {}
        if settings is None:
            continue
        valid = [f.name for f in dataclasses.fields(settings)]
        for key in params:
            if key not in valid:
                close = closest_key(key, valid)
                raise RewardConfigError(
                    f"reward {name!r} has no param {key!r}" + (f" (did you mean {close}?)" if close else "") + f"; "
                    f"valid params: {valid or 'none'} (reward_kwargs.{name})"
                )
        missing = [
            f.name for f in dataclasses.fields(settings) if f.default is dataclasses.MISSING and f.name not in params
        ]
        if missing:
            raise RewardConfigError(f"reward {name!r} needs {', '.join(missing)} (reward_kwargs.{name})")


def reward_kwargs_problems(names: list[str], reward_kwargs: dict) -> list[str]:
    """`check_reward_kwargs`' problem as a list (empty when the rewards are known and their params valid)."""
    try:
        load_task_rewards()
        unknown = [name for name in names if name not in REWARD_REGISTRY]
        if not unknown:
            check_reward_kwargs(list(names), reward_kwargs)
    except RewardConfigError as exc:
        return [str(exc)]
    return []


class NamedReward:
    """A built reward: calls `func` under the registry name (a class, not a closure, so that it pickles)."""

    def __init__(self, name: str, func: RewardFunc, doc: str | None = None):
        self.__name__ = self.__qualname__ = name
        self.__doc__ = doc or getattr(func, "__doc__", None)
        self.func = func

    def __call__(self, *args, **kwargs) -> list[float]:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"NamedReward({self.__name__!r}, {self.func!r})"


def _named(func: RewardFunc, name: str, doc: str | None = None) -> RewardFunc:
    """`func` under the registry name; an async reward gets an async wrapper so TRL still awaits it."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args, **kwargs):
            return await func(*args, **kwargs)

        wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper
    return NamedReward(name, func, doc)


def get_reward_funcs(names: Iterable[str], reward_kwargs: dict[str, dict] | None = None) -> list[RewardFunc]:
    """The reward callables for `names`, in order (TRL's `reward_weights` stay aligned); `reward_kwargs`: {name:
    factory params}, after importing every task's reward module."""
    if isinstance(names, str):
        raise TypeError(f"names must be a list of reward names, got the string {names!r}")
    names = list(names)
    reward_kwargs = dict(reward_kwargs or {})
    load_task_rewards()
    unknown = [name for name in names if name not in REWARD_REGISTRY]
    if unknown:
        raise UnknownRewardError(
            f"unknown reward(s) {unknown}; valid names: {sorted(REWARD_REGISTRY)}. To add one, decorate a factory "
            "with @register_reward('<name>') in open_r1/tasks/<task>/rewards.py "
            "(see open_r1/tasks/counting/rewards.py)."
        )
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RewardConfigError(f"reward(s) {duplicates} listed more than once; TRL would log them under one name")
    check_reward_kwargs(names, reward_kwargs)
    return [
        _named(REWARD_REGISTRY[name](**(reward_kwargs.get(name) or {})), name, REWARD_REGISTRY[name].__doc__)
        for name in names
    ]


def _log(log_metric: LogMetric, name: str, value: float) -> None:
    if log_metric is not None:
        log_metric(name, float(value))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _require_number(reward: str, param: str, value: Any, integer: bool = False) -> None:
    if not (is_int(value) if integer else is_number(value)):
        expected = "an integer" if integer else "a number"
        raise RewardConfigError(f"{reward}: {param} must be {expected}, got {value!r}")


def parse_reward_kwargs(value) -> dict:
    """A recipe's `reward_kwargs` (a YAML mapping, or JSON text from the command line) as {reward name: params}."""
    if value in (None, ""):
        return {}
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise RecipeError(f"reward_kwargs is not valid JSON ({exc}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise RecipeError(f"reward_kwargs must be a mapping of reward name to parameters, got {parsed!r}")
    return parsed
