"""Vision de-duplication: a batch's vision tower encodes each distinct image once (a GRPO prompt's G completions,
or a reward-model pair's two sides, share one image). The tower's class gets a subclass whose `forward` finds exact
copies (`duplicate_map`), encodes the distinct images and expands every output back to every copy; autograd sums
the copies' gradients, so outputs and gradients are the plain forward's (tested per family).
"""

import torch

from open_r1 import compat
from open_r1.errors import TrainerOptionError
from open_r1.families import vision_tower


def duplicate_map(pixel_values, grid_thw) -> list[int]:
    """For each image of a flattened Qwen-VL batch, the index of the first image with identical patches and grid."""
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


# vision kwargs with precomputed per-batch geometry: the tower cannot run on a subset then, so it runs on all
PRECOMPUTED_VISION_KWARGS = (
    "cu_seqlens",
    "max_seqlen",
    "position_ids",
    "window_index",
    "cu_window_seqlens",
    "max_window_seqlen",
    "interp_indices",
    "interp_weights",
)


class DedupeVisionMixin:
    """Mixed into the vision tower's class: per-patch outputs are expanded by each image's patch count, merged ones
    (`pooler_output`, Qwen3-VL's `deepstack_features`) by its merged-token count (Qwen2.5-VL's window order stays
    inside each image, so an image's rows are one contiguous block)."""

    # images given to / images run through the ViT since the subclass was installed (bench and tests read these)
    images_seen = 0
    images_encoded = 0

    def forward(self, hidden_states, grid_thw, **kwargs):
        mapping = duplicate_map(hidden_states, grid_thw)
        unique = sorted(set(mapping))
        self.images_seen += len(mapping)
        if (
            len(unique) == len(mapping)
            or any(kwargs.get(k) is not None for k in PRECOMPUTED_VISION_KWARGS)
            or kwargs.get("output_attentions")
        ):
            self.images_encoded += len(mapping)
            return super().forward(hidden_states, grid_thw, **kwargs)
        self.images_encoded += len(unique)
        sizes = grid_thw.prod(-1).tolist()
        chunks = torch.split(hidden_states, sizes)
        outputs = super().forward(torch.cat([chunks[i] for i in unique]), grid_thw[unique], **kwargs)
        merge = self.spatial_merge_size**2
        merged_sizes = [size // merge for size in sizes]

        def expand(tensor, per_image):
            pieces = dict(zip(unique, torch.split(tensor, [per_image[i] for i in unique])))
            return torch.cat([pieces[i] for i in mapping])

        if isinstance(outputs, torch.Tensor):  # older transformers return the merged features alone
            return expand(outputs, merged_sizes)
        if isinstance(outputs, tuple):  # return_dict=False: (last_hidden_state, pooler_output, ...)
            raise TrainerOptionError(
                "dedupe_vision needs the vision tower's dict output (return_dict=True); set dedupe_vision: false"
            )
        if getattr(outputs, "last_hidden_state", None) is not None:
            outputs.last_hidden_state = expand(outputs.last_hidden_state, sizes)
        if getattr(outputs, "hidden_states", None) is not None:
            outputs.hidden_states = tuple(expand(h, sizes) for h in outputs.hidden_states)
        outputs.pooler_output = expand(outputs.pooler_output, merged_sizes)
        if getattr(outputs, "deepstack_features", None) is not None:  # Qwen3-VL: one merged tensor per layer
            outputs.deepstack_features = [expand(feature, merged_sizes) for feature in outputs.deepstack_features]
        return outputs


def enable_vision_dedupe(model) -> bool:
    """Give the model's vision tower the de-duplicating subclass (weights, names and saving unchanged)."""
    visual = vision_tower(model)
    if visual is None:
        return False
    compat.subclass_instance(visual, DedupeVisionMixin, prefix="Dedupe")
    return True
