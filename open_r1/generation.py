"""Batched generation for the tasks' evaluations: left-padded prompts + images in (right padding shifts M-RoPE
positions), completion texts out, each ending at its first EOS; one that used all `max_new_tokens` is truncated."""

import warnings
import weakref

import torch

from open_r1 import decoding
from open_r1.errors import RecipeError

CACHE_BUCKET_TOKENS = 128
CACHE_MARGIN_TOKENS = 64


def cache_length_bucket(prompt_tokens: int, completion_tokens: int) -> int:
    """Static-cache length for prompts of up to `prompt_tokens` (+ a margin), in whole 128-token buckets: the cache
    length is a compiled shape, so batches whose prompts differ by a few tokens share one compiled decode step."""
    needed = prompt_tokens + completion_tokens + CACHE_MARGIN_TOKENS
    return -(-needed // CACHE_BUCKET_TOKENS) * CACHE_BUCKET_TOKENS


def static_cache_kwargs(prompt_tokens: int, max_new_tokens: int) -> dict:
    """`generate` kwargs for a static (compiled on GPU) cache; the bucketed length where transformers has it (5.24+)."""
    from transformers import GenerationConfig

    kwargs = {"cache_implementation": "static"}
    if hasattr(GenerationConfig(), "max_cache_len"):
        kwargs["max_cache_len"] = cache_length_bucket(prompt_tokens, max_new_tokens)
    return kwargs


def prepare_inputs(processor, prompt_texts, images, image_device=None, pin_memory=False, rope_model=None):
    """The processor's batch for `generate_texts(inputs=...)` (CPU work that can run ahead of the GPU).
    `image_device`: where the image preprocessing runs; `pin_memory`: page-locked CPU tensors for overlapped copies;
    `rope_model`: also the prefill's M-RoPE positions (`decoding.rope_positions`, for the graph decoder)."""
    extra = {"device": image_device} if image_device else {}
    inputs = processor(
        text=list(prompt_texts), images=list(images), padding=True, padding_side="left", return_tensors="pt", **extra
    )
    if rope_model is not None:
        inputs.update(decoding.rope_positions(rope_model, inputs) or {})
    if pin_memory:
        for key, value in inputs.items():
            if hasattr(value, "pin_memory") and value.device.type == "cpu" and not value.is_pinned():
                inputs[key] = value.pin_memory()
    return inputs


def generate_texts(
    model,
    processor,
    prompt_texts,
    images,
    max_new_tokens,
    compile_generation=False,
    do_sample=False,
    decoder=None,
    inputs=None,
    **generate_kwargs,
):
    """(texts, completion token counts, truncated flags) for one batch of chat-formatted prompt texts.
    `compile_generation`: HF generate with a static KV cache (compiled on GPUs). `decoder`: 'graph' (`GraphDecoder`,
    one per model), 'eager' (uncompiled), 'hf' or 'auto'/None (`DEFAULT_DECODER`: graph on CUDA, else hf); a setting
    the graph decoder lacks falls back to 'hf' with a warning. `inputs`: a `prepare_inputs` batch for these prompts."""
    if inputs is None:
        inputs = prepare_inputs(processor, prompt_texts, images)
    positions = {key: inputs.pop(key) for key in decoding.ROPE_INPUT_KEYS if key in inputs}  # the graph decoder's only
    inputs = inputs.to(model.device, non_blocking=True)
    choice = resolve_decoder(decoder, model.device)

    if choice != "hf" and decoding.zero3_partitioned(model):
        if (decoder or DEFAULT_DECODER) != "auto":
            decoding.check_zero3(model)  # the RecipeError that names the fix
        choice = "hf"  # ZeRO-3: gathered weights move between calls; a captured step cannot follow them
    if choice != "hf" and not compile_generation:
        try:
            settings = decoding.resolve_settings(
                model.generation_config, max_new_tokens=max_new_tokens, do_sample=do_sample, **generate_kwargs
            )
        except decoding.UnsupportedGeneration as error:
            warnings.warn(f"graph decoder not used ({error}); generating with HF generate", stacklevel=2)
        else:
            try:
                completion_ids = decoder_for(model, compile=choice == "graph").generate(
                    **inputs, **positions, settings=settings
                )
            except torch.OutOfMemoryError:
                # drop the decoder (its cache is sized for this batch): a retry with a smaller batch gets a new one
                _DECODERS.pop(model, None)
                raise
            return decode_completions(completion_ids.tolist(), processor, settings.eos_token_ids, max_new_tokens)
    with torch.inference_mode():
        extra = static_cache_kwargs(inputs["input_ids"].shape[1], max_new_tokens) if compile_generation else {}
        output = model.generate(
            **inputs, do_sample=do_sample, max_new_tokens=max_new_tokens, **extra, **generate_kwargs
        )
    completion_ids = output[:, inputs["input_ids"].shape[1] :]
    return decode_completions(completion_ids.tolist(), processor, model.generation_config.eos_token_id, max_new_tokens)


DEFAULT_DECODER = "auto"  # selfcheck --decoder sets it; generate_texts(decoder=...) overrides per call
_DECODERS = weakref.WeakKeyDictionary()  # model -> decoding.GraphDecoder (one static cache per model and process)


def resolve_decoder(decoder, device) -> str:
    """'graph' | 'eager' | 'hf' for `decoder` ('auto'/None: `DEFAULT_DECODER`, then graph on CUDA, hf elsewhere)."""
    decoder = decoder or DEFAULT_DECODER
    if decoder not in decoding.DECODER_CHOICES:
        raise RecipeError(f"decoder must be one of {', '.join(decoding.DECODER_CHOICES)} (got {decoder!r})")
    return decoding.default_decoder(device) if decoder == "auto" else decoder


def decoder_for(model, compile: bool | None = None, decoder=None):
    """The process's decoding.GraphDecoder for `model` (created on first use, then reused: its cache is allocated once).
    `decoder`: register an existing one (the trainer shares its training decoder with evaluation)."""
    if decoder is not None:
        _DECODERS[model] = decoder
    if model not in _DECODERS:
        _DECODERS[model] = decoding.GraphDecoder(model, compile=compile)
    found = _DECODERS[model]
    if compile is not None and found.compile != compile:
        found.compile = compile  # steps are kept per (settings, compile): the other kind is built on first use
    return found


def forget_decoders() -> None:
    """Drop every registered decoder (their caches, and the models they hold): for processes that build several
    models one after another (the benches); a training or selfcheck process keeps its one decoder."""
    _DECODERS.clear()


def decode_completions(rows, processor, eos_token_id, max_new_tokens):
    """(texts, lengths, truncated) of completion token rows: each ends at its first EOS; pad after it is filler."""
    eos_ids = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    pad_id = processor.tokenizer.pad_token_id
    decoded, lengths, truncated = [], [], []
    for row in rows:
        length = len(row)
        for i, token in enumerate(row):
            if token in eos_ids or (token == pad_id and pad_id not in eos_ids):
                length = i + 1
                break
        lengths.append(length)
        truncated.append(length >= max_new_tokens and not (set(row[:length]) & eos_ids))
        decoded.append(processor.tokenizer.decode(row[:length], skip_special_tokens=True))
    return decoded, lengths, truncated
