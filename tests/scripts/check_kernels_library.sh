#!/usr/bin/env bash
# libhyper_parallel_kernels (the C interface, include/hyper_parallel_kernels/loss_kernels.h) needs
# no LibTorch at run time: no library it loads, directly or through another, is LibTorch's
# (libtorch*, libc10*), and every symbol resolves without it (ldd -r); and it exports the C
# interface only (hpk_*), nothing C++.
#
#   tests/scripts/check_kernels_library.sh LIBRARY
set -euo pipefail
lib="$1"
ldd -r "$lib"
if ldd "$lib" | grep -E 'libtorch|libc10'; then
  echo "$lib loads LibTorch" >&2
  exit 1
fi
if ldd -r "$lib" 2>&1 | grep -i 'undefined symbol'; then
  echo "$lib has symbols nothing it loads defines" >&2
  exit 1
fi
# Functions and data it exports (besides the linker's section marks and the lock of an OpenMP
# named critical section).
other=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^hpk_/ && $3 !~ /^[.]gomp_critical/ && $3 !~ /^(_edata|_end|__bss_start)$/ {print $3}')
if [ -n "$other" ]; then
  echo "$lib exports more than hpk_*:" >&2
  echo "$other" >&2
  exit 1
fi
echo "$lib: no LibTorch, every symbol resolved, exports $(nm -D --defined-only "$lib" | grep -c ' hpk_') hpk_* functions only"
