#!/usr/bin/env bash
# run_local_cluster.sh: the shardopt "main job" on one machine.
#
# Builds the shard server and the MLP trainer (bazel build), starts
# --shards shard servers and --trainers data-parallel trainers on
# 127.0.0.1 (servers pick free ports and report them through --port_file),
# streams rank 0's progress to the terminal, and exits with rank 0's status:
# 0 only when every process succeeded and the final loss fell below half the
# initial one (the trainer checks that). Everything it starts is stopped on
# exit, error or Ctrl-C. Logs of the servers and of ranks >= 1 go to a temp
# dir, printed (tail) on failure and kept; removed after a clean run.
#
# Crash recovery is on: the servers save periodic checkpoints (every
# --checkpoint_every steps, the newest 3 kept) under the temp dir and restart
# from them (--restore_from), and each trainer journals its pushes there, so
# any server or trainer can be killed and started again with the same command.
# --chaos does exactly that during the run: it kills (SIGKILL) one, two or
# all shard servers at once, or a trainer, or a trainer and then a shard, at
# seeded random moments, restarts them, and the job must still end with PASS;
# after the end it kills every shard server once more and restarts them and the
# trainers: the end was saved (TrainerClient::Finish), so they find it there.
#
# Usage: run_local_cluster.sh [options] [-- extra mlp_trainer flags]
#   --shards=N          shard servers (env SHARDS, default 2)
#   --trainers=N        trainer processes (env TRAINERS, default 2)
#   --steps=N           training steps (env STEPS, default 300)
#   --batch=N           global batch, a multiple of --trainers (env BATCH,
#                       default 256 rounded down to one)
#   --optimizer=NAME    adamw|adam|sgd|adagrad|lion (env OPTIMIZER, default adamw)
#   --lr=X              learning rate (env LR, default: the trainer's per-optimizer one)
#   --server_bin=PATH   prebuilt shardopt_server (env SHARDOPT_SERVER_BIN)
#   --trainer_bin=PATH  prebuilt mlp_trainer (env MLP_TRAINER_BIN)
#                       Given both, nothing is built and bazel is never called.
#   --no_build          use the binaries already built (env SKIP_BUILD=1)
#   --timeout=SECONDS   limit for the training phase (env TRAIN_TIMEOUT_S, default 300)
#   --checkpoint_every=N  periodic checkpoints (env CHECKPOINT_EVERY, default 20)
#   --chaos             kill and restart servers and trainers during the run (env CHAOS=1)
#   --chaos_events=N    how many kills (env CHAOS_EVENTS, default 6)
#   --chaos_seed=N      seed of their schedule (env CHAOS_SEED, default 1); under
#                       chaos each step takes at least 30 ms (env CHAOS_STEP_MS)
#   --keep_logs         keep the temp dir even after a clean run (env KEEP_LOGS=1)
# Works from any directory: it only needs the repository to run bazel, and
# finds that from its own location.
set -euo pipefail

shards=${SHARDS:-2}
trainers=${TRAINERS:-2}
steps=${STEPS:-300}
batch=${BATCH:-}
optimizer=${OPTIMIZER:-adamw}
lr=${LR:-}
server_bin=${SHARDOPT_SERVER_BIN:-}
trainer_bin=${MLP_TRAINER_BIN:-}
skip_build=${SKIP_BUILD:-0}
train_timeout_s=${TRAIN_TIMEOUT_S:-300}
keep_logs=${KEEP_LOGS:-0}
checkpoint_every=${CHECKPOINT_EVERY:-20}
chaos=${CHAOS:-0}
chaos_events=${CHAOS_EVENTS:-6}
chaos_seed=${CHAOS_SEED:-1}
server_threads=${SERVER_THREADS:-1}  # 2-core machines: leave CPU to the trainers.
port_timeout_s=30
stop_timeout_s=10
extra_trainer_args=()

die() {
  echo "run_local_cluster: $*" >&2
  exit 2
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

value_options=" --shards --trainers --steps --batch --optimizer --lr --server_bin --trainer_bin --timeout --checkpoint_every --chaos_events --chaos_seed "
while (($# > 0)); do
  arg=$1
  shift
  case $arg in
    --) extra_trainer_args=("$@"); break ;;
    --help | -h) usage; exit 0 ;;
    --no_build) skip_build=1; continue ;;
    --keep_logs) keep_logs=1; continue ;;
    --chaos) chaos=1; continue ;;
    --*=*) name=${arg%%=*} value=${arg#*=} ;;
    --*)
      name=$arg
      [[ $value_options == *" $name "* ]] || die "unknown option '$name' (see --help)"
      (($# > 0)) || die "$name needs a value"
      value=$1
      shift
      ;;
    *) die "unexpected argument '$arg' (see --help)" ;;
  esac
  case $name in
    --shards) shards=$value ;;
    --trainers) trainers=$value ;;
    --steps) steps=$value ;;
    --batch) batch=$value ;;
    --optimizer) optimizer=$value ;;
    --lr) lr=$value ;;
    --server_bin) server_bin=$value ;;
    --trainer_bin) trainer_bin=$value ;;
    --timeout) train_timeout_s=$value ;;
    --checkpoint_every) checkpoint_every=$value ;;
    --chaos_events) chaos_events=$value ;;
    --chaos_seed) chaos_seed=$value ;;
    *) die "unknown option '$name' (see --help)" ;;
  esac
done
# The trainers need equal shares of the global batch (see batches.h).
if [[ -z $batch ]]; then
  batch=$((256 / trainers * trainers))
fi
for n in shards trainers steps batch train_timeout_s checkpoint_every chaos_events chaos_seed; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "$n must be a positive integer, got '${!n}'"
done
((batch % trainers == 0)) || die "--batch=$batch must be a multiple of --trainers=$trainers"

# Absolute paths, so that nothing depends on the caller's directory.
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ -n $server_bin && -n $trainer_bin ]]; then
  server_bin=$(absolute "$server_bin")
  trainer_bin=$(absolute "$trainer_bin")
else
  [[ -z $server_bin && -z $trainer_bin ]] ||
    die "give both --server_bin and --trainer_bin, or neither"
  repo_root=$(git -C "$script_dir" rev-parse --show-toplevel 2>/dev/null ||
    (cd "$script_dir/../.." && pwd))
  [[ -f $repo_root/WORKSPACE ]] || die "cannot find the repository root (tried $repo_root)"
  cd "$repo_root"
  targets=(//server:shardopt_server //tools/train:mlp_trainer)
  if [[ $skip_build != 1 ]]; then
    echo "run_local_cluster: building ${targets[*]}" >&2
    bazel build "${targets[@]}" || die "bazel build failed"
  fi
  bin_dir=$(bazel info bazel-bin 2>/dev/null) || die "bazel info failed"
  server_bin=$bin_dir/server/shardopt_server
  trainer_bin=$bin_dir/tools/train/mlp_trainer
fi
for bin in "$server_bin" "$trainer_bin"; do
  [[ -x $bin ]] || die "$bin is not an executable (build it, or drop --no_build)"
done

work=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/shardopt_job.XXXXXX")
server_pids=()
trainer_pids=()

# Every exit path (success, failure, set -e, Ctrl-C, SIGTERM) comes through
# here: nothing we started may outlive the script.
# shellcheck disable=SC2317  # Invoked through the trap.
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local pid live=()
  for pid in "${trainer_pids[@]}" "${server_pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      live+=("$pid")
    fi
  done
  if ((${#live[@]} > 0)); then
    local deadline=$((SECONDS + 5))
    for pid in "${live[@]}"; do
      while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "run_local_cluster: pid $pid ignored SIGTERM; killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
      fi
      wait "$pid" 2>/dev/null || true
    done
  fi
  if ((rc == 0)) && [[ $keep_logs != 1 ]]; then
    rm -rf "$work"
  else
    echo "run_local_cluster: logs kept in $work" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "run_local_cluster: interrupted; stopping everything" >&2; exit 130' INT
trap 'echo "run_local_cluster: terminated; stopping everything" >&2; exit 143' TERM

# Prints the tail of every log but rank 0's (which went to the terminal).
dump_logs() {
  local log
  for log in "$work"/*.log; do
    [[ -e $log ]] || continue
    echo "----- $(basename "$log") (last 40 lines) -----" >&2
    tail -n 40 "$log" >&2
  done
}

fail() {
  echo "run_local_cluster: FAILED: $*" >&2
  dump_logs
  exit "${fail_rc:-1}"
}

echo "run_local_cluster: $shards shard servers, $trainers trainers, $steps steps, batch $batch, $optimizer; logs in $work"
ckpt=$work/ckpt
journal=$work/journal  # Each trainer's directory in it is made by the trainer.
ports=()

# Starts (or restarts, on the port it had) shard server $1.
start_server() {
  local i=$1 listen=127.0.0.1:0
  [[ -n ${ports[i]:-} ]] && listen=127.0.0.1:${ports[i]}
  rm -f "$work/server.$i.port"
  "$server_bin" --listen="$listen" --shard_index="$i" --shard_count="$shards" \
    --threads="$server_threads" --port_file="$work/server.$i.port" \
    --checkpoint_dir="$ckpt" --checkpoint_every="$checkpoint_every" --checkpoint_keep=3 \
    --restore_from="$ckpt" >>"$work/server.$i.log" 2>&1 &
  server_pids[i]=$!
}

# Waits for shard server $1 to report its port (it restores before serving).
await_server() {
  local i=$1 deadline=$((SECONDS + port_timeout_s))
  while [[ ! -s $work/server.$i.port ]]; do
    kill -0 "${server_pids[i]}" 2>/dev/null || fail "shard server $i exited during startup"
    ((SECONDS < deadline)) || fail "shard server $i did not report its port within ${port_timeout_s}s"
    sleep 0.05
  done
  read -r port <"$work/server.$i.port"
  [[ $port =~ ^[0-9]+$ ]] || fail "shard server $i wrote a bad port '$port'"
  ports[i]=$port
}

for ((i = 0; i < shards; i++)); do start_server "$i"; done
addresses=()
for ((i = 0; i < shards; i++)); do
  await_server "$i"
  addresses+=("127.0.0.1:${ports[i]}")
done
servers=$(IFS=,; echo "${addresses[*]}")
echo "run_local_cluster: servers up at $servers"

trainer_args=(--servers="$servers" --num_trainers="$trainers" --steps="$steps" --batch="$batch"
  --optimizer="$optimizer" --journal_dir="$journal")
if [[ -n $lr ]]; then trainer_args+=(--lr="$lr"); fi
# Paced under chaos, so that the kills land in the middle of the run.
if ((chaos == 1)); then trainer_args+=(--min_step_ms="${CHAOS_STEP_MS:-30}"); fi
trainer_args+=("${extra_trainer_args[@]}")

# Starts (or restarts) trainer rank $1. Rank 0 talks to the terminal; the
# others only to their logs.
start_trainer() {
  local r=$1
  if ((r == 0)); then
    "$trainer_bin" "${trainer_args[@]}" --rank=0 &
  else
    "$trainer_bin" "${trainer_args[@]}" --rank="$r" >>"$work/trainer.$r.log" 2>&1 &
  fi
  trainer_pids[r]=$!
}
for ((r = 0; r < trainers; r++)); do start_trainer "$r"; done

declare -A trainer_rc=()

# Kills (SIGKILL) and reaps process $1.
kill_hard() {
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# Chaos: one event. The kinds take turns, so that each comes at least once
# when there are enough events: one shard, a trainer, two shards at once, a
# trainer and then (0.2-0.7 s after its restart) a shard, so that the shard
# comes back from a checkpoint older than the trainer's restart, all shards
# at once. Victims and moments come from $RANDOM (seeded).
RANDOM=$chaos_seed
chaos_kinds=(one_shard trainer two_shards trainer_then_shard all_shards)
chaos_done=0
chaos_event() {
  local kind=${chaos_kinds[chaos_done % ${#chaos_kinds[@]}]}
  local victims=() i r
  case $kind in
    one_shard) victims=($((RANDOM % shards))) ;;
    two_shards)
      i=$((RANDOM % shards))
      victims=("$i")
      if ((shards > 1)); then victims+=($(((i + 1 + RANDOM % (shards - 1)) % shards))); fi
      ;;
    all_shards) for ((i = 0; i < shards; i++)); do victims+=("$i"); done ;;
  esac
  case $kind in
    trainer | trainer_then_shard)
      r=$((RANDOM % trainers))  # (Only while no trainer has finished.)
      echo "run_local_cluster: chaos $((chaos_done + 1))/$chaos_events: kill -9 trainer $r, restart it" >&2
      kill_hard "${trainer_pids[r]}"
      start_trainer "$r"
      if [[ $kind == trainer_then_shard ]]; then
        sleep 0.$((2 + RANDOM % 6))
        i=$((RANDOM % shards))
        echo "run_local_cluster: chaos: then kill -9 shard server $i, restart it" >&2
        kill_hard "${server_pids[i]}"
        start_server "$i"
        await_server "$i"
      fi
      ;;
    *)
      echo "run_local_cluster: chaos $((chaos_done + 1))/$chaos_events: kill -9 shard server(s) ${victims[*]}, restart them" >&2
      for i in "${victims[@]}"; do kill_hard "${server_pids[i]}"; done
      for i in "${victims[@]}"; do start_server "$i"; done
      for i in "${victims[@]}"; do await_server "$i"; done
      ;;
  esac
  chaos_done=$((chaos_done + 1))
}
now_ms() { date +%s%3N; }
next_chaos=$(($(now_ms) + 1000))

# Waits for the trainers, failing fast: a trainer or server that dies leaves
# the others blocked in a pull until their RPC deadline, so don't wait for it.
# (The job's end, below, runs the trainers again: no chaos then.)
await_trainers() {
  local deadline=$((SECONDS + train_timeout_s))
  while ((${#trainer_rc[@]} < trainers)); do
    for ((r = 0; r < trainers; r++)); do
      [[ -n ${trainer_rc[$r]:-} ]] && continue
      kill -0 "${trainer_pids[r]}" 2>/dev/null && continue
      rc=0
      wait "${trainer_pids[r]}" || rc=$?
      trainer_rc[$r]=$rc
      if ((rc != 0)); then
        if ((r == 0)); then fail_rc=$rc; fi
        fail "trainer rank $r exited with status $rc"
      fi
    done
    for ((i = 0; i < shards; i++)); do
      kill -0 "${server_pids[i]}" 2>/dev/null || fail "shard server $i exited during training"
    done
    ((SECONDS < deadline)) || fail "training did not finish within ${train_timeout_s}s (--timeout)"
    if ((chaos == 1 && chaos_done < chaos_events && ${#trainer_rc[@]} == 0 && !ended)) &&
      (($(now_ms) >= next_chaos)); then
      chaos_event
      next_chaos=$(($(now_ms) + 500 + RANDOM % 1000))
    fi
    if ((${#trainer_rc[@]} < trainers)); then sleep 0.1; fi
  done
}
ended=0
await_trainers
if ((chaos == 1)); then
  echo "run_local_cluster: chaos: $chaos_done kill events (seed $chaos_seed), the job still finished"
  # The trainers saved the end (TrainerClient::Finish): shard servers killed
  # now come back at the last step, and the trainers, started again with the
  # same command, find nothing left to train.
  ended=1
  echo "run_local_cluster: chaos: after the end, kill -9 every shard server, restart them and the trainers" >&2
  for ((i = 0; i < shards; i++)); do kill_hard "${server_pids[i]}"; done
  for ((i = 0; i < shards; i++)); do start_server "$i"; done
  for ((i = 0; i < shards; i++)); do await_server "$i"; done
  trainer_rc=()
  for ((r = 0; r < trainers; r++)); do start_trainer "$r"; done
  await_trainers
  echo "run_local_cluster: chaos: the trainers started again after the end finished (rank 0 says at which version it joined)"
fi

# A clean shutdown is part of the job: a server that hangs or crashes on
# SIGTERM is a bug worth failing on.
for ((i = 0; i < shards; i++)); do
  kill -TERM "${server_pids[i]}"
done
deadline=$((SECONDS + stop_timeout_s))
for ((i = 0; i < shards; i++)); do
  while kill -0 "${server_pids[i]}" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "shard server $i did not exit within ${stop_timeout_s}s of SIGTERM"
    sleep 0.1
  done
  rc=0
  wait "${server_pids[i]}" || rc=$?
  ((rc == 0)) || fail "shard server $i exited with status $rc after SIGTERM"
done
echo "run_local_cluster: all $trainers trainers and $shards servers exited cleanly"
exit 0
