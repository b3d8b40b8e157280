# Common tasks. `make demo` runs the whole job on the embedded default; `make test` installs and runs the tests.
PY ?= python
DEMO_DATA ?= data
TINY_MODEL ?= models/tiny-qwen2vl

.PHONY: install data tiny-model demo test test-fast

install:
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e ".[dev]"

# Small default split set for the demo (CLEVR-style train/val/compositional + OOD renderer).
data: $(DEMO_DATA)/train/dataset_info.json
$(DEMO_DATA)/train/dataset_info.json:
	$(PY) -m open_r1.tasks.counting.scenes --out $(DEMO_DATA) --train 512 --val 64 --compositional 64 --ood-val 64 --seed 0

tiny-model: $(TINY_MODEL)/config.json
$(TINY_MODEL)/config.json:
	$(PY) -m open_r1.tiny_models --out $(TINY_MODEL)

# End to end on CPU: data -> tiny model -> GRPO -> export -> selfcheck table.
demo: data tiny-model
	MODEL_PATH=$(TINY_MODEL) DATA=$(DEMO_DATA)/train SUBMISSION=submission OUTPUT_DIR=runs/demo NUM_GPUS=0 \
		bash train.sh configs/demo.yaml
	$(PY) selfcheck.py --model submission --sets $(DEMO_DATA)/val $(DEMO_DATA)/compositional $(DEMO_DATA)/ood_val \
		--limit 32 --batch-size 16

test: install
	$(PY) -m pytest -q

test-fast:
	$(PY) -m pytest -q -m "not slow"
