#!/usr/bin/env bash
# Does a second connection per shard help? (tools/bench/connections_compare.py
# --help). Builds the server, the Python binding and the benchmark first.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //server:shardopt_server //python:_shardopt.so //tools/bench:shardopt_bench
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 tools/bench/connections_compare.py \
  --server_binary=bazel-bin/server/shardopt_server \
  --bench_binary=bazel-bin/tools/bench/shardopt_bench "$@"
