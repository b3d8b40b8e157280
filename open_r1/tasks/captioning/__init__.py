"""humor-r1 captioning: the protocol (prompts, format, strict parser), the data layout, the ``caption_rm`` reward,
best-of-N evaluation, and the chain (``pipeline``: synthesize -> sft -> rm -> grpo -> eval, one ``stage_*`` module
each). The offline stand-in (generated data, from-scratch bases) lives outside the package, in ``standin/``."""
