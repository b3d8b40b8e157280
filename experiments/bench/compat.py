"""The benches' uses of private TRL / torch names, each behind a small named function (the package's own are in
`open_r1/compat.py`; these serve only experiments/bench/ and so live beside it).

TRL is pinned at 1.16.0. These names are not public API and may move in any release: each item says what it relies
on, and `tests/test_compat.py` holds one contract test per item that fails with the item's name when an upgrade
moves it.
"""

import contextlib


# 1. TRL's fused LM-head choice (bench --tiny only)
@contextlib.contextmanager
def completion_only_scoring(enabled: bool = True):
    """Within the block, TRL scores only the completion positions (its Triton/GPU path) on any device: a CPU
    bench step then has the GPU's cost profile. Relies on `trl.trainer.utils._use_triton(device) -> bool`."""
    if not enabled:
        yield
        return
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


# 2. torch.compile's per-phase times
def compile_time_report() -> str:
    """torch.compile's seconds per phase in this process, as a text table (`torch._dynamo.utils.compile_times`)."""
    from torch._dynamo.utils import compile_times

    return compile_times(repr="str")
