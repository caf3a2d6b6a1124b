#!/usr/bin/env bash
# Installs every Debian package shardopt needs to build, run and test.
# Idempotent: re-running it on a set-up machine only re-checks the packages.
set -euo pipefail

packages=(
  bazel-bootstrap
  build-essential
  pkg-config
  protobuf-compiler
  protobuf-compiler-grpc
  libprotobuf-dev
  libgrpc++-dev
  libgrpc-dev
  libabsl-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  nlohmann-json3-dev
  zlib1g-dev
  python3
  python3-numpy
  python3-torch
  python3-venv
  python3-dev
  pybind11-dev
  iproute2
  nftables
  procps
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present" >&2
fi

# Test tools from PyPI, in a virtual environment that also sees Debian's
# python3-torch: the reference `safetensors` loader, which the safetensors
# export test uses besides its own reader of the format. Optional: without
# network access the test runs with its own reader only (and says so).
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tools"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors" 2>/dev/null; then
  if /usr/bin/python3 -m venv --system-site-packages "$venv" &&
     timeout 300 "$venv/bin/pip" install -q --disable-pip-version-check "safetensors==0.8.0"; then
    echo "setup: $venv has safetensors for the tests" >&2
  else
    echo "setup: could not install safetensors from PyPI; its tests use their own reader" >&2
  fi
fi
