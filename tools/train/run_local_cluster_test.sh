#!/usr/bin/env bash
# Runs the launcher end to end with the binaries bazel built for this test
# (so the launcher never calls bazel itself) and checks that the job
# succeeds and reports a final loss below its initial loss.
#
# Args: <run_local_cluster.sh> <shardopt_server> <mlp_trainer>, runfiles paths.
set -euo pipefail

launcher=$1 server=$2 trainer=$3
out=$TEST_TMPDIR/launcher.out

rc=0
# 150 steps is enough to fall well below half the initial loss, and keeps
# the test around 10 s on 2 cores. Trainers accumulate 2 micro-batches per
# step, so the accumulation path trains a real model too.
bash "$launcher" --server_bin="$server" --trainer_bin="$trainer" --steps=150 --timeout=45 \
  -- --micro_batches=2 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
if ((rc != 0)); then
  echo "FAIL: the launcher exited with status $rc" >&2
  exit 1
fi

# summary: initial loss 1.3863 acc 25.0% -> final loss 0.2104 acc 93.1% (...)
summary=$(grep '^summary: ' "$out") || { echo "FAIL: no summary line" >&2; exit 1; }
initial=$(sed -E 's/.*initial loss ([0-9.]+).*/\1/' <<<"$summary")
final=$(sed -E 's/.*final loss ([0-9.]+).*/\1/' <<<"$summary")
if ! awk -v i="$initial" -v f="$final" 'BEGIN { exit !(f < i) }'; then
  echo "FAIL: final loss '$final' is not below initial loss '$initial'" >&2
  exit 1
fi
grep -q '^PASS: ' "$out" || { echo "FAIL: no PASS line from rank 0" >&2; exit 1; }
grep -q 'exited cleanly' "$out" || { echo "FAIL: the launcher did not report a clean shutdown" >&2; exit 1; }
echo "OK: initial loss $initial -> final loss $final"

# The same job under --chaos: shard servers and trainers are killed (one,
# two, all shards; a trainer; a trainer then a shard) and restarted from
# their checkpoints and journals. It must still pass, and train exactly as
# the uninterrupted run did: the same final loss to the printed digit.
chaos_out=$TEST_TMPDIR/launcher_chaos.out
rc=0
# Paced (80 ms a step: 12 s) so that all 5 kills land before the job ends.
# Checkpoints every 7 steps: the last one before the end is step 147, so only
# the end Finish saved brings restarted shards back at step 150.
CHAOS_STEP_MS=80 bash "$launcher" --server_bin="$server" --trainer_bin="$trainer" --steps=150 --timeout=90 \
  --chaos --chaos_events=5 --chaos_seed=3 --checkpoint_every=7 \
  -- --micro_batches=2 2>&1 | tee "$chaos_out" || rc=${PIPESTATUS[0]}
if ((rc != 0)); then
  echo "FAIL: the launcher under --chaos exited with status $rc" >&2
  exit 1
fi
grep -q '^PASS: ' "$chaos_out" || { echo "FAIL: no PASS line under --chaos" >&2; exit 1; }
events=$(sed -nE 's/.*chaos: ([0-9]+) kill events.*/\1/p' "$chaos_out")
[[ $events == 5 ]] || { echo "FAIL: expected 5 chaos events, saw '${events}'" >&2; exit 1; }
# After the end every shard server was killed and restarted, and the trainers
# started again: the end was saved, so they joined at the last step.
grep -q 'joined the running job at version 150$' "$chaos_out" ||
  { echo "FAIL: the trainers restarted after the end did not find it at step 150" >&2; exit 1; }
grep -q 'the trainers started again after the end finished' "$chaos_out" ||
  { echo "FAIL: no restart after the end under --chaos" >&2; exit 1; }
chaos_final=$(grep '^summary: ' "$chaos_out" | tail -n 1 | sed -E 's/.*final loss ([0-9.]+).*/\1/')
if [[ $chaos_final != "$final" ]]; then
  echo "FAIL: under --chaos the final loss is $chaos_final, uninterrupted it is $final" >&2
  exit 1
fi
echo "OK: under --chaos ($events kills) the final loss is again $chaos_final"
