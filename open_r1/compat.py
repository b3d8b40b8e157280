"""Every use of a private TRL / transformers / torch name in the package, in one place, each behind a small named
function.

TRL is pinned at 1.16.0; transformers is tested on 5.24 and 5.25. These names are not public API and may move in any
release: each section below says what it relies on, and `tests/test_compat.py` holds one contract test per item that
fails with the item's name when an upgrade moves it. Where the libraries have a public way, the code uses it instead
(TRL's `log_metric`, Trainer's `best_model_checkpoint`, `all_gather_object`, `safetensors.safe_open`).

Only what the product uses lives here; the benches' own items (TRL's completion-only scoring for `--tiny`,
torch.compile's phase times) are in `experiments/bench/compat.py`, under the same contract.
"""

from typing import Any


# 1. GRPOTrainer's round hooks. Relies on `_generate_and_score_completions(inputs)` being the one call that turns a
# round's rows into a scored batch, and on `_prepare_inputs` generating, splitting and storing the micro-batches in
# `self._buffered_inputs`, then returning `_buffered_inputs[self._step % self.args.steps_per_generation]`.
class GRPORoundHooks:
    """Mixed in before `trl.GRPOTrainer` (`class T(GRPORoundHooks, GRPOTrainer)`): override the public hooks.

    * `before_round(rows) -> rows`: the rows of a round (training or evaluation) before TRL generates from them;
    * `after_round(rows, output) -> output`: the scored batch TRL built from them;
    * `regroup_round(micro_batches) -> micro_batches`: a new training round's micro-batches, after TRL's shuffle
      and split, before the first is used; return the same list to keep TRL's order.
    """

    def before_round(self, rows: list[dict]) -> list[dict]:
        return rows

    def after_round(self, rows: list[dict], output: dict) -> dict:
        return output

    def regroup_round(self, micro_batches: list[dict]) -> list[dict]:
        return micro_batches

    def _generate_and_score_completions(self, inputs):
        inputs = self.before_round(inputs)
        return self.after_round(inputs, super()._generate_and_score_completions(inputs))

    def _prepare_inputs(self, generation_batch):
        previous = getattr(self, "_buffered_inputs", None)
        inputs = super()._prepare_inputs(generation_batch)
        buffered = getattr(self, "_buffered_inputs", None)
        if buffered is not previous and buffered:  # TRL just generated a new round and split it
            regrouped = self.regroup_round(buffered)
            if regrouped is not buffered:
                self._buffered_inputs = regrouped
                inputs = regrouped[self._step % self.args.steps_per_generation]
        return inputs


# 2. TRL's batch split helpers (trl.trainer.utils)
def split_by_image(batch: dict) -> dict:
    """`pixel_values` as one tensor per row (by `image_grid_thw` / `num_images`): TRL's split_pixel_values_by_grid."""
    from trl.trainer.utils import split_pixel_values_by_grid

    return split_pixel_values_by_grid(batch)


def unsplit_by_image(batch: dict) -> dict:
    """The inverse of `split_by_image`: TRL's unsplit_pixel_values_by_grid."""
    from trl.trainer.utils import unsplit_pixel_values_by_grid

    return unsplit_pixel_values_by_grid(batch)


def split_rows(batch: dict, num_chunks: int) -> list[dict]:
    """A dict of row-aligned tensors/lists in `num_chunks` equal chunks (scalars copied): TRL's split_tensor_dict."""
    from trl.trainer.utils import split_tensor_dict

    return split_tensor_dict(batch, num_chunks)


# 3. instance class swap: works while the vision tower classes are plain nn.Module subclasses without __slots__
def subclass_instance(obj: Any, mixin: type, prefix: str) -> bool:
    """Give `obj` the class `type(prefix + name, (mixin, type(obj)), {})` in place (weights, module names and
    `state_dict` unchanged). Returns False when it already had `mixin`."""
    if isinstance(obj, mixin):
        return False
    base = type(obj)
    obj.__class__ = type(f"{prefix}{base.__name__}", (mixin, base), {})
    return True


# 4. the trainer's per-step metrics: GRPOTrainer._metrics[mode][name] lists, averaged into the next log row
def log_step_metrics(trainer, metrics: dict[str, float], mode: str = "train") -> bool:
    """Append `metrics` to GRPOTrainer's `_metrics[mode]` (averaged into its next log row). False when the trainer
    has no such store (then log them with the public `Trainer.log`)."""
    store = getattr(trainer, "_metrics", None)
    if not isinstance(store, dict) or mode not in store:
        return False
    for key, value in metrics.items():
        store[mode][key].append(value)
    return True


# 5. LR scheduler's last lr
def set_scheduler_last_lr(scheduler, values: list[float]) -> None:
    """Make `scheduler.get_last_lr()` report `values` (torch's `LRScheduler._last_lr`)."""
    scheduler._last_lr = list(values)


# 6. the rollout generate call
class GRPOGenerateHook:
    """Mixed in before `trl.GRPOTrainer`: `rollout_generator()` returns a function to use instead of HF `generate`
    in TRL's plain-transformers rollouts, same contract (left-padded prompts in, prompt + completion ids out, pad
    after EOS), or None to keep `generate`. Relies on TRL 1.16's `_generate_single_turn` calling
    `unwrapped_model.generate(**generate_inputs, generation_config=...)` on the unwrapped model, and on its flags
    `use_vllm` / `use_transformers_continuous_batching`; the replacement is an instance attribute set for the call
    only, so TRL's padding, unwrapping and EOS masking stay TRL's."""

    def rollout_generator(self):
        return None

    def _generate_single_turn(self, *args, **kwargs):
        fn = self.rollout_generator()
        if fn is None or self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            return super()._generate_single_turn(*args, **kwargs)
        model = self.accelerator.unwrap_model(self.model_wrapped)
        targets = [m for m in {id(model): model, id(self.model): self.model}.values()]
        for target in targets:
            target.__dict__["generate"] = fn
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            for target in targets:
                target.__dict__.pop("generate", None)


# 7. torch inductor's CUDA-graph re-record limit
CUDAGRAPH_RERECORD_LIMIT = 1_000_000


def raise_cudagraph_rerecord_limit(limit: int = CUDAGRAPH_RERECORD_LIMIT) -> None:
    """Let torch.compile(mode="reduce-overhead") re-record a function's CUDA graphs up to `limit` times (default
    128: a decoder whose static buffers move would fall back to eager after ~128 calls). Relies on
    `torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit`."""
    import torch._inductor.config as inductor_config

    inductor_config.triton.cudagraph_unexpected_rerecord_limit = int(limit)


# 8. a config's attention implementation
def attn_implementation(config) -> str | None:
    """The attention implementation `config`'s modules use, or None. Relies on `PretrainedConfig._attn_implementation`
    (what the attention layers read; `set_attn_implementation` is the public setter, there is no public getter)."""
    return getattr(config, "_attn_implementation", None) if config is not None else None


# 9. setting the vision tower's attention implementation
def set_vision_attn_implementation(model, name: str) -> None:
    """Make `model`'s vision tower use the attention function registered as `name`, the language model keeping its
    own: the public `set_attn_implementation({"vision_config": name})` where it accepts the name; from 5.25 it tries
    to preload a flash kernel for a name containing "flash" and raises, so there `vision_config._attn_implementation`
    (shared with the vision tower's modules in every supported family) is set directly."""
    try:
        model.set_attn_implementation({"vision_config": name})
    except ValueError as exc:
        if "flash attention implementation" not in str(exc):
            raise
        model.config.vision_config._attn_implementation = name
    if attn_implementation(model.config.vision_config) != name:
        raise RuntimeError(f"the vision tower's attention implementation could not be set to {name!r}")


# 10. the suppressed tokens of GRPO's rollouts
def suppress_in_rollouts(trainer, token_ids) -> bool:
    """Add `token_ids` to the tokens GRPO's HF-generate rollouts never sample; False where there is no such config
    (vLLM). Relies on TRL 1.16's `__init__` building `self.generation_kwargs` (with `suppress_tokens =
    [image_token_id]`) and `self.generation_config` from it: since TRL sets the field, `generate` never fills in the
    model's own list; this puts it back."""
    config = getattr(trainer, "generation_config", None)
    if config is None or getattr(trainer, "use_vllm", False):
        return False
    merged = sorted(set(config.suppress_tokens or ()) | {int(t) for t in token_ids})
    config.suppress_tokens = merged
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict):
        kwargs["suppress_tokens"] = merged
    return True


# 11. a model built whole while ZeRO-3 is configured
def built_whole():
    """A context in which `type(model)(config)` builds whole tensors although DeepSpeed ZeRO-3 is configured: a
    composite model (Qwen2-VL: vision tower + language model) builds its sub-models through `_from_config`, which
    opens `deepspeed.zero.Init` (partitioning them) unless `set_zero3_state` says one is already open."""
    from transformers.modeling_utils import set_zero3_state

    return set_zero3_state()


# 12. a model's blocks: relies on transformers' `_no_split_modules` naming its decoder layer and vision block classes
def block_class_names(model) -> set[str]:
    return set(getattr(model, "_no_split_modules", None) or ())
