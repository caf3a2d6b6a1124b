#!/usr/bin/env bash
# The one prepared GPU check, for a lent GPU machine (an H200 here): no gRPC
# or Abseil libraries there, no package registry, no Bazel. It runs the
# prebuilt binaries of .gpu_bundle/ (made here by tools/gpu/make_gpu_bundle.sh
# and carried along; see that script), then the machine's own
# torch.optim.AdamW(fused=True) for comparison, and prints one short table
# last.
#
#   bash tools/gpu/gpu_check.sh [--quick]
#
# Steps (each with a time limit; a failing step does not stop the others):
#   1. nvidia-smi: the GPU, driver, clocks (read only; nothing is changed)
#   2. fused_optimizers_test: fused kernels vs the CPU Optimizer, bit for bit,
#      bf16, device selection, buffers (all sizes; ~1 min)
#   3. fused_kernels_emulation_test: the same kernels' code on the CPU (checks
#      that the bundle runs there; a few s)
#   4. compute-sanitizer memcheck over the small cases of step 2
#      (SHARDOPT_GPU_TEST_SMALL=1), where compute-sanitizer exists
#   5. gpu_bench: fused AdamW at 64M and 1G params vs a D2D cudaMemcpy
#   6. tools/gpu/torch_fused_adamw.py with the machine's python3, same sizes
# --quick skips 4 and runs 5-6 with fewer iterations.
#
# Logs go to $OUT when it is set (the device tool brings that folder back),
# else to /tmp/gpu_check. Exit status: 0 when steps 2, 3, 5 passed (and 4 when
# it ran), else 1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

quick=0
[ "${1:-}" = "--quick" ] && quick=1
bundle=.gpu_bundle
log=${OUT:-/tmp/gpu_check}
mkdir -p "$log"
iters=20
[ "$quick" -eq 1 ] && iters=5

if [ ! -x "$bundle/run.sh" ]; then
  echo "no $bundle/run.sh: run tools/gpu/make_gpu_bundle.sh on the build machine and carry $bundle"
  exit 2
fi
echo "== bundle"
head -3 "$bundle/MANIFEST"
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$log/nvidia-smi.csv"
ldd "$bundle/bin/fused_optimizers_test" >"$log/ldd.txt" 2>&1 || true

# gtest's "[  PASSED  ] N tests." / "[  FAILED  ] N tests," / "[  SKIPPED ] N tests,".
gtest_counts() {
  local f=$1 p fl s
  p=$(grep -oE '^\[  PASSED  \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  fl=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  echo "${p:-0} passed, ${fl:-0} failed, ${s:-0} skipped"
}

overall=0
declare -A result

run_step() {  # name, timeout seconds, logfile, command...
  local name=$1 limit=$2 file=$3
  shift 3
  echo "== $name"
  local start=$SECONDS
  timeout "$limit" "$@" >"$file" 2>&1
  local rc=$?
  tail -25 "$file"
  echo "($name: exit $rc, $((SECONDS - start)) s)"
  return $rc
}

run_step "gpu tests" 600 "$log/gpu_test.log" \
  "$bundle/run.sh" fused_optimizers_test --gtest_output="xml:$log/gpu_test.xml"
rc=$?
result[gpu]="$(gtest_counts "$log/gpu_test.log") (exit $rc)"
[ $rc -eq 0 ] || overall=1
# On a GPU machine a skipped GPU test is a failed check (no usable GPU?).
if grep -q '^\[  SKIPPED \]' "$log/gpu_test.log"; then
  overall=1
  result[gpu]="${result[gpu]}: SKIPS ON A GPU MACHINE: $(grep -m1 -A1 'Skipped$' "$log/gpu_test.log" | tail -1 | cut -c1-120)"
fi

run_step "gpu backend tests" 300 "$log/gpu_backend_test.log" "$bundle/run.sh" gpu_backend_test
rc=$?
result[backend]="$(gtest_counts "$log/gpu_backend_test.log") (exit $rc)"
[ $rc -eq 0 ] || overall=1

mkdir -p "$log/e2e_tmp"
run_step "end to end on cuda:0" 300 "$log/e2e_gpu.log" \
  env TEST_SRCDIR="$PWD/$bundle/runfiles" TEST_WORKSPACE=shardopt TEST_TMPDIR="$log/e2e_tmp" \
  "$bundle/run.sh" end_to_end_test --gtest_filter='EndToEndGpuTest.*:*S2_T2*'
rc=$?
result[e2e]="$(gtest_counts "$log/e2e_gpu.log") (exit $rc)"
[ $rc -eq 0 ] || overall=1
grep -q '^\[  SKIPPED \]' "$log/e2e_gpu.log" && { overall=1; result[e2e]="${result[e2e]}: SKIPPED ON A GPU MACHINE"; }

run_step "emulation tests" 300 "$log/emulation_test.log" "$bundle/run.sh" fused_kernels_emulation_test
rc=$?
result[emu]="$(gtest_counts "$log/emulation_test.log") (exit $rc)"
[ $rc -eq 0 ] || overall=1

sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
    /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ "$quick" -eq 1 ]; then
  result[san]="not run (--quick)"
elif [ -z "$sanitizer" ]; then
  result[san]="not run (no compute-sanitizer)"
else
  run_step "compute-sanitizer memcheck (small cases)" 420 "$log/memcheck.log" \
    env SHARDOPT_GPU_TEST_SMALL=1 LD_LIBRARY_PATH="$PWD/$bundle/lib" \
    "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bundle/bin/fused_optimizers_test" \
    --gtest_filter='*Parity*:*Bf16*:*MaximumTrainer*:*StepCount*'
  rc=$?
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$log/memcheck.log" | tail -1 | grep -oE '[0-9]+')
  result[san]="${errors:-?} errors, tests $(gtest_counts "$log/memcheck.log") (exit $rc)"
  [ $rc -eq 0 ] || overall=1
fi

run_step "gpu_bench" 400 "$log/bench.log" "$bundle/run.sh" gpu_bench --sizes=64M,1G --iters=$iters
rc=$?
result[bench]="exit $rc"
[ $rc -eq 0 ] || overall=1

torch_py=$(command -v python3 || true)
if [ -n "$torch_py" ]; then
  run_step "torch fused AdamW" 400 "$log/torch.log" \
    env PYTHONUNBUFFERED=1 "$torch_py" tools/gpu/torch_fused_adamw.py --sizes=64M,1G --iters=$iters
  result[torch]="exit $?"
else
  result[torch]="not run (no python3)"
  : >"$log/torch.log"
fi

# RESULT kind=K n=N median_ms=M gbps=G ... -> "K N M G F" (F: frac_of_copy or -)
results() {
  grep -h '^RESULT ' "$@" 2>/dev/null | awk '{
    k=""; n=""; ms=""; g=""; f="-";
    for (i = 2; i <= NF; i++) { split($i, kv, "=");
      if (kv[1]=="kind") k=kv[2]; else if (kv[1]=="n") n=kv[2];
      else if (kv[1]=="median_ms") ms=kv[2]; else if (kv[1]=="gbps") g=kv[2];
      else if (kv[1]=="frac_of_copy") f=kv[2]; }
    print k, n, ms, g, f }'
}
results "$log/bench.log" "$log/torch.log" >"$log/results.txt"

echo
echo "================ gpu_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)) ================"
printf '%-30s %s\n' "check" "result"
printf '%-30s %s\n' "gpu tests (bit-exact vs CPU)" "${result[gpu]}"
printf '%-30s %s\n' "gpu backend vs cpu backend" "${result[backend]}"
printf '%-30s %s\n' "end to end, shards on cuda:0" "${result[e2e]}"
printf '%-30s %s\n' "emulation tests (host)" "${result[emu]}"
printf '%-30s %s\n' "compute-sanitizer memcheck" "${result[san]}"
printf '%-30s %s\n' "gpu_bench / torch" "${result[bench]} / ${result[torch]}"
echo
awk '
  { key = $1 " " $2; ms[key] = $3; gb[key] = $4; fr[key] = $5; if (!($2 in seen)) { seen[$2] = 1; order[++count] = $2 } }
  END {
    printf "%-6s %-22s %9s %8s %7s %10s %9s\n", "params", "", "ms", "GB/s", "of copy", "torch ms", "torch/us";
    for (i = 1; i <= count; i++) {
      n = order[i]; name = (n % 1073741824 == 0) ? (n / 1073741824 "G") : (n % 1048576 == 0 ? n / 1048576 "M" : n);
      split("adamw_t1 adamw_t1_bf16 adamw_t3 d2d_copy", kinds, " ");
      split("fused AdamW T=1|fused AdamW T=1 +bf16|fused AdamW T=3|D2D cudaMemcpy", labels, "|");
      for (j = 1; j <= 4; j++) {
        k = kinds[j] " " n; if (!(k in ms)) continue;
        t = "torch_adamw_fused " n; tms = "-"; ratio = "-";
        if (j == 1 && (t in ms)) { tms = ms[t]; ratio = sprintf("%.2fx", ms[t] / ms[k]) }
        printf "%-6s %-22s %9.3f %8.0f %6.1f%% %10s %9s\n", name, labels[j], ms[k], gb[k], 100 * fr[k], tms, ratio
      }
    }
  }' "$log/results.txt"
echo "(GB/s counts 28 B/param for T=1, 30 with bf16, 36 for T=3, 8 for the copy; torch/us > 1: ours faster)"
echo "logs: $log"
exit $overall
