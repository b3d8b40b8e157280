"""A whole-weight copy of the policy for the CUDA-graph decoder under DeepSpeed ZeRO-3 (issue 43).

Under ZeRO-3 every rank holds a shard of each parameter and gathers the whole tensor around each use, at a new
address each time, so a captured decode step cannot read them. `RolloutWeights` keeps a second, whole-weight copy
of the policy (bf16: 4.4 GB for Qwen2-VL-2B) on each rank, with no adapter modules: once per optimizer step
`refresh` gathers the sharded weights a chunk of modules at a time (bounded peak memory; the gathers are
collective, so every rank refreshes at the same points: the first rollout after each optimizer step), merges LoRA
(W + scale * B @ A, peft's own `get_delta_weight`) and copies the result IN PLACE into the copy's tensors: their
addresses never change, so the decoder's captured graph stays valid. The copy is built from the policy's config
(on the device, weights uninitialised until the first refresh), never loaded from disk.
"""

import contextlib
import copy
import time

import torch

from open_r1 import compat
from open_r1 import vision_attention as va
from open_r1.errors import RecipeError

DEFAULT_CHUNK_BYTES = 512 * 2**20  # gathered at once per refresh (of the sharded weights, in their training dtype)


def deepspeed_gather(params):
    """DeepSpeed's read-only gather of ZeRO-3 partitioned `params` (a no-op context for whole tensors)."""
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed  # deferred: heavy, and only under ZeRO-3

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def _lora_parts(module):
    """(base module, active LoRA adapter names) for a peft LoRA layer; (module, []) for any other module (for peft's
    modules_to_save wrapper: its active trained copy)."""
    saved = getattr(module, "modules_to_save", None)
    if saved is not None and hasattr(module, "original_module"):
        active = [name for name in module.active_adapters if name in saved]
        return (saved[active[0]] if active else module.original_module), []
    base = getattr(module, "base_layer", None)
    if base is None or not hasattr(module, "lora_A"):
        return module, []
    adapters = [name for name in module.active_adapters if name in module.lora_A]
    if any(module.use_dora.get(name) for name in adapters):
        raise RecipeError(
            "the rollout copy under ZeRO-3 merges plain LoRA only (use_dora is on): set use_dora: "
            "false, or train with DDP (train.sh ZERO3=0)"
        )
    return base, adapters


def _numel(param) -> int:
    return int(getattr(param, "ds_numel", param.numel()))


class RolloutWeights:
    """The copy (`model`, eval mode, no grads) and its `refresh(step)`.

    `policy`: the unwrapped policy (a peft model or a transformers model, sharded or not). `gather(params)`: a
    context manager that makes `params` whole inside it (default: `deepspeed_gather`). Counters for logs and tests:
    `refreshes`, `gathers`, `last_refresh_s`, `nbytes`."""

    def __init__(
        self,
        policy,
        device=None,
        dtype: torch.dtype | None = None,
        gather=deepspeed_gather,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ):
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        self.policy, self.gather, self.chunk_bytes = policy, gather, chunk_bytes
        first = next(policy.parameters())
        device = torch.device(device) if device is not None else first.device
        dtype = dtype or first.dtype  # the dtype rollouts run in (bf16 under DeepSpeed's bf16)
        from transformers.initialization import no_init_weights  # deferred: heavy

        grouped = va.vision_implementation(base) == va.NAME
        if grouped:  # transformers' constructor refuses the registered name: build with sdpa, then set it
            va.use_grouped_vision_attention(base, "per_image")
        try:
            config = copy.deepcopy(base.config)
        finally:
            if grouped:
                va.use_grouped_vision_attention(base, "grouped")
        # built on the device in the copy's dtype, weights left uninitialised (the first refresh fills them): the
        # constructor computes the non-persistent buffers (rotary tables) itself, which a meta build would lose
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with compat.built_whole(), torch.device(device), no_init_weights():
                model = type(base)(config)
        finally:
            torch.set_default_dtype(default_dtype)
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            raise RecipeError(
                "the rollout copy came out partitioned by DeepSpeed ZeRO-3; set fast_decode: false "
                "(or DDP, train.sh ZERO3=0, for LoRA or float32 weights)"
            )
        if grouped:
            va.use_grouped_vision_attention(model, "grouped")
        for param in model.parameters():  # the few a model creates in float32 explicitly
            param.data = param.data.to(dtype)
        model.tie_weights()  # tied embeddings / LM head stay one tensor in the copy
        model.requires_grad_(False).eval()
        if getattr(base, "generation_config", None) is not None:
            model.generation_config = copy.deepcopy(base.generation_config)
        self.model = model
        sources = dict(base.named_modules())
        # (copy module, source module, adapters) for every module that holds tensors of its own
        self._pairs = []
        for name, target in model.named_modules():
            if (
                next(target.parameters(recurse=False), None) is None
                and next(target.buffers(recurse=False), None) is None
            ):
                continue
            if name not in sources:
                raise RecipeError(
                    f"the rollout copy has a module {name!r} the policy lacks; set fast_decode: "
                    "false (or DDP, train.sh ZERO3=0, for LoRA or float32 weights)"
                )
            source, adapters = _lora_parts(sources[name])
            self._pairs.append((target, sources[name], source, adapters))
        with torch.no_grad():  # buffers (rotary tables, ...) are never sharded and never trained: copied once
            for target, _, source, _ in self._pairs:
                for key, buffer in target.named_buffers(recurse=False):
                    value = source.get_buffer(key)
                    if not value.is_meta:  # a DeepSpeed-built policy can hold meta buffers: keep the copy's own
                        buffer.copy_(value)
        self.nbytes = sum(t.nbytes for t in {t.data_ptr(): t for t in [*model.parameters(), *model.buffers()]}.values())
        self.step = None
        self.refreshes = self.gathers = 0
        self.last_refresh_s = 0.0

    def _chunks(self):
        chunk, size = [], 0
        for pair in self._pairs:
            wrapper = pair[1]
            bytes_ = sum(_numel(p) * p.element_size() for p in wrapper.parameters())
            if chunk and size + bytes_ > self.chunk_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(pair)
            size += bytes_
        if chunk:
            yield chunk

    @torch.no_grad()
    def refresh(self, step=None) -> bool:
        """Copy the policy's current weights (LoRA merged) into the copy, in place; skipped (False) when `step` is
        the step of the last refresh (the weights change only at optimizer steps). Collective under ZeRO-3."""
        if step is not None and step == self.step:
            return False
        sync = torch.cuda.synchronize if self.model.device.type == "cuda" else (lambda: None)
        sync()
        started = time.perf_counter()
        seen, gathered = set(), set()
        for chunk in self._chunks():
            # each tensor gathered once (a tied tensor sits in two modules: embeddings and LM head)
            params = list(
                {id(p): p for _, wrapper, _, _ in chunk for p in wrapper.parameters() if id(p) not in gathered}.values()
            )
            if not params:
                continue
            gathered.update(id(p) for p in params)
            self.gathers += 1
            with self.gather(params):
                for target, wrapper, source, adapters in chunk:
                    for key, param in target.named_parameters(recurse=False):
                        if id(param) in seen:  # tied (embeddings and LM head): one tensor, copied once
                            continue
                        seen.add(id(param))
                        value = source.get_parameter(key)
                        if key == "weight" and adapters:
                            # out of place: never write into the policy's own (possibly float32) weight
                            value = value.float() + sum(wrapper.get_delta_weight(name).float() for name in adapters)
                        param.copy_(value)
        sync()
        self.last_refresh_s = time.perf_counter() - started
        self.step = step
        self.refreshes += 1
        return True
