#!/usr/bin/env bash
# Runs every shardopt test from a fresh Debian 12 machine: installs the
# packages (tools/setup.sh), runs `bazel test //...`, and ends with one line
# "N passed, N failed, N skipped" counting test cases (GoogleTest cases,
# shell tests; GPU cases skip themselves where there is no GPU), then runs
# each fuzzer briefly (tools/fuzz/run_fuzzers.sh), one case each, and every
# C++ test again under AddressSanitizer + UBSan
# (tools/testing/run_sanitized_tests.sh), one case per test target.
# Exit status: 0 only when every test target passed.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
bash tools/setup.sh || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }

log=$(mktemp)
# The container tests (//tests:compose_test) need a Docker engine: start one
# if none answers, and stop it at exit if we did (tools/docker_engine.sh).
extra_results=$(mktemp)
trap 'rm -f "$log" "$extra_results"; bash tools/docker_engine.sh stop' EXIT
extra=()
# The PyPI test tools setup.sh installed: the reference safetensors loader
# (SHARDOPT_PYTHON), the real grpcurl, prometheus-client, kubernetes-validate
# (SHARDOPT_VENV/bin/...).
extra+=("--test_env=SHARDOPT_PYTHON=$PWD/.venv-tools/bin/python"
        "--test_env=SHARDOPT_VENV=$PWD/.venv-tools")
# A recent PyTorch for the parity checks against torch.optim.Adafactor and
# torch.optim.Muon (Debian's 1.13 has neither); when PyPI cannot supply it,
# the test fails saying so instead of skipping.
if recent_torch=$(bash tools/setup_recent_torch.sh); then
  extra+=("--test_env=SHARDOPT_TORCH_RECENT=$recent_torch")
else
  extra+=("--test_env=SHARDOPT_TORCH_RECENT=/nonexistent/recent-torch-install-failed")
fi
docker_why=$(bash tools/docker_engine.sh start 2>&1)
docker_rc=$?
echo "$docker_why" >&2
if [ "$docker_rc" -eq 0 ]; then
  extra+=("--test_env=SHARDOPT_DOCKER=1")
else  # The last line says why.
  extra+=("--test_env=SHARDOPT_DOCKER=0" "--test_env=SHARDOPT_DOCKER_WHY=${docker_why##*$'\n'}")
fi
# Every test under the watchdog (tools/testing/watchdog.py): one that hangs
# ends, shortly before Bazel's timeout, with the stacks of its processes.
extra+=("--run_under=/usr/bin/python3 $PWD/tools/testing/watchdog.py")
bazel test //... --test_output=errors "${extra[@]}" "$@" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

# A short bounded run of every fuzzer (about a minute in all, plus the
# clang build), each counted as one test case.
bash tools/fuzz/run_fuzzers.sh --seconds="${SHARDOPT_FUZZ_SECONDS:-12}" --results="$extra_results"
# The C++ tests again, sanitized (about 15 minutes on 2 cores, mostly the
# build). SHARDOPT_SANITIZED_TESTS=0 leaves them out (a quick local run).
if [ "${SHARDOPT_SANITIZED_TESTS:-1}" != 0 ]; then
  bash tools/testing/run_sanitized_tests.sh --results="$extra_results" "${extra[@]}" "$@"
fi

python3 tools/test_summary.py --bazel_log="$log" --testlogs="$(bazel info bazel-testlogs 2>/dev/null)" \
  --extra="$extra_results"
summary_rc=$?
if [ "$bazel_rc" -ne 0 ] || [ "$summary_rc" -ne 0 ]; then
  exit 1
fi
exit 0
