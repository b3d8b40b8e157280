"""The vision tower's attention in one SDPA call per image size, instead of one per image.

transformers 5.24's Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision attention packs every image's patches into one
sequence. With flash attention it passes the image boundaries (`cu_seqlens`) to a variable-length kernel; with any
other implementation it splits the sequence at those boundaries and calls the attention function once per image
and layer. For a selfcheck batch of 512 images through Qwen2-VL-2B's 32 vision layers that is 16,384 small SDPA
calls per prefill, each a few microseconds of GPU work behind tens of microseconds of Python and launch overhead.

`grouped_sdpa` takes the boundaries and runs PyTorch's SDPA once per distinct segment length (or in chunks of at most
`MAX_TOKENS_PER_CALL` tokens): segments of equal length (images of the same size; Qwen2.5-VL's full windows) are
stacked into one `(n, heads, length, dim)` batch.
Each segment still attends only to itself, so the result is the per-image computation's (bit for bit on CPU,
tested; on GPUs the kernels may differ in the last bits). No model code is replaced: the function is registered
through transformers' `AttentionInterface`, the library's extension point, and set on the vision sub-config only
(`compat.set_vision_attn_implementation`: `model.set_attn_implementation({"vision_config": NAME})`, or where
transformers >= 5.25 refuses that name, the vision config's attribute); the language model keeps its own.

What it relies on (checked by `tests/test_vision_attention.py` for every supported family): transformers hands
`cu_seq_lens_q` to an implementation only when its name contains "flash" (`is_flash_attention_requested` is a
substring test), hence the name. Nothing else in those vision towers reads the name beyond computing `max_seqlen`.
The setting lives on the loaded model only and is not written by `save_pretrained` (tested), so a saved
checkpoint loads with plain transformers.
"""
from __future__ import annotations

import torch

from open_r1.compat import attn_implementation, set_vision_attn_implementation
from open_r1.errors import ModelError
from open_r1.families import base_model

# "flash" must stay in the name: it is what makes transformers pass cu_seqlens (see the module docstring).
NAME = "open_r1_flash_grouped_sdpa"

VISION_ATTENTION_CHOICES = ("grouped", "per_image")

# None: one SDPA call per segment length, what was measured (docs/PERFORMANCE.md, run F: a selfcheck batch of 512
# images, 383k patch tokens, peaked ~8 GiB above transformers' loop). A number caps the tokens per call (1 << 16:
# ~6 calls per layer at that batch, extra copies of a few hundred MB): the candidate fix for that memory, tested
# for equal results on CPU, not yet measured on a GPU (the bench's 'k' suffix).
MAX_TOKENS_PER_CALL: int | None = None


def grouped_sdpa(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, cu_seq_lens_q=None,
                 cu_seq_lens_k=None, is_causal=False, **kwargs):
    """Attention of packed segments `(1, heads, total, dim)` split at `cu_seq_lens_q`; returns `(1, total, heads,
    dim)` as transformers' attention functions do. One SDPA call per distinct segment length."""
    if cu_seq_lens_q is None or attention_mask is not None or is_causal:
        raise ModelError(f"{NAME} is a vision-tower attention (packed, non-causal segments at cu_seqlens); it was "
                         f"called from {type(module).__name__} without them. Set it on the vision sub-config only: "
                         "open_r1.vision_attention.use_grouped_vision_attention(model)")
    _, heads, total, dim = query.shape
    bounds = cu_seq_lens_q.tolist()  # transformers' per-image path makes the same host copy
    by_length: dict[int, list[int]] = {}
    for start, end in zip(bounds[:-1], bounds[1:]):
        by_length.setdefault(end - start, []).append(start)
    out = query.new_empty(total, heads, dim)
    for length, starts in by_length.items():
        step = len(starts) if MAX_TOKENS_PER_CALL is None else max(1, MAX_TOKENS_PER_CALL // max(length, 1))
        for first in range(0, len(starts), step):
            part = starts[first:first + step]
            if part[-1] - part[0] == (len(part) - 1) * length:  # adjacent segments (images of one size): a view
                rows = slice(part[0], part[0] + len(part) * length)
            else:
                rows = (torch.tensor(part, device=query.device)[:, None]
                        + torch.arange(length, device=query.device)).reshape(-1)
            q, k, v = (t[0, :, rows].view(heads, len(part), length, dim).transpose(0, 1) for t in (query, key, value))
            attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scaling, dropout_p=dropout)
            out[rows] = attended.transpose(1, 2).reshape(-1, heads, dim)
    return out.unsqueeze(0), None


def register() -> None:
    """Register `grouped_sdpa` under `NAME` with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, grouped_sdpa)


def vision_implementation(model) -> str | None:
    """The vision sub-config's attention implementation, or None for a model without one."""

    return attn_implementation(getattr(getattr(model, "config", None), "vision_config", None))


def use_grouped_vision_attention(model, choice: str = "grouped") -> bool:
    """Set the vision tower's attention to `grouped_sdpa` ('grouped') or leave transformers' own ('per_image').
    Only where the vision tower uses SDPA: flash attention already takes the whole batch in one call, and eager
    attention is left as chosen. Returns whether it was set. Works on peft-wrapped models (the config is shared)."""
    if choice not in VISION_ATTENTION_CHOICES:
        raise ModelError(f"vision_attention must be one of {', '.join(VISION_ATTENTION_CHOICES)} (got {choice!r})")

    model = base_model(model)
    current = vision_implementation(model)
    if choice == "per_image":
        if current == NAME:
            model.set_attn_implementation({"vision_config": "sdpa"})
        return False
    if current != "sdpa":
        return current == NAME
    register()

    set_vision_attn_implementation(model, NAME)
    return True
