"""Cross-entropy on HyperParallel's own DTensor: our route against what its users do today, one run.

    PYTHONPATH=build/python:$HYPER_PARALLEL_CHECKOUT \\
      torchrun --nproc-per-node 2 apps/bench_hyperparallel_ce.py --tokens 4096 --vocab 32000 --dtype float32

Per rank, forward + backward on [tokens, vocab] logits that are a HyperParallel DTensor sharded along
the vocabulary (placements [Shard(1)] on a 1-D "tp" mesh), median of --iters after a warm-up, and the
peak memory the step allocated beyond its inputs (LibTorch's CPU allocator, counted by the library's
memory probe):

  ours (loss_parallel)        integrations.hyperparallel.install(); with hyper_parallel_cpp.loss_parallel():
                              F.cross_entropy(logits, target)  -- HyperParallel's dispatcher, our kernel
  gather + cross_entropy      F.cross_entropy(logits.full_tensor(), target): the classes gathered with
                              HyperParallel's own redistribution (what works there without loss_parallel)

Ratios are against the second row, measured in the same run.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from hyper_parallel_cpp.integrations import hyperparallel
from bench_memory import DEFAULT_PROBE, DeviceMemory, load_memory_probe

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", default=DEFAULT_PROBE, help="the build's libhp_memory_probe.so (CPU memory)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1, as torchrun)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.vocab % world:
        raise SystemExit(f"--vocab {a.vocab}: HyperParallel expresses even pieces only; pick a multiple of {world}")

    import hyper_parallel as hpar
    from hyper_parallel.core.placement_types import Shard
    hyperparallel.install()
    mem = DeviceMemory(torch.device("cpu"), load_memory_probe(a.probe))
    mesh = hpar.init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    dtype = _DTYPES[a.dtype]
    g = torch.Generator().manual_seed(7)
    full = (torch.randn(a.tokens, a.vocab, generator=g) * 2).to(dtype)
    target = torch.randint(a.vocab, (a.tokens,), generator=g)
    local = torch.chunk(full, world, 1)[rank].clone()
    del full

    def measure(step, iters, ours=False):
        _C.release_gradient_buffers()
        times, extra, loss = [], 0, None
        for i in range(iters + 1):  # the first call warms up
            dist.barrier()
            # The gradient buffer ours keeps between steps counts as the step's (as in hp-bench).
            before = mem.current() - (_C.cached_gradient_buffer_bytes() if ours else 0)
            mem.reset_peak()
            t0 = time.perf_counter()
            loss = step()
            if i > 0:
                times.append(time.perf_counter() - t0)
            extra = mem.peak() - before
        return statistics.median(times), extra, loss

    def ours():
        piece = local.detach().requires_grad_()
        with hp.loss_parallel():
            loss = F.cross_entropy(hpar.DTensor.from_local(piece, mesh, [Shard(1)]), target)
        loss.to_local().backward()
        return loss.to_local().item()

    def gather():
        piece = local.detach().requires_grad_()
        whole = hpar.DTensor.from_local(piece, mesh, [Shard(1)]).full_tensor()
        loss = F.cross_entropy(whole, target)
        loss.backward()
        return loss.item()

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # HyperParallel's redistribution's own deprecation notice
        rows = [("ours (loss_parallel)", measure(ours, a.iters, ours=True)),
                ("gather + cross_entropy", measure(gather, a.iters))]
    if rank == 0:
        base_t, base_m = rows[1][1][0], rows[1][1][1]
        print(f"cross-entropy forward + backward on HyperParallel's DTensor, {a.tokens} x {a.vocab} {a.dtype}, "
              f"{world} ranks (Gloo, {a.threads} thread(s) per rank), per rank, median of {a.iters}; "
              f"torch {torch.__version__}")
        print(f"{'':26}{'ms':>10}{'peak MiB':>11}{'x time':>9}{'x memory':>10}{'loss':>14}")
        for name, (t, m, loss) in rows:
            print(f"{name:26}{t * 1e3:10.2f}{m / 2**20:11.1f}{t / base_t:9.2f}{m / base_m if base_m else 0:10.2f}"
                  f"{loss:14.6f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
