"""A CUDA-graph decoder for GRPO rollouts and selfcheck (issue #16): HF `generate`'s host-side loop costs
~46-66 ms per token step on an H200 at any batch size; `GraphDecoder` keeps the model and replaces only the loop.

* prefill through the model's own forward (ViT, M-RoPE, deepstack) into a `StaticCache`; the M-RoPE positions may
  come precomputed on the CPU (`rope_positions`), since `get_rope_index` on the GPU syncs the host per row;
* one-token step: the model's forward with explicit M-RoPE positions, the logits processors and Gumbel-max sampling,
  captured as a CUDA graph by `torch.compile(mode="reduce-overhead")` (eager on CPU, where tests compare it token
  for token with `generate`);
* the cache is allocated once per decoder and reset in place, so the graph's addresses stay valid; fewer rows are
  padded with dummy rows, more rows or tokens reallocate it once to a bucketed size;
* finished rows emit `pad_token_id`; the host checks "all finished?" every `check_every` steps only.

Settings it does not implement (beams, repetition penalty, ...) raise `UnsupportedGeneration`: callers fall back to
HF `generate`. Top-p avoids sort and cumsum (`top_p_filter`), which inductor failed to compile.
"""

import logging
import math
import threading
import time
from dataclasses import dataclass

import torch

from open_r1 import compat
from open_r1.errors import OpenR1Error, RecipeError
from open_r1.families import base_model

logger = logging.getLogger(__name__)

CACHE_BUCKET_TOKENS = 64
CACHE_MARGIN_TOKENS = 32
DEFAULT_CHECK_EVERY = 16
DECODER_CHOICES = ("auto", "graph", "eager", "hf")
COMPILE_OPTIONS = {"mode": "reduce-overhead", "fullgraph": False, "dynamic": False}
# one compile region per decoder layer where torch has them: a shorter first compile, the same speed (PERFORMANCE.md)
LAYERS_ONCE = hasattr(torch.compiler, "nested_compile_region")


class UnsupportedGeneration(OpenR1Error, ValueError):
    """A generation setting the graph decoder does not implement; use HF generate (decoder 'hf') for it."""


@dataclass(frozen=True)
class SamplingSettings:
    """The generation settings the decoder applies, in HF's order (processors, then warpers when sampling)."""

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    min_new_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    suppress_tokens: tuple[int, ...] = ()


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, int):
        return (int(value),)
    return tuple(int(v) for v in value)


# generation-config fields whose non-default values the decoder does not implement: name -> "inactive" test
_NONE_OR_ONE = lambda v: v is None or v == 1  # noqa: E731
_FALSY = lambda v: not v  # noqa: E731
_NONE = lambda v: v is None  # noqa: E731
_UNSUPPORTED = {
    "repetition_penalty": _NONE_OR_ONE,
    "no_repeat_ngram_size": _FALSY,
    "bad_words_ids": _NONE,
    "begin_suppress_tokens": _FALSY,
    "forced_bos_token_id": _NONE,
    "forced_eos_token_id": _NONE,
    "num_beams": _NONE_OR_ONE,
    "num_return_sequences": _NONE_OR_ONE,
    "typical_p": lambda v: v is None or v >= 1.0,
    "epsilon_cutoff": _FALSY,
    "eta_cutoff": _FALSY,
    "guidance_scale": _NONE_OR_ONE,
    "sequence_bias": _NONE,
    "top_h": _NONE,
    "min_length": _FALSY,
    "stop_strings": _FALSY,
    "exponential_decay_length_penalty": _NONE,
    "encoder_repetition_penalty": _NONE_OR_ONE,
    "watermarking_config": _NONE,
}


def resolve_settings(generation_config=None, **overrides) -> SamplingSettings:
    """`SamplingSettings` from a `GenerationConfig` plus kwargs (kwargs win), as `generate` reads them;
    `UnsupportedGeneration` for an active setting this decoder lacks."""
    values = {**(generation_config.to_dict() if generation_config is not None else {}), **overrides}
    for name, inactive in _UNSUPPORTED.items():
        if name in values and not inactive(values[name]):
            raise UnsupportedGeneration(
                f"the graph decoder does not implement {name}={values[name]!r}; use decoder='hf' "
                "(HF generate) for this setting, or drop it"
            )
    if values.get("logits_processor") or values.get("stopping_criteria"):
        raise UnsupportedGeneration("custom logits processors / stopping criteria need HF generate (decoder='hf')")
    max_new = values.get("max_new_tokens")
    if not max_new:
        raise UnsupportedGeneration("the graph decoder needs max_new_tokens (got none); set it or use decoder='hf'")
    eos = _ids(values.get("eos_token_id"))
    pad = values.get("pad_token_id")
    if pad is None:
        pad = eos[0] if eos else 0
    do_sample = bool(values.get("do_sample", False))
    temperature = values.get("temperature")
    if do_sample and temperature is not None and temperature <= 0:
        raise UnsupportedGeneration(f"temperature must be > 0 when sampling (got {temperature})")
    return SamplingSettings(
        max_new_tokens=int(max_new),
        do_sample=do_sample,
        temperature=float(temperature) if temperature is not None else 1.0,
        top_k=int(values.get("top_k") or 0),
        top_p=float(values["top_p"]) if values.get("top_p") is not None else 1.0,
        min_p=float(values["min_p"]) if values.get("min_p") is not None else None,
        min_new_tokens=int(values.get("min_new_tokens") or 0),
        eos_token_ids=eos,
        pad_token_id=int(pad),
        suppress_tokens=_ids(values.get("suppress_tokens")),
    )


def process_logits(
    logits: torch.Tensor,
    settings: SamplingSettings,
    suppress_mask: torch.Tensor,
    eos_mask: torch.Tensor,
    step: torch.Tensor,
) -> torch.Tensor:
    """HF's logits processors and warpers for one step, without host syncs. `step`: a 0-dim tensor, the index of the
    token being chosen (EOS is suppressed while step < min_new_tokens)."""
    neg = -math.inf
    if settings.min_new_tokens > 0:
        logits = logits.masked_fill(eos_mask & (step < settings.min_new_tokens), neg)
    if settings.suppress_tokens:
        logits = logits.masked_fill(suppress_mask, neg)
    if not settings.do_sample:
        return logits
    if settings.temperature != 1.0:
        logits = logits / settings.temperature
    if settings.top_k > 0:
        k = min(settings.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, neg)
    if settings.top_p < 1.0:
        logits = top_p_filter(logits, settings.top_p, settings.top_k)
    if settings.min_p is not None:
        probs = logits.softmax(dim=-1)
        threshold = settings.min_p * probs.amax(dim=-1, keepdim=True)
        remove = probs < threshold
        remove = remove & (probs < probs.amax(dim=-1, keepdim=True))  # keep at least the top token
        logits = logits.masked_fill(remove, neg)
    return logits


PAIRWISE_TOP_K = 256  # top-p after a top-k up to this size compares the survivors pairwise; above it, bisection
BISECTION_STEPS = 32  # float32 values have 2**32 bit patterns: 32 halvings of their order pin the cut exactly


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in the order of the float32 values `x` (IEEE-754 bits, negative magnitudes flipped)."""
    bits = x.view(torch.int32).long()
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _order_value(key: torch.Tensor) -> torch.Tensor:
    """The float32 whose `_order_key` is `key`."""
    return torch.where(key < 0, key ^ 0x7FFFFFFF, key).int().view(torch.float32)


def top_p_filter(logits: torch.Tensor, top_p: float, top_k: int = 0, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """HF's `TopPLogitsWarper` (exact) without a sort or a full-vocabulary cumsum, so it compiles into the decode step.

    A token is kept when the mass of the tokens with a strictly larger logit is < top_p (ties share one fate). The
    kept set is every logit >= a threshold: after a top-k of at most `PAIRWISE_TOP_K`, from a [k, k] comparison of
    the survivors; otherwise by `BISECTION_STEPS` fixed halvings of the float32 order (no data-dependent branch)."""
    neg = -math.inf
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    if 0 < top_k <= PAIRWISE_TOP_K:
        values = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values  # (B, k)
        probs = (values - lse).exp()
        above = ((values.unsqueeze(-2) > values.unsqueeze(-1)) * probs.unsqueeze(-2)).sum(-1)  # (B, k)
        keep = above < top_p
        keep[..., :min_tokens_to_keep] = True
        threshold = values.masked_fill(~keep, math.inf).amin(dim=-1, keepdim=True)
        return logits.masked_fill(logits < threshold, neg)
    finite = torch.isfinite(logits)
    # invariant: the cut's key is in (lo, hi]; hi = the row's max (no mass above it), lo below every finite value
    hi = _order_key(logits.masked_fill(~finite, neg).amax(dim=-1, keepdim=True))
    lo = _order_key(logits.masked_fill(~finite, math.inf).amin(dim=-1, keepdim=True)) - 1
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) // 2
        # one fused reduction over the row per step: reads the logits, no probability tensor kept
        above = (logits - lse).exp().masked_fill(logits <= _order_value(mid), 0.0).sum(dim=-1, keepdim=True)
        ok = above < top_p
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid)
    keep = logits >= _order_value(hi)
    if min_tokens_to_keep > 1:
        kth = torch.topk(logits, min(min_tokens_to_keep, logits.shape[-1]), dim=-1).values[..., -1:]
        keep = keep | (logits >= kth)
    return logits.masked_fill(~keep, neg)


def choose_tokens(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None = None):
    """Greedy argmax, or a sample from softmax(logits) by the Gumbel-max trick (no host sync)."""
    if not settings.do_sample:
        return logits.argmax(dim=-1)
    u = torch.rand(logits.shape, device=logits.device, dtype=torch.float32, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp_(min=1e-20, max=1.0 - 1e-7)))
    return (logits + gumbel).argmax(dim=-1)


_ORIGINAL_SDPA = None


def gqa_decode_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' "sdpa" attention, except that a single-token query of a grouped-query layer attends on the KV
    heads directly (query heads packed per KV head) also under `torch.compile`, where transformers expands the KV
    cache to every query head (6x the cache reads of a decode step for Qwen2-VL-2B). Other calls go unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        groups > 1
        and query.shape[2] == 1
        and kwargs.get("position_bias") is None
        and not kwargs.get("dropout")
        and (attention_mask is None or (attention_mask.ndim == 4 and attention_mask.shape[1] == 1))
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions")
    ):
        batch, heads, _, dim = query.shape
        packed = query.reshape(batch, heads // groups, groups, dim)  # head h -> KV head h // groups, as repeat_kv
        out = torch.nn.functional.scaled_dot_product_attention(
            packed, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling")
        )
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    return _ORIGINAL_SDPA(module, query, key, value, attention_mask, **kwargs)


def install_gqa_decode_attention() -> None:
    """Register `gqa_decode_sdpa` as transformers' "sdpa" attention (`AttentionInterface.register`, the library's
    extension point; idempotent)."""
    global _ORIGINAL_SDPA
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if current is gqa_decode_sdpa:
        return
    _ORIGINAL_SDPA = current
    AttentionInterface.register("sdpa", gqa_decode_sdpa)


ROPE_INPUT_KEYS = ("position_ids", "rope_deltas")


def rope_positions(model, inputs) -> dict | None:
    """{'position_ids': (3, rows, length), 'rope_deltas': (rows, 1)} from the model's own `get_rope_index` on a
    processor batch's CPU tensors (cheap there, e.g. in a prefetch thread), or None (no images, not on the CPU, no
    M-RoPE)."""
    get_rope_index = getattr(_inner_model(model), "get_rope_index", None)
    ids, grid, mask = inputs.get("input_ids"), inputs.get("image_grid_thw"), inputs.get("attention_mask")
    if get_rope_index is None or ids is None or grid is None or "mm_token_type_ids" not in inputs:
        return None
    kinds = inputs["mm_token_type_ids"]
    on_device = any(t is not None and t.device.type != "cpu" for t in (ids, mask, kinds, grid))
    if on_device or inputs.get("video_grid_thw") is not None:
        return None
    with torch.no_grad():
        positions = get_rope_index(ids, mm_token_type_ids=kinds, image_grid_thw=grid, attention_mask=mask)
    return dict(zip(ROPE_INPUT_KEYS, positions))


def _inner_model(model):
    """The module that holds `rope_deltas` (Qwen*VLModel), under peft / DDP wrappers."""
    model = base_model(model)
    inner = getattr(model, "model", None)
    return inner if hasattr(inner, "rope_deltas") else model


def check_zero3(model) -> None:
    """Refuse a ZeRO-3 (sharded) model: the graph decoder needs the full weights at fixed addresses."""
    if zero3_partitioned(model):
        raise RecipeError(
            "the CUDA-graph decoder cannot read a DeepSpeed ZeRO-3 model: the parameters are sharded and gathered "
            "around every generation, so a captured step would read freed memory. Use decoder 'hf' here; GRPO's "
            "rollouts under ZeRO-3 decode from a whole-weight copy of the policy"
        )


def zero3_partitioned(model) -> bool:
    """Whether `model`'s parameters are DeepSpeed ZeRO-3 partitions (they carry DeepSpeed's `ds_id`)."""
    return hasattr(next(model.parameters(), None), "ds_id")


def compile_layers_once(model) -> int:
    """Make each decoder layer of the language model a call of ONE nested compile region, so dynamo and inductor
    compile one layer and reuse it for the others (shorter first compile, still one CUDA graph). Idempotent; returns
    the number of layers marked."""
    import functools

    global _LAYER_REGION
    if _LAYER_REGION is None:  # one region object: every layer's call is a reuse of it
        _LAYER_REGION = torch.compiler.nested_compile_region(_call_layer)
    layers = getattr(getattr(_inner_model(model), "language_model", None), "layers", None) or ()
    for layer in layers:
        if not isinstance(layer.__dict__.get("forward"), functools.partial):
            layer.forward = functools.partial(_LAYER_REGION, layer)
    return len(layers)


_LAYER_REGION = None


def _call_layer(layer, *args, **kwargs):
    return type(layer).forward(layer, *args, **kwargs)


def default_decoder(device) -> str:
    """'graph' (compiled CUDA-graph step) on CUDA devices, 'hf' (transformers generate) elsewhere."""
    return "graph" if torch.device(device).type == "cuda" else "hf"


class GraphDecoder:
    """Batched decoding over a static cache that lives as long as the decoder (module docstring). `compile`: None =
    on CUDA only; `check_every`: steps between host checks of "all finished?"."""

    def __init__(
        self,
        model,
        compile: bool | None = None,
        check_every: int = DEFAULT_CHECK_EVERY,
        cache_margin: int = CACHE_MARGIN_TOKENS,
        cache_bucket: int = CACHE_BUCKET_TOKENS,
        compile_options: dict | None = None,
        layers_once: bool | None = None,
    ):
        self.model = model
        self.layers_once = LAYERS_ONCE if layers_once is None else bool(layers_once)
        self.compile_options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
        self.device = next(model.parameters()).device
        self.compile = (self.device.type == "cuda") if compile is None else bool(compile)
        self.check_every = max(1, int(check_every))
        self.cache_margin = cache_margin
        self.cache_bucket = cache_bucket
        self.cache = None
        self.batch_size = self.max_cache_len = self.allocations = self.calls = 0
        self.timings: list[dict] = []  # per call: rows, prompt_len, steps, prefill_s, decode_s (last 256 calls)
        self._steps = {}
        self._step_fn = None
        self._lock = threading.Lock()

    def _ensure_cache(self, rows: int, needed_len: int, fresh: bool = False) -> None:
        if not fresh and self.cache is not None and rows <= self.batch_size and needed_len <= self.max_cache_len:
            self.cache.reset()  # zeroed in place: same tensors, same addresses for the captured step
            return
        from transformers import StaticCache

        batch = max(rows, self.batch_size)
        bucketed = -(-(needed_len + self.cache_margin) // self.cache_bucket) * self.cache_bucket  # rounded up
        length = max(bucketed, self.max_cache_len)
        if self.cache is not None:
            logger.warning(
                "graph decoder: cache %dx%d cannot take %d rows x %d tokens%s; reallocating to %dx%d "
                "(the decode step is compiled again)",
                self.batch_size,
                self.max_cache_len,
                rows,
                needed_len,
                " in a new dtype" if fresh else "",
                batch,
                length,
            )
            self.cache = None
            self._steps = {}  # the old steps read the old cache; new ones are built (and compiled) for the new one
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        # allocated lazily by the first prefill, in its dtype; then only reset
        self.cache = StaticCache(config=self.model.config, max_cache_len=length)
        self.batch_size, self.max_cache_len = batch, length
        self.allocations += 1
        # persistent step inputs (fixed addresses, so a CUDA graph can read them in place)
        long = {"dtype": torch.long, "device": self.device}
        self._tokens = torch.zeros(batch, 1, **long)
        self._positions = torch.zeros(3, batch, 1, **long)
        self._mask = torch.ones(batch, length, **long)
        self._step = torch.zeros((), **long)

    def _make_step(self, settings: SamplingSettings):
        model, cache = self.model, self.cache
        vocab = model.config.get_text_config(decoder=True).vocab_size
        suppress, eos_mask = (
            torch.isin(torch.arange(vocab, device=self.device), torch.tensor(ids, dtype=torch.long, device=self.device))
            for ids in (settings.suppress_tokens, settings.eos_token_ids)
        )

        def step(tokens, positions, mask, index):
            out = model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1, :].float()
            logits = process_logits(logits, settings, suppress, eos_mask, index)
            return choose_tokens(logits, settings)

        if self.compile:
            install_gqa_decode_attention()
            compat.raise_cudagraph_rerecord_limit()  # torch's private inductor knob, via open_r1.compat
            if self.layers_once:
                compile_layers_once(model)
            step = torch.compile(step, **self.compile_options)
        return step, suppress, eos_mask

    def _use_step(self, settings: SamplingSettings) -> None:
        key = (settings, self.compile)
        if key not in self._steps:  # one step per settings (training's sampling, evaluation's greedy), kept
            self._steps[key] = self._make_step(settings)
        self._step_fn, self._suppress, self._eos_mask = self._steps[key]

    def _settings(self, generation_config, model_inputs: dict) -> SamplingSettings:
        """`resolve_settings` of the generation settings among `model_inputs` (popped), as `generate` reads them."""
        gen_keys = {k: model_inputs.pop(k) for k in list(model_inputs) if k not in _MODEL_INPUT_KEYS}
        return resolve_settings(generation_config or self.model.generation_config, **gen_keys)

    def _pad_rows(self, input_ids, attention_mask, extra: dict, pad_token_id: int):
        """Pad a batch of n rows to the cache's batch with one-token text rows (no images; outputs dropped)."""
        n = input_ids.shape[0]
        missing = self.batch_size - n
        if missing == 0:
            return input_ids, attention_mask, extra
        length = input_ids.shape[1]
        dummy_ids = input_ids.new_full((missing, length), pad_token_id)
        dummy_mask = attention_mask.new_zeros((missing, length))
        dummy_mask[:, -1] = 1
        padded = dict(extra)
        for key, value in extra.items():
            if isinstance(value, torch.Tensor) and value.ndim == 2 and value.shape == input_ids.shape:
                padded[key] = torch.cat([value, value.new_zeros((missing, length))])
        return torch.cat([input_ids, dummy_ids]), torch.cat([attention_mask, dummy_mask]), padded

    def _pad_positions(self, model_inputs: dict, missing: int):
        """The precomputed (position_ids, rope_deltas), popped from `model_inputs`, on the device and padded like
        `_pad_rows` (a dummy row: position 0, delta 0); (None, None) when not given."""
        positions, deltas = (model_inputs.pop(key, None) for key in ROPE_INPUT_KEYS)
        if positions is None or deltas is None:
            return None, None
        positions = positions.to(self.device, non_blocking=True)
        deltas = deltas.to(self.device, non_blocking=True)
        if missing:
            positions = torch.cat([positions, positions.new_zeros(3, missing, positions.shape[2])], dim=1)
            deltas = torch.cat([deltas, deltas.new_zeros(missing, deltas.shape[1])])
        return positions, deltas

    def generate(
        self,
        input_ids,
        attention_mask=None,
        settings: SamplingSettings | None = None,
        generation_config=None,
        **model_inputs,
    ) -> torch.Tensor:
        """Completion token ids (n, T <= max_new_tokens) for left-padded prompts; after a row's EOS come
        `pad_token_id`s, as `generate` returns them. `model_inputs`: the processor's other outputs, optionally the
        precomputed `position_ids`/`rope_deltas`, and generation settings if `settings` is not given."""
        # outside inference mode: the cache outlives this call and is updated in place by later (no_grad) calls
        with self._lock, torch.inference_mode(False), torch.no_grad():
            return self._generate(input_ids, attention_mask, settings, generation_config, model_inputs)

    def hf_generate(self, input_ids, attention_mask=None, generation_config=None, **model_inputs):
        """Drop-in for `model.generate(**inputs, generation_config=...)` as TRL calls it: prompt + completion ids.
        Settings this decoder lacks go to the model class's own `generate`."""
        try:
            settings = self._settings(generation_config, model_inputs)
        except UnsupportedGeneration as error:
            if not getattr(self, "_warned", False):
                logger.warning("graph decoder not used (%s); HF generate instead", error)
                self._warned = True
            for key in ROPE_INPUT_KEYS:  # HF generate computes its own
                model_inputs.pop(key, None)
            return type(self.model).generate(
                self.model,
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                **model_inputs,
            )
        completion = self.generate(input_ids, attention_mask, settings=settings, **model_inputs)
        return torch.cat([input_ids.to(completion.device), completion], dim=1)

    def _generate(self, input_ids, attention_mask, settings, generation_config, model_inputs):
        settings = settings or self._settings(generation_config, model_inputs)
        device = self.device
        input_ids = input_ids.to(device)
        attention_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
        if bool((attention_mask[:, -1] == 0).any()):
            raise UnsupportedGeneration("prompts must be left-padded (a row ends in padding); pad on the left")
        n, prompt_len = input_ids.shape
        max_new = settings.max_new_tokens
        self._ensure_cache(n, prompt_len + max_new)
        self.calls += 1
        self._use_step(settings)
        given_positions, given_deltas = self._pad_positions(model_inputs, self.batch_size - n)
        extra = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in model_inputs.items()}
        ids, mask, extra = self._pad_rows(input_ids, attention_mask, extra, settings.pad_token_id)
        batch = ids.shape[0]

        was_training = self.model.training
        self.model.eval()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        started = time.perf_counter()
        try:
            # ---- prefill through the model's own forward: ViT, M-RoPE positions, rope_deltas (deepstack) ----
            inner = _inner_model(self.model)
            has_vision = extra.get("image_grid_thw") is not None or extra.get("video_grid_thw") is not None
            valid = mask.sum(dim=1)
            prefill_kwargs, deltas = {}, None
            if hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None
            if not has_vision:
                text_pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
                prefill_kwargs["position_ids"] = text_pos.unsqueeze(0).expand(3, -1, -1)
            elif given_positions is not None:  # precomputed (rope_positions): the model skips get_rope_index
                prefill_kwargs["position_ids"], deltas = given_positions, given_deltas

            def prefill():
                return self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    cache=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **prefill_kwargs,
                    **extra,
                )

            try:
                out = prefill()
            except RuntimeError as error:
                if "dtype" not in str(error):
                    raise
                # the cache was allocated by a forward in another dtype (e.g. evaluation without autocast)
                self._ensure_cache(n, prompt_len + max_new, fresh=True)
                self._use_step(settings)
                out = prefill()
            if has_vision and deltas is None:  # what the prefill's own get_rope_index left on the model
                deltas = getattr(inner, "rope_deltas", None)
            next_pos = valid + (deltas.view(-1).to(device) if deltas is not None else 0)

            self._step.zero_()
            first_logits = process_logits(
                out.logits[:, -1, :].float(), settings, self._suppress, self._eos_mask, self._step
            )
            tokens = choose_tokens(first_logits, settings)
            del out, first_logits

            self._mask.fill_(1)
            self._mask[:, :prompt_len].copy_(mask)
            self._positions.copy_(next_pos.view(1, batch, 1).expand(3, -1, -1))
            eos = torch.tensor(settings.eos_token_ids or [-1], device=device)
            pad = settings.pad_token_id
            unfinished = torch.arange(batch, device=device) < n  # the padding rows are done from the start
            result = torch.full((batch, max_new), pad, dtype=torch.long, device=device)
            steps_run = max_new
            sync()
            prefilled = time.perf_counter()
            for t in range(max_new):
                if t > 0:
                    self._tokens.copy_(result[:, t - 1 : t])
                    self._step.fill_(t)
                    if self.compile:
                        torch.compiler.cudagraph_mark_step_begin()
                    tokens = self._step_fn(self._tokens, self._positions, self._mask, self._step)
                    self._positions.add_(1)
                tokens = torch.where(unfinished, tokens, pad)
                result[:, t] = tokens
                unfinished &= ~torch.isin(tokens, eos)
                if (t + 1) % self.check_every == 0 and t + 1 < max_new and not bool(unfinished.any()):
                    steps_run = t + 1  # the one host sync: every check_every steps
                    break
            sync()
            self.timings = self.timings[-255:] + [
                {
                    "rows": n,
                    "batch": batch,
                    "prompt_len": prompt_len,
                    "steps": steps_run,
                    "prefill_s": prefilled - started,
                    "decode_s": time.perf_counter() - prefilled,
                }
            ]
        finally:
            if was_training:
                self.model.train()
        return result[:n, :steps_run]


# processor outputs that go to the model's forward; anything else passed to generate() is a generation setting
_MODEL_INPUT_KEYS = {
    "pixel_values",
    "image_grid_thw",
    "pixel_values_videos",
    "video_grid_thw",
    "mm_token_type_ids",
    "second_per_grid_ts",
    "token_type_ids",
    "cache_position",
    *ROPE_INPUT_KEYS,
}
