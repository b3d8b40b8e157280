"""The eval protocol (open_r1/tasks/counting/protocol.py): templates, the grader's regex, extraction, gold parsing,
scoring.

These pin the grader's behaviour on adversarial strings; rewards are tested against them in test_rewards.py.
"""

import pytest

from open_r1.tasks.counting import protocol
from open_r1.tasks.counting.protocol import (
    ANSWER_RE,
    EVAL_MAX_NEW_TOKENS,
    EVAL_TEMPLATE,
    TRAIN_TEMPLATE,
    build_messages,
    completion_text,
    extract_answer,
    format_prompt,
    is_correct,
    parse_gold,
)


# ---------------------------------------------------------------------------------------------------------------------
# Constants: these are the grader's, verbatim
# ---------------------------------------------------------------------------------------------------------------------
def test_answer_regex_is_the_graders():
    assert ANSWER_RE.pattern == r"<answer>\s*(\d+)\s*</answer>"
    assert protocol.GOLD_RE is ANSWER_RE


def test_eval_budget_is_256_tokens():
    assert EVAL_MAX_NEW_TOKENS == 256


def test_eval_template_wording_is_verbatim():
    assert format_prompt("How many cubes are there?") == (
        "How many cubes are there? First output the thinking process in <think> </think> and final answer "
        "(number) in <answer> </answer> tags."
    )


def test_train_template_keeps_r1v_wording_with_two_spaces():
    text = format_prompt("How many cubes are there?", "train")
    assert text.startswith("How many cubes are there?  Output the thinking process")
    assert text == TRAIN_TEMPLATE.format(question="How many cubes are there?")


def test_format_prompt_strips_question_and_accepts_raw_template():
    assert format_prompt("  Q?\n", "eval") == EVAL_TEMPLATE.format(question="Q?")
    assert format_prompt("Q?", "Count: {question}") == "Count: Q?"


def test_build_messages_puts_image_first_then_text():
    messages = build_messages("Q?")
    assert messages == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": format_prompt("Q?")}]}]
    image = object()
    assert build_messages("Q?", "train", image=image)[0]["content"][0] == {"type": "image", "image": image}


# ---------------------------------------------------------------------------------------------------------------------
# extract_answer / is_correct on adversarial completions
# ---------------------------------------------------------------------------------------------------------------------
EXTRACTION_CASES = [
    ("plain", "<answer>3</answer>", 3),
    ("spaces inside tag", "<answer> 3 </answer>", 3),
    ("newlines inside tag", "<answer>\n 3 \n</answer>", 3),
    ("tabs inside tag", "<answer>\t7\t</answer>", 7),
    ("with think", "<think>there are 2 red and 1 blue</think><answer>3</answer>", 3),
    ("two answer tags: first wins", "<answer>3</answer><answer>5</answer>", 3),
    ("unparseable first, parseable second: second is the first *match*", "<answer>x</answer><answer>5</answer>", 5),
    ("answer before think", "<answer>4</answer><think>hmm</think>", 4),
    ("leading zeros", "<answer>03</answer>", 3),
    ("zero", "<answer>0</answer>", 0),
    ("multi-digit", "<answer>12</answer>", 12),
    ("words inside tag", "<answer>3 objects</answer>", None),
    ("negative", "<answer>-3</answer>", None),
    ("decimal", "<answer>3.0</answer>", None),
    ("spelled number", "<answer>three</answer>", None),
    ("digit separator", "<answer>1,000</answer>", None),
    ("missing closing tag", "<answer>3", None),
    ("missing opening tag", "3</answer>", None),
    ("unclosed then closed", "<answer>3 <answer>4</answer>", 4),
    ("empty", "", None),
    ("no tags", "The answer is 3.", None),
    ("upper-case tag", "<ANSWER>3</ANSWER>", None),
    ("space in tag name", "< answer>3</answer>", None),
    # Python's `\d` on str patterns matches any Unicode decimal digit (category Nd) and int() accepts them, so
    # Arabic-Indic and fullwidth digits parse. The grader uses this same regex, so we match it either way.
    ("arabic-indic digit", "<answer>\u0663</answer>", 3),
    ("fullwidth digit", "<answer>\uff13</answer>", 3),
    # Superscripts are category No, not Nd: not `\d`, so unparseable.
    ("superscript digit", "<answer>\u00b3</answer>", None),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in EXTRACTION_CASES], ids=[c[0] for c in EXTRACTION_CASES])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text,expected", [c[1:] for c in EXTRACTION_CASES], ids=[c[0] for c in EXTRACTION_CASES])
def test_is_correct_is_integer_equality_of_first_match(text, expected):
    gold = 3
    assert is_correct(text, gold) is (expected == gold)


def test_is_correct_zero_gold_needs_a_parsed_zero():
    # None must never compare equal to gold 0.
    assert is_correct("<answer>0</answer>", 0) is True
    assert is_correct("no answer", 0) is False


# ---------------------------------------------------------------------------------------------------------------------
# parse_gold
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "solution,gold",
    [("<answer> 3 </answer>", 3), ("<answer>10</answer>", 10), ("<answer>\n0\n</answer>", 0), (" 7 ", 7), (5, 5)],
)
def test_parse_gold(solution, gold):
    assert parse_gold(solution) == gold


@pytest.mark.parametrize("solution", ["<answer> three </answer>", "", "3.5", "-2", True])
def test_parse_gold_rejects_what_it_cannot_read(solution):
    with pytest.raises(ValueError, match="cannot parse a gold count"):
        parse_gold(solution)


# ---------------------------------------------------------------------------------------------------------------------
# completion_text: what TRL passes to rewards
# ---------------------------------------------------------------------------------------------------------------------
def test_completion_text_string_passthrough():
    assert completion_text("<answer>3</answer>") == "<answer>3</answer>"


def test_completion_text_conversational():
    completion = [{"role": "assistant", "content": "<think>x</think><answer>3</answer>"}]
    assert completion_text(completion) == "<think>x</think><answer>3</answer>"


def test_completion_text_multimodal_content_blocks():
    blocks = [{"type": "text", "text": "<answer>"}, {"type": "text", "text": "3</answer>"}]
    completion = [{"role": "assistant", "content": blocks}]
    assert completion_text(completion) == "<answer>3</answer>"


def test_completion_text_joins_messages_and_handles_empty():
    assert completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]) == "ab"
    assert completion_text([]) == ""
    assert completion_text([{"role": "assistant"}]) == ""
