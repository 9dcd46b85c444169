"""PyTorch's side of `hp-bench --vs-pytorch`: cross-entropy forward+backward per rank with
PyTorch's own tools, on the shapes, seed and thread count hp-bench passes. Launched by
hp-bench through torchrun after its own measurements; one JSON line per method.

  single         F.cross_entropy on the full logits (one process)
  loss_parallel  torch.distributed.tensor.parallel.loss_parallel on Shard(1) logits
  gather         the sharded logits' full_tensor(), then F.cross_entropy

Peak memory is measured as hp-bench measures ours: on the CPU through the same counting
allocator (libhp_memory_probe, loaded here with ctypes; only when this torch is the
LibTorch hp-bench was built against), on a GPU from torch.cuda's allocator statistics.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

from bench_memory import DeviceMemory, load_memory_probe


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--probe", default="")
    p.add_argument("--libtorch-version", default="")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank % max(torch.cuda.device_count(), 1)) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # The probe counts only when this torch is the one the build linked (its allocator).
    same_torch = torch.__version__.split("+")[0] == a.libtorch_version.split("+")[0]
    probe = load_memory_probe(a.probe) if not cuda and a.probe and same_torch else None
    mem = DeviceMemory(device, probe) if cuda or probe is not None else None
    measure = mem is not None

    mesh = init_device_mesh(a.device, (dist.get_world_size(),))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a.dtype]
    g = torch.Generator().manual_seed(7)
    full = (torch.randn(a.tokens, a.vocab, generator=g) * 2).to(dtype).to(device)
    target = torch.randint(a.vocab, (a.tokens,), generator=g).to(device)
    sharded = distribute_tensor(full, mesh, [Shard(1)])

    def run(name, step):
        times, mb, loss = [], None, 0.0
        for i in range(a.iters + 1):  # the first run warms up
            if measure:
                mem.sync()
                before = mem.current()
                mem.reset_peak()
            t0 = time.perf_counter()
            loss = step()
            if cuda:
                mem.sync()
            if i > 0:
                times.append((time.perf_counter() - t0) * 1000)
            if measure:
                mb = (mem.peak() - before) / 2**20
        return {"name": name, "ms": statistics.median(times), "peak_mb": mb, "loss": loss}

    def single():
        x = full.detach().requires_grad_()
        loss = F.cross_entropy(x, target)
        loss.backward()
        return loss.item()

    def parallel():
        x = sharded.detach().requires_grad_()
        with loss_parallel():
            loss = F.cross_entropy(x, target)
            loss.backward()
        return loss.full_tensor().item()

    def gather():
        x = sharded.detach().requires_grad_()
        loss = F.cross_entropy(x.full_tensor(), target)
        loss.backward()
        return loss.item()

    results = [run("single", single), run("loss_parallel", parallel), run("gather", gather)]
    dist.barrier()
    if rank == 0:
        with open(a.json, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    # Skip c10d's teardown, which sometimes aborts under load (see tests/parity).
    os._exit(0)


if __name__ == "__main__":
    main()
