#!/usr/bin/env python3
"""Fails when a source file includes a folder above its own layer.

The library's folders form a stack; each may include only its own folder, the folders
below it and the public headers (include/hyper_parallel/):

    compat, bench, io -> core -> dtensor -> dispatch -> ops -> loss -> nn -> models -> train

src/loss and src/train are each a stack of folders, each a layer of its own. In loss, the
public loss headers (include/hyper_parallel/loss/: declarations every floor uses) sit at the
bottom, then the raw kernels, the cross-rank call (class layouts, the agreements, the input
checks, LossCall), the ATen algorithms (whose one collective carries the call's record) and
the front ends on top:

    loss -> loss/kernel -> loss/call -> loss/math -> loss/front

In train, the training loop (src/train's own files) is on top:

    train/config -> train/data -> train/parallel -> train/optim -> train/spec -> train/checkpoint
        -> train/metrics -> train

src/kernels_c (libhyper_parallel_kernels: the C interface of the loss kernels, include/
hyper_parallel_kernels/, which must not need LibTorch) sits just above the kernels it wraps;
nothing of the library includes it.

apps/ and tests/ sit on top and may include anything. The launcher (src/launcher, hp-run)
stands alone: it includes only itself and public headers, and no library folder includes
it. Public headers (include/hyper_parallel/, include/hyper_parallel_train/: all that is
installed) include only public headers. Each public header sits in the folder of the layer
that implements it (include/hyper_parallel/core/layout.h, include/hyper_parallel_train/spec/
train_spec.h; the umbrella header and the trainer's at the top): only that layer and those
above it include it, a public header included, so no folder below train/ includes a training
header. A header outside a layer's folder is reported.

    python3 scripts/check_layering.py [REPO_ROOT]
"""
import os
import re
import sys

LAYERS = ["compat bench io", "core", "dtensor", "dispatch", "ops",
          "loss", "loss/kernel", "kernels_c", "loss/call", "loss/math", "loss/front", "nn", "models",
          "train/config", "train/data", "train/parallel", "train/optim", "train/spec", "train/checkpoint", "train/metrics",
          "train"]
LEVEL = {folder: i for i, names in enumerate(LAYERS) for folder in names.split()}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


# A public header's layer is its folder: include/hyper_parallel/<layer>/<name> (the runtime
# layers), include/hyper_parallel_train/<part>/<name> (train/<part>); a header directly in
# either folder is that library's top: the umbrella hyper_parallel.h (models) and the trainer.
PUBLIC_TOP = {"hyper_parallel": "models", "hyper_parallel_train": "train", "hyper_parallel_kernels": "kernels_c"}
PUBLIC_FOLDERS = tuple(PUBLIC_TOP)


STACKED = ("loss", "train")  # folders whose subfolders are layers of their own


def layer_of(path):
    """The layer of a path below src/: its first folder, or under loss/ and train/ its first two."""
    parts = path.split("/")
    if parts[0] in STACKED and len(parts) > 2:
        return parts[0] + "/" + parts[1]
    return parts[0]


def public_layer(target):
    """The layer of a public header "<public folder>[/<layer>]/<name>", or None with the reason."""
    parts = target.split("/")
    if len(parts) == 2:
        return PUBLIC_TOP[parts[0]], None
    layer = parts[1] if parts[0] == "hyper_parallel" else "train/" + parts[1]
    if len(parts) != 3 or layer not in LEVEL or (parts[0] == "hyper_parallel") == layer.startswith("train"):
        return None, "not in a layer's folder of include/%s/ (<layer>/<name>)" % parts[0]
    return layer, None


def public_headers(include):
    """Every file below include/<public folder>/, as "<public folder>/.../<name>"."""
    for public_folder in PUBLIC_FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(include, public_folder)):
            for name in sorted(names):
                yield os.path.relpath(os.path.join(dirpath, name), include).replace(os.sep, "/")


def violation(folder, name, target, own_dir_files):
    """Why including `target` from src/`folder`/`name` breaks the layering, or None."""
    if target.split("/")[0] in PUBLIC_FOLDERS:
        layer, why = public_layer(target)
        if why:
            return why
        if folder == "launcher":  # stands alone: any public header
            return None
        if folder not in LEVEL or LEVEL[folder] < LEVEL[layer]:
            return "%s is above %s" % (layer, folder)
        return None
    if "/" not in target:  # a sibling in the same folder
        return None if target in own_dir_files else "unknown relative include"
    top = layer_of(target)
    if folder == "launcher":
        return None if top == "launcher" else "the launcher stands alone"
    if top == "launcher":
        return "only hp-run (apps/) may include the launcher"
    if top not in LEVEL:
        return "'%s' is not a library folder" % top
    if folder not in LEVEL:
        return "src/%s is not in the layer list of scripts/check_layering.py" % folder
    if LEVEL[top] > LEVEL[folder]:
        return "%s is above %s" % (top, folder)
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems, checked = [], 0
    src = os.path.join(root, "src")
    for dirpath, _, files in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        if rel == ".":
            continue
        folder = layer_of(rel.replace(os.sep, "/") + "/")
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(dirpath, name)
            checked += 1
            for number, target in includes(path):
                why = violation(folder, name, target, files)
                if why:
                    problems.append("src/%s/%s:%d includes \"%s\": %s" % (rel, name, number, target, why))
    include = os.path.join(root, "include")
    for header in public_headers(include):
        checked += 1
        own_layer, why = public_layer(header)
        if why:
            problems.append("include/%s: %s" % (header, why))
            continue
        for number, target in includes(os.path.join(include, header)):
            where = "include/%s:%d includes \"%s\"" % (header, number, target)
            if target.split("/")[0] not in PUBLIC_FOLDERS:
                problems.append(where + ": a public header includes only public headers")
                continue
            layer, why = public_layer(target)
            if why:
                problems.append(where + ": " + why)
            elif LEVEL[layer] > LEVEL[own_layer]:
                problems.append(where + ": %s is above %s" % (layer, own_layer))
    for p in problems:
        print(p)
    print("%d files checked, %d layering violation(s)" % (checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
