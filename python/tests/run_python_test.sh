#!/bin/sh
# Runs one Python test of the shardopt package with Debian's python3-torch
# (/usr/bin/python3), or a recent torch where the test's BUILD sets
# SHARDOPT_RUN_WITH_RECENT_TORCH=1. $1: the test script; $2: the shardopt_server binary;
# $3: the built extension (_shardopt.so); the rest go to the script. Runs in
# the runfiles root.
set -e
script=$1
export SHARDOPT_SERVER="$PWD/$2"
ext_dir=$(dirname "$PWD/$3")
shift 3
# The package from the source tree, the extension from the build tree.
export PYTHONPATH="$PWD/python:$ext_dir:$PWD/python/tests"
# torch's kernels without fused multiply-add: the servers' operation order.
export ATEN_CPU_CAPABILITY=default
python=/usr/bin/python3
# A test of optimizers torch 1.13 lacks runs with a recent torch
# (tools/setup_recent_torch.sh; tools/run_tests.sh passes it).
if [ "${SHARDOPT_RUN_WITH_RECENT_TORCH:-0}" = 1 ]; then
  if [ -z "${SHARDOPT_TORCH_RECENT:-}" ]; then
    echo "SKIP: SHARDOPT_TORCH_RECENT is not set (tools/run_tests.sh sets it to a recent torch)"
    exit 0
  fi
  python=$SHARDOPT_TORCH_RECENT
fi
# Under a watchdog that prints every process's stacks if the test hangs
# (tools/testing/watchdog.py); unbuffered, and with faulthandler, whose
# Python stacks the watchdog's SIGABRT prints.
exec /usr/bin/python3 "$PWD/tools/testing/watchdog.py" "$python" -u -X faulthandler "$script" "$@"
