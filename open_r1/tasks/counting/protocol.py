"""The evaluation protocol, the single source of truth for templates, answer extraction and scoring: rewards, data,
selfcheck, in-training evaluation and tests import it, so what the policy is paid for is what the grader counts.

The grader (fixed, not ours to change):
  * prompt = EVAL_TEMPLATE.format(question=...) after the image, in the model's chat template;
  * greedy decoding, max_new_tokens = 256;
  * prediction = first match of ``<answer>\\s*(\\d+)\\s*</answer>``, correct only on integer equality with gold.
"""

import re
from typing import Any

# Eval wording, verbatim from the grader.
EVAL_TEMPLATE = (
    "{question} First output the thinking process in <think> </think> and final answer (number) in "
    "<answer> </answer> tags."
)
# The inherited (R1-V) training wording: no "First", and two spaces after the question, exactly as R1-V has it.
TRAIN_TEMPLATE = (
    "{question}  Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
)
# Named templates a recipe can mix (see open_r1/tasks/counting/data.py: `prompt_templates`).
TEMPLATES: dict[str, str] = {"eval": EVAL_TEMPLATE, "train": TRAIN_TEMPLATE}

EVAL_MAX_NEW_TOKENS = 256
# The grader's regex. `re.search` returns the first match, as the grader does.
ANSWER_RE = re.compile(r"<answer>\s*(\d+)\s*</answer>")
# Gold answers in `solution` look like "<answer> 3 </answer>"; the same pattern parses them.
GOLD_RE = ANSWER_RE


def format_prompt(question: str, template: str = EVAL_TEMPLATE) -> str:
    """The user text for one question under a template (a template string or a name in TEMPLATES)."""
    template = TEMPLATES.get(template, template)
    return template.format(question=question.strip())


def build_messages(question: str, template: str = EVAL_TEMPLATE, image: Any = None) -> list[dict]:
    """One user turn as processors and TRL expect it: the image first, then the text (`image` None: TRL fills the
    placeholder from the dataset)."""
    image_part: dict[str, Any] = {"type": "image"}
    if image is not None:
        image_part["image"] = image
    return [{"role": "user", "content": [image_part, {"type": "text", "text": format_prompt(question, template)}]}]


def extract_answer(completion: str) -> int | None:
    """The grader's prediction: the integer in the first `<answer> N </answer>`, or None when there is none."""
    match = ANSWER_RE.search(completion)
    return int(match.group(1)) if match else None


def parse_gold(solution: str | int) -> int:
    """Gold count from a `solution` cell (`<answer> 3 </answer>`, or a bare integer). Raises ValueError."""
    if isinstance(solution, int) and not isinstance(solution, bool):
        return solution
    text = str(solution)
    match = GOLD_RE.search(text)
    if match:
        return int(match.group(1))
    if text.strip().isdigit():
        return int(text.strip())
    raise ValueError(f"cannot parse a gold count from solution {text!r}; expected '<answer> N </answer>'")


def is_correct(completion: str, gold: int) -> bool:
    """Exact-match scoring, as the grader does it: integer equality of the first extracted answer."""
    pred = extract_answer(completion)
    return pred is not None and pred == gold


def completion_text(completion: Any) -> str:
    """Plain text of a completion as TRL passes it: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts = []
        for message in completion:
            content = message.get("content", "") if isinstance(message, dict) else message
            if isinstance(content, list):  # multimodal content blocks
                parts.extend(block.get("text", "") for block in content if isinstance(block, dict))
            else:
                parts.append(str(content))
        return "".join(parts)
    return str(completion)
