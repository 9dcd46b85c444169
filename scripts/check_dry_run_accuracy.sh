#!/usr/bin/env bash
# hp-dry-run's predictions against measured runs on this machine, at three small jobs:
#   state       parameters + masters + gradients + AdamW bytes of rank 0 after a step:
#               hp-dry-run (meta tensors, fake world) against what hp-train logs
#               (metrics.jsonl "state_bytes") after 2 real steps; bound 5 %
#   activations one micro-batch's activations by formula (memory_formula.h, the job's
#               activation_checkpoint.mode)
#               against what LibTorch allocated and still held when the forward and loss
#               returned (hp-dry-run --measure: the same job for real, through the memory
#               probe, bench/memory_probe.h; FSDP's gathered parameters taken out), rank 0;
#               bound 15 %
#   checkpoint  the predicted checkpoint size against rank 0's rank-0.pt (informative)
# Prints a Markdown table (docs/training_measured.md, "The dry run checked against measured runs") and exits 1 when a bound is
# missed. A benchmark-like check, not a timed test: each job runs through hp-run, one
# intra-op thread per rank.
#
#   scripts/check_dry_run_accuracy.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set +e
hp_require_binaries hp-run hp-train hp-dry-run
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model=(--config "$HP_ROOT/configs/debug_model.toml" --model.dim 256 --model.n_layers 4 --model.n_heads 8
       --model.vocab_size 8192 --model.max_seq_len 256 --training.seq_len 256 --training.batch_size 8
       --lr_scheduler.warmup_steps 1 --validation.enable false --metrics.enable_plot false)
tp1=(--parallelism.tensor_parallel_degree 1)
# The other families come from a config.json of the same sizes (their blocks' own terms:
# Qwen3's q/k norms, Gemma 2's four norms, soft-capped scores, float32 softmax and logits).
mkdir -p "$work/qwen3" "$work/gemma2"
sizes='"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 8192, "intermediate_size": 704, "max_position_embeddings": 256'
echo "{\"model_type\": \"qwen3\", $sizes}" >"$work/qwen3/config.json"
echo "{\"model_type\": \"gemma2\", $sizes, \"query_pre_attn_scalar\": 32, \"sliding_window\": 128}" >"$work/gemma2/config.json"
jobs=(
  "tp 1, float32|1|${tp1[*]}"
  "tp 1, float32, AC full|1|${tp1[*]} --activation_checkpoint.mode full"
  "fsdp 2, float32|2|${tp1[*]} --parallelism.data_parallel_shard_degree 2"
  "fsdp 2, bfloat16, AC selective 2|2|${tp1[*]} --parallelism.data_parallel_shard_degree 2 --training.dtype bfloat16 --activation_checkpoint.mode selective"
  "dp 2, bfloat16|2|${tp1[*]} --parallelism.data_parallel_degree 2 --training.dtype bfloat16"
  "tp 2, float32|2|--parallelism.tensor_parallel_degree 2"
  "tp 2 + sp, float32|2|--parallelism.tensor_parallel_degree 2 --parallelism.sequence_parallel true"
  "qwen3, tp 2, float32|2|--parallelism.tensor_parallel_degree 2 --model.name qwen3 --model.hf_assets_path $work/qwen3"
  "gemma2, tp 1, bfloat16|1|${tp1[*]} --model.name gemma2 --model.hf_assets_path $work/gemma2 --training.dtype bfloat16"
)
echo "| job | ranks | state predicted MiB | state measured MiB | error | activations predicted MiB | activations measured MiB | error | checkpoint predicted MiB | rank-0 file MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
status=0
i=0
for entry in "${jobs[@]}"; do
  IFS='|' read -r name ranks flags <<<"$entry"
  i=$((i + 1))
  read -ra job <<<"$flags"
  dump="$work/run$i"
  OMP_NUM_THREADS=1 "$bin/hp-dry-run" --world-size "$ranks" --json "${model[@]}" "${job[@]}" \
    >"$work/dry$i.json" 2>"$work/dry$i.log" || { echo "| $name | dry run failed: $(tail -1 "$work/dry$i.log") |"; status=1; continue; }
  OMP_NUM_THREADS=1 "$bin/hp-run" --nproc-per-node "$ranks" "$bin/hp-dry-run" --measure "${model[@]}" "${job[@]}" \
    >"$work/measure$i.log" 2>&1 || { echo "| $name | measurement failed: $(tail -1 "$work/measure$i.log") |"; status=1; continue; }
  OMP_NUM_THREADS=1 "$bin/hp-run" --nproc-per-node "$ranks" "$bin/hp-train" "${model[@]}" "${job[@]}" \
    --training.steps 2 --checkpoint.interval 2 --job.dump_folder "$dump" >"$work/train$i.log" 2>&1 ||
    { echo "| $name | hp-train failed: $(tail -1 "$work/train$i.log") |"; status=1; continue; }
  python3 - "$name" "$ranks" "$work/dry$i.json" "$work/measure$i.log" "$dump" <<'PY' || status=1
import glob, json, os, sys
name, ranks, dry, measure, dump = sys.argv[1:]
predicted = json.load(open(dry))[0]
mib = lambda b: b / 2**20
state = predicted["state"]
state_predicted = state["parameters"] + state["gradients"] + state["optimizer"]
logged = [json.loads(l) for l in open(os.path.join(dump, "metrics", "metrics.jsonl"))][-1]["state_bytes"]
state_measured = logged["parameters"] + logged["gradients"] + logged["optimizer"]
measured = [json.loads(l.split("]: ", 1)[-1]) for l in open(measure) if '"saved"' in l][-1]
act_predicted = predicted["activations"][predicted["activation_checkpoint"]]["held_after_forward"]
state_error = state_predicted / state_measured - 1
act_error = act_predicted / measured["saved"] - 1
files = glob.glob(os.path.join(dump, "checkpoints", "step-2", "rank-0.pt"))
file_mib = f"{mib(os.path.getsize(files[0])):.1f}" if files else "none"
print(f"| {name} | {ranks} | {mib(state_predicted):.2f} | {mib(state_measured):.2f} | {100 * state_error:+.2f} % "
      f"| {mib(act_predicted):.1f} | {mib(measured['saved']):.1f} | {100 * act_error:+.1f} % "
      f"| {mib(predicted['checkpoint_bytes']):.1f} | {file_mib} |")
sys.exit(0 if abs(state_error) <= 0.05 and abs(act_error) <= 0.15 else 1)
PY
done
echo
echo "(state bound 5 %, activations bound 15 %; $(lscpu | sed -n 's/^Model name: *//p'), one thread per rank)"
exit $status
