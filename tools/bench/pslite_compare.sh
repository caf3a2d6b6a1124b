#!/usr/bin/env bash
# shardopt against ps-lite, side by side (tools/bench/pslite_compare.py
# --help). Builds shardopt's parts first; ps-lite is built from the source
# given with --pslite in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //server:shardopt_server //python:_shardopt.so //tools/bench:shardopt_bench
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 tools/bench/pslite_compare.py \
  --server_binary=bazel-bin/server/shardopt_server \
  --bench_binary=bazel-bin/tools/bench/shardopt_bench "$@"
