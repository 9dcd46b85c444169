"""Runs a test function on N real processes (Gloo on CPU, torch.multiprocessing spawn).

The processes are a pool the cases of one pytest process share, one per world size: each
imports torch and joins its process group once. A rank that raises fails the test with its
traceback and ends the pool (the next case starts a fresh one); ranks that do not finish
within `timeout` seconds are killed and the test fails as a hang. Each rank has one intra-op
thread (several share the machine's cores).
"""

import atexit
import datetime
import os
import queue
import sys
import tempfile
import time
import traceback

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


class _Pool:
    """`world` rank processes, each with one torch import and one process group, that run test
    cases one after another (spawning and importing torch cost ~3 s per case otherwise). A case
    that fails or hangs on any rank ends the pool: the next case gets a fresh one, so a failure
    never leaves a broken group behind for the next case to trip over."""

    def __init__(self, world):
        ctx = mp.get_context("spawn")
        self.world = world
        self.dir = tempfile.TemporaryDirectory()
        self.tasks = [ctx.SimpleQueue() for _ in range(world)]
        self.results = ctx.Queue()
        self.procs = [ctx.Process(target=_serve, args=(r, world, os.path.join(self.dir.name, "store"), self.tasks[r],
                                                       self.results), daemon=True) for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, fn, args, timeout):
        for q in self.tasks:
            q.put((fn, args))
        deadline = time.monotonic() + timeout
        errors = {}
        done = 0
        while done < self.world:
            try:
                rank, error = self.results.get(timeout=1)
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if errors or dead or time.monotonic() > deadline:
                    # A rank failed (the others may wait in a collective until the group's
                    # timeout: a second is enough for those that fail alike), died, or hung.
                    self.close()
                    what = ("failed" if errors else f"rank(s) {dead} died" if dead
                            else f"did not finish within {timeout} s (a hang)")
                    raise AssertionError(f"{fn.__name__} on {self.world} ranks: {what}"
                                         + "".join(f"\n--- rank {r} ---\n{e}" for r, e in sorted(errors.items())))
                continue
            done += 1
            if error is not None:
                errors[rank] = error
        if errors:
            self.close()
            raise AssertionError(f"{fn.__name__} failed on {self.world} ranks:"
                                 + "".join(f"\n--- rank {r} ---\n{e}" for r, e in sorted(errors.items())))

    def alive(self):
        return all(p.is_alive() for p in self.procs)

    def close(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self.dir.cleanup()


def _serve(rank, world, store_file, tasks, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            fn(rank, world, *args)
            dist.barrier()
            results.put((rank, None))
        except BaseException:  # noqa: B902 - every failure is the case's, reported to the parent
            results.put((rank, traceback.format_exc()))
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as _entry, for the same reason


_pools = {}


@atexit.register
def _close_pools():
    for pool in _pools.values():
        for q in pool.tasks:
            q.put(None)
        for p in pool.procs:
            p.join(timeout=10)
        pool.close()
    _pools.clear()


def run_ranks(world, fn, *args, timeout=300, fresh=False):
    """fn(rank, world, *args) on `world` processes; fn must be a module-level function.

    The processes are a pool shared by the cases of this pytest process (one per world size and
    PYTHONPATH); `fresh=True` runs the case on processes of its own instead, for a case that
    depends on what a process has done once (a warning given once per process)."""
    if fresh:
        return _run_fresh(world, fn, args, timeout)
    key = (world, os.environ.get("PYTHONPATH", ""))
    pool = _pools.get(key)
    if pool is None or not pool.alive():
        pool = _pools[key] = _Pool(world)
    try:
        pool.run(fn, args, timeout)
    except BaseException:
        _pools.pop(key, None)
        raise


def _run_fresh(world, fn, args, timeout):
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
