#!/usr/bin/env bash
# Restarts keep a run exact: hp-train under a launcher with --max-restarts 2 and
# --checkpoint.resume, one rank killed during a save and one between steps, must log the
# same per-step float64 losses as an uninterrupted run, and leave no temporary file of the
# torn save behind.
#   attempt 0: rank 1 dies in step 6's save, its rank file written but not yet renamed
#              (HP_CRASH_AT=rank_file.before_rename@1#3: the third save) -> resume from 4
#   attempt 1: rank 0 dies after step 7 (HP_CRASH_AT=step.finished@0#3: the third step
#              of this attempt) -> resume from 6
#   attempt 2: runs to step 10.
# The launcher restarts the whole group each time (TORCHELASTIC_RESTART_COUNT 0, 1, 2).
# Usage: restart_test.sh PYTHON BIN_DIR torchrun|hp-run. torchrun is the one beside
# PYTHON (its venv's); exit 77 (skip) when no Python is configured.
set -euo pipefail
python="$1" bin="$2" launcher="$3"
if [ -z "$python" ]; then
  echo "SKIP: no Python configured (HP_PYTHON): the losses are compared with Python's json"
  exit 77
fi
case "$launcher" in
  torchrun) launch=("$(dirname "$python")/torchrun" --no-python) ;;
  hp-run) launch=("$bin/hp-run") ;;
  *) echo "restart_test.sh: expected torchrun or hp-run, got '$launcher'" >&2; exit 2 ;;
esac
work="$(mktemp -d "${TMPDIR:-/tmp}/hp_restart_test.XXXXXX")"
trap 'rm -rf "$work"' EXIT

train_args=(--training.steps 10 --training.dtype float64 --parallelism.tensor_parallel_degree 2
  --model.dim 32 --model.n_layers 2 --model.n_heads 4 --model.vocab_size 515
  --training.batch_size 4 --training.seq_len 16 --validation.enable false --metrics.enable_plot false
  --checkpoint.enable --checkpoint.interval 2 --checkpoint.resume)

# Each attempt's fault, chosen by the restart count the launcher gives the ranks.
cat > "$work/rank.sh" <<EOF
#!/usr/bin/env bash
echo "\$TORCHELASTIC_RESTART_COUNT/\$TORCHELASTIC_MAX_RESTARTS rank \$RANK" >> "$work/attempts"
case "\$TORCHELASTIC_RESTART_COUNT" in
  0) export HP_CRASH_AT='rank_file.before_rename@1#3' ;;
  1) export HP_CRASH_AT='step.finished@0#3' ;;
esac
exec "$bin/hp-train" "\$@"
EOF
chmod +x "$work/rank.sh"

echo "== uninterrupted"
"${launch[@]}" --nproc-per-node 2 "$bin/hp-train" "${train_args[@]}" --job.dump_folder "$work/straight" \
  > "$work/straight.log" 2>&1 || { cat "$work/straight.log"; echo "FAILED: the uninterrupted run"; exit 1; }

echo "== two failures, --max-restarts 2"
set +e
"${launch[@]}" --max-restarts 2 --nproc-per-node 2 "$work/rank.sh" "${train_args[@]}" \
  --job.dump_folder "$work/restarted" > "$work/restarted.log" 2>&1
status=$?
set -e
grep -E "injected crash|resumed from|no checkpoint in|temporary file|restarting|FAILED|rror" "$work/restarted.log" || true
[ "$status" -eq 0 ] || { cat "$work/restarted.log"; echo "FAILED: $launcher exited with $status"; exit 1; }

"$python" - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
log = open(f"{work}/restarted.log").read()
problems = []
def expect(ok, what):
    if not ok:
        problems.append(what)
expect("injected crash at rank_file.before_rename (rank 1)" in log, "rank 1 was not killed in a save")
expect("injected crash at step.finished (rank 0)" in log, "rank 0 was not killed between steps")
expect("resumed from step 4" in log, "the first restart did not resume from step 4")
expect("resumed from step 6" in log, "the second restart did not resume from step 6")
expect("temporary file(s) of an interrupted save" in log, "the torn save's temporary files were not removed")
attempts = sorted(open(f"{work}/attempts").read().split("\n")[:-1])
expect(attempts == [f"{a}/2 rank {r}" for a in range(3) for r in range(2)],
       f"attempts (restart count/max restarts rank): expected 0..2 x ranks 0, 1, got {attempts}")
left = [os.path.join(d, f) for d, _, files in os.walk(f"{work}/restarted") for f in files if ".tmp-" in f]
expect(not left, f"temporary files left: {left}")

def losses(run):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(f"{work}/{run}/metrics/metrics.jsonl"))]
straight, restarted = losses("straight"), losses("restarted")
print(f"{'step':>4} {'uninterrupted':>22} {'restarted':>22}")
for (s, a), (_, b) in zip(straight, restarted):
    print(f"{s:>4} {a!r:>22} {b!r:>22}{'' if a == b else '  DIFFERS'}")
expect([s for s, _ in straight] == list(range(1, 11)), f"uninterrupted steps: {[s for s, _ in straight]}")
expect(restarted == straight, "the restarted run's per-step losses differ from the uninterrupted run's")
if problems:
    print("FAILED: " + "; ".join(problems))
    sys.exit(1)
print(f"OK: the run restarted twice logs the uninterrupted run's float64 losses (step 10: {straight[-1][1]!r})")
EOF
