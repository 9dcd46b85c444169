#!/usr/bin/env bash
# hp-train's throughput and per-rank memory for the ways of laying out its ranks: TP alone,
# DP alone, dp x tp, with and without sequence parallel, float32 and bfloat16, all on one
# job (the debug Llama widened to dim 256, 2048 tokens per step), in one run. Prints a
# Markdown table (docs/training_measured.md, "Layouts").
#
#   scripts/bench_training_layouts.sh [--steps N] [-- hp-train overrides]
#
# Per layout: tokens/s (global batch tokens / step time, median of the steps after the
# first two), rank 0's peak memory, collectives per step, and the share of the step rank 0
# spent blocked in collectives (overlapped data-parallel buckets count only their wait).
# The "one bucket" rows send all gradients in one all-reduce after backward: what the
# default 25 MB buckets, sent while backward goes on, gain by overlapping.
# One thread per rank (OMP_NUM_THREADS=1), so that 4 ranks fit 4 cores; on fewer cores
# the 4-rank rows share them and their tokens/s says so. Needs a build.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps=8
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
hp_require_binaries hp-run hp-train
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
job=(--config "$HP_ROOT/configs/debug_model.toml" --model.dim 256 --training.seq_len 256 --training.batch_size 8
     --training.steps "$steps" --lr_scheduler.warmup_steps 2 --validation.enable false --checkpoint.enable false
     --metrics.enable_plot false)
# name | dp | tp | extra flags
layouts=(
  "tp 1|1|1|"
  "tp 2|1|2|"
  "tp 4|1|4|"
  "dp 2|2|1|"
  "dp 2, one bucket|2|1|--parallelism.dp_bucket_mb 100000"
  "dp 4|4|1|"
  "dp 4, one bucket|4|1|--parallelism.dp_bucket_mb 100000"
  "dp 2 x tp 2|2|2|"
)
help="$("$bin/hp-train" --help 2>/dev/null)"  # (grep -q on a pipe would cut it short under pipefail)
if [[ "$help" == *--parallelism.sequence_parallel* ]]; then
  layouts+=("tp 2 + sp|1|2|--parallelism.sequence_parallel" "tp 4 + sp|1|4|--parallelism.sequence_parallel"
            "dp 2 x tp 2 + sp|2|2|--parallelism.sequence_parallel")
fi
layouts+=("tp 2, bf16|1|2|--training.dtype bfloat16" "dp 2 x tp 2, bf16|2|2|--training.dtype bfloat16")
echo "| layout | ranks | tokens/s | rank-0 peak MiB | collectives/step | blocked in collectives |"
echo "|---|---|---|---|---|---|"
i=0
for entry in "${layouts[@]}"; do
  IFS='|' read -r name dp tp flags <<<"$entry"
  i=$((i + 1))
  dump="$work/run$i"
  # shellcheck disable=SC2086
  if ! OMP_NUM_THREADS=1 "$bin/hp-run" --nproc-per-node $((dp * tp)) "$bin/hp-train" "${job[@]}" \
      --parallelism.data_parallel_degree "$dp" --parallelism.tensor_parallel_degree "$tp" $flags "${extra[@]}" \
      --job.dump_folder "$dump" >"$work/log$i" 2>&1; then
    echo "| $name | $((dp * tp)) | failed: $(tail -1 "$work/log$i") | | | |"
    continue
  fi
  python3 - "$dump/metrics/metrics.jsonl" "$name" $((dp * tp)) <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tail = recs[2:] or recs
tps = statistics.median(r["tokens_per_s"] for r in tail)
peak = max(r["peak_memory_mb"] for r in recs)
coll = statistics.median(r["collectives"] for r in tail)
blocked = statistics.median(r["collective_s"] / r["step_s"] for r in tail)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {tps:,.0f} | {peak:,.0f} | {coll:.0f} | {100 * blocked:.0f} % |")
PY
done
