#!/usr/bin/env bash
# Runs every shardopt test from a fresh Debian 12 machine: installs the
# packages (tools/setup.sh), runs `bazel test //...`, and ends with one line
# "N passed, N failed, N skipped" counting test cases (GoogleTest cases,
# shell tests; GPU cases skip themselves where there is no GPU).
# Exit status: 0 only when every test target passed.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
bash tools/setup.sh || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
extra=()
# The reference safetensors loader, when setup.sh could install it.
if [ -x .venv-tools/bin/python ]; then extra+=("--test_env=SHARDOPT_PYTHON=$PWD/.venv-tools/bin/python"); fi
bazel test //... --test_output=errors "${extra[@]}" "$@" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

python3 tools/test_summary.py --bazel_log="$log" --testlogs="$(bazel info bazel-testlogs 2>/dev/null)"
summary_rc=$?
if [ "$bazel_rc" -ne 0 ] || [ "$summary_rc" -ne 0 ]; then
  exit 1
fi
exit 0
