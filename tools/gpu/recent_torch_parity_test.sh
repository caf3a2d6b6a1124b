#!/usr/bin/env bash
# shardopt's Adafactor and Muon against torch.optim.Adafactor and
# torch.optim.Muon of a recent PyTorch (CPU tensors), the python in
# $SHARDOPT_TORCH_RECENT (tools/run_tests.sh installs it with
# tools/setup_recent_torch.sh). Without that variable (a plain `bazel test`)
# it says so and passes; with it, a python that cannot import torch fails.
# Usage: recent_torch_parity_test.sh OPTIMIZER_REPLAY ADAFACTOR_PY MUON_PY
set -uo pipefail
replay="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
python="${SHARDOPT_TORCH_RECENT:-}"
if [ -z "$python" ]; then
  echo "SKIP: SHARDOPT_TORCH_RECENT is not set (tools/run_tests.sh sets it to a recent torch)"
  exit 0
fi
"$python" -c "import torch; print('torch', torch.__version__)" ||
  { echo "FAIL: $python cannot import torch"; exit 1; }
failed=0
for script in "$2" "$3"; do
  "$python" "$script" --replay "$replay"
  rc=$?
  # 77 is "this torch lacks the optimizer": a recent torch must have both.
  [ "$rc" -eq 0 ] || { echo "FAIL: $(basename "$script") exited $rc"; failed=1; }
done
[ "$failed" -eq 0 ] && echo PASS
exit "$failed"
