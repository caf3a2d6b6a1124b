#!/usr/bin/env bash
# A trainer whose peer is replaced only after a delay (as a Kubernetes Job
# recreates a failed pod after its backoff) waits for it with
# --retry_budget_s longer than the delay, instead of failing at its
# --rpc_timeout_s; the job ends, and without the flag it does not (its error
# then names the trainer it waited for).
#
# Args: <shardopt_server> <mlp_trainer>, runfiles paths.
set -euo pipefail

server=$1 trainer=$2
work=$TEST_TMPDIR/peer_late
pids=()
ABSENCE_S=15  # Rank 1 away this long: far past a 2 s budget and its retries.
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Waits (up to 60 s) until file $1 has a line matching $2.
await_line() {
  local deadline=$((SECONDS + 60))
  until grep -q "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "FAIL: no '$2' in $1 within 60 s" >&2; cat "$1" >&2; exit 1; }
    sleep 0.1
  done
}

# One job: rank 1 is killed at step 10 and started again $ABSENCE_S s
# later; rank 0's exit status goes to $work/NAME/rank0.rc. (Not run in a
# command substitution: its processes must be this shell's, for cleanup.)
run_job() {
  local name=$1; shift
  local dir=$work/$name
  mkdir -p "$dir"
  "$server" --listen=127.0.0.1:0 --port_file="$dir/port" --threads=1 --device=cpu \
    >"$dir/server.log" 2>&1 &
  pids+=($!)
  local deadline=$((SECONDS + 30))
  until [[ -s $dir/port ]]; do
    ((SECONDS < deadline)) || { echo "FAIL: the server did not start" >&2; exit 1; }
    sleep 0.05
  done
  local common=(--servers="127.0.0.1:$(cat "$dir/port")" --num_trainers=2 --steps=60 --batch=64
    --hidden=16 --min_step_ms=100 --log_every=1 --max_loss_ratio=10 --rpc_timeout_s=2
    --journal_dir="$dir/journal" "$@")
  "$trainer" --rank=0 "${common[@]}" >"$dir/rank0.log" 2>&1 &
  local rank0=$!
  pids+=($rank0)
  "$trainer" --rank=1 "${common[@]}" >"$dir/rank1.log" 2>&1 &
  local rank1=$!
  pids+=($rank1)
  await_line "$dir/rank0.log" "^step  *10 "
  kill -9 "$rank1"
  wait "$rank1" 2>/dev/null || true
  sleep "$ABSENCE_S"
  "$trainer" --rank=1 "${common[@]}" >>"$dir/rank1.log" 2>&1 &
  pids+=($!)
  local rc=0
  wait "$rank0" || rc=$?
  echo "$rc" >"$dir/rank0.rc"
}

run_job waited --retry_budget_s=40
waited=$(cat "$work/waited/rank0.rc")
if [[ $waited != 0 ]]; then
  echo "FAIL: with --retry_budget_s=40, rank 0 exited $waited while its peer was away ${ABSENCE_S} s" >&2
  cat "$work/waited/rank0.log" >&2
  exit 1
fi
run_job gave_up
gave_up=$(cat "$work/gave_up/rank0.rc")
if [[ $gave_up == 0 ]]; then
  echo "FAIL: without --retry_budget_s, rank 0 waited out a ${ABSENCE_S} s absence on a 2 s budget" >&2
  exit 1
fi
# Its error names what it waited for (the shard's report), not a bare
# DEADLINE_EXCEEDED.
if ! grep -q "mlp_trainer rank 0: step .*waiting for trainer 1" "$work/gave_up/rank0.log"; then
  echo "FAIL: rank 0's error does not name the trainer it waited for:" >&2
  grep "mlp_trainer rank 0" "$work/gave_up/rank0.log" >&2 || true
  exit 1
fi
echo "PASS: rank 0 waited for its late peer with --retry_budget_s (exit 0) and gave up without it (exit $gave_up)"
