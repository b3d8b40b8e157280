"""humor-r1 captioning: the protocol (prompts, format, strict parser), data (real layout + offline stand-in),
the ``caption_rm`` reward and best-of-N evaluation. Engine-side pieces (the Bradley-Terry reward model, SFT, stage
scripts) live in ``open_r1/reward_model.py``, ``open_r1/sft.py`` and the ``stage_*`` scripts."""
