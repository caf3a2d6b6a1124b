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
