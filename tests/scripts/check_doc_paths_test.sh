#!/usr/bin/env bash
# scripts/check_doc_paths.py on a small made-up tree: references that exist pass (a file, a
# folder, a line range within the file, a pattern with a placeholder); a missing file, a line
# past a file's end and a line of a folder fail, each named. Usage: check_doc_paths_test.sh SCRIPT
set -euo pipefail
script="$1"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/src/core" "$root/docs"
printf 'one\ntwo\nthree\n' > "$root/src/core/layout.cpp"
cat > "$root/README.md" <<'DOC'
See `src/core/layout.cpp`, `src/core/`, src/core/layout.cpp:2-3, `src/models/<family>/` and
`src/core/layout.{h,cpp}`.
DOC
python3 "$script" "$root" >/dev/null || { echo "a clean tree failed"; python3 "$script" "$root"; exit 1; }
cat > "$root/docs/guide.md" <<'DOC'
Gone: `src/core/gone.h`. Too far: src/core/layout.cpp:4. A folder's line: src/core:1.
DOC
if out=$(python3 "$script" "$root"); then echo "planted broken references passed: $out"; exit 1; fi
for want in "docs/guide.md:1: src/core/gone.h (no such file or folder)" \
            "docs/guide.md:1: src/core/layout.cpp:4 (the file has 3 lines)" \
            "docs/guide.md:1: src/core:1 (a line of a folder)"; do
  grep -qF "$want" <<<"$out" || { echo "missing: $want"; echo "$out"; exit 1; }
done
echo "check_doc_paths.py: passes a clean tree, names each planted broken reference"
