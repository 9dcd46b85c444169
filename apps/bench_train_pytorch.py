"""The PyTorch side of scripts/bench_train_vs_pytorch.sh: the same Llama, TP plan, data,
initial weights and optimiser as hp-train, trained with PyTorch's own DTensor +
parallelize_module + loss_parallel (Gloo, CPU).

    torchrun --nproc-per-node DP*TP bench_train_pytorch.py EXPORT_DIR OUT_JSON [DP]

With DP > 1 the world is a DP x TP mesh (hp-train's order: the TP ranks of a replica are
neighbours); replica r trains on rows [r*B/DP, (r+1)*B/DP) of each exported batch and the
gradients are averaged over the replicas before clipping (the batch's mean loss).

A bfloat16 job trains as hp-train does (src/train/optim/master_weights.h): the model's
parameters (and RoPE tables) are the exported float32 weights rounded to bfloat16; AdamW
updates float32 copies of them (its state float32); each step's bfloat16 gradients are
widened into the copies' .grad (summed over the replicas in float32), clipped there, and
the updated copies rounded back into the model. The logits are widened to float32 before
the loss (as TorchTitan and hp-train do); RMSNorm normalises in float32.

EXPORT_DIR is what `hp-export-train` wrote (manifest.json, weights/, batches/). Rank 0
writes OUT_JSON: per-step losses, gradient norms, step times and their phases, peak
memory (VmHWM) of every rank.
"""
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                               parallelize_module)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Reduced precision is normalised in float32, as hp's RMSNorm (src/nn/llama.cpp);
        # float32 and float64 stay as they are: x.float() would turn a float64 run's
        # activations into float32 and make the float64 comparison a float32 one.
        xf = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def apply_rope(x, cos, sin):
    s = x.shape[1]
    c = cos[:s].view(1, s, 1, -1).to(x.dtype)
    n = sin[:s].view(1, s, 1, -1).to(x.dtype)
    pairs = x.unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * c - odd * n, even * n + odd * c], -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        d = m["dim"]
        self.head_dim = d // m["n_heads"]
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, s = x.shape[0], x.shape[1]
        heads = lambda t: t.view(b, s, -1, self.head_dim)  # the local heads under TP
        q = apply_rope(heads(self.wq(x)), cos, sin).transpose(1, 2)
        k = apply_rope(heads(self.wk(x)), cos, sin).transpose(1, 2)
        v = heads(self.wv(x)).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        p = torch.softmax(scores.masked_fill(causal, float("-inf")), -1)
        out = torch.matmul(p, v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, h = m["dim"], m["hidden_dim"]
        self.w1 = nn.Linear(d, h, bias=False)
        self.w2 = nn.Linear(h, d, bias=False)
        self.w3 = nn.Linear(d, h, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.attention_norm = RMSNorm(m["dim"], m["norm_eps"])
        self.attention = Attention(m)
        self.ffn_norm = RMSNorm(m["dim"], m["norm_eps"])
        self.feed_forward = FeedForward(m)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.tok_embeddings = nn.Embedding(m["vocab_size"], m["dim"])
        self.layers = nn.ModuleList([Block(m) for _ in range(m["n_layers"])])
        self.norm = RMSNorm(m["dim"], m["norm_eps"])
        self.output = nn.Linear(m["dim"], m["vocab_size"], bias=False)
        head_dim = m["dim"] // m["n_heads"]
        half = head_dim // 2
        freqs = torch.pow(torch.tensor(m["rope_theta"], dtype=torch.float64),
                          -torch.arange(half, dtype=torch.float64) * 2.0 / head_dim)
        angles = torch.outer(torch.arange(m["max_seq_len"], dtype=torch.float64), freqs)
        self.register_buffer("rope_cos", angles.cos().float())
        self.register_buffer("rope_sin", angles.sin().float())

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))


def tp_plan(loss_parallel_on):
    """TorchTitan's plan, as hp's llama_tp_plan (src/nn/llama.cpp)."""
    plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate())}
    plan["output"] = ColwiseParallel(
        input_layouts=Replicate(),
        output_layouts=Shard(-1) if loss_parallel_on else Replicate(),
        use_local_output=not loss_parallel_on)
    return plan


def layer_plan():
    return {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel()}


def torchtitan_lr_lambda(total_steps, s):
    """TorchTitan's warm-up-stable-decay factor (torchtitan/components/optimizer/lr_scheduler.py),
    for a LambdaLR stepped after each optimizer step as TorchTitan's trainer does, from the
    [lr_scheduler] keys hp-export-train wrote; decay_ratio 1 is TorchTitan's None."""
    warmup = min(s["warmup_steps"], total_steps)
    decay = min(round(total_steps * s["decay_ratio"]), total_steps - warmup)
    stable = total_steps + 1 - warmup - decay  # + 1: TorchTitan's virtual last step

    def factor(i):  # i: LambdaLR's count of scheduler steps, from 0
        if i < warmup:
            return (i + 1) / warmup
        if i < warmup + stable:
            return 1.0
        p = (i + 1 - warmup - stable) / decay
        curve = {"linear": lambda: 1 - p, "sqrt": lambda: 1 - math.sqrt(p),
                 "cosine": lambda: 0.5 * (1.0 + math.cos(math.pi * p))}[s["decay_type"]]()
        return s["min_lr_factor"] + (1 - s["min_lr_factor"]) * curve

    return factor


def vm_hwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def local(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def piece(t):
    """This rank's piece of a DTensor (a view of its storage), a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def main():
    export_dir, out_json = sys.argv[1], sys.argv[2]
    dp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    with open(os.path.join(export_dir, "manifest.json")) as f:
        man = json.load(f)
    m, t = man["model"], man["training"]
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    tp = world // dp
    lp = bool(man["loss_parallel"]) and tp > 1

    model = Llama(m)
    with torch.no_grad():
        params = dict(model.named_parameters())
        for w in man["weights"]:
            data = np.fromfile(os.path.join(export_dir, "weights", w["name"] + ".bin"), dtype=np.float32)
            params[w["name"]].copy_(torch.from_numpy(data).reshape(w["shape"]))
    dtype = man.get("dtype", "float32")
    if dtype == "float64":
        model.double()  # parameters and the RoPE tables, as hp-train's model->to(float64)
    elif dtype == "bfloat16":
        model.bfloat16()  # likewise (rounded to nearest), before sharding, as hp-train
    dp_group = None
    if dp > 1:
        world_mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        dp_group = world_mesh.get_group("dp")
    if tp > 1:
        mesh = world_mesh["tp"] if dp > 1 else init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        for block in model.layers:
            parallelize_module(block, mesh, layer_plan())
        parallelize_module(model, mesh, tp_plan(lp))
    params = list(model.parameters())
    # bfloat16: float32 masters of the (sharded) parameters, which AdamW updates.
    masters = [p.detach().float().requires_grad_() for p in params] if dtype == "bfloat16" else params
    opt = torch.optim.AdamW(masters, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"],
                            weight_decay=t["weight_decay"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, torchtitan_lr_lambda(t["steps"], man["lr_scheduler"]))
    shape = [t["batch_size"], t["seq_len"]]
    steps = []
    for step in range(1, t["steps"] + 1):
        x = torch.from_numpy(np.fromfile(os.path.join(export_dir, "batches", "input_%d.bin" % step),
                                         dtype=np.int64)).reshape(shape)
        y = torch.from_numpy(np.fromfile(os.path.join(export_dir, "batches", "target_%d.bin" % step),
                                         dtype=np.int64)).reshape(shape)
        rows = shape[0] // dp
        x, y = (b[rank // tp * rows:(rank // tp + 1) * rows] for b in (x, y))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        logits = model(x)
        if logits.dtype == torch.bfloat16:
            logits = logits.float()  # hp-train's token_loss_sum, TorchTitan's loss
        t2 = time.perf_counter()
        if lp:
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
                value = local(loss).item()
                t3 = time.perf_counter()
                loss.backward()
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            value = local(loss).item()
            t3 = time.perf_counter()
            loss.backward()
        del logits, loss
        if masters is not params:  # bfloat16 gradients widened into the masters' .grad
            for p, mp in zip(params, masters):
                mp.grad, p.grad = (None if p.grad is None else p.grad.float()), None
        if dp_group is not None:  # the replicas' mean gradient and loss (equal rows each)
            for p in masters:
                if p.grad is not None:
                    g = piece(p.grad)
                    dist.all_reduce(g, group=dp_group)
                    g.div_(dp)
            v = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(v, group=dp_group)
            value = v.item() / dp
        t4 = time.perf_counter()
        # TorchTitan's clipping: the total norm of the DTensor gradients made whole (their
        # norms reduce across ranks), with the plain (replicated) ones counted once; then
        # every gradient scaled by max_norm / (norm + 1e-6) when that is below 1. The norm
        # is accumulated in float64, as hp-train's clip_grad_norm_ does: TorchTitan's, in
        # float32, is off by 5e-5 relative at step 1 of the debug job, which training
        # amplified into most of the float32 comparison's difference (5.5e-5 within 10
        # steps at dim 512 x 4 layers; 7e-7 with the norm in float64).
        grads = [p.grad for p in masters if p.grad is not None]
        dgrads = [g.double() for g in grads if isinstance(g, DTensor)]
        pgrads = [g.double() for g in grads if not isinstance(g, DTensor)]
        sq = torch.zeros((), dtype=torch.float64)
        if dgrads:
            sq += local(torch.nn.utils.get_total_norm(dgrads, 2.0)) ** 2
        if pgrads:
            sq += torch.nn.utils.get_total_norm(pgrads, 2.0) ** 2
        norm = sq.sqrt()
        coef = t["max_norm"] / (norm.item() + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        t5 = time.perf_counter()
        opt.step()
        sched.step()
        if masters is not params:
            with torch.no_grad():  # rounded (to nearest) into the bfloat16 parameters
                for p, mp in zip(params, masters):
                    piece(p).copy_(piece(mp))
        t6 = time.perf_counter()
        steps.append({"step": step, "loss": value, "grad_norm": norm.item(), "step_s": t6 - t0,
                      "phases": {"forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3, "clip": t5 - t4,
                                 "optimizer": (t1 - t0) + (t6 - t5)}})
    hwm = torch.tensor([vm_hwm_mib()], dtype=torch.float64)
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, hwm)
    if rank == 0:
        with open(out_json, "w") as f:
            json.dump({"threads_per_rank": threads, "world": world, "loss_parallel": lp,
                       "torch": torch.__version__, "steps": steps,
                       "peak_memory_mb": [g.item() for g in gathered]}, f, indent=1)
    dist.barrier()
    # Skip c10d's teardown: under load, Gloo's shutdown in PyTorch 2.15 sometimes aborts
    # ("terminate called without an active exception") after all the work is done, as in
    # tests/parity/pytorch_parity.py (seen here after a 60-step bfloat16 run).
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
