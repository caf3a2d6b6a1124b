#!/usr/bin/env bash
# shardopt against DDP-style all_reduce + local torch.optim.Adam on 2
# processes (tools/bench/ddp_compare.py --help). Builds what it needs first.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build -c opt //server:shardopt_server //python:_shardopt.so
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 tools/bench/ddp_compare.py \
  --server_binary=bazel-bin/server/shardopt_server "$@"
