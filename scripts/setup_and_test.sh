#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite; then the same suite
# built with ASan + UBSan (clang, build-san/) and each libFuzzer target for
# HP_FUZZ_SECONDS (default 30). HP_SKIP_SANITIZERS=1 skips the second part (and says so).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
hp_install_missing
hp_build
echo "==> running the test suite"
hp_ctest "$@"
if [ "${HP_SKIP_SANITIZERS:-0}" = 1 ]; then
  echo "==> HP_SKIP_SANITIZERS=1: the ASan + UBSan suite and the fuzz targets were NOT run"
  exit 0
fi
hp_build_sanitized
hp_ctest_sanitized "$@"
hp_fuzz
