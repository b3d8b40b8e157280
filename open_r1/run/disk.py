"""Disk space (`DiskSpaceCallback`): after the first checkpoint, will the later ones and the export fit? A save short
of space fails deep inside torch or DeepSpeed, often an hour in (a ZeRO-3 checkpoint of the 2B model: 21.7 GB). At
most `save_total_limit` + 1 exist during a save (unlimited: one per save still due), plus the export's weights where
`$SUBMISSION` is on the same disk. Short of space it warns once, with the fixes; the run goes on (space may be freed)."""
from __future__ import annotations

import os
import shutil

from transformers import TrainerCallback

from open_r1.run.common import _is_rank0, _log


def dir_bytes(path: str, pattern: str = "") -> int:
    """Bytes of the files under `path` whose names end with `pattern` (every file when empty)."""
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path)
               for name in names if name.endswith(pattern))


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
        saves_left = max(state.max_steps - state.global_step, 0) // max(int(args.save_steps or 1), 1) + 1
        most = args.save_total_limit + 1 if args.save_total_limit else present + saves_left
        need = max(most - present, 0) * size
        target = os.path.dirname(os.path.abspath(self.submission)) if self.submission else ""
        if target and os.path.isdir(target) and os.stat(target).st_dev == os.stat(args.output_dir).st_dev:
            need += dir_bytes(checkpoint, ".safetensors")  # the merged model the export writes, about
        if need > (free := shutil.disk_usage(args.output_dir).free):
            _log(f"[disk] warning: a checkpoint here takes {size / 1e9:.1f} GB and the saves still due and the export "
                 f"need ~{need / 1e9:.1f} GB more, but {args.output_dir} has {free / 1e9:.1f} GB free: a later save "
                 "would fail. Free space, lower save_total_limit, or point OUTPUT_DIR / SUBMISSION at a larger disk.")
