"""`CountingGRPOTrainer`: TRL's `GRPOTrainer` plus speed levers and one recipe lever, at TRL's own hook points.

The algorithm is TRL's, unchanged. What this adds:

* **Lazy image decoding** (`lazy_images=True`). TRL's dataloader yields the whole *generation* batch at every
  micro-step (`per_device_train_batch_size x steps_per_generation` rows; `_prepare_inputs` only uses it on the step
  that generates), so with 64 x 8 micro-steps every image of a round is decoded 8 times, with micro-batches of 8 it
  is 64 times, on the training process, while the GPU waits. We store the `image` column undecoded
  (`datasets.Image(decode=False)`, a metadata change; see `lazy_image_column`) and decode once per round, in
  threads (PIL releases the GIL while decoding), in `_generate_and_score_completions` before TRL reads the images.
  Measured on the full-size bench: docs/PERFORMANCE.md.
* **Compiled decoding** (`compile_generation=True`). TRL builds its `GenerationConfig` with `disable_compile=True`
  and a dynamic KV cache, so HF `generate` runs the decode step eagerly and is bound by per-step overhead. With a
  static cache transformers compiles the decode step (`torch.compile`, mode `reduce-overhead`: CUDA graphs). The
  cache length is a compiled shape, so it is bucketed (`generation_config.max_cache_len`, transformers >= 5.24):
  sized before the first round from a sample of prompts, rounded up to 128 tokens with a margin, and raised (one
  recompilation) only if a longer round comes. Each `generate` call builds a new static cache, which CUDA graphs
  re-record rather than recompile; the re-record limit is raised so a long run keeps its graphs. Not with DeepSpeed
  ZeRO-3 (parameters are gathered and released around every generation), where it is refused with a clear error.

* **Vision de-duplication** (`dedupe_vision=True`; on in `open_r1.grpo` and the recipes: 2.50x -> 3.77x plain TRL on
  the H200 bench, docs/PERFORMANCE.md). The G completions of a prompt share one image, yet the training forward runs
  the ViT on every copy (forward, backward and the gradient checkpointing recompute): about 40 % of the training FLOPs
  at 480x320 are the ViT, 7/8 of them repeated. Two pieces: (1) the vision tower's class gets a subclass whose
  `forward` encodes each distinct image of a batch once and expands the features (autograd sums the copies' gradients
  into the one encoding: the same gradient); (2) the micro-batches of a round are put back in generation order after
  TRL's shuffle, so a group's copies share a forward. (2) only runs where the order of micro-batches cannot change the
  update: one optimizer step per round (`steps_per_generation == gradient_accumulation_steps`, `num_iterations == 1`),
  a loss whose normaliser does not depend on the micro-batch (`dapo`, `dr_grpo`, `grpo`) and no per-micro-batch
  entropy quantile; otherwise only (1) runs, on whatever duplicates a micro-batch happens to hold.

And one recipe lever (it changes what is learned, default off):

* **Noisy rollouts** (`noisy_fraction`, after NoisyRollout, arXiv 2504.13055: mixing rollouts on clean and distorted
  images improves OOD). In each group of `num_generations` completions of one prompt, the last `noisy_fraction` of
  them are generated *and trained* on the image with Gaussian pixel noise (`noise_std`, in [0, 1] units); the rest
  see the clean image, and the group's advantages are normalised over both. Deviation from the paper: its policy
  update conditions every rollout on the clean image; here each rollout is trained on the image it was generated
  from, which keeps TRL's on-policy importance ratios exact and needs no change to TRL's loss. Training rounds only;
  evaluation always sees clean images.
"""
from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from trl import GRPOTrainer

from open_r1.errors import TrainerOptionError  # noqa: F401  (re-exported)
from open_r1.tasks.counting.evaluate import (
    cache_length_bucket,  # one bucketing rule for training and selfcheck
)

IMAGE_COLUMN = "image"
# CUDA graphs are re-recorded when the static cache of a new `generate` call lives at new addresses; torch gives up
# on graphs for a function after this many re-records (default 128, i.e. ~128 rounds).
CUDAGRAPH_RERECORD_LIMIT = 1_000_000


def check_noisy_rollouts(fraction: float, std: float) -> None:
    if not 0.0 <= fraction < 1.0 or std <= 0:
        raise TrainerOptionError(
            f"noisy_rollouts must be a fraction of each group in [0, 1) and noise_std > 0 (got {fraction}, {std}); "
            "e.g. noisy_rollouts: 0.5, noise_std: 0.1"
        )


def lazy_image_column(dataset, column: str = IMAGE_COLUMN):
    """The dataset with `column` left as encoded bytes/paths (decoded later by `decode_images`).

    Only `datasets.Image` columns change; anything else (already-decoded lists, other feature types) is returned as
    is, and `decode_images` leaves such values alone."""
    from datasets import Image

    feature = dataset.features.get(column)
    if isinstance(feature, Image) and feature.decode:
        return dataset.cast_column(column, Image(decode=False))
    return dataset


def _is_encoded_image(value: Any) -> bool:
    return isinstance(value, dict) and ("bytes" in value or "path" in value)


def decode_images(rows: list[dict], column: str = IMAGE_COLUMN, max_workers: int | None = None) -> list[dict]:
    """Decode `row[column]` in place where it is an undecoded `datasets.Image` value ({'bytes', 'path'})."""
    from datasets import Image

    todo = [row for row in rows if _is_encoded_image(row.get(column))]
    if not todo:
        return rows
    feature = Image()
    workers = max_workers or min(8, os.cpu_count() or 1, len(todo))

    def decode(row: dict) -> None:
        row[column] = feature.decode_example(row[column])  # loads the pixels: the decode happens in this thread

    if workers <= 1:
        for row in todo:
            decode(row)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(decode, todo))
    return rows


def add_image_noise(image, std: float, seed: int):
    """The PIL image plus Gaussian pixel noise of standard deviation `std` (pixel range [0, 1]), clipped; seeded."""
    import numpy as np
    from PIL import Image as PILImage

    pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    noisy = pixels + np.random.default_rng(seed).normal(0.0, std, pixels.shape).astype(np.float32)
    return PILImage.fromarray((np.clip(noisy, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8))


def noisy_positions(num_rows: int, group_size: int, fraction: float) -> list[int]:
    """Rows whose rollout sees the noisy image: the last round(fraction x G) of every group of G consecutive rows
    (TRL's sampler repeats each prompt G times in a row)."""
    per_group = round(fraction * group_size)
    return [i for i in range(num_rows) if i % group_size >= group_size - per_group]


# --------------------------------------------------------------------------------------------------------------------
# Vision de-duplication
# --------------------------------------------------------------------------------------------------------------------
ROW_ID = "open_r1_row_id"  # generation order of a round's rows; rides through TRL's shuffle, removed after regrouping
ORDER_FREE_LOSSES = ("dapo", "dr_grpo", "grpo")


def vision_tower(model):
    """The ViT module of a Qwen2-VL model (bare, wrapped in peft, or the inner Qwen2VLModel), or None."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    inner = getattr(model, "model", model)
    return getattr(inner, "visual", None) or getattr(model, "visual", None)


def duplicate_map(pixel_values, grid_thw) -> list[int]:
    """For each image of a flattened Qwen2-VL batch, the index of the first image with identical patches and grid."""
    sizes = grid_thw.prod(-1).tolist()
    chunks = torch.split(pixel_values, sizes)
    weights = torch.linspace(0.5, 1.5, pixel_values.shape[-1], device=pixel_values.device, dtype=torch.float32)
    fingerprints = torch.stack([torch.stack([c.float().sum(), (c.float() * weights).sum()]) for c in chunks]).tolist()
    grids = grid_thw.tolist()
    firsts: dict[tuple, list[int]] = {}
    mapping = []
    for i, chunk in enumerate(chunks):
        key = (tuple(grids[i]), *fingerprints[i])
        for candidate in firsts.get(key, []):
            if torch.equal(chunks[candidate], chunk):  # the fingerprint only proposes; equality decides
                mapping.append(candidate)
                break
        else:
            firsts.setdefault(key, []).append(i)
            mapping.append(i)
    return mapping


class DedupeVisionMixin:
    """Mixed into the vision tower's class: encode each distinct image once, expand to every copy."""

    # images given to / images run through the ViT since the subclass was installed (bench and tests read these)
    images_seen = 0
    images_encoded = 0

    def forward(self, hidden_states, grid_thw, **kwargs):
        mapping = duplicate_map(hidden_states, grid_thw)
        unique = sorted(set(mapping))
        self.images_seen += len(mapping)
        self.images_encoded += len(unique)
        if len(unique) == len(mapping):
            return super().forward(hidden_states, grid_thw, **kwargs)
        sizes = grid_thw.prod(-1).tolist()
        chunks = torch.split(hidden_states, sizes)
        outputs = super().forward(torch.cat([chunks[i] for i in unique]), grid_thw[unique], **kwargs)
        merge = self.spatial_merge_size ** 2

        def expand(tensor, per_image):
            pieces = dict(zip(unique, torch.split(tensor, [per_image[i] for i in unique])))
            return torch.cat([pieces[i] for i in mapping])

        merged_sizes = [size // merge for size in sizes]
        if isinstance(outputs, torch.Tensor):  # older transformers return the merged features alone
            return expand(outputs, merged_sizes)
        if getattr(outputs, "last_hidden_state", None) is not None:
            outputs.last_hidden_state = expand(outputs.last_hidden_state, sizes)
        outputs.pooler_output = expand(outputs.pooler_output, merged_sizes)
        return outputs


def enable_vision_dedupe(model) -> bool:
    """Give the model's vision tower the de-duplicating subclass (weights, names and saving unchanged)."""
    visual = vision_tower(model)
    if visual is None:
        return False
    if not isinstance(visual, DedupeVisionMixin):
        base = type(visual)
        visual.__class__ = type(f"Dedupe{base.__name__}", (DedupeVisionMixin, base), {})
    return True


def regroup_micro_batches(batches: list[dict], key: str = ROW_ID) -> list[dict]:
    """The micro-batches of a round with their rows back in generation order (groups contiguous), same sizes."""
    from trl.trainer.utils import (
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )

    parts = [split_pixel_values_by_grid(batch) for batch in batches]
    merged: dict[str, Any] = {}
    for name, first in parts[0].items():
        values = [part[name] for part in parts]
        if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
            merged[name] = first  # batch-wide scalars (num_items_in_batch) are the same in every micro-batch
        elif isinstance(first, torch.Tensor):
            merged[name] = torch.cat(values)
        else:
            merged[name] = [item for value in values for item in value]
    order = torch.argsort(merged.pop(key)).tolist()
    for name, value in merged.items():
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            merged[name] = value[order]
        elif isinstance(value, list):
            merged[name] = [value[i] for i in order]
    return [unsplit_pixel_values_by_grid(chunk) for chunk in split_tensor_dict(merged, len(batches))]


def enable_compiled_generation(generation_config, deepspeed_plugin=None) -> None:
    """Switch a TRL GenerationConfig to a static KV cache with a compiled (CUDA-graph) decode step."""
    from transformers import CompileConfig

    if deepspeed_plugin is not None and getattr(deepspeed_plugin, "zero_stage", 0) == 3:
        raise TrainerOptionError(
            "compile_generation does not work under DeepSpeed ZeRO-3 (parameters are gathered for every generation). "
            "Run with ZERO3=0 (plain DDP) or set compile_generation: false"
        )
    generation_config.cache_implementation = "static"
    generation_config.disable_compile = False
    generation_config.compile_config = CompileConfig(fullgraph=False, mode="reduce-overhead")
    torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit = CUDAGRAPH_RERECORD_LIMIT


def longest_prompt_tokens(processor, rows: list[dict]) -> int:
    """Token length of the longest prompt (chat template, image tokens included) among `rows` of a GRPO dataset."""
    lengths = []
    for row in decode_images([dict(row) for row in rows]):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["prompt"][-1]["content"]}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lengths.append(int(processor(text=[text], images=[row[IMAGE_COLUMN]], return_tensors="pt")["input_ids"].shape[1]))
    return max(lengths)


class CountingGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with lazy image decoding, optional compiled decoding, ViT de-duplication and noisy rollouts
    (module docstring)."""

    def __init__(self, *args, lazy_images: bool = True, compile_generation: bool = False, noisy_fraction: float = 0.0,
                 noise_std: float = 0.1, dedupe_vision: bool = False, **kwargs):
        check_noisy_rollouts(noisy_fraction, noise_std)
        if lazy_images and kwargs.get("train_dataset") is not None:
            kwargs["train_dataset"] = lazy_image_column(kwargs["train_dataset"])
        super().__init__(*args, **kwargs)
        self.compile_generation = compile_generation
        self.noisy_fraction = noisy_fraction
        self.noise_std = noise_std
        self.dedupe_vision = dedupe_vision and enable_vision_dedupe(self.model)
        args = self.args
        self.regroup_rounds = self.dedupe_vision and (
            args.steps_per_generation == args.gradient_accumulation_steps and self.num_iterations == 1
            and self.loss_type in ORDER_FREE_LOSSES and (getattr(args, "top_entropy_quantile", 1.0) or 1.0) >= 1.0
        )
        if compile_generation:
            if self.use_vllm:
                raise TrainerOptionError("compile_generation is for HF generate; vLLM compiles on its own: drop one")
            enable_compiled_generation(self.generation_config, getattr(self.accelerator.state, "deepspeed_plugin", None))
            sample = [self.train_dataset[i] for i in range(min(64, len(self.train_dataset)))]
            if sample and isinstance(sample[0].get("prompt"), list):
                self.generation_config.max_cache_len = cache_length_bucket(
                    longest_prompt_tokens(self.processing_class, sample), self.max_completion_length)

    def _generate_and_score_completions(self, inputs):
        # The one place TRL reads a round's rows (training and evaluation): decode their images here, once.
        inputs = decode_images(inputs)
        if self.noisy_fraction and self.model.training:
            self._add_noise(inputs)
        output = super()._generate_and_score_completions(inputs)
        if self.regroup_rounds and self.model.training:
            output[ROW_ID] = torch.arange(len(inputs))  # follows TRL's shuffle; see _prepare_inputs
        if self.compile_generation and "prompt_ids" in output:
            # a longer round than the sample foresaw: raise the bucket once instead of recompiling every round
            bucket = cache_length_bucket(output["prompt_ids"].shape[1], self.max_completion_length)
            if bucket > (self.generation_config.max_cache_len or 0):
                self.generation_config.max_cache_len = bucket
        return output

    def _prepare_inputs(self, generation_batch):
        previous = getattr(self, "_buffered_inputs", None)
        inputs = super()._prepare_inputs(generation_batch)
        buffered = getattr(self, "_buffered_inputs", None)
        if buffered is not previous and buffered and ROW_ID in buffered[0]:
            # a new round: put its rows back in generation order so that each micro-batch holds whole groups
            self._buffered_inputs = regroup_micro_batches(buffered)
            inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
        return inputs

    def _add_noise(self, rows: list[dict]) -> None:
        rank = self.accelerator.process_index
        for i in noisy_positions(len(rows), self.num_generations, self.noisy_fraction):
            if rows[i].get(IMAGE_COLUMN) is not None:
                seed = zlib.crc32(f"{self.args.seed}-{self.state.global_step}-{rank}-{i}".encode())
                rows[i] = {**rows[i], IMAGE_COLUMN: add_image_noise(rows[i][IMAGE_COLUMN], self.noise_std, seed)}
