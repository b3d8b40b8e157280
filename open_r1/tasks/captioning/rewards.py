"""The captioning reward ``caption_rm``: sigma(RM(image, caption)) for a strictly parsed caption, else ``fail_value``.

A parsed caption gets ``format_bonus + (1 - format_bonus) * sigmoid(RM(image, protocol.rm_messages(desc, caption)))``
from the Bradley-Terry reward model (``open_r1.reward_model``); any other completion ``fail_value`` (default 0, the
bottom of the sigmoid scale: raw BT scores have no fixed zero). Recipe: ``reward_kwargs: {caption_rm: {reward_model:
DIR, fail_value, format_bonus, device}}``; it reads the ``image`` (or ``images``) and description columns (keep
``remove_unused_columns=False``). The RM is loaded once per process, cached by (path, device); tests may register
any object with ``score(images, messages, batch_size)``. Logged under ``caption_rm/``.
"""

import functools
import math
import os
from typing import Any

from open_r1.errors import RewardConfigError
from open_r1.rewards import LogMetric, RewardFunc, _log, _mean, _require_number, register_reward
from open_r1.tasks.captioning import protocol

_RM_CACHE: dict[tuple[str, str], Any] = {}


def _cache_key(path: str, device: Any) -> tuple[str, str]:
    return os.path.abspath(os.fspath(path)), str(device) if device is not None else "auto"


def get_reward_model(path: str, device: Any = None):
    """The reward model saved at ``path`` on ``device``, loaded once per process (cached by path and device)."""
    key = _cache_key(path, device)
    if key not in _RM_CACHE:
        from open_r1.reward_model import load_reward_model  # deferred: torch, peft

        _RM_CACHE[key] = load_reward_model(path, device=device)
    return _RM_CACHE[key]


def sigmoid(x: float) -> float:
    if x >= 0:  # two forms: no overflow for any x
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _images(image: Any, images: Any, n: int) -> list:
    if image is None and images is not None:  # an `images` column: a list of images per row; the cartoon is the first
        image = [row[0] if isinstance(row, (list, tuple)) else row for row in images]
    if image is None:
        raise ValueError(
            "caption_rm needs the dataset column 'image' (the cartoon, one per completion); keep "
            "remove_unused_columns=False in the GRPO config so TRL passes it to rewards"
        )
    if not isinstance(image, (list, tuple)) or len(image) != n:
        raise ValueError(
            f"caption_rm got {len(image) if isinstance(image, (list, tuple)) else image!r} images for "
            f"{n} completions; they must be aligned"
        )
    return list(image)


def _descriptions(columns: dict[str, Any], n: int) -> list[dict]:
    descs = [{} for _ in range(n)]
    for field in protocol.DESCRIPTION_FIELDS:
        values = columns.get(field)
        if values is None:
            continue
        if len(values) != n:
            raise ValueError(f"caption_rm got {len(values)} values of {field!r} for {n} completions")
        for desc, value in zip(descs, values):
            if value is not None:
                desc[field] = value
    return descs


def score_caption_rm(
    completions,
    image=None,
    images=None,
    *,
    reward_model: str,
    fail_value: float = 0.0,
    format_bonus: float = 0.0,
    max_words: int = protocol.MAX_WORDS,
    device: str | None = None,
    batch_size: int = 16,
    log_metric: LogMetric = None,
    **columns,
) -> list[float]:
    n = len(completions)
    parses = [protocol.parse_details(c, max_words) for c in completions]
    ok = [i for i, p in enumerate(parses) if p.ok]
    rewards = [float(fail_value)] * n
    raw = []
    if ok:
        imgs = _images(image, images, n)
        descs = _descriptions(columns, n)  # the description columns TRL passes
        model = get_reward_model(reward_model, device)
        messages = [protocol.rm_messages(descs[i], parses[i].caption) for i in ok]
        raw = [float(s) for s in model.score([imgs[i] for i in ok], messages, batch_size=batch_size)]
        if len(raw) != len(ok):
            raise RuntimeError(f"the reward model returned {len(raw)} scores for {len(ok)} captions")
        for i, s in zip(ok, raw):
            rewards[i] = format_bonus + (1.0 - format_bonus) * sigmoid(s)
    _log(log_metric, "caption_rm/format_ok", len(ok) / n if n else 0.0)
    if raw:  # no caption parsed -> nothing to average; logging 0 would read as a real score
        _log(log_metric, "caption_rm/sigmoid_mean", _mean([sigmoid(s) for s in raw]))
        _log(log_metric, "caption_rm/raw_mean", _mean(raw))
        _log(log_metric, "caption_rm/caption_words", _mean([protocol.count_words(parses[i].caption) for i in ok]))
    _log(log_metric, "caption_rm/reward_mean", _mean(rewards))
    _log(log_metric, "caption_rm/caption_in_think", _mean([float(p.caption_in_think) for p in parses]))
    for reason in protocol.PARSE_REASONS[1:]:
        _log(log_metric, f"caption_rm/fail/{reason}", _mean([float(p.reason == reason) for p in parses]))
    return rewards


def check_caption_rm_settings(
    fail_value=0.0, format_bonus=0.0, max_words=protocol.MAX_WORDS, device=None, batch_size=16
) -> None:
    """caption_rm's settings, checked without its RM dir (the pipeline's preflight, then the reward when built)."""
    _require_number("caption_rm", "fail_value", fail_value)
    _require_number("caption_rm", "format_bonus", format_bonus)
    _require_number("caption_rm", "max_words", max_words, integer=True)
    _require_number("caption_rm", "batch_size", batch_size, integer=True)
    if not math.isfinite(fail_value):
        raise RewardConfigError(f"caption_rm: fail_value must be finite, got {fail_value!r}")
    if not 0 <= format_bonus < 1:
        raise RewardConfigError(f"caption_rm: format_bonus must be in [0, 1), got {format_bonus!r}")
    if max_words < 1 or batch_size < 1:
        raise RewardConfigError(f"caption_rm: max_words and batch_size must be >= 1, got {max_words}, {batch_size}")
    if device is not None and not isinstance(device, str):
        raise RewardConfigError(f"caption_rm: device must be a string like 'cuda:1' or 'cpu', got {device!r}")


@register_reward("caption_rm")
def caption_rm_reward(
    reward_model: str,
    fail_value: float = 0.0,
    format_bonus: float = 0.0,
    max_words: int = protocol.MAX_WORDS,
    device: str | None = None,
    batch_size: int = 16,
) -> RewardFunc:
    """The ``caption_rm`` reward (module docstring)."""
    if not isinstance(reward_model, (str, os.PathLike)) or not str(reward_model):
        raise RewardConfigError(
            f"caption_rm: reward_model must be the path of a saved reward-model dir, got {reward_model!r}"
        )
    check_caption_rm_settings(fail_value, format_bonus, max_words, device, batch_size)
    if _cache_key(reward_model, device) not in _RM_CACHE:  # fail at recipe time, not at the first GRPO step
        from open_r1.reward_model import META_FILE  # deferred: torch, peft

        if not os.path.isfile(os.path.join(os.fspath(reward_model), META_FILE)):
            raise RewardConfigError(
                f"caption_rm: {reward_model} is not a saved reward-model dir (no {META_FILE}); "
                "train one first (open_r1/reward_model.py) and point "
                "reward_kwargs.caption_rm.reward_model at it"
            )
    return functools.partial(
        score_caption_rm,
        reward_model=os.fspath(reward_model),
        fail_value=float(fail_value),
        format_bonus=float(format_bonus),
        max_words=max_words,
        device=device,
        batch_size=batch_size,
    )
