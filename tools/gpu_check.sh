#!/usr/bin/env bash
# The prepared GPU check named in the brief: see tools/gpu/README.md.
# Build the bundle here first (bash tools/gpu/make_gpu_bundle.sh), then run
# this on the lent machine with .gpu_bundle.tgz carried along.
exec bash "$(dirname "$0")/gpu/gpu_check.sh" "$@"
