#!/usr/bin/env bash
# Train with GRPO, then export the merged model to the submission dir.
#
#   bash train.sh [RECIPE.yaml] [--any_recipe_key value ...]
#
# Environment (defaults are the users' machine layout):
#   MODEL_PATH  base model                    (/app/models/Qwen2-VL-2B-Instruct)
#   DATA        train split, save_to_disk dir (/app/data/train)
#   SUBMISSION  where the merged model goes   (/app/submission)
#   OUTPUT_DIR  run dir with checkpoints      (runs/<recipe name>)
#   NUM_GPUS    processes to launch           (all visible GPUs; 0 = CPU mode)
#   ZERO3       1 = DeepSpeed ZeRO-3 with zero3.json on GPUs (default 1), 0 = plain DDP
# On a machine without a GPU it runs one CPU process (the demo: bash train.sh configs/demo.yaml).
set -euo pipefail
cd "$(dirname "$0")"
export TRAIN_START_TIME=$(date +%s)  # origin of time_budget durations ("55m" counts from here)
# Less allocator fragmentation between generation (large KV cache) and training (activations); every GPU number in
# docs/PERFORMANCE.md from 2026-11-30's clean bench was measured with it.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

RECIPE=${1:-configs/qwen2vl_2b_counting.yaml}
[ $# -gt 0 ] && shift
if [ ! -f "$RECIPE" ]; then
  echo "error: recipe $RECIPE not found; pass one of: $(ls configs/*.yaml | tr '\n' ' ')" >&2
  exit 2
fi
MODEL_PATH=${MODEL_PATH:-/app/models/Qwen2-VL-2B-Instruct}
DATA=${DATA:-/app/data/train}
SUBMISSION=${SUBMISSION:-/app/submission}
OUTPUT_DIR=${OUTPUT_DIR:-runs/$(basename "$RECIPE" .yaml)}
ZERO3=${ZERO3:-1}
PYTHON=${PYTHON:-python}

if [ -z "${NUM_GPUS:-}" ]; then
  NUM_GPUS=$($PYTHON -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
fi

ARGS=(--config "$RECIPE" --model_name_or_path "$MODEL_PATH" --dataset_name "$DATA" --output_dir "$OUTPUT_DIR" "$@")
echo "[train.sh] recipe=$RECIPE model=$MODEL_PATH data=$DATA output=$OUTPUT_DIR gpus=$NUM_GPUS submission=$SUBMISSION"

if [ "$NUM_GPUS" -eq 0 ]; then
  $PYTHON -m open_r1.grpo "${ARGS[@]}" --use_cpu true
else
  LAUNCH=($PYTHON -m accelerate.commands.launch --num_processes "$NUM_GPUS" --num_machines 1 --machine_rank 0 --main_process_port "${MAIN_PORT:-29500}")
  if [ "$ZERO3" = "1" ]; then
    ARGS+=(--deepspeed zero3.json)
  fi
  "${LAUNCH[@]}" -m open_r1.grpo "${ARGS[@]}"
fi

$PYTHON -m open_r1.export --checkpoint "$OUTPUT_DIR" --out "$SUBMISSION"
echo "[train.sh] done: submission in $SUBMISSION. Next: python selfcheck.py --model $SUBMISSION"
