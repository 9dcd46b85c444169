#!/usr/bin/env python3
"""The error table of vocab_parallel_logprobs across temperatures (docs/loss_parallel.md,
"Log-probabilities and entropy at a temperature"): TP 2 over Gloo (two processes, the tests'
tests/python/ranks.py), against the softmax's closed forms in float64 on the whole logits
(_truth), beside PyTorch's log_softmax(logits / T) computed in the logits' dtype. Each error is
max |got - want| / max |want| of one result: the log-probabilities, the entropy, d lp/dx
(incoming gradient on lp alone) and d H/dx (on H alone) — against each result's own scale, so
that a small entropy gradient (a nearly one-hot row) must have a small error too.

Logits (64 rows): "mixed", 1001 classes, odd rows within a few T of one another at an offset
~N(0, 10^2) (x / T is large there, the case where rounding x / T first costs most), even rows
N(0, 4^2) (one-hot at small T, near uniform at large T); "issue", 13 classes N(0, 4^2).

    cd build && PYTHONPATH=$PWD/python:../python OMP_NUM_THREADS=1 \\
      ~/.cache/hyper_parallel/torch-2.15.0/bin/python ../scripts/logprobs_temperature_errors.py [mixed|issue]
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

TEMPERATURES = (1e-3, 1e-2, 0.05, 1.0, 1e3)
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _error(got, want, whole=None):
    """max |got - want| / max |whole| (whole: the result on every rank; want: this rank's piece)."""
    whole = want if whole is None else whole
    return ((got.double() - want).abs().max() / whole.abs().max().clamp_min(1e-300)).item()


def _logits(kind, temperature, gen):
    rows, vocab = 64, (13 if kind == "issue" else 1001)
    wide = torch.randn(rows, vocab, dtype=torch.float64, generator=gen) * 4
    if kind == "issue":
        return wide
    near = torch.randn(rows, 1, dtype=torch.float64, generator=gen) * 10 + torch.randn(
        rows, vocab, dtype=torch.float64, generator=gen) * (3 * temperature)
    return torch.where((torch.arange(rows) % 2 == 1).unsqueeze(1), near, wide)


def _truth(full, target, temperature, g_lp, g_h):
    """The softmax's closed forms in float64 on d = (x - max) / T, the difference taken before it
    is divided: PyTorch's own float64 log_softmax(x / T) rounds x / T first (1e-13 off at
    T = 1e-3), and its autograd entropy gradient of a one-hot row is 0 at the max where the
    truth is ~1e-28 (its row then does not sum to 0)."""
    x = full.double()
    d = (x - x.amax(-1, keepdim=True)) / temperature
    log_sum = torch.logsumexp(d, -1, keepdim=True)
    p = torch.exp(d - log_sum)
    mean = (p * d).sum(-1, keepdim=True)
    lp = (d - log_sum).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    h = (log_sum - mean).squeeze(-1)
    onehot = torch.nn.functional.one_hot(target, x.shape[-1]).double()
    grad = (g_lp.unsqueeze(-1) * (onehot - p) - g_h.unsqueeze(-1) * p * (d - mean)) / temperature
    return lp, h, grad


def _pytorch(full, target, temperature, g_lp, g_h):
    x = full.detach().clone().requires_grad_()
    lsm = torch.log_softmax(x / temperature, -1)
    lp = lsm.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    h = -(lsm.exp() * lsm).sum(-1)
    (lp.double() * g_lp + h.double() * g_h).sum().backward()
    return lp.detach(), h.detach(), x.grad


def table(rank, world, kind):
    import hyper_parallel_cpp as hp
    if rank == 0:
        print(f"logits: {kind}; TP {world}\n| T | dtype | lp | H | d lp/dx | d H/dx "
              "| PyTorch lp | PyTorch H | PyTorch d lp/dx | PyTorch d H/dx |\n" + "|---" * 10 + "|", flush=True)
    for temperature in TEMPERATURES:
        gen = torch.Generator().manual_seed(3)
        full64 = _logits(kind, temperature, gen)
        target = torch.randint(0, full64.shape[1], (full64.shape[0],), generator=gen)
        g_lp = torch.randn(full64.shape[0], dtype=torch.float64, generator=gen)
        g_h = torch.randn(full64.shape[0], dtype=torch.float64, generator=gen)
        for dtype in DTYPES:
            full = full64.to(dtype)
            ours, theirs = {}, {}
            for name, (a, b) in (("lp", (g_lp, 0 * g_h)), ("H", (0 * g_lp, g_h))):
                want_lp, want_h, want_all = _truth(full, target, temperature, a, b)
                want_grad = torch.chunk(want_all, world, -1)[rank]
                x = torch.chunk(full, world, -1)[rank].clone().requires_grad_()
                lp, h = hp.vocab_parallel_logprobs(x, target, dist.group.WORLD, temperature=temperature,
                                                   return_entropy=True, vocab_size=full.shape[1])
                (lp.double() * a + h.double() * b).sum().backward()
                ours.update(lp=_error(lp, want_lp), H=_error(h, want_h),
                            **{"g" + name: _error(x.grad, want_grad, want_all)})
                t_lp, t_h, t_grad = _pytorch(full, target, temperature, a, b)
                theirs.update(lp=_error(t_lp, want_lp), H=_error(t_h, want_h),
                              **{"g" + name: _error(torch.chunk(t_grad, world, -1)[rank], want_grad, want_all)})
            keys = ("lp", "H", "glp", "gH")
            worst = torch.tensor([ours[k] for k in keys] + [theirs[k] for k in keys], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if rank == 0:
                print(f"| {temperature:g} | {str(dtype).replace('torch.', '')} | "
                      + " | ".join(f"{v:.1e}" for v in worst.tolist()) + " |", flush=True)


if __name__ == "__main__":
    from ranks import run_ranks
    import logprobs_temperature_errors as me
    run_ranks(2, me.table, sys.argv[1] if len(sys.argv) > 1 else "mixed")
