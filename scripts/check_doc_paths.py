#!/usr/bin/env python3
"""Every repository path a document names exists, and every file:line (or file:a-b) it names
is within that file: README.md, docs/*.md and the Markdown under python/.

A path is a token that starts with one of the repository's top folders (src/, include/,
tests/, scripts/, apps/, python/, configs/, docs/, cmake/, .ci/) and is made of path
characters; tokens with placeholders (<family>, *, {a,b}, ...) name patterns, not files, and
are skipped. Prints each broken reference as FILE:LINE: PATH (why) and exits 1 if any.

    python3 scripts/check_doc_paths.py [REPO_ROOT]
"""

import os
import re
import sys

TOP = ("src", "include", "tests", "scripts", "apps", "python", "configs", "docs", "cmake", ".ci")
PATH = re.compile(r"(?<![\w/.<>-])((?:%s)/[A-Za-z0-9_./+-]*[A-Za-z0-9_/+-])(?::(\d+)(?:-(\d+))?)?" %
                  "|".join(re.escape(t) for t in TOP))
PLACEHOLDER = re.compile(r"[<>*{}]")


def documents(root):
    yield os.path.join(root, "README.md")
    for folder in ("docs", "python"):
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(".md"):
                    yield os.path.join(dirpath, f)


def line_count(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check(root):
    broken = []
    for doc in documents(root):
        if not os.path.exists(doc):
            continue
        with open(doc, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for m in PATH.finditer(line):
                    end = m.end(1)
                    rest = line[end:end + 2]
                    if PLACEHOLDER.match(rest[:1]) or rest in (".{", ".*"):
                        continue  # src/models/<family>/..., file_system.{h,cpp}: a pattern
                    path = m.group(1)
                    full = os.path.join(root, path)
                    where = f"{os.path.relpath(doc, root)}:{number}: {m.group(0)}"
                    if not os.path.exists(full):
                        # A build output (build/...) or a file the reader makes is not named with a top folder.
                        broken.append(f"{where} (no such file or folder)")
                        continue
                    if m.group(2):
                        if not os.path.isfile(full):
                            broken.append(f"{where} (a line of a folder)")
                            continue
                        last = int(m.group(3) or m.group(2))
                        lines = line_count(full)
                        if last > lines:
                            broken.append(f"{where} (the file has {lines} lines)")
    return broken


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    broken = check(root)
    for b in broken:
        print(b)
    if broken:
        print(f"{len(broken)} reference(s) in the docs name no file, folder or line of this tree")
        return 1
    print("every path and file:line named in the docs exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
