#!/usr/bin/env bash
# The one prepared GPU check, for a lent GPU machine (an H200 here): no gRPC
# or Abseil libraries there, no package registry, no Bazel. It runs the
# prebuilt binaries of .gpu_bundle/ (made here by tools/gpu/make_gpu_bundle.sh
# and carried along; see that script), then the machine's own
# torch.optim.AdamW(fused=True) for comparison, and prints one short table
# last.
#
#   bash tools/gpu/gpu_check.sh [--quick] [--budget=SECONDS] [--steps=LIST]
#
# --steps=gpu,backend,e2e,nccl,pairs,emu,bench,nccl_bench,pair_bench,torch_pairs,torch,parity,san runs
# only the steps named (a short second run after a fix); the others are
# reported "not run (--steps)" and do not fail the check.
#
# Steps (each capped by its own limit and by what is left of the budget,
# default 480 s, so the summary is printed inside the device call's limit; a
# failing step does not stop the others; a step that would start with under
# 20 s left is reported "not run (budget)"):
#   1. nvidia-smi, glibc, bundle fingerprint vs the sources that travelled
#   2. fused_optimizers_test: fused kernels vs the CPU Optimizer, bit for bit,
#      bf16, device selection, buffers
#   3. gpu_backend_test: GpuBackend vs CpuBackend through ModelShard (bit for
#      bit; pipelined ranges; LAMB whole and flat, Adafactor packed; Muon
#      through cuBLAS within 1e-4, its figure in the table)
#   4. end_to_end_test: 2 trainers, 1 and 2 shards on cuda:0 vs the CPU run
#      (LAMB and Adafactor included; LAMB flat over 3 GPU shards)
#   4b. nccl_pair_test: NCCL between this process and nccl_peer on cuda:0
#      (NCCL_HOSTID apart): bytes both ways, a peer killed mid-transfer or
#      after joining, a stalled peer, a peer that never joins: each call
#      fails within its deadline
#   4c. device_pair_test's NCCL cases: 2 trainers and 2 shards on cuda:0
#      with NCCL pairs (NCCL_HOSTID apart), host and device buffers (the
#      trainers' StepOnDevice), bit-identical to the same job over gRPC
#      streams; a shard kill -9'ed mid-job (the trainers' pair calls fail in
#      time, the job ends exactly over new pairs); and a loopback case
#   5. fused_kernels_emulation_test: the same kernels' code on the CPU
#   6. gpu_bench: fused AdamW, LAMB's passes and Adafactor's step at 64M and
#      1G params vs a D2D cudaMemcpy
#   6b. nccl_bench: NCCL round trips of 64 and 256 MiB between two processes
#      on cuda:0 (socket transport over loopback) vs a D2D copy
#   6c. device_pair_bench: push + SGD + pull of 64 and 256 MiB over NCCL
#      pairs vs gRPC streams vs payload sockets, the shard on cuda:0 in its
#      own process, the trainer's buffers in host memory, then in device
#      memory
#   6d. shardopt.torch with its model on cuda:0 over NCCL pairs
#      (tools/gpu/torch_device_pairs.py): the binding compiled here against
#      this machine's Python and pybind11 (tools/gpu/build_binding.sh, from
#      the bundle's kit), two shards on cuda:0, 12 AdamW steps bit-identical
#      to the same training over the other planes
#   7. tools/gpu/torch_fused_adamw.py with the machine's python3, same sizes
#   8. tools/gpu/adafactor_torch_parity.py: the CPU Adafactor (optimizer_replay)
#      vs the machine's torch.optim.Adafactor (PyTorch 2.5+; Debian's 1.13
#      here has none), CPU tensors, 200 steps, within 1e-5; and
#      tools/gpu/muon_torch_parity.py: the CPU Muon vs torch.optim.Muon
#      (2.9+; its Newton-Schulz runs in bf16, so to bf16 level)
#   9. compute-sanitizer memcheck over the small cases of step 2
#      (SHARDOPT_GPU_TEST_SMALL=1) and over the LAMB and Adafactor cases of
#      step 3, then racecheck and synccheck over the latter (their staged
#      sums share tiles within a warp), where compute-sanitizer exists
#      (last: the numbers matter more)
# --quick skips 9 and runs 6-7 with fewer iterations.
#
# Every GPU test runs with SHARDOPT_REQUIRE_GPU=1: there, a test that finds
# no usable GPU fails instead of skipping (tests/support/gpu_required.h).
#
# Logs go to /tmp/gpu_check. When $OUT is set (the device tool brings back at
# most 8 files from it), it receives summary.txt (rewritten after every step,
# so a run cut short still leaves one) and logs.tgz only. Exit status: 0 when
# the bundle matches the sources, its libraries resolve, and steps 2-6 (4b, 4c and 6d too) passed
# (and 8 and 9 when they ran), else 1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

quick=0
budget=480
steps=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --budget=*) budget=${arg#--budget=} ;;
    --steps=*) steps=",${arg#--steps=}," ;;
    *) echo "unknown argument $arg" >&2; exit 2 ;;
  esac
done
# A misspelt step would otherwise run nothing and pass.
if [ -n "$steps" ]; then
  [ "$steps" = ",," ] && { echo "--steps names no step" >&2; exit 2; }
  for name in $(tr ',' ' ' <<<"$steps"); do
    case " gpu backend e2e nccl pairs emu bench nccl_bench pair_bench torch_pairs torch parity san " in
      *" $name "*) ;;
      *) echo "--steps: unknown step '$name' (gpu backend e2e nccl pairs emu bench nccl_bench pair_bench torch_pairs torch parity san)" >&2
         exit 2 ;;
    esac
  done
fi
deadline=$((SECONDS + budget))
bundle=.gpu_bundle
log=/tmp/gpu_check
rm -rf "$log" /tmp/gpu_check_e2e /tmp/gpu_check_pairs
mkdir -p "$log" /tmp/gpu_check_e2e /tmp/gpu_check_pairs
iters=20
[ "$quick" -eq 1 ] && iters=5
export SHARDOPT_REQUIRE_GPU=1

# The packed bundle travels (make_gpu_bundle.sh): it replaces any unpacked
# one a warm machine kept, unless that is the same bundle (its MANIFEST
# equal), whose binding a rerun then need not build again.
# (Unpacked beside it and moved into place: a bundle cut short by a killed
# run never looks whole.)
kept_bundle=0
if [ -f "$bundle.tgz" ]; then
  if [ -f "$bundle/MANIFEST" ] &&
     tar -xzOf "$bundle.tgz" "$bundle/MANIFEST" 2>/dev/null | cmp -s - "$bundle/MANIFEST"; then
    echo "(the unpacked $bundle is this $bundle.tgz's: kept)"
    kept_bundle=1
  else
    rm -rf "$bundle" "$bundle.unpacking"
    mkdir -p "$bundle.unpacking"
    tar -xzf "$bundle.tgz" -C "$bundle.unpacking" || { echo "cannot unpack $bundle.tgz"; exit 2; }
    mv "$bundle.unpacking/$bundle" "$bundle" && rm -rf "$bundle.unpacking"
  fi
fi
if [ ! -f "$bundle/run.sh" ]; then
  echo "no $bundle/run.sh: run tools/gpu/make_gpu_bundle.sh on the build machine and carry $bundle.tgz"
  exit 2
fi
# Execute bits may not survive the transfer.
chmod +x "$bundle/run.sh" "$bundle"/bin/* 2>/dev/null

overall=0
declare -A result

# Whether step $1 runs (every step without --steps); a skipped one is
# reported as such.
wanted() {
  if [ -z "$steps" ] || [[ "$steps" == *",$1,"* ]]; then return 0; fi
  result[$1]="not run (--steps)"
  return 1
}

echo "== bundle"
head -4 "$bundle/MANIFEST"
built_from=$(sed -n 's/^sources: //p' "$bundle/MANIFEST")
here_sources=$(bash tools/gpu/source_fingerprint.sh 2>/dev/null || echo unknown)
if [ -n "$built_from" ] && [ "$built_from" = "$here_sources" ]; then
  result[bundle]="built from these sources ($here_sources)"
else
  overall=1
  result[bundle]="STALE: built from ${built_from:-?}, sources here are $here_sources (rebuild it)"
fi
echo "${result[bundle]:-(not run yet)}"
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$log/nvidia-smi.csv"
ldd --version 2>&1 | head -1
# Where run.sh finds cuBLAS and NCCL (the machine's own).
SHARDOPT_SHOW_CUBLAS=1 "$bundle/run.sh" gpu_backend_test --gtest_list_tests >/dev/null 2>"$log/cublas.txt"
cat "$log/cublas.txt"
LD_LIBRARY_PATH="$PWD/$bundle/lib" ldd "$bundle/bin/fused_optimizers_test" >"$log/ldd.txt" 2>&1 || true
if grep "not found" "$log/ldd.txt"; then
  overall=1
  result[libs]="MISSING: $(grep 'not found' "$log/ldd.txt" | awk '{print $1}' | tr '\n' ' ')"
else
  result[libs]="all resolve (glibc $(ldd --version 2>&1 | head -1 | awk '{print $NF}'); $(grep -E '^lib' "$log/cublas.txt" | tr '\n' ' '))"
fi

# gtest's "[  PASSED  ] N tests." / "[  FAILED  ] N tests," / "[  SKIPPED ] N tests,".
gtest_counts() {
  local f=$1 p fl s
  p=$(grep -oE '^\[  PASSED  \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  fl=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$f" | tail -1 | grep -oE '[0-9]+')
  echo "${p:-0} passed, ${fl:-0} failed, ${s:-0} skipped"
}

# name, cap in seconds, logfile, command... Returns the command's status, or
# 125 when the budget left no room to start it.
run_step() {
  local name=$1 cap=$2 file=$3
  shift 3
  local left=$((deadline - SECONDS - 15))
  if [ "$left" -lt 20 ]; then
    echo "== $name: not run (budget)" | tee "$file"
    return 125
  fi
  local limit=$((cap < left ? cap : left))
  echo "== $name (limit ${limit} s)"
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" >"$file" 2>&1
  local rc=$?
  tail -20 "$file"
  echo "($name: exit $rc, $((SECONDS - start)) s)"
  return $rc
}

# A gtest step: counts, and any skip is a failure here (see SHARDOPT_REQUIRE_GPU).
gtest_step() {  # key, name, cap, logfile, command...
  local key=$1
  shift
  run_step "$@"
  local rc=$?
  local file=$3
  if [ $rc -eq 125 ]; then
    result[$key]="not run (budget)"
    overall=1
    return
  fi
  result[$key]="$(gtest_counts "$file") (exit $rc)"
  [ $rc -eq 0 ] || overall=1
  if grep -q '^\[  SKIPPED \]' "$file"; then
    overall=1
    result[$key]="${result[$key]}: SKIPS ON A GPU MACHINE: $(grep -m1 -B1 '^\[  SKIPPED \]' "$file" | head -1 | cut -c1-100)"
  fi
}

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

summary() {
  echo "================ gpu_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)) ================"
  printf '%-30s %s\n' "check" "result"
  printf '%-30s %s\n' "bundle" "${result[bundle]:-(not run yet)}"
  printf '%-30s %s\n' "shared libraries" "${result[libs]:-}"
  printf '%-30s %s\n' "gpu tests (bit-exact vs CPU)" "${result[gpu]:-(not run yet)}"
  printf '%-30s %s\n' "gpu backend vs cpu backend" "${result[backend]:-(not run yet)}"
  printf '%-30s %s\n' "end to end, shards on cuda:0" "${result[e2e]:-(not run yet)}"
  printf '%-30s %s\n' "nccl pair, 2 processes" "${result[nccl]:-(not run yet)}"
  printf '%-30s %s\n' "end to end over nccl pairs" "${result[pairs]:-(not run yet)}"
  printf '%-30s %s\n' "nccl round trip, 2 processes" "${result[nccl_bench]:-(not run yet)}"
  printf '%-30s %s\n' "push+pull over nccl pairs" "${result[pair_bench]:-(not run yet)}"
  printf '%-30s %s\n' "shardopt.torch, nccl pairs" "${result[torch_pairs]:-(not run yet)}"
  printf '%-30s %s\n' "emulation tests (host)" "${result[emu]:-(not run yet)}"
  printf '%-30s %s\n' "gpu_bench / torch" "${result[bench]:-(not run yet)} / ${result[torch]:-(not run yet)}"
  printf '%-30s %s\n' "adafactor vs torch.optim" "${result[adafactor]:-(not run yet)}"
  printf '%-30s %s\n' "muon vs torch.optim" "${result[muon]:-(not run yet)}"
  printf '%-30s %s\n' "muon on cuda vs cpu backend" \
    "$(grep -oE 'muon gpu vs cpu: max relative difference [^ ]+' "$log/gpu_backend_test.log" 2>/dev/null |
      awk '{print $NF}' | tr '\n' ' ')"
  printf '%-30s %s\n' "compute-sanitizer" "${result[san]:-(not run yet)}"
  echo
  awk '
    { key = $1 " " $2; ms[key] = $3; gb[key] = $4; fr[key] = $5; if (!($2 in seen)) { seen[$2] = 1; order[++count] = $2 } }
    END {
      printf "%-6s %-22s %9s %8s %7s %10s %9s\n", "params", "", "ms", "GB/s", "of copy", "torch ms", "torch/us";
      for (i = 1; i <= count; i++) {
        n = order[i]; name = (n % 1073741824 == 0) ? (n / 1073741824 "G") : (n % 1048576 == 0 ? n / 1048576 "M" : n);
        split("adamw_t1 adamw_t1_bf16 adamw_t3 lamb_measure lamb_apply adafactor_step adafactor_piece_sums adafactor_rows adafactor_column_blocks adafactor_update_sums adafactor_apply d2d_copy", kinds, " ");
        split("fused AdamW T=1|fused AdamW T=1 +bf16|fused AdamW T=3|LAMB measure pass|LAMB apply pass|Adafactor step|  its sums of p^2|  its row factors|  its column blocks|  its sums of U^2|  its apply|D2D cudaMemcpy", labels, "|");
        for (j = 1; j <= 12; j++) {
          k = kinds[j] " " n; if (!(k in ms)) continue;
          t = "torch_adamw_fused " n; tms = "-"; ratio = "-";
          if (j == 1 && (t in ms)) { tms = ms[t]; ratio = sprintf("%.2fx", ms[t] / ms[k]) }
          printf "%-6s %-22s %9.3f %8.0f %6.1f%% %10s %9s\n", name, labels[j], ms[k], gb[k], 100 * fr[k], tms, ratio
        }
      }
    }' "$log/results.txt"
  echo "(GB/s counts 28 B/param for T=1, 30 with bf16, 36 for T=3, 16 / 28 for LAMB's passes, 28 for Adafactor's step, 4 for each of its sums and factors, 12 for its apply, 8 for the copy; torch/us > 1: ours faster)"
  echo "overall: $([ $overall -eq 0 ] && echo PASS || echo FAIL); logs: $log"
}

# The summary so far, into $OUT at once: a run cut short still reports.
save_summary() {
  results "$log/bench.log" "$log/torch.log" >"$log/results.txt"
  summary >"$log/summary.txt" 2>&1
  if [ -n "${OUT:-}" ]; then cp "$log/summary.txt" "$OUT/summary.txt"; fi
}

wanted gpu && gtest_step gpu "gpu tests" 180 "$log/gpu_test.log" \
  "$bundle/run.sh" fused_optimizers_test --gtest_output="xml:$log/gpu_test.xml"
save_summary
wanted backend && gtest_step backend "gpu backend tests" 120 "$log/gpu_backend_test.log" \
  "$bundle/run.sh" gpu_backend_test
save_summary
wanted e2e && gtest_step e2e "end to end on cuda:0" 150 "$log/e2e_gpu.log" \
  env TEST_SRCDIR="$PWD/$bundle/runfiles" TEST_WORKSPACE=shardopt TEST_TMPDIR=/tmp/gpu_check_e2e \
  "$bundle/run.sh" end_to_end_test --gtest_filter='EndToEndGpuTest.*:*S2_T2*'
save_summary
# NCCL between two processes on cuda:0 (each its own NCCL_HOSTID): bytes
# both ways, and dead, stalled or absent peers failing in time.
wanted nccl && gtest_step nccl "nccl pair tests" 90 "$log/nccl_pair_test.log" \
  "$bundle/run.sh" nccl_pair_test "$PWD/$bundle/bin/nccl_peer"
save_summary
# The device data plane end to end: NCCL pairs between trainer and shard
# processes on cuda:0, against the same job over gRPC.
wanted pairs && gtest_step pairs "end to end over nccl pairs" 200 "$log/device_pair_test.log" \
  env TEST_SRCDIR="$PWD/$bundle/runfiles" TEST_WORKSPACE=shardopt TEST_TMPDIR=/tmp/gpu_check_pairs \
  "$bundle/run.sh" device_pair_test --gtest_filter='DevicePairGpuTest.*:*S3_T2*'
save_summary
wanted emu && gtest_step emu "emulation tests" 60 "$log/emulation_test.log" \
  "$bundle/run.sh" fused_kernels_emulation_test
save_summary

if wanted bench; then
  run_step "gpu_bench" 100 "$log/bench.log" "$bundle/run.sh" gpu_bench --sizes=64M,1G --iters=$iters
  rc=$?
  result[bench]="exit $rc"
  [ $rc -eq 125 ] && result[bench]="not run (budget)"
  [ $rc -eq 0 ] || overall=1
fi
save_summary

if wanted nccl_bench; then
  run_step "nccl_bench" 60 "$log/nccl_bench.log" \
    "$bundle/run.sh" nccl_bench --peer="$PWD/$bundle/bin/nccl_peer" --sizes_mib=64,256 --iters=$iters
  rc=$?
  case $rc in
    0) result[nccl_bench]=$(grep -E '^ *[0-9]+ MiB: NCCL' "$log/nccl_bench.log" |
         sed -E 's/^ *([0-9]+) MiB: NCCL round trip [^(]*\(([^ ]+) GB\/s.*NCCL at ([^%]+)%.*/\1 MiB \2 GB\/s (\3% of D2D)/' |
         tr '\n' ' ') ;;
    125) result[nccl_bench]="not run (budget)" ;;
    *) result[nccl_bench]="FAIL (exit $rc)"; overall=1 ;;
  esac
fi
save_summary

# Push + pull over NCCL pairs vs gRPC streams vs payload sockets, the shard
# on cuda:0 in its own process.
if wanted pair_bench; then
  result[pair_bench]=""
  # The trainer's buffers in host memory (a CPU trainer of GPU shards), then
  # in device memory (a GPU trainer: StepOnDevice over the pairs; the other
  # planes copy to and from the host around each step).
  for buffers in host device; do
    run_step "device_pair_bench ($buffers buffers)" 75 "$log/pair_bench_$buffers.log" \
      "$bundle/run.sh" device_pair_bench --server="$PWD/$bundle/bin/shardopt_server" \
      --device=cuda:0 --kind=nccl --sizes_mib=64,256 --rounds=2 --seconds_per_case=1 \
      "--device_buffers=$([ $buffers = device ] && echo true || echo false)"
    rc=$?
    case $rc in
      0) result[pair_bench]+="$buffers: $(grep -E '^ +[0-9]+ MiB +pairs' "$log/pair_bench_$buffers.log" |
           awk '{printf "%s MiB %s GB/s (%s grpc) ", $1, $7, $8}')" ;;
      125) result[pair_bench]+="$buffers: not run (budget) " ;;
      *) result[pair_bench]+="$buffers: FAIL (exit $rc) "; overall=1 ;;
    esac
  done
fi
save_summary

torch_py=$(command -v python3 || true)
# shardopt.torch with a CUDA model over NCCL pairs: the binding is built
# here (this machine's Python is not the one the bundle was built for).
if ! wanted torch_pairs; then
  :
elif [ -z "$torch_py" ]; then
  result[torch_pairs]="not run (no python3)"
  overall=1
else
  if [ "$kept_bundle" -eq 1 ] && compgen -G "$bundle/binding/shardopt/_shardopt*.so" >/dev/null; then
    echo "== build the binding: built by an earlier run of this bundle (kept)"
    rc=0
  else
    run_step "build the binding" 150 "$log/build_binding.log" \
      env PYTHON="$torch_py" bash tools/gpu/build_binding.sh "$bundle"
    rc=$?
  fi
  if [ $rc -eq 125 ]; then
    result[torch_pairs]="not run (budget)"
    overall=1
  elif [ $rc -ne 0 ]; then
    result[torch_pairs]="FAIL: the binding did not build ($(grep -m1 -E 'error|build_binding: no' "$log/build_binding.log" | cut -c1-100))"
    overall=1
  else
    # (run.sh gives the shards the bundle's libraries; this process keeps
    # its own C++ runtime, which torch loaded, and NCCL.)
    run_step "shardopt.torch over nccl pairs" 120 "$log/torch_pairs.log" \
      env PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/$bundle/binding" \
      LD_LIBRARY_PATH="$PWD/$bundle/binding/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      "$torch_py" tools/gpu/torch_device_pairs.py --server="$PWD/$bundle/run.sh shardopt_server" \
      --kind=nccl --device=cuda:0 --server_device=cuda:0
    rc=$?
    # (The verdict line, not the one before it that names torch and NCCL.)
    verdict=$(grep -E '^torch_device_pairs: (PASS|FAIL|SKIP)' "$log/torch_pairs.log" | tail -1 |
      cut -d' ' -f2- | cut -c1-160)
    case $rc in
      0) result[torch_pairs]="$verdict" ;;
      125) result[torch_pairs]="not run (budget)"; overall=1 ;;
      *) result[torch_pairs]="${verdict:-FAIL} (exit $rc)"; overall=1 ;;
    esac
  fi
fi
save_summary

if ! wanted torch; then
  : >"$log/torch.log"
elif [ -n "$torch_py" ]; then
  run_step "torch fused AdamW" 120 "$log/torch.log" \
    env PYTHONUNBUFFERED=1 "$torch_py" tools/gpu/torch_fused_adamw.py --sizes=64M,1G --iters=$iters
  rc=$?
  result[torch]="exit $rc"
  [ $rc -eq 125 ] && result[torch]="not run (budget)"
else
  result[torch]="not run (no python3)"
  : >"$log/torch.log"
fi
save_summary

if ! wanted parity; then
  result[adafactor]="not run (--steps)"
  result[muon]="not run (--steps)"
elif [ -n "$torch_py" ]; then
  run_step "Adafactor vs torch.optim.Adafactor" 60 "$log/adafactor.log" \
    env PYTHONUNBUFFERED=1 "$torch_py" tools/gpu/adafactor_torch_parity.py \
    --replay "$bundle/run.sh optimizer_replay"
  rc=$?
  worst=$(grep -oE 'max_rel=[^ ]+' "$log/adafactor.log" | cut -d= -f2 | sort -g | tail -1)
  case $rc in
    0) result[adafactor]="within 1e-5 (worst ${worst:-?})" ;;
    77) result[adafactor]="not run ($(grep -m1 SKIP "$log/adafactor.log" | cut -c7-80))" ;;
    125) result[adafactor]="not run (budget)" ;;
    *) result[adafactor]="FAIL (exit $rc, worst ${worst:-?})"; overall=1 ;;
  esac
  run_step "Muon vs torch.optim.Muon" 60 "$log/muon.log" \
    env PYTHONUNBUFFERED=1 "$torch_py" tools/gpu/muon_torch_parity.py \
    --replay "$bundle/run.sh optimizer_replay"
  rc=$?
  figures=$(grep -oE 'first_update_rel=[^ ]+ cosine=[^ ]+' "$log/muon.log" | tr '\n' ' ')
  case $rc in
    0) result[muon]="to bf16 level (${figures:-?})" ;;
    77) result[muon]="not run ($(grep -m1 SKIP "$log/muon.log" | cut -c7-80))" ;;
    125) result[muon]="not run (budget)" ;;
    *) result[muon]="FAIL (exit $rc: ${figures:-?})"; overall=1 ;;
  esac
else
  result[adafactor]="not run (no python3)"
  result[muon]="not run (no python3)"
fi
save_summary

sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
  ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
    /opt/nvidia/*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if ! wanted san; then
  :
elif [ "$quick" -eq 1 ]; then
  result[san]="not run (--quick)"
elif [ -z "$sanitizer" ]; then
  result[san]="not run (no compute-sanitizer)"
else
  # One sanitizer tool over one test (through run.sh, so that only the test,
  # not the sanitizer's own front end, loads the bundle's libraries; exec
  # keeps it the same process): adds "TOOL of LABEL: ..." to result[san],
  # fails the check on an error or a skip, and returns the step's status.
  # ENVIRONMENT: "" or VAR=value, for the sanitizer and the test.
  sanitize() {  # tool, label, cap, logfile, environment, test and arguments...
    local tool=$1 label=$2 cap=$3 file=$4 environment=$5
    shift 5
    # (Unquoted on purpose: an empty environment is no word.)
    run_step "compute-sanitizer $tool ($label)" "$cap" "$file" \
      env $environment "$sanitizer" --tool "$tool" --target-processes all --error-exitcode 9 \
      "$bundle/run.sh" "$@"
    local rc=$?
    local entry
    if [ $rc -eq 125 ]; then
      entry="$tool of $label: not run (budget)"
    elif grep -qiE 'device not supported|not supported on this platform' "$file"; then
      entry="$tool of $label: not run (the sanitizer refused this machine: $(grep -m1 -iE 'not supported' "$file" | cut -c1-80))"
    else
      local errors
      errors=$(grep -oE '(ERROR|RACECHECK) SUMMARY: [0-9]+ (error|hazard)' "$file" |
        grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}')
      entry="$tool of $label: $errors errors, $(gtest_counts "$file") (exit $rc)"
      [ $rc -eq 0 ] || overall=1
      grep -q '^\[  SKIPPED \]' "$file" && { overall=1; entry="$entry: SKIPS"; }
    fi
    result[san]="${result[san]:+${result[san]}; }$entry"
    save_summary
    return $rc
  }
  # The fused kernels' small cases, then LAMB's and Adafactor's passes
  # (their staged sums share tiles within a warp: racecheck and synccheck
  # too, which memcheck's view does not cover).
  if sanitize memcheck "the fused cases" 150 "$log/memcheck.log" SHARDOPT_GPU_TEST_SMALL=1 \
    fused_optimizers_test --gtest_filter='*Parity*:*Bf16*:*MaximumTrainer*:*StepCount*'; then
    for tool in memcheck racecheck synccheck; do
      sanitize "$tool" "LAMB/Adafactor" 120 "$log/${tool}_backend.log" "" \
        gpu_backend_test --gtest_filter='*Lamb*:*Adafactor*'
    done
  fi
fi

save_summary
echo
cat "$log/summary.txt"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/logs.tgz" -C /tmp gpu_check 2>/dev/null || true
fi
exit $overall
