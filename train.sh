#!/usr/bin/env bash
# Train with GRPO, then export the merged model to the submission dir.
#
#   bash train.sh [RECIPE.yaml] [--any_recipe_key value ...]
#   bash train.sh --help
#
# Environment (defaults: the recipe's model_name_or_path / dataset_name, else the users' machine layout):
#   MODEL_PATH  base model                    (recipe, else /app/models/Qwen2-VL-2B-Instruct)
#   DATA        train split, save_to_disk dir (recipe, else /app/data/train; the demo's is rendered on first use);
#               the recipe's eval_sets (ood_val, val) are taken from DATA's folder where it holds them all
#   SUBMISSION  where the merged model goes   (/app/submission where /app exists, else OUTPUT_DIR/submission)
#   OUTPUT_DIR  run dir with checkpoints      (recipe, else runs/<recipe name>)
#   NUM_GPUS    processes to launch per machine (all visible GPUs; 0 = CPU mode)
#   ZERO3       1 = DeepSpeed ZeRO-3 with zero3.json (default, also on one GPU: its fp32 master weights keep the
#               small updates that bf16 weights round away), 0 = plain DDP (faster, bf16 weights: docs/PERFORMANCE.md)
#   GPU_MEMORY_CAP_GIB  cap each process's GPU memory, e.g. 48 to emulate 48 GB cards (experiments/bench/capped_grpo.py)
#   REPLACE_SUBMISSION  1 = replace a scored submission (one holding its selfcheck.json) without comparing;
#               by default the new model is written beside it (<SUBMISSION>.candidate-<time>) with the commands
#               to score and promote it (docs/GUARANTEES.md)
# Several machines: run the same command on each, with (SLURM example: docs/USAGE.md)
#   NUM_MACHINES  machines in the run (1); each launches NUM_GPUS processes
#   MACHINE_RANK  this machine's rank, 0 .. NUM_MACHINES-1 (0); rank 0 exports once training ends
#   MAIN_ADDR     address of rank 0 (required with NUM_MACHINES > 1); MAIN_PORT its port (29500)
#   OUTPUT_DIR and SUBMISSION must then be on a filesystem every machine shares.
# A second train.sh on the same OUTPUT_DIR is refused while the first runs (OUTPUT_DIR/.train.lock).
# On a machine without a GPU it runs one CPU process (the demo: bash train.sh configs/demo.yaml).
# Every input is checked before the model loads (open_r1/validate.py). SIGTERM/SIGINT reach the trainer, which
# saves a checkpoint and stops; no export follows a stop (re-run the same command to resume, then export).
set -euo pipefail
cd "$(dirname "$0")"

usage() { sed -n '2,/^[^#]/p' "$0" | sed '$d; s/^# \{0,1\}//'; }  # the whole comment block above
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac

export TRAIN_START_TIME=$(date +%s)  # origin of time_budget durations ("55m" counts from here)
# Less allocator fragmentation between generation (large KV cache) and training (activations); every GPU number in
# docs/PERFORMANCE.md from 2026-11-30's clean bench was measured with it.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

RECIPE=${1:-configs/qwen2vl_2b_counting.yaml}
[ $# -gt 0 ] && shift
if [ ! -f "$RECIPE" ]; then
  echo "error: recipe $RECIPE not found; pass one of: $(ls configs/*.yaml | tr '\n' ' ') (bash train.sh --help)" >&2
  exit 2
fi
PYTHON=${PYTHON:-python}
recipe_value() {  # a top-level key of the recipe, empty when unset (a broken recipe is open_r1.grpo's to report)
  $PYTHON -c 'import sys, yaml; v = (yaml.safe_load(open(sys.argv[1])) or {}).get(sys.argv[2]); print("" if v is None else v)' \
    "$RECIPE" "$1" 2>/dev/null || true
}
MODEL_PATH=${MODEL_PATH:-$(recipe_value model_name_or_path)}
MODEL_PATH=${MODEL_PATH:-/app/models/Qwen2-VL-2B-Instruct}
DATA=${DATA:-$(recipe_value dataset_name)}
DATA=${DATA:-/app/data/train}
OUTPUT_DIR=${OUTPUT_DIR:-$(recipe_value output_dir)}
OUTPUT_DIR=${OUTPUT_DIR:-runs/$(basename "$RECIPE" .yaml)}
if [ -z "${SUBMISSION:-}" ]; then  # the grader's path on the users' machine (/app); elsewhere inside the run dir
  if [ -d /app ]; then SUBMISSION=/app/submission; else SUBMISSION=$OUTPUT_DIR/submission; fi
fi
export SUBMISSION  # open_r1.grpo checks up front that it can be written
# the export would move the run dir aside with the old submission: SUBMISSION inside OUTPUT_DIR is fine, not the reverse
case "$(realpath -m "$OUTPUT_DIR")/" in "$(realpath -m "$SUBMISSION")"/*)
  echo "error: SUBMISSION=$SUBMISSION is or contains OUTPUT_DIR=$OUTPUT_DIR; the export would replace the run dir." \
       "Point SUBMISSION elsewhere (default: OUTPUT_DIR/submission)" >&2
  exit 2 ;;
esac
VISIBLE_GPUS=$($PYTHON -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
NUM_GPUS=${NUM_GPUS:-$VISIBLE_GPUS}
if ! [[ "$NUM_GPUS" =~ ^[0-9]{1,4}$ ]]; then
  echo "error: NUM_GPUS=$NUM_GPUS is not a number of GPUs: set a whole number such as 1 or 8 (0 = CPU mode)," \
       "or unset it to use every visible GPU" >&2
  exit 2
fi
if [ "$NUM_GPUS" -gt "$VISIBLE_GPUS" ]; then
  echo "error: NUM_GPUS=$NUM_GPUS but this machine shows $VISIBLE_GPUS GPU(s) (torch.cuda.device_count());" \
       "set NUM_GPUS=$VISIBLE_GPUS (0 = CPU mode, e.g. bash train.sh configs/demo.yaml)" >&2
  exit 2
fi

NUM_MACHINES=${NUM_MACHINES:-1}
MACHINE_RANK=${MACHINE_RANK:-0}
MAIN_PORT=${MAIN_PORT:-29500}
if ! [[ "$NUM_MACHINES$MACHINE_RANK" =~ ^[0-9]+$ ]] || [ "$NUM_MACHINES" -lt 1 ] || [ "$MACHINE_RANK" -ge "$NUM_MACHINES" ]; then
  echo "error: NUM_MACHINES=$NUM_MACHINES MACHINE_RANK=$MACHINE_RANK: set NUM_MACHINES >= 1 and MACHINE_RANK to" \
       "this machine's rank, 0 .. NUM_MACHINES-1 (bash train.sh --help)" >&2
  exit 2
fi
if [ "$NUM_MACHINES" -gt 1 ] && { [ -z "${MAIN_ADDR:-}" ] || [ "$NUM_GPUS" -eq 0 ]; }; then
  echo "error: NUM_MACHINES=$NUM_MACHINES needs GPUs (NUM_GPUS=$NUM_GPUS) and MAIN_ADDR, the address of the" \
       "MACHINE_RANK=0 machine (SLURM: docs/USAGE.md)" >&2
  exit 2
fi

# ZeRO-3 shards gradients and optimizer state across processes and, even in one, keeps fp32 master weights
ZERO3=${ZERO3:-1}
if [ "$ZERO3" != 0 ] && [ "$ZERO3" != 1 ]; then  # any other value used to launch without DeepSpeed
  echo "error: ZERO3=$ZERO3 is not 0 or 1: set ZERO3=1 (DeepSpeed ZeRO-3, the default) or ZERO3=0 (plain DDP)" >&2
  exit 2
fi
if [ -n "${GPU_MEMORY_CAP_GIB:-}" ] \
   && ! [[ "$GPU_MEMORY_CAP_GIB" =~ ^[0-9]*\.?[0-9]+$ && "$GPU_MEMORY_CAP_GIB" =~ [1-9] ]]; then
  echo "error: GPU_MEMORY_CAP_GIB=$GPU_MEMORY_CAP_GIB is not a positive number of GiB: set e.g. 48, or unset it" \
       "(no cap)" >&2
  exit 2
fi

# One run at a time per OUTPUT_DIR (a second would interleave its checkpoints with the first's): machine 0 locks
# OUTPUT_DIR/.train.lock until every process it starts has ended (they inherit the lock). Needs flock (util-linux);
# an OUTPUT_DIR that cannot be written is left to the checks in open_r1.grpo, which name the fix.
LOCK=$OUTPUT_DIR/.train.lock
if [ "$MACHINE_RANK" -eq 0 ] && command -v flock >/dev/null && mkdir -p "$OUTPUT_DIR" 2>/dev/null \
   && { exec 9>>"$LOCK"; } 2>/dev/null; then
  if ! flock -n 9; then
    echo "error: another train.sh (pid $(cat "$LOCK" 2>/dev/null)) is training into OUTPUT_DIR=$OUTPUT_DIR; wait for" \
         "it to end, or use another OUTPUT_DIR" >&2
    exit 2
  fi
  echo $$ > "$LOCK"
fi

# A clean clone has no data for the demo recipe: render the demo's train split (open_r1.tasks.counting.demo's scenes).
if [ "$DATA" = runs/demo/data/train ] && [ ! -e "$DATA" ]; then
  echo "[train.sh] rendering the demo's training scenes into runs/demo/data (first use)"
  $PYTHON -m open_r1.tasks.counting.scenes --out runs/demo/data --splits train --train 400 --image-size 168x112 \
    --min-objects 1 --max-objects 5 --no-progress --overwrite  # only the missing train split
fi

# The recipe's eval sets are named by their split (ood_val, val): where DATA's folder holds all of them, they are
# taken from there, so DATA=<dir>/train brings its own held-out splits (docs/USAGE.md). --eval_sets overrides.
EVAL_ARGS=()
if [[ " $* " != *" --eval_sets "* ]]; then
  mapfile -t EVAL_SETS < <($PYTHON -c '
import os, sys, yaml
sets = (yaml.safe_load(open(sys.argv[1])) or {}).get("eval_sets") or []
sets = [sets] if isinstance(sets, str) else sets
moved = [os.path.join(os.path.dirname(sys.argv[2]), os.path.basename(os.path.normpath(s))) for s in sets]
if moved != sets and all(os.path.isdir(m) for m in moved):
    print("\n".join(moved))' "$RECIPE" "$DATA" 2>/dev/null || true)
  if [ ${#EVAL_SETS[@]} -gt 0 ]; then
    EVAL_ARGS=(--eval_sets "${EVAL_SETS[@]}")
    echo "[train.sh] eval_sets from DATA's folder: ${EVAL_SETS[*]}"
  fi
fi
ARGS=(--config "$RECIPE" --model_name_or_path "$MODEL_PATH" --dataset_name "$DATA" --output_dir "$OUTPUT_DIR"
      "${EVAL_ARGS[@]}" "$@")
echo "[train.sh] recipe=$RECIPE model=$MODEL_PATH data=$DATA output=$OUTPUT_DIR gpus=$NUM_GPUS" \
     "machine=$MACHINE_RANK/$NUM_MACHINES submission=$SUBMISSION"

# Run a child in the background and wait for it, forwarding SIGTERM/SIGINT: the trainer's graceful stop saves a
# checkpoint at the end of the step (a shell killed alone would leave it orphaned, never saving).
CHILD=""
SIGNALLED=""
forward() {
  SIGNALLED=$1
  echo "[train.sh] $1 received: asking the trainer to save a checkpoint and stop" >&2
  # SIGTERM for both: background children of a non-interactive shell start with SIGINT ignored.
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null || true
}
trap 'forward SIGTERM' TERM
trap 'forward SIGINT' INT
run_child() {
  "$@" &
  CHILD=$!
  local rc=0
  while true; do
    rc=0
    wait "$CHILD" || rc=$?
    # wait returns >128 when a trapped signal interrupts it; the child is still running then
    if kill -0 "$CHILD" 2>/dev/null; then continue; fi
    break
  done
  CHILD=""
  return "$rc"
}

RC=0
GRPO_MODULE=open_r1.grpo
if [ -n "${GPU_MEMORY_CAP_GIB:-}" ]; then GRPO_MODULE=experiments.bench.capped_grpo; fi  # the same entry, capped
if [ "$NUM_GPUS" -eq 0 ]; then
  run_child $PYTHON -m $GRPO_MODULE "${ARGS[@]}" --use_cpu true || RC=$?
else
  # --quiet: a failed run ends with its own error line, not the launcher's traceback (several GPUs: torch's summary)
  LAUNCH=($PYTHON -m accelerate.commands.launch --quiet --num_processes $((NUM_GPUS * NUM_MACHINES))
          --num_machines "$NUM_MACHINES" --machine_rank "$MACHINE_RANK" --main_process_port "$MAIN_PORT")
  [ -n "${MAIN_ADDR:-}" ] && LAUNCH+=(--main_process_ip "$MAIN_ADDR")
  if [ "$ZERO3" = "1" ]; then
    ARGS+=(--deepspeed zero3.json)
  fi
  run_child "${LAUNCH[@]}" -m $GRPO_MODULE "${ARGS[@]}" || RC=$?
fi
if [ -n "$SIGNALLED" ] || [ "$RC" -ge 128 ]; then
  echo "[train.sh] training stopped by ${SIGNALLED:-a signal} (exit $RC): no export. The last checkpoint is in" \
       "$OUTPUT_DIR; re-run the same command to resume, or export it: $PYTHON -m open_r1.submission.export --checkpoint" \
       "$OUTPUT_DIR --out $SUBMISSION" >&2
  case "$SIGNALLED" in SIGINT) exit 130 ;; SIGTERM) exit 143 ;; esac
  exit "$RC"
fi
if [ "$RC" -ne 0 ]; then
  exit "$RC"
fi

if [ "$MACHINE_RANK" -ne 0 ]; then
  echo "[train.sh] done on machine $MACHINE_RANK; machine 0 exports the model to $SUBMISSION"
  exit 0
fi
EXPORT_ARGS=(--checkpoint "$OUTPUT_DIR" --out "$SUBMISSION")
[ "${REPLACE_SUBMISSION:-0}" = "1" ] && EXPORT_ARGS+=(--replace)
RC=0
run_child $PYTHON -m open_r1.submission.export "${EXPORT_ARGS[@]}" || RC=$?
if [ "$RC" -ne 0 ]; then
  exit "$RC"
fi
SETS=""  # the held-out splits beside the train split (selfcheck's own default: /app/data/val and ood_val)
for s in val compositional ood_val; do [ -d "$(dirname "$DATA")/$s" ] && SETS="$SETS $(dirname "$DATA")/$s"; done
echo "[train.sh] done. Next: python selfcheck.py --model $SUBMISSION${SETS:+ --sets$SETS} (or the candidate path printed above)"
