"""Counting rewards, registered in the engine's registry (`open_r1/rewards.py`: call convention, `log_metric`, how
to add one). Each scores with the grader's protocol (`protocol.ANSWER_RE`, integer equality), never its own regex:
exact_count {0, 1}, format {0, 1}, soft_count [0, 1], length_penalty [-1, 0], and answer_tag {0, 1}, the weak
inherited reward kept only for `configs/weak_baseline.yaml`. A bad recipe param raises RewardConfigError; an
unparseable gold `solution` raises ValueError (a data bug that a 0 score would hide).
"""

import functools
import math
from typing import Any

from open_r1.errors import RewardConfigError
from open_r1.rewards import LogMetric, RewardFunc, _log, _mean, _require_number, register_reward
from open_r1.tasks.counting.protocol import (
    ANSWER_RE,
    EVAL_MAX_NEW_TOKENS,
    completion_text,
    extract_answer,
    is_correct,
    parse_gold,
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
# Token estimate used only when a caller gives text without `completion_ids` (tests, selfcheck on raw strings).
CHARS_PER_TOKEN_ESTIMATE = 4.0


def _texts(completions: list[Any]) -> list[str]:
    return [completion_text(c) for c in completions]


def _golds(solution: list[Any] | None, n: int) -> list[int]:
    if solution is None:
        raise ValueError("this reward needs the dataset column 'solution' (gold like '<answer> 3 </answer>')")
    if len(solution) != n:
        raise ValueError(f"got {len(solution)} solutions for {n} completions; they must be aligned")
    return [parse_gold(s) for s in solution]


def format_checks(text: str) -> dict[str, bool]:
    """The separate conditions the `format` reward combines (also handy for eval-time diagnostics).

    parseable      the grader's regex finds an answer;
    single_answer  exactly one `<answer>` and one `</answer>`;
    clean_end      only whitespace after the first `</answer>` (and there is one);
    think_ok       exactly one `<think>` and one `</think>`, in that order, closed before the first `<answer>`.
    """
    match = ANSWER_RE.search(text)
    close_at = text.find(ANSWER_CLOSE)
    answer_at = text.find(ANSWER_OPEN)
    think_open_at, think_close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    think_ok = (
        text.count(THINK_OPEN) == 1
        and text.count(THINK_CLOSE) == 1
        and think_open_at < think_close_at
        and (answer_at == -1 or think_close_at < answer_at)
    )
    return {
        "parseable": match is not None,
        "single_answer": text.count(ANSWER_OPEN) == 1 and text.count(ANSWER_CLOSE) == 1,
        "clean_end": close_at != -1 and not text[close_at + len(ANSWER_CLOSE) :].strip(),
        "think_ok": think_ok,
    }


def think_char_span(text: str) -> int:
    """Characters inside the first think block; an unclosed `<think>` runs to the end of the text."""
    start = text.find(THINK_OPEN)
    if start == -1:
        return 0
    start += len(THINK_OPEN)
    end = text.find(THINK_CLOSE, start)
    return (len(text) if end == -1 else end) - start


# Each reward: a module-level scoring function + a registered factory that checks params and binds them with
# functools.partial, so a built reward pickles (worker processes) and shows its params in repr.
def score_exact_count(completions, solution=None, log_metric: LogMetric = None, **kwargs) -> list[float]:
    texts = _texts(completions)
    golds = _golds(solution, len(texts))
    rewards = [1.0 if is_correct(text, gold) else 0.0 for text, gold in zip(texts, golds)]
    _log(log_metric, "exact_count/accuracy", _mean(rewards))
    _log(log_metric, "exact_count/parseable", _mean([float(extract_answer(t) is not None) for t in texts]))
    return rewards


@register_reward("exact_count")
def exact_count_reward() -> RewardFunc:
    """Accuracy, {0, 1}: 1.0 iff the grader would mark the completion correct (`protocol.is_correct`)."""
    return score_exact_count


def score_format(completions, *, require_think: bool = True, log_metric: LogMetric = None, **kwargs) -> list[float]:
    required = ["parseable", "single_answer", "clean_end"] + (["think_ok"] if require_think else [])
    checks = [format_checks(text) for text in _texts(completions)]
    rewards = [1.0 if all(c[key] for key in required) else 0.0 for c in checks]
    for key in ("parseable", "single_answer", "clean_end", "think_ok"):
        _log(log_metric, f"format/{key}", _mean([float(c[key]) for c in checks]))
    return rewards


@register_reward("format")
def format_reward(require_think: bool = True) -> RewardFunc:
    """{0, 1}: 1.0 iff the completion is well formed (see `format_checks`); think block required unless ablated."""
    if not isinstance(require_think, bool):  # a YAML/JSON string "false" would silently be truthy
        raise RewardConfigError(f"format: require_think must be true or false, got {require_think!r}")
    return functools.partial(score_format, require_think=require_think)


def score_soft_count(
    completions, solution=None, *, tolerance: float = 3.0, log_metric: LogMetric = None, **kwargs
) -> list[float]:
    texts = _texts(completions)
    golds = _golds(solution, len(texts))
    preds = [extract_answer(text) for text in texts]
    rewards = [0.0 if p is None else max(0.0, 1.0 - abs(p - gold) / tolerance) for p, gold in zip(preds, golds)]
    errors = [abs(pred - gold) for pred, gold in zip(preds, golds) if pred is not None]
    _log(log_metric, "soft_count/parseable", _mean([float(p is not None) for p in preds]))
    if errors:  # no parseable answer -> no error to average; logging 0 would read as perfect counting
        _log(log_metric, "soft_count/abs_error", _mean(errors))
    return rewards


@register_reward("soft_count")
def soft_count_reward(tolerance: float = 3.0) -> RewardFunc:
    """[0, 1]: partial credit ``max(0, 1 - |pred - gold| / tolerance)``; exact = 1.0, unparseable = 0.0."""
    _require_number("soft_count", "tolerance", tolerance)
    if not tolerance > 0:
        raise RewardConfigError(f"soft_count: tolerance must be > 0, got {tolerance!r}")
    return functools.partial(score_soft_count, tolerance=tolerance)


def score_length_penalty(
    completions,
    completion_ids=None,
    *,
    budget_tokens: int = EVAL_MAX_NEW_TOKENS,
    think_budget: int = 128,
    max_think_penalty: float = 0.5,
    log_metric: LogMetric = None,
    **kwargs,
) -> list[float]:
    texts = _texts(completions)
    if completion_ids is not None and len(completion_ids) != len(texts):
        raise ValueError(f"got {len(completion_ids)} completion_ids for {len(texts)} completions")
    rewards, truncated, think_tokens_all, n_tokens_all = [], [], [], []
    for i, text in enumerate(texts):
        if completion_ids is not None:
            n_tokens = len(completion_ids[i])
        else:
            n_tokens = math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)
        tokens_per_char = n_tokens / len(text) if text else 0.0
        match = ANSWER_RE.search(text)
        answer_end_token = match.end() * tokens_per_char if match else math.inf
        is_truncated = n_tokens >= budget_tokens and answer_end_token > budget_tokens
        think_tokens = think_char_span(text) * tokens_per_char
        if is_truncated:
            reward = -1.0
        else:
            over = max(0.0, think_tokens - think_budget) / (budget_tokens - think_budget)
            reward = -max_think_penalty * min(1.0, over) + 0.0  # + 0.0 turns -0.0 into 0.0
        rewards.append(reward)
        truncated.append(float(is_truncated))
        think_tokens_all.append(think_tokens)
        n_tokens_all.append(float(n_tokens))
    _log(log_metric, "length_penalty/truncated_frac", _mean(truncated))
    _log(log_metric, "length_penalty/mean_think_tokens", _mean(think_tokens_all))
    _log(log_metric, "length_penalty/mean_completion_tokens", _mean(n_tokens_all))
    over_think_budget = [float(t > think_budget) for t in think_tokens_all]
    _log(log_metric, "length_penalty/over_think_budget_frac", _mean(over_think_budget))
    return rewards


@register_reward("length_penalty")
def length_penalty_reward(
    budget_tokens: int = EVAL_MAX_NEW_TOKENS, think_budget: int = 128, max_think_penalty: float = 0.5
) -> RewardFunc:
    """[-1, 0]: -1.0 when the completion reaches `budget_tokens` with no parseable answer ending inside it (greedy
    eval at 256 tokens would cut it; set `budget_tokens` to a shorter training `max_completion_length`); otherwise
    ``-max_think_penalty * min(1, max(0, think_tokens - think_budget) / (budget_tokens - think_budget))``. Token counts
    come from `completion_ids` (else ``ceil(chars / CHARS_PER_TOKEN_ESTIMATE)``); positions inside a completion by
    character fraction; an unclosed `<think>` counts to the end."""
    for param, value in [("budget_tokens", budget_tokens), ("think_budget", think_budget)]:
        _require_number("length_penalty", param, value, integer=True)
    _require_number("length_penalty", "max_think_penalty", max_think_penalty)
    if not 0 <= think_budget < budget_tokens:
        raise RewardConfigError(
            f"length_penalty: need 0 <= think_budget < budget_tokens, got {think_budget} and {budget_tokens}"
        )
    if not 0 <= max_think_penalty <= 1:
        raise RewardConfigError(f"length_penalty: max_think_penalty must be in [0, 1], got {max_think_penalty!r}")
    return functools.partial(
        score_length_penalty,
        budget_tokens=budget_tokens,
        think_budget=think_budget,
        max_think_penalty=max_think_penalty,
    )


def score_answer_tag(completions, log_metric: LogMetric = None, **kwargs) -> list[float]:
    rewards = [1.0 if ANSWER_OPEN in text else 0.0 for text in _texts(completions)]
    _log(log_metric, "answer_tag/present", _mean(rewards))
    return rewards


@register_reward("answer_tag")
def answer_tag_reward() -> RewardFunc:
    """{0, 1}: 1.0 if "<answer>" appears anywhere. Trivial to game; only for configs/weak_baseline.yaml."""
    return score_answer_tag
