#!/usr/bin/env bash
# Fails when a C++ file of the tree is not as clang-format writes it (.clang-format), naming
# the files and the command that formats them. Formatting differs between clang-format
# versions: the tree follows clang-format 14 (Debian bookworm's, which the setup scripts
# install); HP_CLANG_FORMAT names another binary of that version.
#
#   scripts/check_format.sh [ROOT]
set -euo pipefail
root="${1:-$(dirname "${BASH_SOURCE[0]}")/..}"
cd "$root"
fmt="${HP_CLANG_FORMAT:-clang-format}"
if ! command -v "$fmt" >/dev/null; then
  echo "no $fmt on PATH: install Debian's clang-format package (scripts/setup_and_test.sh does)" >&2
  exit 1
fi
version="$("$fmt" --version | sed -nE 's/.*version ([0-9]+)\..*/\1/p')"
if [ "$version" != 14 ]; then
  echo "$fmt is version ${version:-unknown}; the tree is formatted with clang-format 14 (set HP_CLANG_FORMAT)" >&2
  exit 1
fi
patterns=('*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- "${patterns[@]}")
else
  names=()
  for p in "${patterns[@]}"; do names+=(${names:+-o} -name "$p"); done
  mapfile -t files < <(find . -path ./build -prune -o -path ./build-san -prune -o \( "${names[@]}" \) -print |
    sed 's|^\./||' | sort)
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "${#bad[@]} of ${#files[@]} C++ files are not formatted as .clang-format says:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "format them with: $fmt -i ${bad[*]}" >&2
  exit 1
fi
echo "all ${#files[@]} C++ files are formatted ($fmt $version)"
