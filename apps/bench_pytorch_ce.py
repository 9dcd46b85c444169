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
import ctypes
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
    probe = None
    if not cuda and a.probe and torch.__version__.split("+")[0] == a.libtorch_version.split("+")[0]:
        probe = ctypes.CDLL(a.probe)
        probe.hp_memory_probe_current_bytes.restype = ctypes.c_int64
        probe.hp_memory_probe_peak_bytes.restype = ctypes.c_int64
        probe.hp_memory_probe_install()

    def current():
        return torch.cuda.memory_allocated(device) if cuda else probe.hp_memory_probe_current_bytes()

    def reset_peak():
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        else:
            probe.hp_memory_probe_reset_peak()

    def peak():
        return torch.cuda.max_memory_allocated(device) if cuda else probe.hp_memory_probe_peak_bytes()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    mesh = init_device_mesh(a.device, (dist.get_world_size(),))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[a.dtype]
    g = torch.Generator().manual_seed(7)
    full = (torch.randn(a.tokens, a.vocab, generator=g) * 2).to(dtype).to(device)
    target = torch.randint(a.vocab, (a.tokens,), generator=g).to(device)
    sharded = distribute_tensor(full, mesh, [Shard(1)])

    def run(name, step):
        times, mb, loss = [], None, 0.0
        for i in range(a.iters + 1):  # the first run warms up
            sync()
            measure = cuda or probe is not None
            if measure:
                before = current()
                reset_peak()
            t0 = time.perf_counter()
            loss = step()
            sync()
            if i > 0:
                times.append((time.perf_counter() - t0) * 1000)
            if measure:
                mb = (peak() - before) / 2**20
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
