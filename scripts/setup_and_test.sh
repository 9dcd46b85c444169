#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
hp_install_missing
hp_build
echo "==> running the test suite"
hp_ctest "$@"
