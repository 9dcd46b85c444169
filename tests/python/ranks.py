"""Runs a test function on N real processes (Gloo on CPU, torch.multiprocessing spawn).

A rank that raises fails the test with its traceback and ends the others; ranks that do
not finish within `timeout` seconds are killed and the test fails as a hang. Each rank
has one intra-op thread (several share the machine's cores).
"""

import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, store_file, fn, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # A rank that finished cleanly ends here, without the interpreter's finalization. Gloo's
    # worker thread can still hold the barrier's work, which holds every earlier collective's
    # tensors; when it drops them while the interpreter finalizes, releasing a Python-owned
    # tensor on that thread takes the GIL, which exits the thread through a noexcept
    # destructor: "terminate called without an active exception", SIGABRT after the test
    # passed (seen about once in 8 runs of test_loss_parallel.py under load; the core showed
    # c10d AsyncBarrierWork -> AsyncAllgatherCoalescedWork -> decref_pyobject -> take_gil ->
    # pthread_exit). A rank that raised still finalizes and reports its error as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(world, fn, *args, timeout=300):
    """fn(rank, world, *args) on `world` processes; fn must be a module-level function."""
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_entry, args=(world, os.path.join(d, "store"), fn, args), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise AssertionError(f"{fn.__name__} on {world} ranks did not finish within {timeout} s (a hang)")


def assert_close(got, want, tol, what):
    """|got - want| <= tol * max(1, |want|), elementwise, with the worst element named."""
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs() / want.abs().clamp_min(1.0)
    both_nan = got.isnan() & want.isnan()
    err = torch.where(both_nan, torch.zeros_like(err), err)
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= tol, f"{what}: relative error {worst:.3e} > {tol:.1e}"
    return worst
