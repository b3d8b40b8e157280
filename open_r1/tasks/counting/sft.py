"""SFT rows for a counting warm start: the protocol-format targets, plain (question alone -> bare number) rows, and
the protocol format taught on another task (arithmetic). TRL's prompt-completion format, for `trl.SFTTrainer`.

Used by the CPU demo (`open_r1.tasks.counting.demo`) and by the proxy experiment's warm start
(`experiments/proxy/sft_warmstart.py`, which imports these through `experiments.proxy.proxy`).
"""
from __future__ import annotations

import re

from open_r1.tasks.counting import protocol
from open_r1.tasks.counting.data import TemplateMix, replace_columns

TARGET_STYLES = ("think", "answer", "mixed")


def sft_target(count: int, style: str, thought: str | None = None) -> str:
    """The assistant text for a gold count, in the protocol's format.

    think:  `<think>There are N objects.</think> <answer>N</answer>` (short thinking, as the grader's prompt asks);
    answer: `<answer>N</answer>` (no thinking: R1-V's best checkpoint answers like this, and the grader accepts it).
    The chat template closes the assistant turn with `<|im_end|>` (the eos of generation), so the model learns to stop.
    """
    if style == "think":
        thought = thought or f"There are {int(count)} objects."
        return f"<think>{thought}</think> <answer>{int(count)}</answer>"
    if style == "answer":
        return f"<answer>{int(count)}</answer>"
    raise ValueError(f"unknown target style {style!r}; choose think or answer (or mixed for a per-row draw)")


THINK_NOISE_OFFSETS = (-2, -1, 1, 2)


def to_sft_dataset(dataset, template_entries: list[str], seed: int = 0, style: str = "think",
                   think_share: float = 0.5, think_noise: float = 0.0, thoughts: list[str] | None = None):
    """Add conversational `prompt` / `completion` columns (TRL prompt-completion format); the image stays in `image`.

    The user turn is plain text: TRL's collator puts the image placeholder before it, which is the grader's layout
    (image first, then the text). Each row gets a template drawn from `template_entries` ("eval:0.5"...) with a
    seeded generator; style "mixed" draws think (with probability `think_share`) or answer per row (TON-style
    thought dropout).

    `think_noise` (default 0) makes the start model's thinking unreliable, the documented failure of the real start
    model (Qwen2-VL-2B counts Super-CLEVR at 48 % under the think prompt vs 79-86 % answering directly; docs/RECIPE.md): that
    fraction of the think-style rows state a wrong count (gold + one of THINK_NOISE_OFFSETS, kept >= 1) in the
    thought *and* the answer that follows it; answer-style rows stay correct. A recipe can then gain by changing how
    the model answers, which is where the published GRPO gains on counting come from, without the proxy having to
    learn to see better. The `target_count` column records what each row teaches.
    """
    import numpy as np

    if style not in TARGET_STYLES:
        raise ValueError(f"unknown target style {style!r}; choose one of {TARGET_STYLES}")
    for name, value in (("think_share", think_share), ("think_noise", think_noise)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    templates = TemplateMix.parse(template_entries)
    names = templates.assign(len(dataset), seed)
    golds = [protocol.parse_gold(s) for s in dataset["solution"]]
    styles = [style] * len(dataset)
    if style == "mixed":
        draw = np.random.default_rng(seed + 1).random(len(dataset))
        styles = ["think" if d < think_share else "answer" for d in draw]
    targets = list(golds)
    if think_noise:
        rng = np.random.default_rng(seed + 2)
        wrong = rng.random(len(dataset)) < think_noise
        offsets = rng.choice(THINK_NOISE_OFFSETS, size=len(dataset))
        for i, (gold, row_style) in enumerate(zip(golds, styles)):
            if row_style == "think" and wrong[i]:
                offset = int(offsets[i])
                targets[i] = gold + offset if gold + offset >= 1 else gold + abs(offset)
    prompts = [
        [{"role": "user", "content": protocol.format_prompt(problem, protocol.TEMPLATES[name])}]
        for problem, name in zip(dataset["problem"], names)
    ]
    thoughts = thoughts or [None] * len(dataset)
    completions = [[{"role": "assistant", "content": sft_target(t, s, thought)}]
                   for t, s, thought in zip(targets, styles, thoughts)]
    return replace_columns(dataset, target_count=targets, prompt=prompts, completion=completions, template=names)


def to_arithmetic_sft_dataset(dataset, template_entries: list[str], seed: int = 0, style: str = "think",
                              think_share: float = 0.5):
    """The protocol format taught on another task: each row keeps its image but asks "What is A plus B?" (A, B in
    1..9, seeded) under a protocol template, answered `<think>A plus B is C.</think> <answer>C</answer>` (or the
    answer alone, per `style` / `think_share` as in to_sft_dataset).

    Why: Qwen2-VL-2B-Instruct learned answer tags from instruction data about other things, never from counting
    these scenes under this prompt. A warm start that counts only from plain rows (`--plain-share 1`) and learns
    the format only here has the same split: whether counting shows up inside the protocol format is left to the
    model, and to the recipes. The `problem` / `solution` columns are replaced by the arithmetic ones.
    """
    import numpy as np

    rng = np.random.default_rng(seed + 4)
    left, right = rng.integers(1, 10, size=len(dataset)), rng.integers(1, 10, size=len(dataset))
    questions = [f"What is {int(a)} plus {int(b)}?" for a, b in zip(left, right)]
    rows = replace_columns(dataset, problem=questions,
                           solution=[f"<answer> {int(a + b)} </answer>" for a, b in zip(left, right)])
    thoughts = [f"{int(a)} plus {int(b)} is {int(a + b)}." for a, b in zip(left, right)]
    return to_sft_dataset(rows, template_entries, seed=seed, style=style, think_share=think_share, thoughts=thoughts)


EXPOSURE_TEMPLATE = "plain"  # the `template` column of plain rows (exposure and --plain-share): the question alone
PLAIN_PROMPT = "{question}"  # the user text of plain rows, as a protocol.format_prompt template
PLAIN_NUMBER_RE = re.compile(r"\d+")


def plain_count(completion: str) -> int | None:
    """The first integer of a plain answer ("7", "7 objects"), or None. A diagnostic of what the model knows when
    asked directly; never a protocol score (the grader reads only `<answer>N</answer>`: open_r1.tasks.counting.protocol)."""
    match = PLAIN_NUMBER_RE.search(completion)
    return int(match.group(0)) if match else None


def split_plain_rows(n: int, plain_share: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Row indices for the warm start's two kinds of CLEVR rows: (plain, protocol), a seeded draw of
    round(plain_share * n) plain rows; both lists sorted."""
    import numpy as np

    if not 0.0 <= plain_share <= 1.0:
        raise ValueError(f"plain_share must be in [0, 1], got {plain_share!r}")
    order = np.random.default_rng(seed + 3).permutation(n)
    k = int(round(plain_share * n))
    return sorted(int(i) for i in order[:k]), sorted(int(i) for i in order[k:])


def to_exposure_sft_dataset(dataset):
    """Pretraining-style rows: the question alone (no protocol template) answered with the bare number. Used for
    the warm start's OOD exposure (OOD-renderer images) and for its `--plain-share` CLEVR rows.

    Why: the real Qwen2-VL-2B has seen vehicles in pre-training and counts Super-CLEVR well when asked directly
    (79-86 %; docs/RECIPE.md) but only 48 % under the think template. A model trained from scratch on
    CLEVR alone has never seen the OOD renderer and is at chance there (it answered "10" to 65 % of ood_val in our
    first proxy), so no GRPO recipe could move it. These rows give the proxy start the same kind of knowledge: it can
    count the OOD scenes when asked plainly, never in the protocol format; whether the format and the counting
    combine under the eval template is left to the recipes. ood_val is a disjoint seed stream of the same renderer.
    """
    golds = [protocol.parse_gold(s) for s in dataset["solution"]]
    prompts = [[{"role": "user", "content": protocol.format_prompt(str(problem), PLAIN_PROMPT)}]
               for problem in dataset["problem"]]
    completions = [[{"role": "assistant", "content": str(int(g))}] for g in golds]
    return replace_columns(dataset, target_count=golds, prompt=prompts, completion=completions,
                           template=[EXPOSURE_TEMPLATE] * len(dataset))
