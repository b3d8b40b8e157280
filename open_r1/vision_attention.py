"""The vision tower's attention in one SDPA call per image size, instead of one per image.

Without flash attention, transformers' Qwen-VL vision attention splits the packed patch sequence at the image
boundaries and calls SDPA once per image and layer: 16,384 small calls per prefill for 512 images through
Qwen2-VL-2B. `grouped_sdpa` stacks segments of equal length into one batch (the same per-segment result: bit for bit
on CPU), registered through `AttentionInterface` and set on the vision sub-config only. transformers passes
`cu_seq_lens_q` only to an implementation whose name contains "flash", hence the name (tested for every family).
The setting is not saved with the model, so a checkpoint loads with plain transformers.
"""

import torch

from open_r1.compat import attn_implementation, set_vision_attn_implementation
from open_r1.errors import ModelError
from open_r1.families import base_model

# "flash" must stay in the name: it is what makes transformers pass cu_seqlens (see the module docstring).
NAME = "open_r1_flash_grouped_sdpa"

VISION_ATTENTION_CHOICES = ("grouped", "per_image")

# None: one SDPA call per segment length (measured: docs/PERFORMANCE.md, ~8 GiB above transformers' loop at 512
# images). A number caps the tokens per call, trading calls for memory (tested on CPU, not yet measured on a GPU).
MAX_TOKENS_PER_CALL: int | None = None


def grouped_sdpa(
    module,
    query,
    key,
    value,
    attention_mask=None,
    scaling=None,
    dropout=0.0,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    is_causal=False,
    **kwargs,
):
    """Attention of packed segments `(1, heads, total, dim)` split at `cu_seq_lens_q`; returns `(1, total, heads,
    dim)` as transformers' attention functions do. One SDPA call per distinct segment length."""
    if cu_seq_lens_q is None or attention_mask is not None or is_causal:
        raise ModelError(
            f"{NAME} is a vision-tower attention (packed, non-causal segments at cu_seqlens); it was "
            f"called from {type(module).__name__} without them. Set it on the vision sub-config only: "
            "open_r1.vision_attention.use_grouped_vision_attention(model)"
        )
    _, heads, total, dim = query.shape
    bounds = cu_seq_lens_q.tolist()  # transformers' per-image path makes the same host copy
    by_length: dict[int, list[int]] = {}
    for start, end in zip(bounds[:-1], bounds[1:]):
        by_length.setdefault(end - start, []).append(start)
    out = query.new_empty(total, heads, dim)
    for length, starts in by_length.items():
        step = len(starts) if MAX_TOKENS_PER_CALL is None else max(1, MAX_TOKENS_PER_CALL // max(length, 1))
        for first in range(0, len(starts), step):
            part = starts[first : first + step]
            if part[-1] - part[0] == (len(part) - 1) * length:  # adjacent segments (images of one size): a view
                rows = slice(part[0], part[0] + len(part) * length)
            else:
                rows = (
                    torch.tensor(part, device=query.device)[:, None] + torch.arange(length, device=query.device)
                ).reshape(-1)
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
