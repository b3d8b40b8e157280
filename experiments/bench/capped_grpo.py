"""``open_r1.grpo`` under a GPU memory cap: ``GPU_MEMORY_CAP_GIB=48`` caps each process's GPU memory, to rehearse a
48 GB card on a larger one (issue 44). train.sh runs this module instead of ``open_r1.grpo`` when the variable is
set; the benches cap their own process with ``--memory-cap-gib``."""

import logging
import os
import sys

from open_r1 import grpo
from open_r1.errors import RecipeError, error_exit, setup_logging

logger = logging.getLogger(__name__)
MEMORY_CAP_ENV = "GPU_MEMORY_CAP_GIB"


def apply_memory_cap(environ=os.environ) -> float | None:
    """Cap this process's GPU memory at ``GPU_MEMORY_CAP_GIB`` GiB (None: unset, or no GPU)."""
    value = environ.get(MEMORY_CAP_ENV, "").strip()
    if not value:
        return None
    try:
        cap = float(value)
    except ValueError:
        cap = 0.0
    if not 0 < cap < float("inf"):
        raise RecipeError(f"{MEMORY_CAP_ENV}={value!r} is not a positive number of GiB (e.g. 48)")
    import torch  # deferred: the error above needs no torch

    if not torch.cuda.is_available():
        return None
    device = int(environ.get("LOCAL_RANK", 0))
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), device)
    logger.warning("GPU memory capped at %g GiB of %.1f (%s)", cap, total / 2**30, MEMORY_CAP_ENV)
    return cap


def main(argv=None) -> int:
    setup_logging()
    try:
        apply_memory_cap()
    except RecipeError as exc:
        return error_exit(exc)
    return grpo.cli(argv)


if __name__ == "__main__":
    sys.exit(main())
