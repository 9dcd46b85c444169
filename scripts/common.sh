# Shared by the two top-level scripts: install what is missing, then configure and build.
# Sourced, not run.
set -euo pipefail

HP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HP_BUILD_DIR="${HP_BUILD_DIR:-$HP_ROOT/build}"

# Debian packages the project needs. libopenblas0-openmp matters: without it LibTorch
# falls back to the reference BLAS (libblas3) and matrix products run ~6x slower.
HP_PACKAGES=(
  libtorch-dev libgloo-dev libopenblas0-openmp cmake ninja-build ccache g++
  libgtest-dev libgmock-dev libbenchmark-dev libyaml-cpp-dev libcli11-dev
  libtomlplusplus-dev nlohmann-json3-dev libfmt-dev gnuplot-nox
)

hp_install_missing() {
  local missing=()
  for p in "${HP_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "==> installing missing packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

hp_build() {
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  echo "==> configuring in $HP_BUILD_DIR"
  cmake -S "$HP_ROOT" -B "$HP_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  echo "==> building ($jobs jobs)"
  cmake --build "$HP_BUILD_DIR" -j "$jobs"
}
