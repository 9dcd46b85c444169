#!/usr/bin/env bash
# scripts/check_layering.py on small made-up trees: a clean one passes, one with a file
# of each kind of violation fails and names every one. Usage: check_layering_test.sh SCRIPT
set -euo pipefail
script="$1"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/src/core" "$root/src/dtensor" "$root/src/launcher" "$root/src/train/data" "$root/src/train/checkpoint" "$root/include/hyper_parallel"
echo '#pragma once' > "$root/include/hyper_parallel/layout.h"
echo '#pragma once' > "$root/src/core/redistribute.h"
printf '#include "core/redistribute.h"\n#include "hyper_parallel/layout.h"\n' > "$root/src/dtensor/dtensor_impl.cpp"
printf '#include "launcher.h"\n#include "hyper_parallel/layout.h"\n' > "$root/src/launcher/launcher.cpp"
echo '#pragma once' > "$root/src/launcher/launcher.h"
printf '#include "train/data/batches.h"\n#include "hyper_parallel/layout.h"\n' > "$root/src/train/trainer.h"
echo '#pragma once' > "$root/src/train/data/batches.h"
echo '#include "core/redistribute.h"' > "$root/src/train/trainer.cpp"             # a .cpp may
echo '#pragma once' > "$root/src/train/checkpoint/checkpoint_io.h"
printf '#include "train/data/batches.h"\n' > "$root/src/train/checkpoint/checkpoint_io.cpp"  # a lower part
python3 "$script" "$root" || { echo "FAIL: a clean tree was reported"; exit 1; }

echo '#include "dtensor/dtensor_impl.h"' >> "$root/src/core/redistribute.h"   # a folder above
echo '#include "launcher/launcher.h"' > "$root/src/core/fatal_error.cpp"      # the launcher
echo '#include "core/redistribute.h"' >> "$root/src/launcher/launcher.cpp"    # launcher -> library
echo '#include "core/redistribute.h"' >> "$root/include/hyper_parallel/layout.h"  # public -> src
echo '#include "core/redistribute.h"' >> "$root/src/train/trainer.h"            # installed -> src
echo '#include "train/checkpoint/checkpoint_io.h"' > "$root/src/train/data/batches.cpp"  # a train part above
set +e
out="$(python3 "$script" "$root")"
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0 with violations planted"; exit 1; }
for where in src/core/redistribute.h src/core/fatal_error.cpp src/launcher/launcher.cpp \
             include/hyper_parallel/layout.h src/train/trainer.h src/train/data/batches.cpp; do
  grep -q "^$where:" <<<"$out" || { echo "FAIL: $where not reported"; exit 1; }
done
grep -q " 6 layering violation(s)" <<<"$out" || { echo "FAIL: expected exactly 6 violations"; exit 1; }
echo "check_layering.py catches each planted violation"
