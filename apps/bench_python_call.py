"""What a small loss call costs through Python, beside the C++ path, in one run:

    PYTHONPATH=build/python OMP_NUM_THREADS=1 python apps/bench_python_call.py --hp-bench build/bin/hp-bench

One process (no group: the time is the call's own, not two processes' scheduling), one
thread, [tokens, vocab] float32 logits, forward + backward, median over --repeats blocks of
--calls calls:

  python op         hyper_parallel_cpp.vocab_parallel_cross_entropy(x, target); loss.backward()
  C++ kernels       the library's forward and backward called directly through the module's
                    bindings (no autograd, no dispatcher): the C++ path's cost seen from Python
  hp-bench fused    hp-bench's fused row on the same shape (a C++ program: loss_parallel on a
                    DTensor, C++ autograd), through hp-run beside it, when --hp-bench names it

and the same for vocab_parallel_logprobs with the entropy. Ratios are against the C++ kernels.
"""

import argparse
import os
import re
import statistics
import subprocess
import time

import torch

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C


def per_call(fn, calls, repeats):
    for _ in range(calls):  # warm-up
        fn()
    blocks = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        blocks.append((time.perf_counter() - t0) / calls)
    return statistics.median(blocks)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--hp-bench", default="", help="path of hp-bench, for its fused row on the same shape")
    a = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(a.tokens, a.vocab, generator=g) * 2
    target = torch.randint(a.vocab, (a.tokens,), generator=g)
    ones = torch.ones(())
    ones_rows = torch.ones(a.tokens)
    empty = torch.empty(0)

    def python_ce():
        x = logits.detach().requires_grad_()
        hp.vocab_parallel_cross_entropy(x, target).backward()

    def kernels_ce():
        loss, row_max, log_sum, row_weight, grad_rows, _ = _C.cross_entropy_forward(
            logits, 1, target, None, "", a.vocab, -100, 1, 0.0, 0.0, 0.0, False)
        _C.cross_entropy_backward(ones, logits, 1, target, None, row_max, log_sum, row_weight, empty, "", a.vocab,
                                  -100, 1, 0.0, 0.0, 0.0)

    def python_logprobs():
        x = logits.detach().requires_grad_()
        lp, ent = hp.vocab_parallel_logprobs(x, target, temperature=0.7, return_entropy=True)
        (lp.sum() + ent.sum()).backward()

    rows = [("cross-entropy", per_call(python_ce, a.calls, a.repeats), per_call(kernels_ce, a.calls, a.repeats))]
    rows.append(("log-probabilities + entropy", per_call(python_logprobs, a.calls, a.repeats), None))
    fused = None
    if a.hp_bench:
        hp_run = os.path.join(os.path.dirname(a.hp_bench), "hp-run")
        out = subprocess.run([hp_run, "--nproc-per-node", "1", a.hp_bench, "--tokens", str(a.tokens), "--vocab",
                              str(a.vocab), "--threads", "1", "--iters", "500"], capture_output=True, text=True).stdout
        m = re.search(r"^(?:\[rank0\]: )?fused\s+([0-9.]+)", out, re.M)
        fused = float(m.group(1)) / 1e3 if m else None
    print(f"a small loss call, forward + backward, [{a.tokens}, {a.vocab}] float32, one process, 1 thread, "
          f"median of {a.repeats} x {a.calls} calls; torch {torch.__version__}")
    base = rows[0][2]
    print(f"  {'':30}{'python op us':>14}{'C++ kernels us':>16}{'x kernels':>11}")
    for name, py, cpp in rows:
        cpp_text = f"{cpp * 1e6:16.1f}" if cpp else f"{'':16}"
        print(f"  {name:30}{py * 1e6:14.1f}{cpp_text}{py / base:11.2f}")
    if fused is not None:
        print(f"  hp-bench fused row (C++ program): {fused * 1e6:.1f} us; python op / it: {rows[0][1] / fused:.2f}")


if __name__ == "__main__":
    main()
