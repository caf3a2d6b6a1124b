#!/usr/bin/env bash
# Installs a recent PyTorch from PyPI into .venv-torch-recent for the parity
# checks against optimizers Debian's torch 1.13 lacks (torch.optim.Adafactor,
# torch.optim.Muon: //tools/gpu:recent_torch_parity_test). Pinned to the
# version the lent GPU machine has, so that both check the same formulas.
# PyPI's Linux wheel brings its CUDA libraries (about 4.7 GB installed); they
# are not used: the checks run on CPU tensors.
# Prints the venv's python on stdout when it is ready; exit 1 (with why on
# stderr) when it cannot be installed.
set -euo pipefail
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-torch-recent"
torch_version="2.11.0"
numpy_version="2.2.6"
ready() {
  "$venv/bin/python" -c "import sys, torch, numpy; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null
}
if [ ! -x "$venv/bin/python" ] || ! ready; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  if ! timeout 900 "$venv/bin/pip" install -q --disable-pip-version-check \
      "torch==$torch_version" "numpy==$numpy_version" >&2 || ! ready; then
    echo "setup_recent_torch: cannot install torch==$torch_version from PyPI into $venv" >&2
    exit 1
  fi
  echo "setup_recent_torch: $venv has torch $torch_version" >&2
fi
echo "$venv/bin/python"
