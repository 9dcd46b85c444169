"""Side-by-side benchmark of the Python front end, every figure from one run:

    PYTHONPATH=build/python torchrun --nproc-per-node 2 apps/bench_python_loss.py --tokens 4096 --vocab 32000 --dtype float32
    PYTHONPATH=build/python torchrun --nproc-per-node 4 apps/bench_python_loss.py --dp 2 ...   # dp 2 x tp 2

Per rank, cross-entropy forward + backward on [tokens, vocab] logits sharded along the
vocabulary (median of --iters after a warm-up), and the peak memory the step allocated
beyond its inputs (LibTorch's CPU allocator, counted by the memory probe hp-bench uses,
build/src/libhp_memory_probe.so loaded with ctypes, --probe; on a GPU torch.cuda's
statistics):

  ours (loss_parallel)   hyper_parallel_cpp.loss_parallel() + F.cross_entropy on the DTensor
  ours (functional)      hyper_parallel_cpp.vocab_parallel_cross_entropy on the local piece
  PyTorch loss_parallel  torch.distributed.tensor.parallel.loss_parallel, the same DTensor
  compiled gather        the logits all-gathered, then torch.compile'd F.cross_entropy

the call overhead: forward + backward of each on a [1, 8] input over a one-rank mesh,
where neither the kernels nor a transfer take time; and what each context adds to an op it
does not route (ours sees every torch call inside it). Ratios are against PyTorch's loss_parallel in the same run.
With --dp N the mesh is (dp N, tp world / N), the logits [Shard(0), Shard(1)] and the target
[Shard(0), Replicate()] (PyTorch 2.15's multi-dim loss_parallel), and the loss a sum: PyTorch
refuses reduction="mean" on a mesh of more than one dim.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

import hyper_parallel_cpp as hp
from bench_memory import DEFAULT_PROBE, DeviceMemory, load_memory_probe
from hyper_parallel_cpp import _C

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def main(argv=None):
    p = argparse.ArgumentParser(prog="apps/bench_python_loss.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1, as torchrun)")
    p.add_argument("--dp", type=int, default=1, help="a (dp, tp) mesh with this many batch shards (default 1: 1-D)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--probe", default=DEFAULT_PROBE,
                   help="libhp_memory_probe.so of the build hyper_parallel_cpp comes from (CPU memory)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if not dist.is_initialized():
        if "RANK" in os.environ:
            dist.init_process_group("nccl" if cuda else "gloo")
        else:
            import tempfile
            dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mem = DeviceMemory(device, None if cuda else load_memory_probe(a.probe))
    if world % a.dp:
        p.error(f"--dp {a.dp} does not divide the {world} ranks")
    if a.dp > 1:
        mesh = init_device_mesh(a.device, (a.dp, world // a.dp), mesh_dim_names=("dp", "tp"))
        placements, target_placements, reduction = [Shard(0), Shard(1)], [Shard(0), Replicate()], "sum"
    else:
        mesh = init_device_mesh(a.device, (world,))
        placements, target_placements, reduction = [Shard(1)], [Replicate()], "mean"
    dtype = _DTYPES[a.dtype]
    g = torch.Generator().manual_seed(7)
    full = (torch.randn(a.tokens, a.vocab, generator=g) * 2).to(dtype)
    full_target = torch.randint(a.vocab, (a.tokens,), generator=g).to(device)
    sharded = distribute_tensor(full.to(device), mesh, placements)
    dist_target = distribute_tensor(full_target, mesh, target_placements)
    target = dist_target if a.dp > 1 else full_target  # what the DTensor routes take
    local = sharded.to_local()
    local_target = dist_target.to_local()
    group = mesh.get_group(mesh.ndim - 1)
    del full

    def measure(step, iters, ours=False):
        _C.release_gradient_buffers()  # what ours kept from an earlier row is no one's now
        times, extra, loss = [], 0, None
        for i in range(iters + 1):  # the first call warms up (and compiles)
            dist.barrier()
            mem.sync()
            # The gradient buffer ours keeps between steps counts as the step's (as in hp-bench).
            before = mem.current() - (_C.cached_gradient_buffer_bytes() if ours and not cuda else 0)
            mem.reset_peak()
            t0 = time.perf_counter()
            loss = step()
            mem.sync()
            if i > 0:
                times.append(time.perf_counter() - t0)
            extra = mem.peak() - before
        return statistics.median(times), extra, loss

    def ours_context():
        x = sharded.detach().requires_grad_()
        with hp.loss_parallel():
            loss = F.cross_entropy(x, target, reduction=reduction)
        loss.backward()
        return loss.to_local().item()

    def ours_functional():
        x = local.detach().requires_grad_()
        loss = hp.vocab_parallel_cross_entropy(x, local_target, group, vocab_size=a.vocab, reduction=reduction)
        loss.backward()
        return loss.item()

    def pytorch():
        x = sharded.detach().requires_grad_()
        with torch_loss_parallel():
            loss = F.cross_entropy(x, target, reduction=reduction)
            loss.backward()
        return loss.to_local().item()

    compiled_ce = torch.compile(F.cross_entropy)

    def compiled_gather():
        x = sharded.detach().requires_grad_()
        loss = compiled_ce(x.full_tensor(), full_target, reduction=reduction)
        loss.backward()
        return loss.item()

    rows = [("ours (loss_parallel)", measure(ours_context, a.iters, ours=True)),
            ("ours (functional)", measure(ours_functional, a.iters, ours=True)),
            ("PyTorch loss_parallel", measure(pytorch, a.iters)),
            ("compiled gather", measure(compiled_gather, a.iters))]

    # Python call overhead: the same calls on an input too small for the kernels to matter, on
    # a one-rank mesh of each rank's own, so that no transfer is timed either.
    own = [dist.new_group([r]) for r in range(world)][rank]
    own_mesh = DeviceMesh.from_group(own, a.device)
    tiny_full = torch.randn(1, 8, dtype=dtype, device=device)
    tiny_target = torch.zeros(1, dtype=torch.long, device=device)
    tiny = distribute_tensor(tiny_full, own_mesh, [Shard(1)])

    def tiny_context():
        x = tiny.detach().requires_grad_()
        with hp.loss_parallel():
            loss = F.cross_entropy(x, tiny_target)
        loss.backward()

    def tiny_functional():
        x = tiny.to_local().detach().requires_grad_()
        hp.vocab_parallel_cross_entropy(x, tiny_target, own, vocab_size=8).backward()

    def tiny_pytorch():
        x = tiny.detach().requires_grad_()
        with torch_loss_parallel():
            F.cross_entropy(x, tiny_target).backward()

    overhead = [(name, measure(fn, 50)[0]) for name, fn in (("ours (loss_parallel)", tiny_context),
                                                             ("ours (functional)", tiny_functional),
                                                             ("PyTorch loss_parallel", tiny_pytorch))]
    # What each context costs an op it does not route (the model's forward under a train context).
    def unrelated_op_us(context, n=20000):
        a, b = torch.randn(8, 8), torch.randn(8, 8)
        with context():
            for _ in range(200):
                a + b
            t0 = time.perf_counter()
            for _ in range(n):
                a + b
            return (time.perf_counter() - t0) / n * 1e6

    import contextlib
    unrelated = [(name, min(unrelated_op_us(c) for _ in range(3))) for name, c in
                 (("no context", contextlib.nullcontext), ("inside ours", hp.loss_parallel),
                  ("inside PyTorch's", torch_loss_parallel))]
    if rank == 0:
        base_t, base_m = rows[2][1][0], rows[2][1][1]
        print(f"cross-entropy ({reduction}) forward + backward, {a.tokens} x {a.vocab} {a.dtype}, {world} ranks "
              f"on {'dp %d x tp %d' % (a.dp, world // a.dp) if a.dp > 1 else 'tp %d' % world} "
              f"({'Gloo' if not cuda else 'NCCL'}, {a.threads} thread(s) per rank), per rank, median of {a.iters}; "
              f"torch {torch.__version__}")
        print(f"{'':24}{'ms':>10}{'peak MiB':>11}{'x time':>9}{'x memory':>10}{'loss':>14}")
        for name, (t, m, loss) in rows:
            print(f"{name:24}{t * 1e3:10.2f}{m / 2**20:11.1f}{t / base_t:9.2f}{m / base_m if base_m else 0:10.2f}"
                  f"{loss:14.6f}")
        print("call overhead (fwd + bwd on a [1, 8] input, a one-rank mesh):")
        for name, t in overhead:
            print(f"  {name:22}{t * 1e6:10.1f} us")
        print("an op the context does not route (a + b on [8, 8], CPU):")
        for name, t in unrelated:
            print(f"  {name:22}{t:10.2f} us")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
