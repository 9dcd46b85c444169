#!/usr/bin/env bash
# The out-of-tree model family (examples/minigpt_family) as a user builds and trains it:
# cmake --install into a temporary prefix, build the example with find_package(HyperParallel)
# against that prefix, then train it with the installed hp-run and hp-train at TP 2 through
# HYPER_PARALLEL_MODEL_PLUGIN_PATH (a few steps of a tiny model), its last step exported as a
# Hugging Face folder through the family's adapter and again by the installed hp-hf-export
# (the same bytes), and the installed hp-dry-run plans it; then a plugin path that does not
# load is refused naming the variable. Arguments: the project's build dir, the example's folder, the
# cmake to use.
set -euo pipefail
build_dir="$1"
example="$2"
cmake="${3:-cmake}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$cmake" --install "$build_dir" --prefix "$work/prefix" >/dev/null
"$cmake" -S "$example" -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" >/dev/null
"$cmake" --build "$work/example" >/dev/null
plugin="$work/example/libminigpt_family.so"
test -f "$plugin"
cd "$work"
log="$work/train.log"
env -u LD_LIBRARY_PATH HYPER_PARALLEL_MODEL_PLUGIN_PATH="$plugin" OMP_NUM_THREADS=1 \
  "$work/prefix/bin/hp-run" --nproc-per-node 2 "$work/prefix/bin/hp-train" --config "$example/minigpt.toml" \
  --job.dump_folder "$work/job" >"$log" 2>&1 || { cat "$log"; exit 1; }
grep -q "hp-train: minigpt dim 64, 2 layers, 4 heads, vocab 256; DP 1 x TP 2, loss parallel on" "$log" || { cat "$log"; exit 1; }
# The loss fell over the 4 steps: "hp-train: done: loss A (step 1) -> B (step 4), ...".
done_line="$(grep "hp-train: done: loss" "$log")" || { cat "$log"; exit 1; }
echo "$done_line" | awk '{ for (i = 1; i <= NF; ++i) if ($i == "loss") { a = $(i + 1); b = $(i + 5); exit } }
  END { if (!(b + 0 < a + 0)) { print "the loss did not fall: " $0; exit 1 } }'
# The export went through the family's own config.json writer and names.
grep -q '"model_type": "minigpt"' "$work/job/hf/step-4/config.json"
# The installed hp-hf-export reaches the family through the same spec: the same tensors.
env -u LD_LIBRARY_PATH HYPER_PARALLEL_MODEL_PLUGIN_PATH="$plugin" \
  "$work/prefix/bin/hp-hf-export" "$work/job/checkpoints" "$work/export" >/dev/null
cmp "$work/export/model.safetensors" "$work/job/hf/step-4/model.safetensors"
# The installed hp-dry-run finds the family the same way (the registry loads the variable's
# plugins at any program's first lookup): it builds and steps the plugin's model on meta tensors.
env -u LD_LIBRARY_PATH HYPER_PARALLEL_MODEL_PLUGIN_PATH="$plugin" \
  "$work/prefix/bin/hp-dry-run" --world-size 2 --config "$example/minigpt.toml" >"$work/dry_run.log" 2>&1 ||
  { cat "$work/dry_run.log"; exit 1; }
grep -q "hp-dry-run: minigpt dim 64, 2 layers, 4 heads, vocab 256; dp 1 x tp 2 = 2 ranks" "$work/dry_run.log" ||
  { cat "$work/dry_run.log"; exit 1; }
# A plugin that cannot be loaded stops hp-train with the variable and the path named.
if env -u LD_LIBRARY_PATH HYPER_PARALLEL_MODEL_PLUGIN_PATH="$work/missing.so" \
  "$work/prefix/bin/hp-train" --config "$example/minigpt.toml" --parallelism.tensor_parallel_degree 1 \
  --job.dump_folder "$work/job2" >"$work/missing.log" 2>&1; then
  echo "hp-train ran with a plugin path that does not exist"; exit 1
fi
grep -q "HYPER_PARALLEL_MODEL_PLUGIN_PATH: cannot load model family plugin '$work/missing.so'" "$work/missing.log" ||
  { cat "$work/missing.log"; exit 1; }
echo "minigpt family plugin OK: $done_line"
