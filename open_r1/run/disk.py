"""Disk space (`DiskSpaceCallback`): after the first checkpoint, will the later ones and the export fit? A save short
of space fails deep in torch or DeepSpeed, often an hour in (a ZeRO-3 checkpoint of the 2B model: 30.9 GB). A save
holds `save_total_limit` + 1 (the rotation follows it; unlimited: one per save due); after training the export's
weights join `save_total_limit` where `$SUBMISSION` shares the disk (LoRA: the adapter's size, an under-estimate).
Short of space it warns once, with the fixes, and the run goes on. A first checkpoint that does not fit is not
caught."""

import logging
import os
import shutil

from transformers import TrainerCallback

from open_r1.run.common import _is_rank0

logger = logging.getLogger(__name__)


def dir_bytes(path: str, pattern: str = "") -> int:
    """Bytes of the files under `path` whose names end with `pattern` (every file when empty)."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
        if name.endswith(pattern)
    )


class DiskSpaceCallback(TrainerCallback):
    def __init__(self, submission: str | None = None):
        self.submission, self.checked = os.environ.get("SUBMISSION") if submission is None else submission, False

    def on_save(self, args, state, control, **kwargs):
        checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if self.checked or not _is_rank0(state) or not os.path.isdir(checkpoint):
            return
        self.checked = True  # once: the first checkpoint measures them all
        size = dir_bytes(checkpoint)
        present = sum(name.startswith("checkpoint-") for name in os.listdir(args.output_dir))
        limit, every = args.save_total_limit, max(int(state.save_steps or args.save_steps), 1)
        saves_left = state.max_steps // every - state.global_step // every + (state.max_steps % every != 0)
        most, after = (limit + 1, limit) if limit else (present + saves_left,) * 2  # at a save; after training
        target = os.path.dirname(os.path.abspath(self.submission)) if self.submission else ""
        same_disk = target and os.path.isdir(target) and os.stat(target).st_dev == os.stat(args.output_dir).st_dev
        export = dir_bytes(checkpoint, ".safetensors") if same_disk else 0  # the merged model's weights, about
        need = max((most - present) * size, (after - present) * size + export)
        if need > (free := shutil.disk_usage(args.output_dir).free):
            logger.warning(
                f"[disk] warning: a checkpoint here takes {size / 1e9:.1f} GB and the saves still due and the export "
                f"need ~{need / 1e9:.1f} GB more, but {args.output_dir} has {free / 1e9:.1f} GB free: a later save "
                "would fail. Free space, lower save_total_limit, or point OUTPUT_DIR / SUBMISSION at a larger disk."
            )
