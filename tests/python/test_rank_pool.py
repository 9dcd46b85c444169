"""The rank pool the Python tests share (ranks.py): a case that fails on one rank is reported
at once with that rank's traceback, while the other rank still waits in a collective, and
the next case runs on a working pool of its own."""

import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks


def fails_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("planted failure on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, which never comes


def sums(rank, world):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world


def test_a_failure_on_one_rank_is_reported_at_once():
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="planted failure on rank 1"):
        run_ranks(2, fails_on_rank_1)
    assert time.monotonic() - t0 < 30, "the failure waited for the other rank's collective timeout"


def test_the_case_after_a_failure_runs_on_a_working_pool():
    run_ranks(2, sums)
