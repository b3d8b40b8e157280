"""The captioning protocol: the ONE source of the task's prompts, output format and caption parser, so every stage
sees the same prompt and what GRPO pays for is exactly what evaluation counts.

Prompt (``build_messages``): ``SYSTEM_PROMPT``, then the image and ``user_text(description)``. Output:
``<think>{thinking}</think>\n\n<caption>{caption}</caption>`` (the Thinking template's generation prompt opens the
think block). Parser (strict, ``parse_details`` gives the reason): the single caption after the single ``</think>``,
nothing but whitespace before it, only whitespace or ``EOS_STRINGS`` after it; a caption inside the think block never
counts; the caption non-empty, one line, tag-free, at most ``max_words`` words. Engines that stop at ``STOP`` must
keep the stop string (the parser needs the closing tag).
"""

import re
from typing import Any, NamedTuple

from open_r1.errors import DataError
from open_r1.tasks.counting.protocol import completion_text  # task-neutral: str or messages -> text

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CAPTION_OPEN, CAPTION_CLOSE = "<caption>", "</caption>"

MAX_WORDS = 25
# Thinking + caption. SFT traces are 1-2 sentences (synthesis is capped at SYNTHESIS_MAX_NEW_TOKENS), so 1024 tokens
# leave room for a trace, the caption and slack; evaluation reports the truncated share under the same budget.
MAX_NEW_TOKENS = 1024
STOP = (CAPTION_CLOSE,)
# End-of-sequence markers a decoder may leave in the text (skip_special_tokens=False, or vLLM); allowed after the
# caption, nothing else is.
EOS_STRINGS = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<end_of_turn>")

DESCRIPTION_FIELDS = ("scene", "twist", "location", "entities")  # each a "Scene: ..." line of the prompt

SYSTEM_PROMPT = (
    "You are a witty cartoon captionist. Look at the cartoon, think briefly about what is odd or surprising in it, "
    f"then write one funny caption. Answer in exactly this form: your brief reasoning, then {THINK_CLOSE}, then "
    f"{CAPTION_OPEN}your caption{CAPTION_CLOSE} on one line, at most {MAX_WORDS} words, with nothing after it."
)
CAPTION_REQUEST = "Write a funny one-line caption for this New Yorker-style cartoon."


def field_text(value: Any) -> str:
    """A description field as one line (entities may come as a list)."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v).strip() for v in value if v is not None and str(v).strip())
    return " ".join(str(value).split())  # one line: newlines in a description would blur the prompt's structure


def user_text(description: dict | None) -> str:
    """The caption request, then one ``Label: value`` line per non-empty description field (in
    ``DESCRIPTION_FIELDS`` order); an unknown key is a DataError (a typo would drop a field from every prompt)."""
    description = description or {}
    if not isinstance(description, dict):
        raise DataError(f"a cartoon description must be a dict with keys {DESCRIPTION_FIELDS}, got {type(description)}")
    unknown = sorted(set(description) - set(DESCRIPTION_FIELDS))
    if unknown:
        raise DataError(
            f"unknown description field(s) {unknown}; the protocol knows {list(DESCRIPTION_FIELDS)}. "
            "Rename the columns, or build the description with description_from_row(row)."
        )
    lines = [CAPTION_REQUEST]
    for field in DESCRIPTION_FIELDS:
        text = field_text(description.get(field))
        if text:
            lines.append(f"{field.capitalize()}: {text}")
    return "\n".join(lines)


def description_from_row(row: dict) -> dict:
    """The description fields of a data row (other columns ignored; missing fields left out)."""
    return {field: row[field] for field in DESCRIPTION_FIELDS if field in row and row[field] is not None}


def build_messages(description: dict | None) -> list[dict]:
    """System prompt + one user turn (image placeholder, then ``user_text``): the prompt of every stage."""
    return [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user_text(description)}]},
    ]


def format_target(thinking: str, caption: str) -> str:
    """The completion after the template's ``<think>\\n``; a DataError when the pieces would not parse back (a tag
    inside them, a multi-line or empty caption), so a bad trace cannot become an SFT target the parser rejects."""
    thinking, caption = thinking.strip(), caption.strip()
    for name, value in (("thinking", thinking), ("caption", caption)):
        for tag in _TAGS:
            if tag in value:
                raise DataError(
                    f"format_target: the {name} contains the tag {tag!r}; strip tags before building targets"
                )
    if not caption or "\n" in caption or "\r" in caption:
        raise DataError(f"format_target: the caption must be one non-empty line, got {caption!r}")
    return f"{thinking}{THINK_CLOSE}\n\n{CAPTION_OPEN}{caption}{CAPTION_CLOSE}"


def rm_messages(description: dict | None, caption: str) -> list[dict]:
    """What the reward model scores: every stage's prompt + the caption turn (the thinking is not part of it)."""
    return build_messages(description) + [rm_turn(caption)]


def rm_turn(caption: str) -> dict:
    """The assistant turn of `rm_messages`."""
    text = f"{CAPTION_OPEN}{caption.strip()}{CAPTION_CLOSE}"
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


PARSE_REASONS = (
    "ok",
    "extra_think_open",
    "no_think_close",
    "multiple_think_close",
    "caption_only_in_think",
    "no_caption",
    "text_before_caption",
    "multiple_captions",
    "unclosed_caption",
    "trailing_text",
    "empty",
    "multi_line",
    "tag_in_caption",
    "too_long",
)


class CaptionParse(NamedTuple):
    caption: str | None  # the stripped caption, or None
    reason: str  # "ok" or the first failed check (one of PARSE_REASONS)
    caption_in_think: bool = False  # a <caption> tag appeared inside the think block (never counted)

    @property
    def ok(self) -> bool:
        return self.caption is not None


_EOS_TAIL = re.compile(r"(?:\s|" + "|".join(re.escape(s) for s in EOS_STRINGS) + r")*\Z")
_TAGS = (THINK_OPEN, THINK_CLOSE, CAPTION_OPEN, CAPTION_CLOSE)


def count_words(caption: str) -> int:
    return len(caption.split())


def parse_details(text: Any, max_words: int = MAX_WORDS) -> CaptionParse:
    """Parse a completion (str or TRL message list) strictly; see the module docstring for the rules."""
    body = completion_text(text).lstrip().removeprefix(THINK_OPEN)
    if THINK_OPEN in body:
        return CaptionParse(None, "extra_think_open")
    n_close = body.count(THINK_CLOSE)
    if n_close == 0:
        return CaptionParse(None, "no_think_close", CAPTION_OPEN in body)
    if n_close > 1:
        return CaptionParse(None, "multiple_think_close")
    thinking, after = body.split(THINK_CLOSE)
    in_think = CAPTION_OPEN in thinking or CAPTION_CLOSE in thinking
    if CAPTION_OPEN not in after:
        return CaptionParse(None, "caption_only_in_think" if in_think else "no_caption", in_think)
    if after.lstrip().find(CAPTION_OPEN) != 0:
        return CaptionParse(None, "text_before_caption", in_think)
    if after.count(CAPTION_OPEN) > 1 or after.count(CAPTION_CLOSE) > 1:
        return CaptionParse(None, "multiple_captions", in_think)
    start = after.index(CAPTION_OPEN) + len(CAPTION_OPEN)
    end = after.find(CAPTION_CLOSE, start)
    if end == -1:
        return CaptionParse(None, "unclosed_caption", in_think)
    tail = after[end + len(CAPTION_CLOSE) :]
    if not _EOS_TAIL.match(tail):
        return CaptionParse(None, "trailing_text", in_think)
    caption = after[start:end].strip()
    if not caption:
        return CaptionParse(None, "empty", in_think)
    if "\n" in caption or "\r" in caption:
        return CaptionParse(None, "multi_line", in_think)
    if any(tag in caption for tag in _TAGS) or "<caption" in caption:
        return CaptionParse(None, "tag_in_caption", in_think)
    if count_words(caption) > max_words:
        return CaptionParse(None, "too_long", in_think)
    return CaptionParse(caption, "ok", in_think)


# --- Trace synthesis (stage 1): the same system prompt and user turn, plus the known-good caption to explain ---
SYNTHESIS_MAX_NEW_TOKENS = 512
SYNTHESIS_INSTRUCTION = (
    'Readers rated this caption among the funniest for the cartoon: "{caption}"\n'
    "Think, in one or two sentences, about what in the picture makes a caption like that funny, as you would before "
    "writing it yourself. Do not quote the caption and do not mention readers, ratings or judges."
)


def synthesis_messages(description: dict | None, caption: str) -> list[dict]:
    """``build_messages(description)`` with the synthesis instruction appended to the user text (the SFT row uses
    the plain prompt: the policy never sees the caption it is asked to write)."""
    messages = build_messages(description)
    messages[1]["content"][1]["text"] += "\n\n" + SYNTHESIS_INSTRUCTION.format(caption=caption.strip())
    return messages


_WORD = re.compile(r"[a-z0-9']+")


def trace_leaks_caption(thinking: str, caption: str, max_shared_run: int = 4) -> bool:
    """True when a synthesized trace would teach the answer instead of reasoning: it contains a tag, the caption
    verbatim (case- and punctuation-insensitive), or a run of more than `max_shared_run` consecutive caption words."""
    if any(tag in thinking for tag in _TAGS):
        return True
    t_words, c_words = _WORD.findall(thinking.lower()), _WORD.findall(caption.lower())
    if not c_words:
        return False
    if f" {' '.join(c_words)} " in f" {' '.join(t_words)} ":
        return True
    run = max_shared_run + 1
    if len(c_words) < run:
        return False
    grams = {tuple(c_words[i : i + run]) for i in range(len(c_words) - run + 1)}
    return any(tuple(t_words[i : i + run]) in grams for i in range(len(t_words) - run + 1))
