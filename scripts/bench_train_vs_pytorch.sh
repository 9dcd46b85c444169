#!/usr/bin/env bash
# hp-train side by side with the same job trained by PyTorch's own tensor parallelism
# (DTensor + parallelize_module with the same TP plan + loss_parallel, torchrun, Gloo):
# the same Llama, initial weights, batches, AdamW, learning-rate schedule and clipping,
# the same threads per rank, in one run. Prints tokens/s, step phases and peak memory of
# both, and the per-step losses of both, which must agree (exit 1 if not: an end-to-end
# parity test against PyTorch; apps/bench_train_compare.py states the bounds: rounding
# level over the first 10 steps, the level training amplifies rounding to after that).
#
#   scripts/bench_train_vs_pytorch.sh [--steps N] [--rounds R] [--threads T] [--tp N] [--dp N] [-- hp-train overrides]
#
# --dp N: N data-parallel replicas of TP N ranks each (an N x TP mesh) on both sides.
#
# Needs a build (scripts/setup_and_test.sh or hp_build) and the venv's Python with torch.
# HP_BENCH_KEEP=1 keeps the work folder (exports, logs, metrics) and prints where it is.
# --rounds R alternates hp-train and PyTorch R times (the machine may be shared: same-run
# ratios of alternating rounds are what to compare).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps=60 rounds=1 threads=1 tp=2 dp=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --dp) dp="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
python="$(hp_python)"
hp_require_binaries hp-run hp-train hp-export-train
# One Python start-up (~2 s of importing torch) both checks and names PyTorch.
if [ -z "$python" ] || ! torch_version="$("$python" -c 'import torch, torch.distributed.tensor.parallel; print(torch.__version__)' 2>/dev/null)"; then
  echo "SKIP: no Python with torch (set HP_PYTHON, or configure with -DHP_PYTHON=...)" >&2
  exit 77
fi
work="$(mktemp -d)"
[ -n "${HP_BENCH_KEEP:-}" ] && echo "==> keeping $work" || trap 'rm -rf "$work"' EXIT
job=(--config "$HP_ROOT/configs/debug_model.toml" --training.steps "$steps"
     --parallelism.tensor_parallel_degree "$tp" --parallelism.data_parallel_degree "$dp" --checkpoint.enable false --validation.enable false
     --metrics.enable_plot false --training.log_freq 1 "${extra[@]}")
"$bin/hp-export-train" "$work/export" "${job[@]}"
export OMP_NUM_THREADS="$threads"
for ((r = 1; r <= rounds; ++r)); do
  echo "==> round $r: hp-train (DP $dp x TP $tp, $threads thread(s) per rank, $steps steps)"
  "$bin/hp-run" --nproc-per-node "$((dp * tp))" "$bin/hp-train" "${job[@]}" --job.dump_folder "$work/hp$r" \
    > "$work/hp$r.log" 2>&1 || { cat "$work/hp$r.log"; exit 1; }
  echo "==> round $r: PyTorch $torch_version (torchrun, Gloo)"
  "$python" -m torch.distributed.run --standalone --nproc-per-node "$((dp * tp))" \
    "$HP_ROOT/apps/bench_train_pytorch.py" "$work/export" "$work/pytorch$r.json" "$dp" \
    > "$work/pytorch$r.log" 2>&1 || { cat "$work/pytorch$r.log"; exit 1; }
done
"$python" "$HP_ROOT/apps/bench_train_compare.py" "$work" "$rounds" "$threads" "$([ "$dp" -gt 1 ] && echo "$tp, DP $dp" || echo "$tp")"
