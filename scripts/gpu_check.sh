#!/usr/bin/env bash
# The GPU check: builds the project against a given LibTorch on a GPU machine, runs the
# whole suite there (the CUDA tests included) and prints one summary line per area, then
# the GPU benchmark table.
#
#   bash scripts/gpu_check.sh [LIBTORCH]      # default: the LibTorch of python3's torch
#
# A GPU machine without internet lacks some Debian -dev packages; fetch them
# here first, into .gpu-deps/ (ignored by git, carried to the machine):
#   bash scripts/gpu_check.sh --fetch-debs
set -uo pipefail
HP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEBS=(libyaml-cpp-dev libyaml-cpp0.7 libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev
      libgtest-dev libgmock-dev libgloo-dev)

if [ "${1:-}" = "--fetch-debs" ]; then
  mkdir -p "$HP_ROOT/.gpu-deps" && cd "$HP_ROOT/.gpu-deps" && apt-get download "${DEBS[@]}"
  exit $?
fi

libtorch="${1:-$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path)))')}"
build="${HP_GPU_BUILD_DIR:-$HP_ROOT/build-gpu}"
out="${OUT:-$build}"
jobs="$(nproc)"
prefixes="$libtorch/share/cmake"
cxxflags=""
if [ -d "$HP_ROOT/.gpu-deps" ]; then
  # Unpack the carried Debian packages into prefixes of their own (gloo's headers apart, after
  # the system's, so that they never shadow anything else).
  for f in "$HP_ROOT"/.gpu-deps/*.deb; do
    case "$f" in *gloo*) dpkg -x "$f" /opt/hp-gloo ;; *) dpkg -x "$f" /opt/hp-deps ;; esac
  done
  prefixes="$prefixes;/opt/hp-deps/usr"
  cxxflags="-idirafter /opt/hp-gloo/usr/include"
  export LD_LIBRARY_PATH="/opt/hp-deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi

echo "== gpu_check: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "== LibTorch: $libtorch"
t0=$(date +%s)
cmake -S "$HP_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefixes" -DCMAKE_CXX_FLAGS="$cxxflags" \
  -DHP_PYTHON="$(command -v python3)" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"

t0=$(date +%s)
(cd "$build" && ctest -j "$jobs" --timeout 600 --output-on-failure > "$out/ctest.log" 2>&1)
echo "== ctest in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
# One line per area (the test suite name before the first dot).
python3 - "$out/ctest.log" <<'PY'
import collections, re, sys
areas = collections.OrderedDict()
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"Test\s+#\d+: (\S+) \.+\s*(\*\*\*)?(Passed|Failed|Not Run|Skipped|\w+)", line)
    if not m:
        continue
    name, status = m.group(1), m.group(3)
    area = name.split(".")[0].split("/")[-1]
    a = areas.setdefault(area, collections.Counter())
    a["passed" if status == "Passed" else "skipped" if "Skipped" in line else "failed"] += 1
for area, c in areas.items():
    print("%-34s %3d passed, %d failed, %d skipped" % (area, c["passed"], c["failed"], c["skipped"]))
PY
grep -E "\*\*\*Failed|Failed  |\(Failed\)" "$out/ctest.log" | head -20

echo "== GPU benchmark (TP 1, one GPU): cross-entropy forward+backward, then % of the HBM bound"
for dtype in bfloat16 float16 float32; do
  "$build/bin/hp-run" --nproc-per-node 1 "$build/bin/hp-bench" --device cuda --tokens 8192 --vocab 128256 --dtype "$dtype" --vs-pytorch 2>&1 | sed "s/^\\[rank0\\]: //"
done
# Few rows, many classes: the kernels split each row over several blocks.
"$build/bin/hp-run" --nproc-per-node 1 "$build/bin/hp-bench" --device cuda --tokens 256 --vocab 128256 --dtype bfloat16 2>&1 | sed "s/^\\[rank0\\]: //"
# The DTensor dispatcher's cost per op on CUDA tensors (host time per op, ranks as threads on
# the one GPU), against the same op on a plain tensor.
echo "== DTensor dispatcher per op (hp-bench-dispatch, cuda)"
"$build/bin/hp-bench-dispatch" 20000 5 "" cuda 2>&1
# The Python package on the GPU: ours through PyTorch's DTensor and the functional op against
# PyTorch's loss_parallel and a compiled gather (TP 1, NCCL), with the python3 torch it built against.
echo "== Python package (apps/bench_python_loss.py, TP 1, one GPU)"
for dtype in bfloat16 float32; do
  PYTHONPATH="$build/python" python3 -m torch.distributed.run --nproc-per-node 1 "$HP_ROOT/apps/bench_python_loss.py" \
    --device cuda --tokens 8192 --vocab 128256 --dtype "$dtype" 2>&1 | grep -v "^W[0-9]"
done
