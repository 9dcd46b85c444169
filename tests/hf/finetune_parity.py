"""Fine-tuning parity with transformers: hp-train at TP 2 (real processes through hp-run,
loss_parallel) starts from a tiny random transformers model made offline (LlamaForCausalLM,
Gemma2ForCausalLM) and trains it on a pre-tokenized corpus; a plain PyTorch loop trains transformers' own model,
loaded from the same folder, with the same AdamW (every parameter decayed, as hp-train
does), learning-rate schedule, gradient clipping and batches (exported by hp-export-train).
Per-step losses and gradient norms must agree within TOL in float64.

    python finetune_parity.py BIN_DIR WORK_DIR [--steps N] [--tp N]

Cases: "gqa" (Llama, 4 query / 2 kv heads, explicit head_dim, untied), "tied" (Llama,
tie_word_embeddings: one parameter for the embeddings and the head on both sides) and
"gemma2" (Gemma 2 through hp-train's train spec: soft-capped attention and logits, sliding
windows shorter than the sequence, (1 + w) norms, GeGLU, tied; transformers in eager
attention, its float32 norm and softmax kept in float64 as make_gemma2_models.py does).
Exits 77 when transformers is not importable (the ctest skips), 1 when a step disagrees.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "apps"))
# Exits 77 without transformers.
from hf_reference import rms_norm_in_float64  # noqa: E402
from make_llama_models import BASE  # noqa: E402
import make_gemma2_models  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

# transformers' RMSNorm rounds a float64 model's norms through float32 (see hf_reference.py).
rms_norm_in_float64(modeling_llama.LlamaRMSNorm)
make_gemma2_models.in_float64()

from bench_train_pytorch import torchtitan_lr_lambda  # noqa: E402  hp-train's (TorchTitan's) schedule

TOL = 1e-8


class Family:
    def __init__(self, name, config, model, base, attn, norm_weights):
        self.name, self.config, self.model, self.base = name, config, model, base
        self.attn, self.norm_weights = attn, norm_weights


LLAMA = Family("llama", LlamaConfig, LlamaForCausalLM, BASE, "sdpa", (0.5, 1.5))
# Gemma 2 scales by 1 + weight: norms around 0. No sdpa attention there (it cannot soft-cap).
GEMMA2 = Family("gemma2", Gemma2Config, Gemma2ForCausalLM, make_gemma2_models.BASE, "eager", (-0.5, 0.5))
CASES = {"gqa": (LLAMA, {}), "tied": (LLAMA, {"tie_word_embeddings": True}), "gemma2": (GEMMA2, {})}


def make_model(folder, family, overrides):
    torch.manual_seed(0)
    model = family.model(family.config(**{**family.base, **overrides}))
    with torch.no_grad():  # norms away from their identity so that their gradients and values matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(*family.norm_weights)
    model.save_pretrained(folder)


def reference_losses(folder, export, family):
    """transformers' model trained by a plain loop on hp-train's batches and settings."""
    with open(os.path.join(export, "manifest.json")) as f:
        man = json.load(f)
    t = man["training"]
    model = family.model.from_pretrained(folder, dtype=torch.float64, attn_implementation=family.attn)
    model.train()
    params = list(model.parameters())  # deduplicated: a tied weight once, as in hp-train
    opt = torch.optim.AdamW(params, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                            weight_decay=t["weight_decay"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, torchtitan_lr_lambda(t["steps"], man["lr_scheduler"]))
    shape = [t["batch_size"], t["seq_len"]]
    out = []
    for step in range(1, t["steps"] + 1):
        x, y = (torch.from_numpy(np.fromfile(os.path.join(export, "batches", "%s_%d.bin" % (k, step)),
                                             dtype=np.int64)).reshape(shape) for k in ("input", "target"))
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())  # the mean over every target token
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, t["max_norm"])
        opt.step()
        sched.step()
        out.append((loss.item(), norm.item()))
    return out


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stdout.write(open(log).read())
        raise SystemExit("FAILED: %s (exit %d)" % (" ".join(cmd[:3]), r.returncode))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("work")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tp", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    failed = False
    for name, (family, overrides) in CASES.items():
        # A flat uint16 corpus (nanoGPT's layout) of random ids below the model's vocabulary:
        # the windows hp-train samples from it are what both sides train on.
        corpus = os.path.join(args.work, "corpus_%s.bin" % name)
        rng = np.random.default_rng(0)
        rng.integers(0, family.base["vocab_size"], size=20000, dtype=np.uint16).tofile(corpus)
        folder = os.path.join(args.work, name)
        make_model(folder, family, overrides)
        job = ["--model.name", family.name, "--model.hf_assets_path", folder, "--checkpoint.initial_load_in_hf", "true",
               "--training.data", corpus, "--training.data_format", "bin_u16", "--training.dtype", "float64",
               "--training.steps", str(args.steps), "--training.batch_size", "4", "--training.seq_len", "32",
               "--lr_scheduler.warmup_steps", "3", "--training.lr", "3e-3", "--training.max_norm", "1.0",
               "--parallelism.tensor_parallel_degree", str(args.tp), "--validation.enable", "false",
               "--checkpoint.enable", "false", "--metrics.enable_plot", "false", "--training.log_freq", "1"]
        export = os.path.join(args.work, "export_" + name)
        dump = os.path.join(args.work, "hp_" + name)
        run([os.path.join(args.bin_dir, "hp-export-train"), export] + job, export + ".log")
        run([os.path.join(args.bin_dir, "hp-run"), "--nproc-per-node", str(args.tp),
             os.path.join(args.bin_dir, "hp-train")] + job + ["--job.dump_folder", dump], dump + ".log")
        with open(os.path.join(dump, "metrics", "metrics.jsonl")) as f:
            ours = [json.loads(line) for line in f if line.strip()]
        ref = reference_losses(folder, export, family)
        print("%s: hp-train TP %d (loss_parallel) vs transformers %s, float64, %d steps"
              % (name, args.tp, __import__("transformers").__version__, args.steps))
        print("  step  loss (hp-train)        loss (transformers)    |d loss|   |d grad norm|")
        worst = 0.0
        for rec, (loss, norm) in zip(ours, ref):
            d, dn = abs(rec["loss"] - loss), abs(rec["grad_norm"] - norm)
            worst = max(worst, d, dn)
            print("  %4d  %.17f  %.17f  %.1e    %.1e" % (rec["step"], rec["loss"], loss, d, dn))
        ok = len(ours) == len(ref) == args.steps and worst <= TOL
        print("  max |d| %.1e: %s (tolerance %.0e)" % (worst, "ok" if ok else "FAILED", TOL))
        failed = failed or not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
