"""`VLMGRPOTrainer`: TRL's `GRPOTrainer` (algorithm unchanged) plus speed levers and one recipe lever, at the hooks
of `open_r1.compat`; task- and family-neutral. Speed levers (measured in docs/PERFORMANCE.md):

* lazy images: TRL's dataloader yields the whole generation batch at every micro-step, so each image would be
  decoded once per micro-step; the `image` column is stored undecoded and decoded once per round, in threads;
* vision de-duplication: a prompt's G completions share one image, yet the ViT runs on every copy (~40 % of the
  training FLOPs at 480x320). The vision tower encodes each distinct image once and expands its outputs to every
  copy (`open_r1.vision_dedupe`; the same gradient), and a round's micro-batches are put back in generation order
  after TRL's shuffle so a group shares a forward, only where the order cannot change the update (one optimizer
  step per round, `num_iterations == 1`, a loss in `ORDER_FREE_LOSSES`, no entropy quantile);
* image preprocessing once per distinct image (`open_r1.image_dedupe`; outputs unchanged);
* the model's own suppressed tokens added to TRL's rollout config (`compat.suppress_in_rollouts`).

Recipe lever (changes what is learned, default off): noisy rollouts (`noisy_fraction`, after NoisyRollout, arXiv
2504.13055): the last fraction of each group is generated *and trained* on the image with Gaussian pixel noise
(`noise_std`), the group's advantages normalised over both; unlike the paper each rollout trains on the image it was
generated from, which keeps TRL's importance ratios exact. Training rounds only.
"""

import logging
import zlib
from typing import Any

import torch
from trl import GRPOTrainer

from open_r1 import compat
from open_r1 import rollout_weights as rollout_lib
from open_r1.decoding import GraphDecoder
from open_r1.errors import RecipeError, TrainerOptionError  # noqa: F401  (re-exported)
from open_r1.generation import decoder_for
from open_r1.image_dedupe import enable_image_dedupe
from open_r1.images import IMAGE_COLUMN, decode_images, lazy_image_column  # noqa: F401  (re-exported)
from open_r1.vision_dedupe import enable_vision_dedupe


def resolve_fast_decode(value, trainer) -> str | None:
    """`fast_decode` -> 'graph' (CUDA-graph decoder), 'eager' (uncompiled: CPU) or None (HF generate). 'auto' uses
    it on a CUDA device without vLLM; under ZeRO-3 it decodes from a whole-weight copy (`open_r1.rollout_weights`)."""
    value = {True: "graph", False: "hf", None: "hf", "true": "graph", "false": "hf"}.get(value, value)
    if value not in ("auto", "graph", "eager", "hf"):
        raise TrainerOptionError(f"fast_decode must be true, false, auto, graph, eager or hf (got {value!r})")
    if value == "hf":
        return None
    if value == "auto":
        return None if trainer.use_vllm or trainer.accelerator.device.type != "cuda" else "graph"
    if trainer.use_vllm:
        raise TrainerOptionError("fast_decode replaces HF generate; with use_vllm vLLM generates: drop one")
    if value == "graph" and trainer.accelerator.device.type != "cuda":
        return "eager"  # CUDA graphs need a CUDA device: the same decoder, uncompiled
    return value


def uses_zero3(trainer) -> bool:
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", 0) == 3


def zero3_block_classes(model) -> list[type]:
    """The classes ZeRO-3 hooks as one module each, not the ~12 modules inside each: decoder layers and vision blocks.
    Never the vision tower: DeepSpeed reduces a leaf's gradients from its full backward hook, which torch skips for a
    module returning a ModelOutput (docs/PERFORMANCE.md: the tower's gradients were lost that way)."""
    names = compat.block_class_names(model)
    return sorted({type(module) for module in model.modules() if type(module).__name__ in names}, key=str)


def check_noisy_rollouts(fraction: float, std: float) -> None:
    if not 0.0 <= fraction < 1.0 or std <= 0:
        raise TrainerOptionError(
            f"noisy_rollouts must be a fraction of each group in [0, 1) and noise_std > 0 (got {fraction}, {std}); "
            "e.g. noisy_rollouts: 0.5, noise_std: 0.1"
        )


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


logger = logging.getLogger(__name__)
ROW_ID = "open_r1_row_id"  # generation order of a round's rows; rides through TRL's shuffle, removed after regrouping
ORDER_FREE_LOSSES = ("dapo", "dr_grpo", "grpo")


def regroup_micro_batches(batches: list[dict], key: str = ROW_ID) -> list[dict]:
    """The micro-batches of a round with their rows back in generation order (groups contiguous), same sizes."""
    parts = [compat.split_by_image(batch) for batch in batches]
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
    return [compat.unsplit_by_image(chunk) for chunk in compat.split_rows(merged, len(batches))]


class VLMGRPOTrainer(compat.GRPORoundHooks, compat.GRPOGenerateHook, GRPOTrainer):
    """`GRPOTrainer` with lazy image decoding, ViT de-duplication and noisy rollouts (module docstring), through the
    round hooks of `open_r1.compat.GRPORoundHooks`."""

    def __init__(
        self,
        *args,
        lazy_images: bool = True,
        noisy_fraction: float = 0.0,
        noise_std: float = 0.1,
        dedupe_vision: bool = False,
        fast_decode: bool | str = "auto",
        dedupe_images: bool = True,
        **kwargs,
    ):
        check_noisy_rollouts(noisy_fraction, noise_std)
        if lazy_images and kwargs.get("train_dataset") is not None:
            kwargs["train_dataset"] = lazy_image_column(kwargs["train_dataset"])
        super().__init__(*args, **kwargs)
        # TRL sets suppress_tokens, so generate never reads the model's own: rollouts must sample what evaluation does
        model_config = getattr(self.accelerator.unwrap_model(self.model), "generation_config", None)
        if getattr(model_config, "suppress_tokens", None):
            compat.suppress_in_rollouts(self, model_config.suppress_tokens)
        blocks = zero3_block_classes(self.model) if uses_zero3(self) else []
        if blocks:  # before deepspeed.initialize, which train() runs
            import deepspeed  # deferred: only under ZeRO-3

            deepspeed.utils.set_z3_leaf_modules(self.model, blocks)
        self.noisy_fraction = noisy_fraction
        self.noise_std = noise_std
        self.fast_decode = resolve_fast_decode(fast_decode, self)
        self.fast_decode_asked = fast_decode
        self._graph_decoder = None
        # ZeRO-3: the decoder reads a whole-weight copy, so TRL's gather around generation would only cost
        self.rollout_weights = None
        self.copy_for_rollouts = bool(self.fast_decode) and uses_zero3(self)
        if self.copy_for_rollouts:
            self.args.ds3_gather_for_generation = False
        self.dedupe_vision = dedupe_vision and enable_vision_dedupe(self.model)
        if dedupe_images:
            enable_image_dedupe(self.processing_class)
        self.dedupe_images = dedupe_images
        args = self.args
        self.regroup_rounds = self.dedupe_vision and (
            args.steps_per_generation == args.gradient_accumulation_steps
            and self.num_iterations == 1
            and self.loss_type in ORDER_FREE_LOSSES
            and (args.top_entropy_quantile or 1.0) >= 1.0
        )

    def rollout_generator(self):
        """The graph decoder's `generate` for TRL's rollouts (compat.GRPOGenerateHook), or None for HF generate."""
        if not self.fast_decode:
            return None
        if self.copy_for_rollouts:
            try:
                self.refresh_rollout_weights()
            except RecipeError as exc:
                if self.fast_decode_asked != "auto":
                    raise
                # 'auto' means "where it can run": no rollout copy, so HF generate on TRL's gathered weights
                self.fast_decode, self.copy_for_rollouts = None, False
                self.args.ds3_gather_for_generation = True
                logger.info(f"[grpo] fast_decode auto: HF generate for the rollouts ({exc})")
                return None
        if self._graph_decoder is None:
            model = self.accelerator.unwrap_model(self.model_wrapped)
            decoder = GraphDecoder(
                self.rollout_weights.model if self.copy_for_rollouts else model, compile=self.fast_decode == "graph"
            )
            # one decoder (one static cache) per model and process, shared with the in-training evaluation
            self._graph_decoder = decoder if self.copy_for_rollouts else decoder_for(model, decoder=decoder)
        return self._graph_decoder.hf_generate

    def refresh_rollout_weights(self) -> None:
        """Under ZeRO-3: build the rollouts' whole-weight copy on first use, and refresh it from the sharded policy
        once per optimizer step (every rank calls this at the same rollouts: the gathers are collective)."""
        if self.rollout_weights is None:
            self.rollout_weights = rollout_lib.RolloutWeights(
                self.accelerator.unwrap_model(self.model_wrapped),
                device=self.accelerator.device,
                gather=rollout_lib.deepspeed_gather,
            )
            if self.dedupe_vision:  # the rollouts' prefill, too, encodes each distinct image once
                enable_vision_dedupe(self.rollout_weights.model)
            logger.info(
                f"[grpo] fast_decode under DeepSpeed ZeRO-3: rollouts decode from a whole-weight copy of the "
                f"policy ({self.rollout_weights.nbytes / 2**30:.2f} GiB a process, LoRA merged), refreshed "
                "once per optimizer step"
            )
        if self.rollout_weights.refresh(self.state.global_step):
            weights = self.rollout_weights
            compat.log_step_metrics(
                self, {"rollout_copy/refresh_s": weights.last_refresh_s, "rollout_copy/gib": weights.nbytes / 2**30}
            )
            if weights.refreshes == 1:
                logger.info(f"[grpo] rollout copy: first refresh {weights.last_refresh_s:.2f} s")

    def before_round(self, rows):
        # The one place TRL reads a round's rows (training and evaluation): decode their images here, once.
        rows = decode_images(rows)
        if self.noisy_fraction and self.model.training:
            self._add_noise(rows)
        return rows

    def after_round(self, rows, output):
        if self.regroup_rounds and self.model.training:
            output[ROW_ID] = torch.arange(len(rows))  # follows TRL's shuffle; see regroup_round
        return output

    def regroup_round(self, micro_batches):
        if self.model.training and ROW_ID in micro_batches[0]:
            # a new round: put its rows back in generation order so that each micro-batch holds whole groups
            return regroup_micro_batches(micro_batches)
        return micro_batches

    def _add_noise(self, rows: list[dict]) -> None:
        rank = self.accelerator.process_index
        for i in noisy_positions(len(rows), self.num_generations, self.noisy_fraction):
            if rows[i].get(IMAGE_COLUMN) is not None:
                seed = zlib.crc32(f"{self.args.seed}-{self.state.global_step}-{rank}-{i}".encode())
                rows[i] = {**rows[i], IMAGE_COLUMN: add_image_noise(rows[i][IMAGE_COLUMN], self.noise_std, seed)}
