#!/usr/bin/env bash
# Under torchrun, the rank that failed is the one torchrun names: a checkpoint whose rank-1 file is
# corrupted fails rank 1 (its CRC check), rank 0 stops only because rank 1 did; torchrun's summary
# must name rank 1 as the root cause, with its message, read from the error file hp-train writes
# (TORCHELASTIC_ERROR_FILE), not rank 0 with "error_file: <N/A>".
# Usage: torchrun_error_file_test.sh PYTHON BIN_DIR; exit 77 (skip) when no Python is configured.
set -euo pipefail
python="$1" bin="$2"
if [ -z "$python" ]; then
  echo "SKIP: no Python configured (HP_PYTHON): torchrun is the one in its environment"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/hp_torchrun_error_file_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
args=(--training.dtype float32 --parallelism.tensor_parallel_degree 2 --model.dim 32 --model.n_layers 2
  --model.n_heads 4 --model.vocab_size 515 --training.batch_size 4 --training.seq_len 16 --validation.enable false
  --metrics.enable_plot false --checkpoint.enable --checkpoint.interval 2 --job.dump_folder "$work/run")
"$bin/hp-run" --nproc-per-node 2 "$bin/hp-train" "${args[@]}" --training.steps 2 >"$work/first.log" 2>&1 ||
  { cat "$work/first.log"; echo "FAILED: the run that writes the checkpoint"; exit 1; }
"$python" - "$work/run/checkpoints/step-2/rank-1.pt" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0xFF
open(path, "wb").write(bytes(data))
PY
set +e
"$(dirname "$python")/torchrun" --no-python --nproc-per-node 2 "$bin/hp-train" "${args[@]}" --training.steps 4 \
  --checkpoint.resume >"$work/torchrun.log" 2>&1
status=$?
set -e
[ "$status" -ne 0 ] || { cat "$work/torchrun.log"; echo "FAILED: torchrun succeeded on a corrupted checkpoint"; exit 1; }
root="$(sed -n '/Root Cause (first observed failure):/,/^====/p' "$work/torchrun.log")"
echo "$root"
grep -q "rank      : 1 (local_rank: 1)" <<<"$root" || { echo "FAILED: torchrun's root cause is not rank 1"; exit 1; }
grep -q "error_file: <N/A>" <<<"$root" && { echo "FAILED: rank 1 wrote no error file for torchrun"; exit 1; }
grep -qi "crc\|checksum" <<<"$root" || { echo "FAILED: the root cause does not carry rank 1's message"; exit 1; }
echo "torchrun names rank 1 and its error"
