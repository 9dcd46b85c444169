#!/usr/bin/env python3
"""Fails when a source file includes a folder above its own layer.

The library's folders form a stack; each may include only its own folder, the folders
below it and the public headers (include/hyper_parallel/):

    compat, bench, io -> core -> dtensor -> dispatch -> ops -> loss -> nn -> models -> train

src/train is itself a stack of folders, each a layer of its own, with the training loop
(src/train's own files) on top:

    train/config -> train/data -> train/parallel -> train/optim -> train/spec -> train/checkpoint
        -> train/metrics -> train

apps/ and tests/ sit on top and may include anything. The launcher (src/launcher, hp-run)
stands alone: it includes only itself and public headers, and no library folder includes
it. Public headers (include/hyper_parallel/, include/hyper_parallel_train/: all that is
installed) include only public headers. Each public header belongs to the layer named in
RUNTIME_PUBLIC_LAYER or TRAIN_PUBLIC_LAYER (the folder that implements it): only that layer
and those above it include it, a public header included, so no folder below train/ includes
a training header. A header in neither map is reported.

    python3 scripts/check_layering.py [REPO_ROOT]
"""
import os
import re
import sys

LAYERS = ["compat bench io", "core", "dtensor", "dispatch", "ops", "loss", "nn", "models",
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


# include/hyper_parallel_train/<name>: the train layer each public header belongs to.
TRAIN_PUBLIC_LAYER = {
    "job_config.h": "train/config", "parallel_dims.h": "train/config", "batch.h": "train/data",
    "train_context.h": "train/parallel", "train_spec.h": "train/spec", "parallelized_model.h": "train/spec",
    "checkpoint_identity.h": "train/checkpoint", "saved_model.h": "train/checkpoint",
    "step_result.h": "train/metrics", "trainer.h": "train",
}
# include/hyper_parallel/<name>: the runtime layer each public header belongs to.
RUNTIME_PUBLIC_LAYER = {
    "export.h": "core", "fatal_error.h": "core", "rank_error_file.h": "core", "placement.h": "core",
    "layout.h": "core", "communicator.h": "core", "distributed.h": "core", "device_mesh.h": "core",
    "collective_stats.h": "core", "pending_collective.h": "core", "run_then_agree.h": "core",
    "cpu_allocator.h": "core",
    "dtensor.h": "dtensor",
    "dispatch.h": "dispatch",
    "distributed_op.h": "dispatch", "sharding_strategy.h": "dispatch",
    "loss_parallel.h": "loss", "cross_entropy_definition.h": "loss", "vocab_parallel.h": "loss", "vocab_logprobs.h": "loss", "fused_linear_loss.h": "loss",
    "gradient_buffers.h": "loss", "parallelism_config.h": "loss",
    "block_hooks.h": "nn", "activation_checkpoint.h": "nn", "module_utils.h": "nn", "parallel_style.h": "nn",
    "parameters_on_meta.h": "nn", "fully_shard.h": "nn",
    "causal_lm.h": "models", "decoder_sizes.h": "models", "block_activations.h": "models", "hf_checkpoint.h": "models", "model_registry.h": "models", "llama.h": "models",
    "qwen3.h": "models", "gemma2.h": "models", "hyper_parallel.h": "models",
}
PUBLIC_LAYER = {"hyper_parallel": RUNTIME_PUBLIC_LAYER, "hyper_parallel_train": TRAIN_PUBLIC_LAYER}
PUBLIC_FOLDERS = tuple(PUBLIC_LAYER)


def layer_of(path):
    """The layer of a path below src/: its first folder, or under train/ its first two."""
    parts = path.split("/")
    if parts[0] == "train" and len(parts) > 2:
        return "train/" + parts[1]
    return parts[0]


def public_layer(target):
    """The layer of a public header "<public folder>/<name>", or None with the reason."""
    public_folder, name = target.split("/", 1)
    layer = PUBLIC_LAYER[public_folder].get(name)
    if layer is None:
        table = "RUNTIME_PUBLIC_LAYER" if public_folder == "hyper_parallel" else "TRAIN_PUBLIC_LAYER"
        return None, "not a header of include/%s/ (add it to %s)" % (public_folder, table)
    return layer, None


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
    for public_folder in PUBLIC_FOLDERS:
        public = os.path.join(root, "include", public_folder)
        if not os.path.isdir(public):
            continue
        for name in sorted(os.listdir(public)):
            checked += 1
            own_layer, why = public_layer(public_folder + "/" + name)
            if why:
                problems.append("include/%s/%s: %s" % (public_folder, name, why))
                continue
            for number, target in includes(os.path.join(public, name)):
                where = "include/%s/%s:%d includes \"%s\"" % (public_folder, name, number, target)
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
