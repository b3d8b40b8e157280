"""Rewards (open_r1/tasks/counting/rewards.py): grader consistency, format rules, partial credit, length penalty, the
registry.

Every reward is called the way TRL 1.16 calls it: keyword arguments, dataset columns as aligned lists.
"""

import math
import pickle

import pytest

from open_r1.rewards import (
    REWARD_REGISTRY,
    RewardConfigError,
    UnknownRewardError,
    get_reward_funcs,
    register_reward,
)
from open_r1.tasks.counting import protocol, rewards
from open_r1.tasks.counting.protocol import (
    EVAL_MAX_NEW_TOKENS,
    completion_text,
    is_correct,
    parse_gold,
)

BUILTIN_REWARDS = ["answer_tag", "exact_count", "format", "length_penalty", "soft_count"]


class MetricSink:
    """Stands in for TRL's `log_metric`: records every (name, value) a reward logs."""

    def __init__(self):
        self.values: dict[str, list[float]] = {}

    def __call__(self, name: str, value: float) -> None:
        assert isinstance(name, str) and isinstance(value, float)
        self.values.setdefault(name, []).append(value)

    def last(self, name: str) -> float:
        return self.values[name][-1]


def reward(name: str, **params):
    (func,) = get_reward_funcs([name], {name: params} if params else None)
    return func


def score(name: str, completions, gold=3, completion_ids=None, log_metric=None, **params) -> list[float]:
    solution = [f"<answer> {gold} </answer>"] * len(completions)
    return reward(name, **params)(
        prompts=["Q?"] * len(completions),
        completions=completions,
        completion_ids=completion_ids,
        solution=solution,
        log_metric=log_metric,
    )


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture
def scratch_registry():
    """Lets a test register rewards without leaking them into other tests."""
    saved = dict(REWARD_REGISTRY)
    yield
    REWARD_REGISTRY.clear()
    REWARD_REGISTRY.update(saved)


# ---------------------------------------------------------------------------------------------------------------------
# exact_count agrees with the grader on every string
# ---------------------------------------------------------------------------------------------------------------------
def TEXT_BLOCK(text: str) -> dict:  # noqa: N802 (reads like a constant inside the tables)
    return {"type": "text", "text": text}


# (id, completion, gold, grader's verdict)
GRADER_CASES = [
    ("correct", "<think>1+2</think><answer>3</answer>", 3, True),
    ("wrong", "<think>1+1</think><answer>2</answer>", 3, False),
    ("spaces and newlines in tag", "<answer>\n  3 \n</answer>", 3, True),
    ("two tags, first right", "<answer>3</answer><answer>4</answer>", 3, True),
    ("two tags, first wrong", "<answer>4</answer><answer>3</answer>", 3, False),
    ("answer before think", "<answer>3</answer><think>x</think>", 3, True),
    ("answer inside think", "<think><answer>3</answer></think>", 3, True),
    ("words inside tag", "<answer>3 objects</answer>", 3, False),
    ("words then parseable tag", "<answer>3 objects</answer> <answer>3</answer>", 3, True),
    ("negative", "<answer>-3</answer>", 3, False),
    ("decimal", "<answer>3.0</answer>", 3, False),
    ("spelled", "<answer>three</answer>", 3, False),
    ("leading zeros", "<answer>03</answer>", 3, True),
    ("missing closing tag", "<think>x</think><answer>3", 3, False),
    ("empty", "", 3, False),
    ("no tag", "3", 3, False),
    ("gold zero", "<answer>0</answer>", 0, True),
    ("gold zero, no answer", "nothing", 0, False),
    ("big number", "<answer>10</answer>", 10, True),
    ("arabic-indic digit (\\d is Unicode)", "<answer>\u0663</answer>", 3, True),
    ("fullwidth digit (\\d is Unicode)", "<answer>\uff13</answer>", 3, True),
    ("superscript is not \\d", "<answer>\u00b3</answer>", 3, False),
    ("conversational correct", assistant("<think>x</think><answer>3</answer>"), 3, True),
    ("conversational wrong", assistant("<answer>5</answer>"), 3, False),
    (
        "conversational content blocks",
        [{"role": "assistant", "content": [TEXT_BLOCK("<answer>3"), TEXT_BLOCK("</answer>")]}],
        3,
        True,
    ),
]


@pytest.mark.parametrize("completion,gold,verdict", [c[1:] for c in GRADER_CASES], ids=[c[0] for c in GRADER_CASES])
def test_exact_count_equals_grader(completion, gold, verdict):
    (value,) = score("exact_count", [completion], gold=gold)
    assert value == float(is_correct(completion_text(completion), gold))
    assert value == float(verdict)


def test_exact_count_scores_a_batch_against_aligned_golds():
    completions = ["<answer>1</answer>", "<answer>2</answer>", "<answer>2</answer>"]
    func = reward("exact_count")
    assert func(completions=completions, solution=["<answer> 1 </answer>", "<answer> 2 </answer>", 3]) == [1, 1, 0]


def test_exact_count_logs_accuracy_and_parse_rate():
    sink = MetricSink()
    score("exact_count", ["<answer>3</answer>", "<answer>4</answer>", "four", "<answer>3</answer>"], log_metric=sink)
    assert sink.values == {"exact_count/accuracy": [0.5], "exact_count/parseable": [0.75]}


def test_exact_count_refuses_bad_gold_and_misaligned_columns():
    func = reward("exact_count")
    with pytest.raises(ValueError, match="cannot parse a gold count"):
        func(completions=["<answer>3</answer>"], solution=["three"])
    with pytest.raises(ValueError, match="aligned"):
        func(completions=["a", "b"], solution=["<answer> 3 </answer>"])
    with pytest.raises(ValueError, match="solution"):
        func(completions=["a"])


# ---------------------------------------------------------------------------------------------------------------------
# format
# ---------------------------------------------------------------------------------------------------------------------
# (id, completion, reward with require_think=True, reward with require_think=False)
FORMAT_CASES = [
    ("well formed", "<think>two cubes, one ball</think><answer>3</answer>", 1.0, 1.0),
    ("whitespace around blocks", "<think>\nx\n</think>\n<answer> 3 </answer>\n ", 1.0, 1.0),
    ("preamble before think is allowed", "Sure. <think>x</think><answer>3</answer>", 1.0, 1.0),
    ("leading zeros parse", "<think>x</think><answer>03</answer>", 1.0, 1.0),
    ("no think", "<answer>3</answer>", 0.0, 1.0),
    ("answer before think", "<answer>3</answer><think>x</think>", 0.0, 0.0),
    ("answer inside think", "<think>x<answer>3</answer></think>", 0.0, 0.0),
    ("two answer tags", "<think>x</think><answer>3</answer><answer>3</answer>", 0.0, 0.0),
    ("text after answer", "<think>x</think><answer>3</answer> So, 3.", 0.0, 0.0),
    ("stray close tag in think", "<think>x</answer></think><answer>3</answer>", 0.0, 0.0),
    ("spelled number", "<think>x</think><answer>three</answer>", 0.0, 0.0),
    ("words inside tag", "<think>x</think><answer>3 objects</answer>", 0.0, 0.0),
    ("negative", "<think>x</think><answer>-3</answer>", 0.0, 0.0),
    ("decimal", "<think>x</think><answer>3.0</answer>", 0.0, 0.0),
    ("missing closing answer tag", "<think>x</think><answer>3", 0.0, 0.0),
    ("two think blocks", "<think>a</think><think>b</think><answer>3</answer>", 0.0, 1.0),
    ("unclosed think", "<think>a <answer>3</answer>", 0.0, 1.0),
    ("think tags reversed", "</think>a<think><answer>3</answer>", 0.0, 1.0),
    ("empty", "", 0.0, 0.0),
    ("conversational", assistant("<think>x</think><answer>3</answer>"), 1.0, 1.0),
]


@pytest.mark.parametrize(
    "completion,with_think,without_think", [c[1:] for c in FORMAT_CASES], ids=[c[0] for c in FORMAT_CASES]
)
def test_format(completion, with_think, without_think):
    assert score("format", [completion]) == [with_think]
    assert score("format", [completion], require_think=False) == [without_think]


@pytest.mark.parametrize("completion", [c[1] for c in FORMAT_CASES], ids=[c[0] for c in FORMAT_CASES])
def test_well_formatted_implies_grader_parseable(completion):
    for require_think in (True, False):
        if score("format", [completion], require_think=require_think) == [1.0]:
            assert protocol.extract_answer(completion_text(completion)) is not None


def test_format_logs_each_condition():
    sink = MetricSink()
    completions = [
        "<think>x</think><answer>3</answer>",  # all good
        "<answer>3</answer>",  # no think
        "<think>x</think><answer>three</answer> more",  # unparseable, trailing text
        "<think>x</think><answer>3</answer><answer>3</answer>",  # two answers, trailing text
    ]
    assert score("format", completions, log_metric=sink) == [1.0, 0.0, 0.0, 0.0]
    assert sink.values == {
        "format/parseable": [0.75],
        "format/single_answer": [0.75],
        "format/clean_end": [0.5],
        "format/think_ok": [0.75],
    }


@pytest.mark.parametrize(
    "text,think_ok",
    [
        ("<think>x</think><answer>3</answer>", True),
        ("<think>x</think>", True),
        ("<answer>3</answer><think>x</think>", False),  # think after the answer
        ("<think>x<answer>3</answer></think>", False),  # answer inside think
        ("</think>x<think>", False),
        ("<think>a</think><think>b</think>", False),
        ("<think>a", False),
        ("", False),
    ],
)
def test_format_think_ok_sub_score(text, think_ok):
    # Logged as format/think_ok; within `format` the trailing-text rule also rejects a think after the answer.
    assert rewards.format_checks(text)["think_ok"] is think_ok


def test_format_rejects_non_bool_require_think():
    with pytest.raises(RewardConfigError, match="require_think"):
        reward("format", require_think="false")  # a string from a recipe would otherwise be truthy


# ---------------------------------------------------------------------------------------------------------------------
# soft_count
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prediction,expected",
    [("3", 1.0), ("2", 2 / 3), ("4", 2 / 3), ("5", 1 / 3), ("6", 0.0), ("9", 0.0), ("03", 1.0), ("0", 0.0)],
)
def test_soft_count_falls_linearly_with_error(prediction, expected):
    assert score("soft_count", [f"<answer>{prediction}</answer>"], gold=3) == [pytest.approx(expected)]


@pytest.mark.parametrize(
    "completion", ["", "<answer>three</answer>", "<answer>-3</answer>", "<answer>3.0</answer>", "3"]
)
def test_soft_count_is_zero_when_unparseable(completion):
    assert score("soft_count", [completion], gold=3) == [0.0]


def test_soft_count_uses_first_answer_like_the_grader():
    assert score("soft_count", ["<answer>4</answer><answer>3</answer>"], gold=3) == [pytest.approx(2 / 3)]


def test_soft_count_tolerance_param():
    assert score("soft_count", ["<answer>4</answer>"], gold=3, tolerance=1) == [0.0]
    assert score("soft_count", ["<answer>5</answer>"], gold=3, tolerance=4) == [pytest.approx(0.5)]


@pytest.mark.parametrize("tolerance", [0, -1, "3"])
def test_soft_count_rejects_bad_tolerance(tolerance):
    with pytest.raises(RewardConfigError, match="tolerance"):
        reward("soft_count", tolerance=tolerance)


def test_soft_count_logs_abs_error_over_parseable_only():
    sink = MetricSink()
    score("soft_count", ["<answer>3</answer>", "<answer>7</answer>", "none"], gold=3, log_metric=sink)
    assert sink.last("soft_count/abs_error") == 2.0
    assert sink.last("soft_count/parseable") == pytest.approx(2 / 3)
    sink = MetricSink()
    score("soft_count", ["none"], log_metric=sink)
    assert "soft_count/abs_error" not in sink.values  # 0 would read as perfect counting


# ---------------------------------------------------------------------------------------------------------------------
# length_penalty
# ---------------------------------------------------------------------------------------------------------------------
def ids(n: int) -> list[int]:
    return list(range(n))


def test_length_penalty_minus_one_at_budget_without_answer():
    truncated = "<think>" + "counting " * 200  # cut off mid-thought: no </answer>
    assert score("length_penalty", [truncated], completion_ids=[ids(EVAL_MAX_NEW_TOKENS)]) == [-1.0]


def test_length_penalty_minus_one_at_budget_with_unclosed_answer():
    text = "<think>x</think><answer>3"
    assert score("length_penalty", [text], completion_ids=[ids(EVAL_MAX_NEW_TOKENS)]) == [-1.0]


def test_length_penalty_none_when_answer_fits_exactly_in_budget():
    text = "<think>x</think><answer>3</answer>"
    assert score("length_penalty", [text], completion_ids=[ids(EVAL_MAX_NEW_TOKENS)]) == [0.0]


def test_length_penalty_minus_one_when_answer_ends_past_the_eval_budget():
    # 400 training tokens, answer at the very end: greedy eval at 256 tokens would never reach it.
    text = "<think>" + "a" * 2000 + "</think><answer>3</answer>"
    assert score("length_penalty", [text], completion_ids=[ids(400)]) == [-1.0]


def test_length_penalty_spares_long_completion_whose_answer_ends_inside_budget():
    text = "<answer>3</answer>" + " " * 2000  # answer in the first tokens, then trailing whitespace
    assert score("length_penalty", [text], completion_ids=[ids(400)]) == [0.0]


def test_length_penalty_ignores_short_completions_without_answer():
    # Not a length problem; format/exact_count deal with it.
    assert score("length_penalty", ["I don't know"], completion_ids=[ids(5)]) == [0.0]


def test_length_penalty_linear_above_think_budget():
    think_chars = 967
    text = "<think>" + "a" * think_chars + "</think><answer>3</answer>"
    assert len(text) == 1000
    n_tokens = 200
    think_tokens = n_tokens * think_chars / len(text)  # the documented character-fraction estimate
    expected = -0.5 * (think_tokens - 128) / (EVAL_MAX_NEW_TOKENS - 128)
    sink = MetricSink()
    assert score("length_penalty", [text], completion_ids=[ids(n_tokens)], log_metric=sink) == [pytest.approx(expected)]
    assert sink.last("length_penalty/mean_think_tokens") == pytest.approx(think_tokens)
    # Under the think budget: no penalty.
    assert score("length_penalty", [text], completion_ids=[ids(100)]) == [0.0]


def test_length_penalty_params():
    text = "<think>" + "a" * 967 + "</think><answer>3</answer>"  # ~193 think tokens at 200 ids
    assert score("length_penalty", [text], completion_ids=[ids(200)], think_budget=200) == [0.0]
    stricter = score("length_penalty", [text], completion_ids=[ids(200)], think_budget=64, max_think_penalty=1.0)
    assert stricter == [pytest.approx(-(193.4 - 64) / (256 - 64))]
    # A shorter training budget makes 200 tokens without an answer a cut-off.
    assert score("length_penalty", ["<think>a"], completion_ids=[ids(200)], budget_tokens=200) == [-1.0]


def test_length_penalty_think_penalty_is_capped():
    # Thinking longer than the whole budget, but after a parseable answer that fits: capped at -max_think_penalty.
    text = "<answer>3</answer><think>" + "a" * 5000
    assert score("length_penalty", [text], completion_ids=[ids(1000)]) == [-0.5]
    assert score("length_penalty", [text], completion_ids=[ids(1000)], max_think_penalty=0.2) == [-0.2]


def test_length_penalty_estimates_tokens_from_text_without_ids():
    long_no_answer = "a" * int(EVAL_MAX_NEW_TOKENS * rewards.CHARS_PER_TOKEN_ESTIMATE)
    assert score("length_penalty", [long_no_answer, "<answer>3</answer>"], completion_ids=None) == [-1.0, 0.0]


def test_length_penalty_stays_in_range():
    texts = ["", "<answer>3</answer>", "<think>" + "a" * 3000, "<think>" + "b" * 900 + "</think><answer>2</answer>"]
    for n_tokens in (1, 50, 128, 255, 256, 257, 512, 2048):
        for value in score("length_penalty", texts, completion_ids=[ids(n_tokens)] * len(texts)):
            assert -1.0 <= value <= 0.0


def test_length_penalty_logs_truncation_and_think_tokens():
    sink = MetricSink()
    texts = ["<think>" + "a" * 2000, "<think>abc</think><answer>3</answer>"]
    score("length_penalty", texts, completion_ids=[ids(256), ids(40)], log_metric=sink)
    assert sink.last("length_penalty/truncated_frac") == 0.5
    assert sink.last("length_penalty/mean_completion_tokens") == 148.0
    assert sink.last("length_penalty/mean_think_tokens") > 100  # the truncated one is almost all thinking
    assert sink.last("length_penalty/over_think_budget_frac") == 0.5


@pytest.mark.parametrize(
    "params,match",
    [
        ({"think_budget": 256}, "think_budget"),
        ({"think_budget": -1}, "think_budget"),
        ({"max_think_penalty": 2.0}, "max_think_penalty"),
        ({"budget_tokens": 256.5}, "budget_tokens"),
    ],
)
def test_length_penalty_rejects_bad_params(params, match):
    with pytest.raises(RewardConfigError, match=match):
        reward("length_penalty", **params)


# ---------------------------------------------------------------------------------------------------------------------
# answer_tag (the weak baseline reward)
# ---------------------------------------------------------------------------------------------------------------------
def test_answer_tag_only_checks_for_the_opening_tag():
    completions = ["<answer>", "blah <answer>seven", "<answer>3</answer>", "answer: 3", "<ANSWER>3", "", "<answer"]
    sink = MetricSink()
    assert score("answer_tag", completions, log_metric=sink) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert sink.last("answer_tag/present") == pytest.approx(3 / 7)


def test_answer_tag_docstring_says_it_is_trivial():
    assert "trivial" in REWARD_REGISTRY["answer_tag"].__doc__.lower()
    assert "trivial" in get_reward_funcs(["answer_tag"])[0].__doc__.lower()


# ---------------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------------
def test_registry_has_the_builtin_rewards():
    assert set(BUILTIN_REWARDS) <= set(REWARD_REGISTRY)


def test_rewards_use_the_protocol_regex():
    assert rewards.ANSWER_RE is protocol.ANSWER_RE


@pytest.mark.parametrize("name", BUILTIN_REWARDS)
def test_reward_name_is_registry_name(name):
    (func,) = get_reward_funcs([name])
    assert func.__name__ == name  # TRL logs rewards/<__name__>


@pytest.mark.parametrize("name", BUILTIN_REWARDS)
def test_trl_reads_the_registry_name(name):
    from trl.trainer.utils import (  # what GRPOTrainer uses for names/dispatch
        get_callable_name,
        is_async_callable,
    )

    (func,) = get_reward_funcs([name])
    assert get_callable_name(func) == name
    assert not is_async_callable(func)  # sync rewards must not be awaited


@pytest.mark.parametrize("name", BUILTIN_REWARDS)
def test_built_rewards_pickle_with_their_params(name):
    params = {"soft_count": {"tolerance": 1}, "format": {"require_think": False}}.get(name)
    (func,) = get_reward_funcs([name], {name: params} if params else None)
    clone = pickle.loads(pickle.dumps(func))
    completions = ["<answer>4</answer>", "<think>x</think><answer>3</answer>", "<think>" + "a" * 2000]
    kwargs = dict(completions=completions, solution=["3"] * 3, completion_ids=[ids(5), ids(9), ids(256)])
    assert clone.__name__ == name and clone(**kwargs) == func(**kwargs)


def test_unknown_reward_lists_valid_names_and_how_to_add_one():
    with pytest.raises(UnknownRewardError) as info:
        get_reward_funcs(["exact_count", "acuracy"])
    message = str(info.value)
    assert "acuracy" in message
    assert str(sorted(REWARD_REGISTRY)) in message
    assert "register_reward" in message and "open_r1/tasks/counting/rewards.py" in message
    assert isinstance(info.value, ValueError)


def test_unknown_param_names_valid_params():
    with pytest.raises(RewardConfigError, match=r"tolerence.*valid params: \['tolerance'\]"):
        get_reward_funcs(["soft_count"], {"soft_count": {"tolerence": 2}})
    with pytest.raises(RewardConfigError, match="valid params: none"):
        get_reward_funcs(["exact_count"], {"exact_count": {"strict": True}})


def test_reward_kwargs_are_a_yaml_mapping_checked_against_each_rewards_params(tmp_path):
    """reward_kwargs is a YAML mapping (JSON text on the command line); each reward's params are the dataclass made
    from its factory, and a misspelt reward or param is one error naming the closest, before any model loads."""
    import dataclasses

    from open_r1 import grpo, validate
    from open_r1.errors import OpenR1Error
    from open_r1.rewards import reward_kwargs_problems, reward_settings

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "reward_funcs: [soft_count, format]\nreward_kwargs:\n  soft_count: {tolerence: 2}\n"
        "  format: {require_think: false}\nmodel_name_or_path: /nowhere/model\n"
    )
    parsed = grpo.parse_args(["--config", str(recipe), "--output_dir", str(tmp_path), "--use_cpu", "true"])
    script_args = parsed[0]
    assert script_args.reward_kwargs == {"soft_count": {"tolerence": 2}, "format": {"require_think": False}}
    [problem] = reward_kwargs_problems(script_args.reward_funcs, script_args.reward_kwargs)
    assert "reward 'soft_count' has no param 'tolerence' (did you mean tolerance?)" in problem
    with pytest.raises(OpenR1Error, match=r"did you mean tolerance\?") as info:
        validate.validate_training(*parsed)  # with the missing model, in one error, before anything loads
    assert "/nowhere/model" in str(info.value)
    fields = [f.name for f in dataclasses.fields(reward_settings("length_penalty"))]
    assert fields == ["budget_tokens", "think_budget", "max_think_penalty"]
    assert "needs reward_model" in reward_kwargs_problems(["caption_rm"], {})[0]
    assert "(did you mean soft_count?)" in reward_kwargs_problems(["soft_count"], {"soft_cont": {}})[0]
    flag = grpo.parse_args(["--output_dir", str(tmp_path), "--use_cpu", "true", "--reward_kwargs", '{"format": {}}'])
    assert flag[0].reward_kwargs == {"format": {}}


def test_reward_params_must_be_a_mapping():
    with pytest.raises(RewardConfigError, match="mapping"):
        get_reward_funcs(["soft_count"], {"soft_count": [2]})


def test_reward_kwargs_for_a_reward_not_listed_is_an_error():
    with pytest.raises(RewardConfigError, match="soft_count"):
        get_reward_funcs(["exact_count"], {"soft_count": {"tolerance": 2}})


def test_duplicate_reward_names_are_an_error():
    with pytest.raises(RewardConfigError, match="more than once"):
        get_reward_funcs(["exact_count", "exact_count"])


def test_a_bare_string_is_not_a_reward_list():
    with pytest.raises(TypeError, match="list of reward names"):
        get_reward_funcs("exact_count")


def test_order_is_kept_so_reward_weights_line_up():
    names = ["length_penalty", "exact_count", "format", "soft_count"]
    params = {"soft_count": {"tolerance": 1}, "format": {"require_think": False}, "exact_count": None}
    funcs = get_reward_funcs(names, params)
    assert [f.__name__ for f in funcs] == names
    by_name = dict(zip(names, funcs))
    # Params reached their own reward and no other.
    kwargs = dict(completions=["<answer>4</answer>"], solution=["<answer> 3 </answer>"], completion_ids=[ids(5)])
    assert by_name["soft_count"](**kwargs) == [0.0]  # tolerance=1
    assert by_name["format"](**kwargs) == [1.0]  # require_think=False
    assert get_reward_funcs(["format"])[0](**kwargs) == [0.0]  # default require_think=True


def test_each_build_is_independent():
    strict, lenient = get_reward_funcs(["soft_count"], {"soft_count": {"tolerance": 1}})[0], reward("soft_count")
    kwargs = dict(completions=["<answer>4</answer>"], solution=["3"])
    assert strict(**kwargs) == [0.0] and lenient(**kwargs) == [pytest.approx(2 / 3)]


def test_register_a_custom_factory(scratch_registry):
    @register_reward("even_count")
    def even_count(bonus: float = 1.0):
        def even(completions, log_metric=None, **kwargs):
            preds = [protocol.extract_answer(completion_text(c)) for c in completions]
            return [bonus if p is not None and p % 2 == 0 else 0.0 for p in preds]

        return even

    func, exact = get_reward_funcs(["even_count", "exact_count"], {"even_count": {"bonus": 2.0}})
    assert func.__name__ == "even_count"
    assert func(completions=["<answer>4</answer>", "<answer>3</answer>"], solution=["3", "3"]) == [2.0, 0.0]
    with pytest.raises(RewardConfigError, match=r"valid params: \['bonus'\]"):
        get_reward_funcs(["even_count"], {"even_count": {"bonsu": 2.0}})


def test_register_a_plain_reward_function(scratch_registry):
    @register_reward("always_one")
    def some_function_name(completions, **kwargs):
        return [1.0] * len(completions)

    (func,) = get_reward_funcs(["always_one"])
    assert func.__name__ == "always_one"
    assert some_function_name.__name__ == "some_function_name"  # the user's function is not renamed
    assert func(completions=["a", "b"]) == [1.0, 1.0]
    with pytest.raises(RewardConfigError, match="valid params: none"):
        get_reward_funcs(["always_one"], {"always_one": {"x": 1}})


def test_registering_a_taken_name_needs_overwrite(scratch_registry):
    with pytest.raises(ValueError, match="already registered"):
        register_reward("format")(lambda: None)

    @register_reward("format", overwrite=True)
    def replaced(completions, **kwargs):
        return [0.5] * len(completions)

    assert get_reward_funcs(["format"])[0](completions=["x"]) == [0.5]


def test_async_rewards_stay_async_for_trl(scratch_registry):
    from trl.trainer.utils import is_async_callable

    @register_reward("async_one")
    async def async_one(completions, **kwargs):
        return [1.0] * len(completions)

    (func,) = get_reward_funcs(["async_one"])
    assert func.__name__ == "async_one" and is_async_callable(func)
    assert not is_async_callable(reward("exact_count"))


# ---------------------------------------------------------------------------------------------------------------------
# The call exactly as TRL 1.16 makes it
# ---------------------------------------------------------------------------------------------------------------------
def test_trl_signature_with_extra_columns_and_trainer_kwargs():
    from PIL import Image
    from transformers import TrainerState

    completions = [
        assistant("<think>2 cubes + 1 ball</think><answer>3</answer>"),
        assistant("<think>" + "hmm " * 300),
        assistant("<answer>4</answer> done"),
    ]
    n = len(completions)
    image = Image.new("RGB", (8, 8))
    extra_logged = {}
    sink = MetricSink()
    kwargs = dict(
        prompts=[protocol.build_messages("How many objects?")] * n,
        completions=completions,
        completion_ids=[ids(30), ids(EVAL_MAX_NEW_TOKENS), ids(8)],
        solution=["<answer> 3 </answer>"] * n,
        problem=["How many objects?"] * n,
        image=[image] * n,
        scene=[{"objects": [{"shape": "cube"}] * 3}] * n,
        trainer_state=TrainerState(),
        log_extra=lambda column, values: extra_logged.setdefault(column, values),
        log_metric=sink,
    )
    results = {func.__name__: func(**kwargs) for func in get_reward_funcs(BUILTIN_REWARDS)}
    for name, values in results.items():
        assert len(values) == n and all(isinstance(v, float) for v in values), name
    assert results["exact_count"] == [1.0, 0.0, 0.0]
    assert results["format"] == [1.0, 0.0, 0.0]
    assert results["soft_count"] == [1.0, 0.0, pytest.approx(2 / 3)]
    assert results["length_penalty"] == [0.0, -1.0, 0.0]
    assert results["answer_tag"] == [1.0, 0.0, 1.0]
    # Every reward reported its sub-scores, each under its own prefix.
    prefixes = {name.split("/")[0] for name in sink.values}
    assert prefixes == set(BUILTIN_REWARDS)


def test_rewards_work_without_log_metric_or_ids():
    for func in get_reward_funcs(BUILTIN_REWARDS):
        assert len(func(completions=["<answer>3</answer>", ""], solution=["3", "3"])) == 2


@pytest.mark.parametrize("name", BUILTIN_REWARDS)
def test_rewards_are_finite_on_adversarial_table(name):
    completions = [c[1] for c in GRADER_CASES] + [c[1] for c in FORMAT_CASES]
    values = score(name, completions, gold=3)
    assert len(values) == len(completions) and all(math.isfinite(v) for v in values)


def test_gold_is_parsed_with_protocol():
    # An integer gold and the dataset string form score identically.
    func = reward("exact_count")
    assert func(completions=["<answer>5</answer>"], solution=[5]) == [1.0]
    assert func(completions=["<answer>5</answer>"], solution=["<answer> 5 </answer>"]) == [1.0]
    assert parse_gold("<answer> 5 </answer>") == 5
