"""Library noise, filtered once at the entry points: only warnings the libraries raise about themselves, which a
user cannot act on (ours are fixed where they arise). pyproject.toml's pytest `filterwarnings` lists the same ones.
"""

import warnings

LIBRARY_WARNINGS = (
    # TRL 1.16's GRPOConfig / SFTConfig default the deprecated alias gradient_checkpointing=True, so transformers
    # 5.24 warns on every config a recipe builds without naming activation_checkpointing.
    (FutureWarning, r"`gradient_checkpointing` is deprecated"),
    # TRL 1.16 reads model.is_gradient_checkpointing (renamed in transformers 5.24) around generation.
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # ... and calls model.gradient_checkpointing_enable / _disable (renamed activation_checkpointing_*).
    (FutureWarning, r"`gradient_checkpointing_(enable|disable)` is deprecated"),
)


def quiet_library_noise(progress_bars: bool = True) -> None:
    """Ignore LIBRARY_WARNINGS; with `progress_bars=False` also the per-call loading / saving / casting bars of
    transformers and datasets (the demo's log shows its own one-line steps instead)."""
    for category, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if not progress_bars:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        try:
            import datasets

            datasets.disable_progress_bars()
        except ImportError:
            pass
