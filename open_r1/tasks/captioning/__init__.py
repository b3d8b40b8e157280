"""humor-r1 captioning: the protocol (prompts, format, strict parser), the data layout, the ``caption_rm`` reward,
best-of-N evaluation, and the chain (``pipeline``: synthesize -> sft -> rm -> grpo -> eval, one ``stage_*`` module
each). The offline stand-in (generated data, from-scratch bases) lives outside the package, in ``standin/``."""

from dataclasses import dataclass

from open_r1.errors import help_field


@dataclass
class CaptioningSettings:
    """The captioning task's own recipe keys (its in-training evaluation), parsed by `open_r1.grpo` beside the
    engine's (`open_r1.tasks.TASK_SETTINGS`)."""

    caption_eval_samples: int = help_field(1, "Completions per cartoon in eval_sets.")
    caption_eval_temperature: float | None = help_field(
        None, "Sample the eval completions at this temperature (unset: greedy)."
    )
    caption_eval_max_new_tokens: int | None = help_field(
        None, "Token cap of an eval completion (unset: the protocol's MAX_NEW_TOKENS)."
    )
    caption_eval_reward_model: str | None = help_field(
        None, "Reward model dir that scores eval_sets (unset: reward_kwargs.caption_rm's)."
    )
