"""Per-token log-probabilities and entropy at a temperature, forward + backward, per rank,
every figure from one run:

    torchrun --nproc-per-node 2 apps/bench_logprobs.py --tokens 4096 --vocab 32000 --hidden 1024

On [tokens, vocab] logits sharded along the vocabulary, the loss a PPO / GRPO step takes
(sum of g_lp * log p(target | x / T) + g_h * entropy, random g) and its gradient:

  ours                   hyper_parallel_cpp.vocab_parallel_logprobs on the local piece
  PyTorch loss_parallel  as a verl / TorchTitan user writes it on PyTorch's DTensor: logits / T,
                         log_softmax under torch's loss_parallel, nll_loss at the target, the
                         entropy -(p * log p).sum(-1)
  gather                 the scaled logits' full_tensor(), then the same on the whole

and from hidden [tokens, hidden] and the ColwiseParallel head's local rows [vocab / tp, hidden]:

  ours fused             hyper_parallel_cpp.fused_linear_logprobs (the logits never exist)
  PyTorch loss_parallel  the local matmul as a Shard(-1) DTensor, then as above

Times are medians of --iters after a warm-up; peak memory is what the step allocated beyond
its inputs (LibTorch's CPU allocator, counted by the build's memory probe,
apps/bench_memory.py; torch.cuda's statistics on a GPU). Ratios are against PyTorch's loss_parallel in the same run.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from bench_memory import DEFAULT_PROBE, DeviceMemory, load_memory_probe

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", default=DEFAULT_PROBE, help="the build's libhp_memory_probe.so (CPU memory)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=1024, help="the fused rows' hidden size (0: skip them)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1, as torchrun)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    mem = DeviceMemory(torch.device("cpu"), load_memory_probe(a.probe))
    mesh = init_device_mesh("cpu", (world,))
    group = mesh.get_group(0)
    dtype, T = _DTYPES[a.dtype], a.temperature
    g = torch.Generator().manual_seed(7)
    target = torch.randint(a.vocab, (a.tokens,), generator=g)
    g_lp = torch.randn(a.tokens, generator=g).to(dtype)
    g_h = (torch.randn(a.tokens, generator=g) * 0.1).to(dtype)
    full = (torch.randn(a.tokens, a.vocab, generator=g) * 2).to(dtype)
    sharded = distribute_tensor(full, mesh, [Shard(1)])
    local = sharded.to_local()
    del full

    def measure(step, ours=False):
        _C.release_gradient_buffers()
        times, extra, value = [], 0, None
        for i in range(a.iters + 1):  # the first call warms up
            dist.barrier()
            # A gradient buffer ours keeps between steps counts as the step's (as in hp-bench).
            before = mem.current() - (_C.cached_gradient_buffer_bytes() if ours else 0)
            mem.reset_peak()
            t0 = time.perf_counter()
            value = step()
            if i > 0:
                times.append(time.perf_counter() - t0)
            extra = max(extra, mem.peak() - before)
        return statistics.median(times), extra, value

    def objective(lp, ent):
        return (lp * g_lp + ent * g_h).sum()

    def ours():
        x = local.detach().requires_grad_()
        lp, ent = hp.vocab_parallel_logprobs(x, target, group, temperature=T, return_entropy=True,
                                             vocab_size=a.vocab)
        loss = objective(lp, ent)
        loss.backward()
        return loss.item()

    def pytorch_way(x_dtensor):
        with torch_loss_parallel():
            lsm = F.log_softmax(x_dtensor / T, -1)
            lp = -F.nll_loss(lsm, target, reduction="none")
            ent = -(lsm.exp() * lsm).sum(-1)
            loss = objective(lp.full_tensor(), ent.full_tensor())
            loss.backward()
        return loss.item()

    def pytorch():
        return pytorch_way(sharded.detach().requires_grad_())

    def gather():
        x = sharded.detach().requires_grad_()
        lsm = F.log_softmax(x.full_tensor() / T, -1)
        lp = lsm.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        loss = objective(lp, -(lsm.exp() * lsm).sum(-1))
        loss.backward()
        return loss.item()

    rows = [("ours", measure(ours, ours=True)), ("PyTorch loss_parallel", measure(pytorch)),
            ("gather", measure(gather))]
    del sharded, local

    fused_rows = []
    if a.hidden > 0:
        hidden = (torch.randn(a.tokens, a.hidden, generator=g) * 0.05).to(dtype)
        weight = (torch.randn(a.vocab, a.hidden, generator=g) * 0.05).to(dtype)
        w_local = torch.chunk(weight, world, 0)[rank].contiguous()
        del weight

        def ours_fused():
            h, w = hidden.detach().requires_grad_(), w_local.detach().requires_grad_()
            lp, ent = hp.fused_linear_logprobs(h, w, target, group, temperature=T, return_entropy=True,
                                               vocab_size=a.vocab)
            loss = objective(lp, ent)
            loss.backward()
            return loss.item()

        def pytorch_linear():
            h, w = hidden.detach().requires_grad_(), w_local.detach().requires_grad_()
            logits = DTensor.from_local(h @ w.T, mesh, [Shard(1)], run_check=False)
            # hidden's gradient is summed over the group, as the ColwiseParallel head's is.
            value = pytorch_way(logits)
            dist.all_reduce(h.grad)
            return value

        fused_rows = [("ours fused", measure(ours_fused, ours=True)),
                      ("PyTorch loss_parallel", measure(pytorch_linear))]

    if rank == 0:
        import subprocess
        cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True,
                             text=True).stdout.strip()
        print(f"log-probabilities + entropy at T = {T}, forward + backward, {a.tokens} x {a.vocab} {a.dtype}, "
              f"{world} ranks (Gloo, {a.threads} thread(s) per rank), per rank, median of {a.iters}; "
              f"torch {torch.__version__}; {cpu}")

        def table(title, rows):
            base_t, base_m = rows[1][1][0], rows[1][1][1]
            print(title)
            print(f"  {'':24}{'ms':>10}{'peak MiB':>11}{'x time':>9}{'x memory':>10}{'objective':>16}")
            for name, (t, m, v) in rows:
                print(f"  {name:24}{t * 1e3:10.1f}{m / 2**20:11.1f}{t / base_t:9.3f}{m / base_m:10.3f}{v:16.6f}")

        table("on the logits:", rows)
        if fused_rows:
            table(f"from hidden [{a.tokens}, {a.hidden}] and the head's rows (the matmuls included):", fused_rows)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
