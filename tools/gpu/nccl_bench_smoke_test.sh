#!/usr/bin/env bash
# Smoke test of nccl_bench (see BUILD): where there is no GPU it must say so
# and exit 3 (the test then passes, printing SKIP); with one, print both
# RESULT lines for a small size.
set -uo pipefail
out=$("$1" --peer="$2" --sizes_mib=1 --iters=2 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 3 ]; then
  echo "SKIP: no usable GPU or NCCL here (nccl_bench exited 3, as it should)"
  grep -q "no usable CUDA GPU\|NCCL could not be loaded" <<<"$out" || { echo "FAIL: no reason given"; exit 1; }
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "FAIL: nccl_bench exited $rc"; exit 1; }
for kind in nccl_round_trip d2d_copy_both_ways; do
  grep -q "^RESULT kind=$kind n=1048576 " <<<"$out" || { echo "FAIL: no RESULT line for $kind"; exit 1; }
done
echo PASS
