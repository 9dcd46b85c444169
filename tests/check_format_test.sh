#!/usr/bin/env bash
# scripts/check_format.sh on a made-up tree (not a git repository): formatted files pass,
# one unformatted file fails and is named. Usage: check_format_test.sh SCRIPT CLANG_FORMAT_FILE
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
echo "PASS"
