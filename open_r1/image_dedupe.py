"""Each distinct image of a processor call is preprocessed once, and the last call's results are reused.

A GRPO round hands the processor G copies of each prompt's image, twice (generation, then the loss's inputs): 1024
preprocessings for 64 distinct images at 64 x 8, serial CPU work while the GPU waits (docs/PERFORMANCE.md). The
copies are the same Python objects, so identity is the key. `preprocess` runs the library's own preprocessing on the
distinct images not held from the previous call with the same arguments and copies each image's rows back to every
position: `pixel_values` and `image_grid_thw` come out exactly as the plain processor builds them. Any other output
layout is the library's own, and that processor is left to the library from then on. The cache holds the last
call's distinct images (strong references, so an `id` is not reused while held). The subclass keeps the base class's
name, so a saved `preprocessor_config.json` still names the library's class.
"""

import weakref
from dataclasses import dataclass, field
from typing import Any

from open_r1 import compat

OUTPUT_KEYS = {"pixel_values", "image_grid_thw"}


@dataclass
class DedupeState:
    """Per image processor, kept outside the instance: `to_dict` / `save_pretrained` deep-copy `__dict__`."""

    signature: str | None = None
    held: dict = field(default_factory=dict)  # id(image) -> (image, (pixel rows, grid_thw))
    images_seen: int = 0  # images given to the processor since the mixin was installed (benches, tests)
    images_processed: int = 0  # images it actually preprocessed
    unsupported: bool = False  # its outputs had a layout this does not know: every later call is the plain one


_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def dedupe_state(image_processor) -> DedupeState:
    image_processor = getattr(image_processor, "image_processor", image_processor)
    if image_processor not in _STATES:
        _STATES[image_processor] = DedupeState()
    return _STATES[image_processor]


class DedupeImagesMixin:
    """Mixed into an image processor instance's class by `enable_image_dedupe` (see the module docstring)."""

    def preprocess(self, images, *args, **kwargs):
        import torch
        from transformers.image_utils import make_flat_list_of_images

        try:
            flat = make_flat_list_of_images(images)
        except (TypeError, ValueError):
            return super().preprocess(images, *args, **kwargs)
        state = dedupe_state(self)
        if state.unsupported:
            return super().preprocess(images, *args, **kwargs)
        # rows are tensors whatever `return_tensors` asks (TRL's two calls differ only in it); converted below
        settings = {key: value for key, value in kwargs.items() if key != "return_tensors"}
        signature = repr((args, sorted(settings.items(), key=lambda item: item[0])))
        held = state.held if state.signature == signature else {}
        slot: dict[int, int] = {}
        distinct: list[Any] = []
        for image in flat:
            if id(image) not in slot:
                slot[id(image)] = len(distinct)
                distinct.append(image)
        todo = [image for image in distinct if id(image) not in held]
        state.images_seen += len(flat)
        if len(distinct) == len(flat) and len(todo) == len(flat):
            # nothing repeated and nothing held: the plain call (and remember its rows for a second call)
            output = super().preprocess(images, *args, **kwargs)
            state.images_processed += len(flat)
            rows = per_image_rows(output, len(flat))
            state.unsupported = rows is None
            _remember(state, signature, distinct, rows or [])
            return output
        fresh = {}
        if todo:
            output = super().preprocess(todo, *args, **kwargs)
            rows = per_image_rows(output, len(todo))
            if rows is None:  # a layout this does not know: the library's result on the whole list, from now on
                state.unsupported = True
                state.images_processed += len(flat)
                _remember(state, None, [], [])
                return super().preprocess(images, *args, **kwargs)
            state.images_processed += len(todo)
            fresh = {id(image): row for image, row in zip(todo, rows)}
        per_distinct = [fresh[id(image)] if id(image) in fresh else held[id(image)][1] for image in distinct]
        _remember(state, signature, distinct, per_distinct)
        order = [slot[id(image)] for image in flat]
        from transformers.image_processing_utils import BatchFeature

        return BatchFeature(
            data={
                "pixel_values": torch.cat([per_distinct[i][0] for i in order]),
                "image_grid_thw": torch.stack([per_distinct[i][1] for i in order]),
            },
            tensor_type=kwargs.get("return_tensors"),
        )


def _remember(state: DedupeState, signature: str | None, images: list, rows: list) -> None:
    state.signature = signature
    state.held = {id(image): (image, row) for image, row in zip(images, rows)}


def per_image_rows(output, count: int):
    """[(pixel rows, grid_thw)] per image of a processed batch, or None for a layout this does not know."""
    import torch

    if set(output.keys()) != OUTPUT_KEYS:
        return None
    pixels, grids = output["pixel_values"], output["image_grid_thw"]
    if not (isinstance(pixels, torch.Tensor) and isinstance(grids, torch.Tensor)) or grids.shape[0] != count:
        return None
    sizes = [int(n) for n in grids.prod(-1).tolist()]
    if sum(sizes) != pixels.shape[0]:
        return None
    return list(zip(torch.split(pixels, sizes), grids))


def enable_image_dedupe(processor) -> bool:
    """Give `processor.image_processor` (or an image processor itself) the de-duplicating subclass, keeping its
    class name (saved configs name the library's class). False when there is none or it already has it."""
    image_processor = getattr(processor, "image_processor", processor)
    if image_processor is None or not hasattr(image_processor, "preprocess"):
        return False
    return compat.subclass_instance(image_processor, DedupeImagesMixin, prefix="")
