#!/usr/bin/env bash
# Builds the shard server and the Python extension, then runs the two-trainer
# example with Debian's python3-torch. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build //server:shardopt_server //python:_shardopt.so
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 \
  python/examples/train_two_trainers.py --server_binary=bazel-bin/server/shardopt_server "$@"
