#!/usr/bin/env python3
"""Fails when a library exports a symbol of src/'s internals.

libhyper_parallel and libhp_train are compiled with hidden symbols and export what their
installed headers declare (include/hyper_parallel/core/export.h). This reads each library's
dynamic symbol table (nm -DC --defined-only) and reports every exported symbol that names
  - a namespace that only src/ declares (hyper_parallel::compat, io, hf, ce_kernel ...), or
  - a class, struct or function that only a header under src/ declares.
It prints each library's exported symbol count, and its share in hyper_parallel::.

    check_exported_symbols.py REPO_ROOT LIBRARY...
"""
import os
import re
import subprocess
import sys

NAMESPACE = re.compile(r"^namespace (hyper_parallel(?:::\w+)*) \{")
TYPE = re.compile(r"^(?:class|struct) (\w+)\b[^;]*$")
FUNCTION = re.compile(r"^[\w:<>,\s\*&]+?[\s\*&](\w+)\(")


def declared(folder):
    """Namespaces, types and functions declared at namespace scope in folder's headers."""
    spaces, types, functions = set(), set(), set()
    for dirpath, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(".h"):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    for pattern, found in ((NAMESPACE, spaces), (TYPE, types), (FUNCTION, functions)):
                        m = pattern.match(line)
                        if m:
                            found.add(m.group(1))
    return spaces, types, functions


def main():
    root, libraries = sys.argv[1], sys.argv[2:]
    src_spaces, src_types, src_functions = declared(os.path.join(root, "src"))
    public_spaces, public_types, public_functions = declared(os.path.join(root, "include"))
    internal_spaces = sorted(src_spaces - public_spaces - {"hyper_parallel"})
    internal_names = (src_types - public_types) | (src_functions - public_functions)
    leaks = []
    for library in libraries:
        symbols = subprocess.run(["nm", "-DC", "--defined-only", library], check=True, capture_output=True,
                                 text=True).stdout.splitlines()
        ours = 0
        for line in symbols:
            symbol = line.split(" ", 2)[-1]
            if "hyper_parallel::" not in symbol:
                continue
            ours += 1
            why = next((s for s in internal_spaces if s + "::" in symbol), None)
            if why is None:
                for name in re.findall(r"hyper_parallel::(?:\w+::)*(\w+)", symbol):
                    if name in internal_names:
                        why = name
                        break
            if why:
                leaks.append("%s exports %s (%s is declared only under src/)" % (os.path.basename(library), symbol, why))
        print("%s: %d exported symbols, %d of them in hyper_parallel::" % (os.path.basename(library), len(symbols), ours))
    for leak in leaks[:40]:
        print(leak)
    print("%d internal symbol(s) exported" % len(leaks))
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
