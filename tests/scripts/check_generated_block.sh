#!/usr/bin/env bash
# Checks that the block between "BEGIN GENERATED" and "END GENERATED" in a doc equals
# what a command prints. Usage: check_generated_block.sh DOC COMMAND [ARGS...]
set -euo pipefail
doc="$1"
shift
expected="$(sed -n '/BEGIN GENERATED/,/END GENERATED/p' "$doc" | sed '1d;$d')"
actual="$("$@")"
if [ "$expected" != "$actual" ]; then
  echo "$doc is stale: regenerate its generated block with: $*"
  diff <(echo "$expected") <(echo "$actual") || true
  exit 1
fi
echo "$doc: generated block up to date"
