"""The tasks, one folder each: its protocol (prompts, parser, scoring), rewards, data and evaluation.

* `counting/` — CLEVR-style counting VQA that generalizes (GRPO on Qwen2-VL-2B-Instruct).
* `captioning/` — humor-r1: cartoon captions, thinking SFT, a Bradley-Terry VLM reward model, GRPO, best-of-N.

The engine (`open_r1/*.py`, `open_r1/run/`) knows no task; a task imports the engine, never the reverse except
through the registries (rewards by name, `open_r1.rewards.TASK_REWARD_MODULES`).
"""
