#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its built-in default data.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
hp_install_missing
# Only what the main job runs; scripts/setup_and_test.sh builds the rest (tests, benchmarks).
hp_build hp-run hp-train
echo "==> running the main job: hp-train on the built-in synthetic corpus, 2 TP ranks through hp-run"
cd "$HP_ROOT"
# The demo starts over on every run (hp-train says so when it deletes the earlier run's
# checkpoints); pass --checkpoint.resume (and a larger --training.steps) to continue instead.
start_over=(--checkpoint.overwrite)
for arg in "$@"; do
  case "$arg" in --checkpoint.resume*|--checkpoint.overwrite*) start_over=() ;; esac
done
exec "$HP_BUILD_DIR/bin/hp-run" --nproc-per-node 2 "$HP_BUILD_DIR/bin/hp-train" --config configs/debug_model.toml \
  "${start_over[@]}" "$@"
