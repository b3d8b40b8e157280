# Common tasks (docs/DEMO.md for the demo, README.md for the rest).
PY ?= python

.PHONY: install style quality demo demo-start test test-fast humor-demo humor-demo-start

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

# Rebuild the demo's shipped start policy (standin/captioning/start_policy: the chain's own data and pre-training
# stages on the demo's train contests); on 2 CPU cores in minutes, command, seed and time in its start_report.json.
humor-demo-start:
	$(PY) -m standin.captioning.build_start --out standin/captioning/start_policy --work runs/humor-demo-start
