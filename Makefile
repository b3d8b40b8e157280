# Common tasks (docs/DEMO.md for the demo, README.md for the rest).
PY ?= python

.PHONY: install style quality demo demo-start test test-fast humor-demo humor-demo-start humor-real-cpu

install:
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"

# Format the code (ruff format, 120 columns) and sort imports.
style:
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix --select I .

# Lint: the formatter's layout, pyflakes errors, syntax, import order, line length (config in pyproject.toml).
# `make test` runs it first.
quality:
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .

# CPU, 2 cores: the shipped warm start vs the same model after GRPO, side by side (selfcheck protocol), plots + JSON
# in runs/demo. Measured time and table: docs/DEMO.md.
demo:
	$(PY) -m open_r1.tasks.counting.demo --out runs/demo

# Rebuild the shipped warm start (open_r1/tasks/counting/demo_start) by SFT from random init; on a GPU in minutes.
demo-start:
	$(PY) -m open_r1.tasks.counting.demo --build-start open_r1/tasks/counting/demo_start --out runs/demo-start

# The whole suite (CI: .ci/run), slow end-to-end tests included, in TEST_WORKERS processes (pytest-xdist; one
# test file per worker at a time, so module fixtures are built once). Measured time in README.md.
TEST_WORKERS ?= 2
test: install quality
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15

# Without the end-to-end tests marked slow.
test-fast:
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

# humor-r1 captioning, the whole chain on CPU with tiny models on generated data (minutes), ending in the eval table:
# stand-in data -> base pre-training -> trace synthesis -> templated traces -> SFT + merge -> ratings round -> RM + blind RM
# -> GRPO -> best-of-N (standin/captioning/demo.py runs its stages around the real ones).
HUMOR_DEMO_DIR ?= runs/humor-demo
humor-demo:
	$(PY) -m standin.captioning.demo --config configs/captioning/standin_demo.yaml \
		--set work_dir=$(HUMOR_DEMO_DIR) --set data.overwrite=true
	cat $(HUMOR_DEMO_DIR)/results/results.md

# The REAL chain on CPU before renting GPUs: the public data (SOURCE: --ratings DIR or --hub DIR; a few contests do)
# -> prepare -> synthesis (the tiny policy never writes </think>: its traces are closed and counted) -> SFT + merge
# -> RM + blind RM -> GRPO -> best-of-N, with configs/captioning/real_qwen3vl2b.yaml's settings but tiny models and
# sizes.
# It shows that the data and the recipe go through; its numbers mean nothing (tests/test_prepare.py runs it).
HUMOR_REAL_CPU_DIR ?= runs/humor-real-cpu
SOURCE ?= --ratings caption-contest-data
REAL_CPU_SETS = work_dir=$(HUMOR_REAL_CPU_DIR) data_dir=$(HUMOR_REAL_CPU_DIR)/data \
	models.policy=$(HUMOR_REAL_CPU_DIR)/tiny-policy models.reward_backbone=$(HUMOR_REAL_CPU_DIR)/tiny-rm \
	synthesize.limit=4 synthesize.max_new_tokens=16 synthesize.batch_size=4 synthesize.close_unterminated=true \
	sft.max_steps=1 sft.gradient_accumulation_steps=1 rm.max_pairs=8 rm.max_steps=1 rm.per_device_batch_size=2 \
	rm.gradient_accumulation_steps=1 rm.eval_cap_per_contest=4 rm.eval_image_swaps=4 rm.eval_batch_size=8 \
	grpo.max_steps=1 grpo.num_generations=2 grpo.per_device_train_batch_size=2 grpo.gradient_accumulation_steps=1 \
	grpo.max_completion_length=16 grpo.caption_eval_max_new_tokens=16 grpo.eval_limit=2 \
	grpo.reward_kwargs.caption_rm.device=cpu \
	eval.n=2 eval.max_new_tokens=16 eval.limit=2 eval.batch_size=4 eval.n_boot=100
humor-real-cpu:
	$(PY) -m open_r1.tiny_models --family qwen3_vl --suppress-unused --out $(HUMOR_REAL_CPU_DIR)/tiny-policy
	$(PY) -m open_r1.tiny_models --family qwen2_5_vl --out $(HUMOR_REAL_CPU_DIR)/tiny-rm
	$(PY) -m open_r1.tasks.captioning.prepare $(SOURCE) --out $(HUMOR_REAL_CPU_DIR)/data --overwrite $(PREPARE)
	$(PY) -m open_r1.tasks.captioning.pipeline --config configs/captioning/real_qwen3vl2b.yaml \
		$(addprefix --set ,$(REAL_CPU_SETS))
	cat $(HUMOR_REAL_CPU_DIR)/results/results.md

# Rebuild the demo's shipped start policy (standin/captioning/start_policy: the chain's own data and pre-training
# stages on the demo's train contests); on 2 CPU cores in minutes, command, seed and time in its start_report.json.
humor-demo-start:
	$(PY) -m standin.captioning.build_start --out standin/captioning/start_policy --work runs/humor-demo-start
