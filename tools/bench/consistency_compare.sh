#!/usr/bin/env bash
# The three consistency modes side by side in one run: the main job's model
# (tools/train/lm_job.py) on 2 shards with 2 trainers, trainer 1 twice as
# slow, synchronous vs bounded staleness vs asynchronous
# (tools/bench/consistency_compare.py --help). Builds what it needs first.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //server:shardopt_server //python:_shardopt.so
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 \
  tools/bench/consistency_compare.py --server_binary=bazel-bin/server/shardopt_server "$@"
