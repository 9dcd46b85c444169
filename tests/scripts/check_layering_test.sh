#!/usr/bin/env bash
# scripts/check_layering.py on small made-up trees: a clean one passes, one with a file
# of each kind of violation fails and names every one. Usage: check_layering_test.sh SCRIPT
set -euo pipefail
script="$1"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/src/core" "$root/src/dtensor" "$root/src/launcher" "$root/src/train/data" "$root/src/train/checkpoint" \
         "$root/src/loss/call" "$root/src/loss/front" "$root/include/hyper_parallel/loss" \
         "$root/include/hyper_parallel/core" "$root/include/hyper_parallel/dtensor" "$root/include/hyper_parallel/models" \
         "$root/include/hyper_parallel_train/data"
echo '#pragma once' > "$root/include/hyper_parallel/core/layout.h"
echo '#pragma once' > "$root/src/core/redistribute.h"
printf '#include "core/redistribute.h"\n#include "hyper_parallel/core/layout.h"\n' > "$root/src/dtensor/dtensor_impl.cpp"
printf '#include "launcher.h"\n#include "hyper_parallel/core/layout.h"\n' > "$root/src/launcher/launcher.cpp"
echo '#pragma once' > "$root/src/launcher/launcher.h"
printf '#include "hyper_parallel/core/layout.h"\n' > "$root/include/hyper_parallel_train/data/batch.h"
printf '#include "hyper_parallel_train/data/batch.h"\n#include "hyper_parallel/core/layout.h"\n' > "$root/include/hyper_parallel_train/trainer.h"
printf '#include "train/data/batches.h"\n#include "hyper_parallel_train/trainer.h"\n' > "$root/src/train/trainer.cpp"
echo '#pragma once' > "$root/src/train/data/batches.h"
echo '#include "core/redistribute.h"' >> "$root/src/train/trainer.cpp"            # a .cpp may
echo '#pragma once' > "$root/src/train/checkpoint/checkpoint_io.h"
printf '#include "train/data/batches.h"\n' > "$root/src/train/checkpoint/checkpoint_io.cpp"  # a lower part
echo '#pragma once' > "$root/include/hyper_parallel/loss/loss_parallel.h"
printf '#include "hyper_parallel/loss/loss_parallel.h"\n' > "$root/src/loss/call/loss_call.h"  # loss's public floor
printf '#include "loss/call/loss_call.h"\n' > "$root/src/loss/front/vocab_parallel.cpp"       # a lower loss floor
python3 "$script" "$root" || { echo "FAIL: a clean tree was reported"; exit 1; }

echo '#include "dtensor/dtensor_impl.h"' >> "$root/src/core/redistribute.h"   # a folder above
echo '#include "launcher/launcher.h"' > "$root/src/core/fatal_error.cpp"      # the launcher
echo '#include "core/redistribute.h"' >> "$root/src/launcher/launcher.cpp"    # launcher -> library
echo '#include "core/redistribute.h"' >> "$root/include/hyper_parallel/core/layout.h"  # public -> src
echo '#include "train/data/batches.h"' >> "$root/include/hyper_parallel_train/trainer.h"  # installed -> src
echo '#include "hyper_parallel_train/trainer.h"' > "$root/src/train/data/corpus.cpp"     # public train header above
echo '#include "train/checkpoint/checkpoint_io.h"' > "$root/src/train/data/batches.cpp"  # a train part above
echo '#include "loss/front/vocab_parallel.h"' > "$root/src/loss/call/loss_call.cpp"  # a loss floor above
echo '#include "hyper_parallel/models/llama.h"' > "$root/src/core/placement.cpp"      # a public header of a layer above
mkdir "$root/include/hyper_parallel/extra"
echo '#pragma once' > "$root/include/hyper_parallel/extra/unlisted.h"         # a public header in no layer's folder
echo '#include "hyper_parallel/dtensor/dtensor.h"' > "$root/include/hyper_parallel/core/placement.h"  # public, a layer above
set +e
out="$(python3 "$script" "$root")"
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0 with violations planted"; exit 1; }
for where in src/core/redistribute.h src/core/fatal_error.cpp src/launcher/launcher.cpp \
             include/hyper_parallel/core/layout.h include/hyper_parallel_train/trainer.h src/train/data/batches.cpp \
             src/train/data/corpus.cpp src/core/placement.cpp include/hyper_parallel/extra/unlisted.h \
             include/hyper_parallel/core/placement.h src/loss/call/loss_call.cpp; do
  grep -q "^$where:" <<<"$out" || { echo "FAIL: $where not reported"; exit 1; }
done
grep -q " 11 layering violation(s)" <<<"$out" || { echo "FAIL: expected exactly 11 violations"; exit 1; }
echo "check_layering.py catches each planted violation"
