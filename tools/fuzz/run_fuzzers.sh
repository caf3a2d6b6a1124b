#!/usr/bin/env bash
# Builds the fuzz targets of tools/fuzz with clang-14, libFuzzer and
# AddressSanitizer + UndefinedBehaviorSanitizer (`--config=fuzz`, in an
# output base of its own so the main build keeps its cache) and runs each one
# for a bounded time, starting from a scratch copy of its committed seeds.
#
#   bash tools/fuzz/run_fuzzers.sh                  # 12 s each (what CI runs)
#   bash tools/fuzz/run_fuzzers.sh --seconds=3600   # a long run
#   bash tools/fuzz/run_fuzzers.sh --seconds=600 service_fuzzer
#
# Prints one line per fuzzer (executions, corpus size, result) and writes
# "PASSED <fuzzer>" / "FAILED <fuzzer>" lines to --results=FILE if given.
# A crash leaves its reproducer in --artifacts=DIR (default /tmp/shardopt-fuzz/
# artifacts); replay it with the seeds test's binary, e.g.
#   bazel build //tools/fuzz:service_fuzzer && bazel-bin/tools/fuzz/service_fuzzer FILE
# Exit status 1 when a fuzzer crashed or did not build.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

seconds=12
results=""
work=/tmp/shardopt-fuzz
artifacts="$work/artifacts"
fuzzers=()
for arg in "$@"; do
  case "$arg" in
    --seconds=*) seconds="${arg#*=}" ;;
    --results=*) results="${arg#*=}" ;;
    --artifacts=*) artifacts="${arg#*=}" ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) fuzzers+=("$arg") ;;
  esac
done
if [ "${#fuzzers[@]}" -eq 0 ]; then
  fuzzers=(service_fuzzer pull_frame_fuzzer checkpoint_fuzzer safetensors_fuzzer text_fuzzer)
fi

# One output base per checkout (an output base belongs to one workspace).
output_base="${SHARDOPT_FUZZ_OUTPUT_BASE:-$HOME/.cache/shardopt-fuzz-bazel/$(pwd | md5sum | cut -c1-12)}"
targets=()
for f in "${fuzzers[@]}"; do targets+=("//tools/fuzz:$f"); done
record() { [ -n "$results" ] && echo "$1 fuzz:$2" >> "$results"; return 0; }

if ! command -v clang-14 >/dev/null || [ ! -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  echo "fuzz: clang-14 and libclang-rt-14-dev are needed (tools/setup.sh installs them)" >&2
  for f in "${fuzzers[@]}"; do record FAILED "$f"; done
  exit 1
fi
echo "fuzz: building ${fuzzers[*]} with clang, libFuzzer, ASan and UBSan" >&2
# --symlink_prefix=/: no bazel-bin / bazel-<workspace> links into this output
# base, which would replace the main build's (and make `bazel build //...`
# descend into the fuzz build's tree).
if ! bazel --output_base="$output_base" build --config=fuzz --symlink_prefix=/ "${targets[@]}" 2>&1 | tail -3; then
  for f in "${fuzzers[@]}"; do record FAILED "$f"; done
  bazel --output_base="$output_base" shutdown >/dev/null 2>&1
  exit 1
fi
bin="$(bazel --output_base="$output_base" info --config=fuzz bazel-bin 2>/dev/null)"
bazel --output_base="$output_base" shutdown >/dev/null 2>&1

mkdir -p "$artifacts"
status=0
printf '%-20s %12s %10s %8s  %s\n' fuzzer executions exec/s corpus result
for f in "${fuzzers[@]}"; do
  corpus="$work/corpus/$f"
  rm -rf "$corpus"
  mkdir -p "$corpus"
  cp tools/fuzz/corpus/"$f"/* "$corpus"/
  log="$work/$f.log"
  # -timeout: one input running for 10 s is a hang; -rss_limit_mb: a leak.
  "$bin/tools/fuzz/$f" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$artifacts/$f-" \
    "$corpus" > "$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  size=$(ls "$corpus" | wc -l)
  if [ "$rc" -eq 0 ]; then
    result=ok
    record PASSED "$f"
  else
    result="CRASHED (exit $rc; reproducer in $artifacts, log $log)"
    grep -m5 -E "ERROR|SUMMARY|deadly|Timeout|out-of-memory" "$log" >&2
    record FAILED "$f"
    status=1
  fi
  printf '%-20s %12s %10s %8s  %s\n' "$f" "${runs:-?}" "${rate:-?}" "$size" "$result"
done
exit "$status"
