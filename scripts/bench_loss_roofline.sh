#!/usr/bin/env bash
# The fused cross-entropy's roofline for several TP degrees: hp-bench --grid per degree,
# one JSON line per case into OUT.jsonl, and OUT.png (% of the binding bound per case)
# when the Python given has matplotlib.
#
#   bash scripts/bench_loss_roofline.sh [BUILD_DIR] [OUT] [hp-bench args...]
#   e.g. bash scripts/bench_loss_roofline.sh build /tmp/roofline --threads 1 --iters 5
#
# TP 1 and 2 by default; HP_ROOFLINE_TP="1 2 4" for more. With --full-grid hp-bench runs
# V 32000/128256 x tokens 4096/16384 (memory: a rank holds its logits, its gradient and a
# logits-sized bandwidth buffer).
set -euo pipefail
build="${1:-build}"
out="${2:-/tmp/hp-roofline}"
shift $(( $# >= 2 ? 2 : $# ))
rm -f "$out.jsonl"
for tp in ${HP_ROOFLINE_TP:-1 2}; do
  "$build/bin/hp-run" --nproc-per-node "$tp" "$build/bin/hp-bench" --grid --json "$out.jsonl" "$@"
done
python="${HP_PYTHON:-python3}"
if ! "$python" -c "import matplotlib" 2>/dev/null; then
  echo "(no plot: $python lacks matplotlib)"
  echo "wrote $out.jsonl"
  exit 0
fi
"$python" - "$out" <<'PY'
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
rows = [json.loads(l) for l in open(out + ".jsonl")]
labels = [f"TP{r['tp']} {r['tokens']}x{r['vocab']} {r['dtype'][:4]}{' gif' if r['gradient_in_forward'] else ''}" for r in rows]
fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4))
ax.bar(range(len(rows)), [r["percent_of_bound"] for r in rows])
ax.axhline(90, color="red", linestyle="--", label="target 90 %")
ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
ax.set_ylabel("% of the binding bound (same run)")
ax.legend()
fig.tight_layout()
fig.savefig(out + ".png", dpi=120)
print(f"wrote {out}.png")
PY
echo "wrote $out.jsonl"
