#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build and run a consumer project with
# find_package(HyperParallel) (which finds the LibTorch it was built against by itself),
# and start the installed programs from the prefix. Arguments: the project's build dir,
# this folder, the cmake to use.
set -euo pipefail
build_dir="$1"
here="$2"
cmake="${3:-cmake}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$cmake" --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/hyper_parallel/hyper_parallel.h"
# Installed programs start from the prefix (RPATH), with no LD_LIBRARY_PATH.
for prog in hp-run hp-train hp-bench hp-example; do test -x "$work/prefix/bin/$prog"; done
env -u LD_LIBRARY_PATH "$work/prefix/bin/hp-train" --help | grep -- "--training.device" >/dev/null
"$cmake" -S "$here" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache || true)" >/dev/null
"$cmake" --build "$work/consumer" >/dev/null
env -u LD_LIBRARY_PATH "$work/consumer/consumer"
# The installed train headers and HyperParallel::hp_train (docs/training_reference.md, "The Trainer from C++").
test -f "$work/prefix/include/hyper_parallel_train/trainer.h"
# Only include/ is installed: no header of src/.
test ! -e "$work/prefix/include/hyper_parallel_train/train"
env -u LD_LIBRARY_PATH "$work/consumer/train_consumer" --parallelism.tensor_parallel_degree 1 \
  --training.steps 2 --job.dump_folder "$work/train_job" | grep "train consumer OK: 2 steps"
