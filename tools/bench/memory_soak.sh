#!/usr/bin/env bash
# Memory of shard servers under a sustained load, with the daemon's malloc
# settings (2 arenas, server/malloc_tuning.h) and with glibc's default arena
# count (MALLOC_ARENA_MAX=8 x cores), side by side in one run; then SIGTERM
# with the trainers' connections gone, timed.
#
#   bazel build -c opt //server:shardopt_server //tools/train:mlp_trainer
#   bash tools/bench/memory_soak.sh [--seconds=60] [--trainers=8] [--hidden=512,512]
#
# Prints each server's VmRSS every 10 s and the model state it holds, per
# configuration. Loopback only; everything it starts it stops.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
seconds=60
trainers=8
hidden=512,512
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds="${arg#*=}" ;;
    --trainers=*) trainers="${arg#*=}" ;;
    --hidden=*) hidden="${arg#*=}" ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
server=bazel-bin/server/shardopt_server
trainer=bazel-bin/tools/train/mlp_trainer
for b in "$server" "$trainer"; do
  [ -x "$b" ] || { echo "build $b first (see --help)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

rss_mib() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status" 2>/dev/null; }

run() {  # $1: label, $2: MALLOC_ARENA_MAX ("" for the daemon's own setting)
  local label=$1 arenas=$2 pids=() addresses=()
  for i in 0 1; do
    rm -f "$work/port$i"
    env ${arenas:+MALLOC_ARENA_MAX=$arenas} "$server" --listen=127.0.0.1:0 --port_file="$work/port$i" \
      --shard_index=$i --shard_count=2 --threads=1 --device=cpu 2> "$work/server$i.log" &
    pids+=($!)
  done
  for i in 0 1; do
    for _ in $(seq 100); do [ -s "$work/port$i" ] && break; sleep 0.1; done
    addresses+=("127.0.0.1:$(cat "$work/port$i")")
  done
  local servers; servers=$(IFS=,; echo "${addresses[*]}")
  local tpids=()
  for r in $(seq 0 $((trainers - 1))); do
    "$trainer" --servers="$servers" --rank="$r" --num_trainers="$trainers" --steps=1000000 \
      --batch=$((trainers * 2)) --hidden="$hidden" --log_every=1000000 --eval_every=1000000 \
      --model_id=soak > "$work/trainer$r.log" 2>&1 &
    tpids+=($!)
  done
  local shown=${arenas:-unset}
  echo "== $label (MALLOC_ARENA_MAX=$shown), $trainers trainers, hidden $hidden"
  for t in $(seq 10 10 "$seconds"); do
    sleep 10
    echo "  t=${t}s  shard0 $(rss_mib "${pids[0]}") MiB  shard1 $(rss_mib "${pids[1]}") MiB"
  done
  grep -h "registered model" "$work"/server*.log | sed 's/^.*registered/  registered/' | head -2
  kill -9 "${tpids[@]}" 2>/dev/null
  wait "${tpids[@]}" 2>/dev/null
  sleep 1
  echo "  idle 1 s after the trainers died: shard0 $(rss_mib "${pids[0]}") MiB  shard1 $(rss_mib "${pids[1]}") MiB"
  local start; start=$(date +%s.%N)
  kill -TERM "${pids[@]}"
  wait "${pids[@]}"
  echo "  SIGTERM to exit of both: $(echo "$(date +%s.%N) - $start" | bc) s"
}

run "daemon default" ""
run "glibc default arenas" "$(( 8 * $(nproc) ))"
