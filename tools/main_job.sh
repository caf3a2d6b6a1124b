#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs the packages
# (tools/setup.sh), builds the shard server and the Python binding, starts a
# local cluster of 2 shard servers and 2 PyTorch trainer processes on
# 127.0.0.1 (free ports), trains a small transformer language model on the
# Python standard library's sources through shardopt.torch with a progress
# bar, trains the same model in one process with torch.optim for the same
# steps, writes both loss curves to out/main_job/loss.png, and exits 0 when
# the loss fell and the two curves lie on each other
# (tools/train/lm_job.py --help for its options, which it passes on).
#
#   bash tools/main_job.sh --mlp [run_local_cluster.sh options, e.g. --chaos]
# runs the C++ example instead: the MLP trainer of the C++ client library on
# spirals, with crash recovery (tools/train/run_local_cluster.sh --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [[ "${1:-}" == "--mlp" ]]; then
  shift
  exec bash tools/train/run_local_cluster.sh "$@"
fi
bazel build //server:shardopt_server //python:_shardopt.so
PYTHONPATH="$PWD/python:$PWD/bazel-bin/python" exec /usr/bin/python3 tools/train/lm_job.py \
  --server_binary=bazel-bin/server/shardopt_server "$@"
