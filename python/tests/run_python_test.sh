#!/bin/sh
# Runs one Python test of the shardopt package with Debian's python3-torch
# (/usr/bin/python3). $1: the test script; $2: the shardopt_server binary;
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
exec /usr/bin/python3 "$script" "$@"
