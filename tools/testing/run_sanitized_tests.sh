#!/usr/bin/env bash
# Runs every C++ test (cc_test) again, built with AddressSanitizer + UBSan
# (`--config=asan` of .bazelrc: gcc, the default toolchain), so that a use
# after free, an overflow or undefined behaviour in the server, the client
# or the tests fails the run instead of passing by luck. The server
# processes the tests start are the sanitized build too. CUDA is left out
# (nvcc's archives are not instrumented): its targets are skipped here.
#
#   bash tools/testing/run_sanitized_tests.sh [--results=FILE] [bazel test flags...]
#
# An output base of its own (the main build keeps its cache). Writes one
# "PASSED asan:<target>" / "FAILED asan:<target>" line per test target to
# --results=FILE if given (tools/test_summary.py --extra). Leaks are not
# checked (gRPC's and Abseil's process-lifetime allocations would drown
# them). Exit status 1 when a target failed or did not build.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

results=""
flags=()
for arg in "$@"; do
  case "$arg" in
    --results=*) results="${arg#*=}" ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) flags+=("$arg") ;;
  esac
done

output_base="${SHARDOPT_ASAN_OUTPUT_BASE:-$HOME/.cache/shardopt-asan-bazel/$(pwd | md5sum | cut -c1-12)}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "asan: building and running the C++ tests with AddressSanitizer and UBSan" >&2
# --symlink_prefix=/: no bazel-bin / bazel-testlogs links into this output
# base, which would replace the main build's.
# Each top-level package tree by name: `//...` would descend into the main
# build's bazel-<workspace> links, foreign to this output base. (Not the
# container test: its images would need the sanitizer runtimes.)
patterns=(//:all)
for dir in $(find . -mindepth 2 -name BUILD -not -path './bazel-*' -not -path './.*' |
             cut -d/ -f2 | sort -u); do
  patterns+=("//$dir/...")
done
bazel --output_base="$output_base" test --config=asan --symlink_prefix=/ \
  --repo_env=CUDA_PATH=/nonexistent --test_lang_filters=cc --test_output=errors --keep_going \
  --build_tests_only \
  "${flags[@]}" -- "${patterns[@]}" -//tests:compose_test 2>&1 | tee "$log" |
  grep -E '^(//|ERROR|Executed)'
rc=${PIPESTATUS[0]}
bazel --output_base="$output_base" shutdown >/dev/null 2>&1
# What the failed ones printed (the sanitizer's report among it).
sed -n '/^==================== Test output for/,/^=\{40,\}$/p' "$log" | tail -1000 >&2

# "//target  PASSED in 1.2s" (or FAILED, TIMEOUT, NO STATUS, FAILED TO BUILD).
results_lines=$(sed -nE 's#^(//[^ ]+) +(\(cached\) +)?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY|FAILED TO BUILD|INCOMPLETE)\b.*#\3 \1#p' "$log" |
  sed -E 's#^(FAILED TO BUILD|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE) #FAILED #')
# 0: all passed; 3: some tests failed (each has its line). Anything else (a
# target that did not build, an interrupted or failed build) is a failure
# of its own, whatever the tests that ran said.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
  results_lines+="${results_lines:+$'\n'}FAILED //...:build(bazel exit status $rc)"
fi
if [ -n "$results" ]; then
  while read -r result target; do echo "$result asan:$target"; done <<< "$results_lines" >> "$results"
fi
passed=$(grep -c '^PASSED' <<< "$results_lines")
failed=$(grep -vc '^PASSED' <<< "$results_lines")
echo "asan: $passed test targets passed, $failed failed" >&2
[ "$rc" -eq 0 ] && [ "$failed" -eq 0 ]
