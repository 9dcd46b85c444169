#!/usr/bin/env bash
# Parity with PyTorch: the same inputs through PyTorch's DTensor/loss_parallel (torchrun,
# Gloo on CPU) and through ours (hp-run), compared with one process in float64.
#   run_parity.sh PYTHON BIN_DIR TP
# Exits 77 (ctest: skipped) when PYTHON is empty or has no torch, saying so.
set -euo pipefail
python="$1"; bin="$2"; tp="$3"
here="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$python" ] || ! "$python" -c 'import torch.distributed.tensor.parallel' 2>/dev/null; then
  echo "SKIP: no Python with torch (configure with -DHP_PYTHON=...; scripts/setup_and_test.sh does)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One intra-op thread per rank: these runs share the machine's cores.
export OMP_NUM_THREADS=1
"$python" "$here/pytorch_parity.py" inputs "$work" "$tp"
"$python" -m torch.distributed.run --standalone --nproc-per-node "$tp" \
  "$here/pytorch_parity.py" pytorch "$work" > "$work/pytorch.log" 2>&1 || { cat "$work/pytorch.log"; exit 1; }
for ((r = 0; r < tp; ++r)); do
  [ -f "$work/pytorch/rank$r/done" ] || { cat "$work/pytorch.log"; echo "PyTorch rank $r did not finish"; exit 1; }
done
"$bin/hp-run" --nproc-per-node "$tp" "$bin/hp-parity" "$work" > "$work/ours.log" 2>&1 || { cat "$work/ours.log"; exit 1; }
"$python" "$here/pytorch_parity.py" compare "$work"
