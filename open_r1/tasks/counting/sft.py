"""SFT rows for a counting warm start (TRL prompt-completion format, for `trl.SFTTrainer`): protocol-format targets,
plain rows (question alone -> bare number), and the protocol format taught on arithmetic. Used by the CPU demo's
warm start (the retired proxy experiment's `--think-noise` and `--plain-share` rows: experiments/LOG.md).
"""

import re

import numpy as np

from open_r1.tasks.counting import protocol
from open_r1.tasks.counting.data import TemplateMix, replace_columns

TARGET_STYLES = ("think", "answer", "mixed")


def sft_target(count: int, style: str, thought: str | None = None) -> str:
    """The assistant text for a gold count: think = `<think>There are N objects.</think> <answer>N</answer>` (short
    thinking, as the grader's prompt asks); answer = `<answer>N</answer>` (R1-V's best checkpoint answers so). The
    chat template closes the turn with `<|im_end|>`, so the model learns to stop."""
    if style == "think":
        thought = thought or f"There are {int(count)} objects."
        return f"<think>{thought}</think> <answer>{int(count)}</answer>"
    if style == "answer":
        return f"<answer>{int(count)}</answer>"
    raise ValueError(f"unknown target style {style!r}; choose think or answer (or mixed for a per-row draw)")


def to_sft_dataset(
    dataset,
    template_entries: list[str],
    seed: int = 0,
    style: str = "think",
    think_share: float = 0.5,
    thoughts: list[str] | None = None,
):
    """Add `prompt` / `completion` columns (TRL prompt-completion); the image stays in `image`, and TRL's collator
    puts its placeholder before the text, the grader's layout. Each row gets a seeded template from
    `template_entries` ("eval:0.5"...); style "mixed" draws think (probability `think_share`) or answer per row.
    `target_count` records what each row teaches."""
    if style not in TARGET_STYLES:
        raise ValueError(f"unknown target style {style!r}; choose one of {TARGET_STYLES}")
    if not 0.0 <= think_share <= 1.0:
        raise ValueError(f"think_share must be in [0, 1], got {think_share!r}")
    templates = TemplateMix.parse(template_entries)
    names = templates.assign(len(dataset), seed)
    golds = [protocol.parse_gold(s) for s in dataset["solution"]]
    styles = [style] * len(dataset)
    if style == "mixed":
        draw = np.random.default_rng(seed + 1).random(len(dataset))
        styles = ["think" if d < think_share else "answer" for d in draw]
    targets = golds
    prompts = [
        [{"role": "user", "content": protocol.format_prompt(problem, protocol.TEMPLATES[name])}]
        for problem, name in zip(dataset["problem"], names)
    ]
    thoughts = thoughts or [None] * len(dataset)
    completions = [
        [{"role": "assistant", "content": sft_target(t, s, thought)}]
        for t, s, thought in zip(targets, styles, thoughts)
    ]
    return replace_columns(dataset, target_count=targets, prompt=prompts, completion=completions, template=names)


def to_arithmetic_sft_dataset(
    dataset, template_entries: list[str], seed: int = 0, style: str = "think", think_share: float = 0.5
):
    """The protocol format taught on another task: "What is A plus B?" (A, B in 1..9, seeded) on each row's image,
    answered `<think>A plus B is C.</think> <answer>C</answer>` (or the answer alone, as in to_sft_dataset), so that
    whether counting shows up inside the format is left to the model and the recipes (docs/RECIPE.md)."""
    rng = np.random.default_rng(seed + 4)
    left, right = rng.integers(1, 10, size=len(dataset)), rng.integers(1, 10, size=len(dataset))
    questions = [f"What is {int(a)} plus {int(b)}?" for a, b in zip(left, right)]
    rows = replace_columns(
        dataset, problem=questions, solution=[f"<answer> {int(a + b)} </answer>" for a, b in zip(left, right)]
    )
    thoughts = [f"{int(a)} plus {int(b)} is {int(a + b)}." for a, b in zip(left, right)]
    return to_sft_dataset(rows, template_entries, seed=seed, style=style, think_share=think_share, thoughts=thoughts)


EXPOSURE_TEMPLATE = "plain"  # the `template` column of plain rows : the question alone
PLAIN_PROMPT = "{question}"  # the user text of plain rows, as a protocol.format_prompt template
PLAIN_NUMBER_RE = re.compile(r"\d+")


def plain_count(completion: str) -> int | None:
    """The first integer of a plain answer ("7", "7 objects"), or None: a diagnostic, never a protocol score."""
    match = PLAIN_NUMBER_RE.search(completion)
    return int(match.group(0)) if match else None


def to_exposure_sft_dataset(dataset):
    """Pretraining-style rows: the question alone answered with the bare number (the demo start's counting rows).
    Like the real Qwen2-VL-2B, which counts Super-CLEVR well when asked directly but not under the think template
    (docs/RECIPE.md), the start then counts when asked plainly, never in the format."""
    golds = [protocol.parse_gold(s) for s in dataset["solution"]]
    prompts = [
        [{"role": "user", "content": protocol.format_prompt(str(problem), PLAIN_PROMPT)}]
        for problem in dataset["problem"]
    ]
    completions = [[{"role": "assistant", "content": str(int(g))}] for g in golds]
    return replace_columns(
        dataset, target_count=golds, prompt=prompts, completion=completions, template=[EXPOSURE_TEMPLATE] * len(dataset)
    )
