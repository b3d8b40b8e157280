#!/usr/bin/env bash
# The captioning chain detached from the calling shell, in a copy of the tree, and a way to check on it.
# For a machine whose commands are cut after a few minutes but which stays up between them (this workplace's lent
# H200: 10 min a command, given back after 30 s idle): the chain runs on as one process across commands, each later
# command waits for it and copies what it has. Runs 17a/17b and 18 (docs/CAPTIONING.md) were driven this way.
#   bash experiments/captioning/detached_chain.sh start [pipeline args ...]  # copy, start, then wait $WAIT s
#   bash experiments/captioning/detached_chain.sh exec 'COMMAND LINE'    # the same for any command (run 18's probe)
#   bash $CHAIN_DIR/experiments/captioning/detached_chain.sh wait SECONDS    # wait (end or SECONDS), copy to $OUT
# WHEELS=dir installs those wheels into $CHAIN_DIR.site first (a machine without TRL/datasets).
set -u
dir=${CHAIN_DIR:-/tmp/chain}
out=${OUT:-$dir/collected}
# `detach CMD`: copy the tree to $dir, then run CMD there as a process of its own session (setsid: it outlives the
# command that started it), writing chain.log, and $dir/DONE (rc=N) when it ends
detach() {
  if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dir.site" \
      "$WHEELS"/*.whl || exit 3
  fi
  rm -rf "$dir" && mkdir -p "$dir/out" && cp -r . "$dir"  # later commands may re-sync this tree: the chain must not see it
  cd "$dir" || exit 3
  export PYTHONPATH="$dir.site:$dir${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1  # the caller's too: wheels there
  { date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
    python3 -c "from importlib.metadata import version as v
for name in ('torch', 'transformers', 'trl'):
    try: print(name, v(name))
    except Exception: print(name, 'not installed')"; } > chain.log 2>&1
  setsid nohup bash -c "($1)"'; echo "rc=$?" > DONE' < /dev/null >> chain.log 2>&1 &  # ( ): an `exit` in CMD too
  sleep 2
  exec bash "$dir/experiments/captioning/detached_chain.sh" wait "${WAIT:-560}"
}
case "${1:-}" in
start)
  shift
  detach "python3 -m open_r1.tasks.captioning.pipeline --out out $(printf '%q ' "$@")"
  ;;
exec)  # any command line, e.g. a probe (run 18): it runs in $dir; what it writes to out/ is collected
  detach "$2"
  ;;
wait)
  limit=${2:-570}; t0=$(date +%s)
  while [ ! -f "$dir/DONE" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
  mkdir -p "$out"; cp "$dir"/out/* "$out"/ 2>/dev/null; cp "$dir/chain.log" "$out/chain_log.txt"
  for f in "$dir"/runs/*/logs/*.log; do [ -f "$f" ] && { echo "=== $f"; tail -n 40 "$f"; }; done > "$out/jobs.txt"
  cat "$dir/DONE" 2>/dev/null || echo "running"
  grep -a "\[pipeline\] stage" "$dir/chain.log" | tail -2
  ;;
*) echo "usage: $0 start [pipeline args ...] | exec 'COMMAND LINE' | wait SECONDS" >&2; exit 2 ;;
esac
