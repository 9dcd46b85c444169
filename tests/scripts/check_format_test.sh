#!/usr/bin/env bash
# scripts/check_format.sh on a made-up tree (not a git repository): formatted files pass,
# one unformatted file fails and is named; a clang-format of another version, or none, is
# refused with the reason. Usage: check_format_test.sh SCRIPT CLANG_FORMAT_FILE
set -euo pipefail
script="$1"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
cp "$2" "$root/.clang-format"
mkdir -p "$root/src"
printf 'int add(int a, int b) { return a + b; }\n' > "$root/src/good.cpp"
printf '#pragma once\n\nint twice(int a);\n' > "$root/src/good.h"
bash "$script" "$root" || { echo "FAIL: a formatted tree was reported"; exit 1; }

printf 'int   sub(int a,int b){\nreturn a-b;}\n' > "$root/src/bad.cpp"
set +e
out="$(bash "$script" "$root" 2>&1)"
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: exit status 0 with an unformatted file"; exit 1; }
grep -q "src/bad.cpp" <<<"$out" || { echo "FAIL: the unformatted file is not named"; exit 1; }
if grep -q "src/good.cpp" <<<"$out"; then echo "FAIL: a formatted file was named"; exit 1; fi

# Another clang-format version, or none: refused with the reason, not run.
fake="$root/clang-format-15"
printf '#!/bin/sh\necho "clang-format version 15.0.7"\n' > "$fake"
chmod +x "$fake"
expect_refusal() {  # expect_refusal BINARY MESSAGE
  set +e
  out="$(HP_CLANG_FORMAT="$1" bash "$script" "$root" 2>&1)"
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || { echo "FAIL: $1 was accepted"; exit 1; }
  grep -q "$2" <<<"$out" || { echo "FAIL: for $1 expected '$2', got: $out"; exit 1; }
}
expect_refusal "$fake" "is version 15; the tree is formatted with clang-format 14"
expect_refusal "$root/no-such-clang-format" "no $root/no-such-clang-format on PATH"
echo "PASS"
