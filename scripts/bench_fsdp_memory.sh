#!/usr/bin/env bash
# What each rank keeps under sharded data parallelism (FSDP, fully_shard.h): the bytes of
# parameters, gradients and AdamW state on rank 0 after a training step (measured from
# its live tensors, hp-train's metrics "state_bytes"), and its peak resident memory, at
# dp_shard 1 / 2 / 4 x tp 1 / 2, next to the formula for the state: 16 bytes per
# parameter (float32 weight, gradient and two AdamW moments) / (dp_shard x tp). Prints a
# Markdown table (docs/training.md, section "Sharded data parallelism").
#
#   scripts/bench_fsdp_memory.sh [-- hp-train overrides]
#
# The model (dim 512, 8 layers, vocabulary 32000: 58 M parameters, 0.9 GB of state) is
# large enough that its state dominates a small batch's activations. Peak memory counts
# the process too (LibTorch's code and its allocator's caches): it falls with the state
# but not to zero. One thread per rank; 8 ranks share the cores they find. Needs a build.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set +e
extra=()
if [ "${1:-}" = "--" ]; then shift; extra=("$@"); fi
hp_require_binaries hp-run hp-train
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
job=(--config "$HP_ROOT/configs/debug_model.toml" --model.dim 512 --model.n_layers 8 --model.n_heads 8
     --training.seq_len 64 --training.batch_size 8 --training.steps 2 --lr_scheduler.warmup_steps 1
     --validation.enable false --checkpoint.enable false --metrics.enable_plot false)
echo "| dp_shard x tp | parameters MiB | gradients MiB | AdamW MiB | state MiB | formula MiB | rank-0 peak MiB |"
echo "|---|---|---|---|---|---|---|"
i=0
for tp in 1 2; do
  for shard in 1 2 4; do
    i=$((i + 1))
    dump="$work/run$i"
    if ! OMP_NUM_THREADS=1 "$bin/hp-run" --nproc-per-node $((shard * tp)) "$bin/hp-train" "${job[@]}" \
        --parallelism.data_parallel_shard_degree "$shard" --parallelism.tensor_parallel_degree "$tp" "${extra[@]}" \
        --job.dump_folder "$dump" >"$work/log$i" 2>&1; then
      echo "| $shard x $tp | failed: $(tail -1 "$work/log$i") | | | | | |"
      continue
    fi
    python3 - "$dump/metrics/metrics.jsonl" "$shard" "$tp" <<'PY'
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1])][-1]
shard, tp = int(sys.argv[2]), int(sys.argv[3])
s = rec["state_bytes"]
mib = lambda b: b / 2**20
state = s["parameters"] + s["gradients"] + s["optimizer"]
formula = 16 * s["model_parameters"] / (shard * tp)
print(f"| {shard} x {tp} | {mib(s['parameters']):,.1f} | {mib(s['gradients']):,.1f} | {mib(s['optimizer']):,.1f} "
      f"| {mib(state):,.1f} | {mib(formula):,.1f} | {rec['peak_memory_mb']:,.0f} |")
PY
  done
done
