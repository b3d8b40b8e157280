"""A Bradley-Terry reward model on a Qwen-VL backbone: image + chat messages in, one scalar score out.

transformers has no `ForSequenceClassification` for Qwen-VL and TRL's `RewardTrainer` is text-only (trl#4021), so
the head is built here and trained by `transformers.Trainer` with a pair loss and collator. The model: the VLM's
`AutoModel` backbone (no LM head), a zero-initialised `Linear(hidden, 1)` head (initial loss exactly log 2) read at
the LAST REAL token from the attention mask (same score under either padding side; the chat text drops the
template's trailing newline so that token is `<|im_end|>`), the image budget saved with the model (training and
scoring resize alike), optional LoRA, and each distinct image of a batch encoded once (`open_r1.vision_dedupe`).
Loss: -log sigmoid(s_chosen - s_rejected - margin) + `center_rewards_coefficient` * mean((s_c + s_r)^2).
Saved as ONE dir (backbone with LoRA merged, `reward_head.safetensors`, processor, `reward_model.json`). Raw scores
have no fixed zero. Held-out metric: pairwise accuracy with a bootstrap CI over groups (a contest's pairs share an
image, so pairs are not independent).
"""

import inspect
import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from open_r1 import modeling
from open_r1.errors import ModelError, RecipeError
from open_r1.families import base_model, family_of
from open_r1.image_dedupe import enable_image_dedupe
from open_r1.jsonio import read_json, write_json
from open_r1.submission.install import installing
from open_r1.vision_attention import use_grouped_vision_attention
from open_r1.vision_dedupe import enable_vision_dedupe

META_FILE = "reward_model.json"
HEAD_FILE = "reward_head.safetensors"
FORMAT = "open_r1.reward_model/v1"
POOLING = "last_real_token"


def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the position of the last 1 of the attention mask: the last real token under any padding side."""
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be (batch, length), got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.to(torch.long)
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("a row of the batch has no real token (all-zero attention mask)")
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return (positions * mask).argmax(-1)


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """-log sigmoid(s_c - s_r - margin), mean; + coefficient * mean((s_c + s_r)^2) (keeps scores centred)."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    loss = -nn.functional.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
    return loss


def pairwise_accuracy(
    chosen: Sequence[float],
    rejected: Sequence[float],
    groups: Sequence[Any] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """P(s_chosen > s_rejected) (ties 1/2) with a percentile bootstrap CI of the pooled accuracy that resamples whole
    groups (contests); with fewer than two groups it resamples pairs and says so (`ci_unit`)."""
    if len(chosen) != len(rejected) or not len(chosen):
        raise ValueError(f"need equally many chosen and rejected scores (> 0), got {len(chosen)} and {len(rejected)}")
    wins = [1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected)]
    groups = list(groups) if groups is not None else list(range(len(wins)))
    if len(groups) != len(wins):
        raise ValueError(f"{len(groups)} group labels for {len(wins)} pairs")
    by_group: dict[Any, list[float]] = {}
    for group, win in zip(groups, wins):
        by_group.setdefault(group, []).append(win)
    unit = "group"
    if len(by_group) < 2:
        by_group = {i: [w] for i, w in enumerate(wins)}
        unit = "pair"
    sums = [(sum(v), len(v)) for v in by_group.values()]
    rng = random.Random(seed)
    stats = []
    for _ in range(n_boot):
        draw = [sums[rng.randrange(len(sums))] for _ in sums]
        stats.append(sum(s for s, _ in draw) / sum(n for _, n in draw))
    stats.sort()
    lo_i = math.floor((1 - level) / 2 * n_boot)
    hi_i = min(n_boot - 1, math.ceil((1 + level) / 2 * n_boot) - 1)
    return {
        "accuracy": sum(wins) / len(wins),
        "ci_low": stats[lo_i],
        "ci_high": stats[hi_i],
        "ci_level": level,
        "ci_unit": unit,
        "n_pairs": len(wins),
        "n_groups": len(set(groups)),
        "n_boot": n_boot,
        "mean_margin": sum(c - r for c, r in zip(chosen, rejected)) / len(wins),
    }


def chat_text(processor, messages: list[dict]) -> str:
    """The chat-template text of a full conversation, without the template's trailing newline (so the last real
    token is the final turn's end-of-turn token)."""
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return text.removesuffix("\n")


def encode(processor, images: Sequence, messages_list: Sequence[list[dict]], padding_side: str = "left"):
    """Processor inputs for rows of (image, messages): the chat text of each row and its image."""
    if len(images) != len(messages_list):
        raise ValueError(f"{len(images)} images for {len(messages_list)} conversations")
    texts = [chat_text(processor, messages) for messages in messages_list]
    return processor(text=texts, images=list(images), padding=True, padding_side=padding_side, return_tensors="pt")


def load_backbone(path: str, dtype=None, attn_implementation: str | None = None):
    """The VLM without its LM head (`AutoModel`), from a saved VLM dir; its vision tower's attention grouped as
    `modeling.load_model`'s default (one SDPA call per segment length, `open_r1.vision_attention`)."""
    from transformers import AutoConfig, AutoModel

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelError(
            f"{path} has no config.json: point the reward model's backbone to a saved Qwen-VL model dir "
            "(e.g. Qwen/Qwen2.5-VL-3B-Instruct or a stand-in base from stage_pretrain)"
        )
    config = AutoConfig.from_pretrained(path)
    if not hasattr(config, "vision_config"):
        raise ModelError(
            f"{path} is a {config.model_type!r} model without a vision tower; the reward model needs a "
            "vision-language backbone (qwen2_vl, qwen2_5_vl or qwen3_vl)"
        )
    attn_implementation = attn_implementation or modeling.default_attn_implementation()
    backbone = AutoModel.from_pretrained(
        path, dtype=modeling.resolve_dtype(dtype), attn_implementation=attn_implementation
    )
    use_grouped_vision_attention(backbone, "grouped")
    return backbone


class RewardModel(nn.Module):
    """VLM backbone + zero-initialised scalar head read at the last real token (module docstring)."""

    def __init__(self, backbone, processor, meta: dict | None = None, dedupe_vision: bool = True):
        super().__init__()
        self.backbone = backbone
        self.processor = processor
        if processor is not None:
            enable_image_dedupe(processor)  # a pair's two conversations (and a contest's pairs) share one image
        if dedupe_vision:  # ... and the vision tower encodes that image once (the same scores and gradients)
            enable_vision_dedupe(self._base_backbone())
        hidden = int(self.config.get_text_config().hidden_size)
        self.head = nn.Linear(hidden, 1, bias=False, dtype=torch.float32)
        nn.init.zeros_(self.head.weight)
        self.meta = dict(meta or {})
        self._forward_params = set(inspect.signature(self._base_backbone().forward).parameters)

    @property
    def config(self):
        return self._base_backbone().config

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def _base_backbone(self):
        return base_model(self.backbone)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """The Trainer's call (transformers >= 5.23 also passes `every_n_layers` / `offload`), passed on as the
        backbone's version names it."""
        base = self._base_backbone()
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs, **kwargs)
        if hasattr(base, "enable_input_require_grads"):  # LoRA: the frozen embedding must still pass a gradient
            base.enable_input_require_grads()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):  # transformers < 5.23
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self):
        self._base_backbone().gradient_checkpointing_disable()

    def forward(self, input_ids, attention_mask, **inputs) -> torch.Tensor:
        kwargs = {k: v for k, v in inputs.items() if k in self._forward_params and v is not None}
        if "use_cache" in self._forward_params:
            kwargs["use_cache"] = False
        outputs = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = outputs.last_hidden_state
        index = last_real_index(attention_mask)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), index]
        return self.head(pooled.to(self.head.weight.dtype)).squeeze(-1)

    @torch.no_grad()
    def score(
        self,
        images: Sequence,
        messages_list: Sequence[list[dict]],
        batch_size: int = 16,
        padding_side: str = "left",
        progress=None,
    ) -> list[float]:
        """Raw BT scores of (image, conversation) rows, batched, without gradients, in eval mode. `progress(done,
        total)` is called after each batch (long scoring shows it is moving)."""
        was_training = self.training
        self.eval()
        scores: list[float] = []
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        try:
            for start in range(0, len(images), batch_size):
                batch = encode(
                    self.processor,
                    images[start : start + batch_size],
                    messages_list[start : start + batch_size],
                    padding_side=padding_side,
                ).to(self.device)
                with autocast:
                    scores.extend(self(**batch).float().cpu().tolist())
                if progress is not None:
                    progress(len(scores), len(images))
        finally:
            if was_training:
                self.train()
        return scores

    def save(self, out_dir: str, extra_meta: dict | None = None) -> str:
        """Write the ONE dir (backbone with LoRA merged, head, processor, meta) atomically; returns its path."""
        from safetensors.torch import save_file

        if hasattr(self.backbone, "merge_and_unload"):
            self.backbone = self.backbone.merge_and_unload()  # folds LoRA in; the model scores the same
        out_dir = os.path.abspath(out_dir)
        with installing(out_dir) as staging:
            self.backbone.save_pretrained(staging)  # safetensors
            head = {"weight": self.head.weight.detach().float().cpu().contiguous()}
            save_file(head, os.path.join(staging, HEAD_FILE))
            self.processor.save_pretrained(staging)
            min_pixels, max_pixels = modeling.pixel_budget(self.processor)
            meta = {
                **self.meta,
                **(extra_meta or {}),
                "format": FORMAT,
                "pooling": POOLING,
                "hidden_size": int(self.head.in_features),
                "min_pixels": min_pixels,
                "max_pixels": max_pixels,
                "model_type": self.config.model_type,
            }
            write_json(os.path.join(staging, META_FILE), meta)
        self.meta = meta
        return out_dir


LORA_KEYS = ("r", "alpha", "dropout", "vision", "target_modules")  # `build_reward_model`'s ``lora`` mapping


def build_reward_model(
    backbone_path: str,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    dtype=None,
    attn_implementation: str | None = None,
    lora: dict | None = None,
    meta: dict | None = None,
    dedupe_vision: bool = True,
) -> RewardModel:
    """A fresh RM (zero head) on the backbone at `backbone_path`, with the given image budget and optional LoRA
    (`lora` = {"r", "alpha", "dropout", "vision": bool, "target_modules": regex}); `dedupe_vision`: the vision tower
    encodes each distinct image of a batch once (`open_r1.vision_dedupe`)."""
    backbone = load_backbone(backbone_path, dtype=dtype, attn_implementation=attn_implementation)
    processor = modeling.load_processor(backbone_path, min_pixels, max_pixels)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = lora.get("target_modules") or family_of(backbone.config).lora_targets(bool(lora.get("vision")))
        bad = sorted(set(lora) - set(LORA_KEYS))
        if bad:
            raise RecipeError(f"unknown reward-model LoRA key(s) {bad}; valid: {', '.join(LORA_KEYS)}")
        config = LoraConfig(
            r=int(lora.get("r", 16)),
            lora_alpha=int(lora.get("alpha", 32)),
            lora_dropout=float(lora.get("dropout", 0.0)),
            target_modules=targets,
            bias="none",
        )
        backbone = get_peft_model(backbone, config)
    base_meta = {"backbone": os.path.abspath(backbone_path), "lora": lora or None}
    return RewardModel(backbone, processor, meta={**base_meta, **(meta or {})}, dedupe_vision=dedupe_vision)


def load_reward_model(path: str, device=None, dtype=None, attn_implementation: str | None = None) -> RewardModel:
    """The RM saved by `RewardModel.save`, on `device` (default cuda when available), in eval mode."""
    from safetensors.torch import load_file

    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise ModelError(
            f"{path} is not a reward-model dir (no {META_FILE}); train one with the captioning chain's "
            "rm stage: open-r1-caption --config configs/captioning/real_qwen3vl2b.yaml --stages rm"
        )
    meta = read_json(meta_path)
    if meta.get("format") != FORMAT or meta.get("pooling") != POOLING:
        raise ModelError(
            f"{path}: reward-model format {meta.get('format')!r} / pooling {meta.get('pooling')!r} is "
            f"not {FORMAT!r} / {POOLING!r}; retrain it with this version"
        )
    backbone = load_backbone(path, dtype=dtype, attn_implementation=attn_implementation)
    # the saved budget, applied explicitly: scoring resizes images exactly as training did
    processor = modeling.load_processor(path, meta["min_pixels"], meta["max_pixels"])
    model = RewardModel(backbone, processor, meta=meta)
    weight = load_file(os.path.join(path, HEAD_FILE))["weight"]
    if tuple(weight.shape) != tuple(model.head.weight.shape):
        raise ModelError(
            f"{path}: head of shape {tuple(weight.shape)} does not fit the backbone's hidden size "
            f"{model.head.in_features}"
        )
    with torch.no_grad():
        model.head.weight.copy_(weight)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval()


@dataclass
class PairCollator:
    """One batch = B pairs as 2B rows: the B chosen conversations, then the B rejected ones, each with its image,
    through the RM's processor (so its pixel budget)."""

    processor: Any
    padding_side: str = "right"  # training: right (the pooling reads the mask, so either side gives the same score)

    def __call__(self, rows: list[dict]) -> dict:
        messages = [row["chosen"] for row in rows] + [row["rejected"] for row in rows]
        images = [row["image"] for row in rows] + [row.get("rejected_image") or row["image"] for row in rows]
        return dict(encode(self.processor, images, messages, self.padding_side))


def _trainer_class():
    from transformers import Trainer

    class PairwiseRewardTrainer(Trainer):
        """`transformers.Trainer` with the Bradley-Terry pair loss (module docstring); logs batch accuracy and
        score statistics beside the loss."""

        def __init__(self, *args, center_rewards_coefficient: float | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self.center_rewards_coefficient = center_rewards_coefficient
            self._sums: Counter = Counter()
            self._count = 0

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            scores = model(**inputs)
            pairs = scores.shape[0] // 2
            chosen, rejected = scores[:pairs], scores[pairs:]
            loss = bradley_terry_loss(chosen, rejected, None, self.center_rewards_coefficient)
            with torch.no_grad():
                for name, value in (
                    ("accuracy", (chosen > rejected).float()),
                    ("margin", chosen - rejected),
                    ("mean", scores),
                ):
                    self._sums[f"rewards/{name}"] += float(value.mean())
                self._count += 1
            return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss

        def log(self, logs: dict, *args, **kwargs):
            if self._count:
                logs = {**logs, **{k: v / self._count for k, v in self._sums.items()}}
                self._sums, self._count = Counter(), 0
            return super().log(logs, *args, **kwargs)

        def _save(self, output_dir=None, state_dict=None):  # checkpoints: the head + the (adapter) backbone state
            from safetensors.torch import save_file

            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
            save_file(state, os.path.join(output_dir, "reward_model_state.safetensors"))

    return PairwiseRewardTrainer


def train_reward_model(
    model: RewardModel,
    pairs: Sequence[dict],
    training_args,
    center_rewards_coefficient=None,
    callbacks=None,
):
    """Fit `model` on pair rows {"image", "chosen", "rejected": messages, optional "rejected_image",
    "group"} with `transformers.Trainer`; returns the trainer (its `state.log_history` has the loss curve)."""
    pairs = list(pairs)
    for key in ("image", "chosen", "rejected"):
        if pairs and key not in pairs[0]:
            raise ValueError(f"pair rows need a {key!r} field, got {sorted(pairs[0])}")
    training_args.remove_unused_columns = False
    trainer = _trainer_class()(
        model=model,
        args=training_args,
        train_dataset=pairs,
        data_collator=PairCollator(model.processor),
        callbacks=callbacks,
        center_rewards_coefficient=center_rewards_coefficient,
    )
    trainer.train()
    return trainer


def evaluate_pairs(
    model: RewardModel,
    pairs: Sequence[dict],
    batch_size: int = 16,
    n_boot: int = 2000,
    seed: int = 0,
    progress=None,
) -> dict:
    """Held-out pairwise accuracy of `model` on pair rows, with the by-group bootstrap CI (`pairwise_accuracy`).
    `progress(done, total)`: called after each scored batch, counting both sides of every pair."""
    pairs = list(pairs)
    n = len(pairs)
    chosen = model.score(
        [p["image"] for p in pairs],
        [p["chosen"] for p in pairs],
        batch_size=batch_size,
        progress=None if progress is None else (lambda done, _: progress(done, 2 * n)),
    )
    rejected = model.score(
        [p.get("rejected_image") or p["image"] for p in pairs],
        [p["rejected"] for p in pairs],
        batch_size=batch_size,
        progress=None if progress is None else (lambda done, _: progress(n + done, 2 * n)),
    )
    groups = [p.get("group") for p in pairs]
    return pairwise_accuracy(
        chosen, rejected, groups if all(g is not None for g in groups) else None, n_boot=n_boot, seed=seed
    )
