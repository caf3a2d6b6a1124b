#!/usr/bin/env bash
# One short hash of the source files the GPU bundle is built from. The .git
# folder does not travel to the lent GPU machine, so gpu_check.sh compares
# this (computed there from the working tree that travelled) with the value
# make_gpu_bundle.sh wrote into the bundle: a bundle built from other sources
# is reported before any device time is spent on it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# (python/: the binding's kit carries its sources and the shardopt package.)
find WORKSPACE BUILD .bazelrc client common platforms proto python server tests third_party tools \
  -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.proto' -o -name 'BUILD' \
  -o -name 'WORKSPACE' -o -name '*.bzl' -o -name '.bazelrc' -o -path 'python/shardopt/*.py' \) \
  -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
