#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs the packages
# (tools/setup.sh), builds, starts a local cluster of 2 shard servers and 2
# trainer processes on 127.0.0.1 (free ports), trains an MLP classifier on
# generated data with progress shown, and exits 0 when the final loss is
# clearly below the initial one. Extra arguments go to the launcher
# (tools/train/run_local_cluster.sh --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec bash tools/train/run_local_cluster.sh "$@"
