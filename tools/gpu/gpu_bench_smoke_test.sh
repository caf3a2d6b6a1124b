#!/usr/bin/env bash
# Smoke test of gpu_bench (see BUILD).
set -uo pipefail
bench="$1"
out=$("$bench" --sizes=1M,3K --iters=3 --warmup=1 2>&1)
rc=$?
echo "$out"
if [ "$rc" -eq 3 ]; then
  echo "SKIP: no usable GPU here (gpu_bench exited 3, as it should)"
  grep -q "no CUDA GPU\|no usable CUDA GPU" <<<"$out" || { echo "FAIL: no reason given"; exit 1; }
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "FAIL: gpu_bench exited $rc"; exit 1; }
for kind in adamw_t1 adamw_t1_bf16 adamw_t3 d2d_copy; do
  n=$(grep -c "^RESULT kind=$kind " <<<"$out")
  [ "$n" -eq 2 ] || { echo "FAIL: $n RESULT lines for $kind, want 2"; exit 1; }
done
echo PASS
