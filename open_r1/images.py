"""Lazily decoded image columns: keep a `datasets.Image` column as bytes and decode a batch's images at once, in
threads (PIL releases the GIL while decoding), identical bytes once. Used by the GRPO trainer (once per round,
`open_r1/trainer.py`) and by the evaluation (the next batch, in the prefetch thread, `tasks/counting/evaluate.py`).
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

IMAGE_COLUMN = "image"


def lazy_image_column(dataset, column: str = IMAGE_COLUMN):
    """The dataset with a `datasets.Image` column left as encoded bytes/paths (decoded later by `decode_images`);
    any other column is returned as is."""
    from datasets import Image

    feature = dataset.features.get(column)
    if isinstance(feature, Image) and feature.decode:
        return dataset.cast_column(column, Image(decode=False))
    return dataset


def _is_encoded_image(value: Any) -> bool:
    return isinstance(value, dict) and ("bytes" in value or "path" in value)


def decode_images(rows: list[dict], column: str = IMAGE_COLUMN, max_workers: int | None = None) -> list[dict]:
    """Decode `row[column]` in place where it is an undecoded `datasets.Image` value ({'bytes', 'path'}). Rows
    holding the same bytes (a GRPO round repeats each prompt's row G times) get one decoded image object, so the
    image preprocessing downstream (`open_r1.image_dedupe`) sees them as one."""
    from datasets import Image

    todo = [row for row in rows if _is_encoded_image(row.get(column))]
    if not todo:
        return rows
    feature = Image()
    groups: dict[Any, list[dict]] = {}
    for row in todo:
        value = row[column]
        key = value.get("bytes") or value.get("path") or id(value)
        groups.setdefault(key, []).append(row)
    firsts = [members[0][column] for members in groups.values()]
    workers = max_workers or min(8, os.cpu_count() or 1, len(firsts))

    if workers <= 1:
        decoded = [feature.decode_example(value) for value in firsts]
    else:  # decode_example loads the pixels, in the pool's threads
        with ThreadPoolExecutor(max_workers=workers) as pool:
            decoded = list(pool.map(feature.decode_example, firsts))
    for members, image in zip(groups.values(), decoded):
        for row in members:
            row[column] = image
    return rows
