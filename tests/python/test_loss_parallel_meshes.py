"""loss_parallel on meshes of more than one dim, as PyTorch 2.15's loss_parallel takes them:
dp x tp, tp x dp, cp x tp (a sequence-sharded 3-D input), a Replicate non-TP dim, and dp 2 x
tp 3 (uneven class pieces), against one process's F.cross_entropy in float64 (values and
gradients) and against PyTorch's own loss_parallel on the same DTensors (the loss's placements,
and its values where it is right). Plain tensors inside the context are PyTorch's."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from ranks import assert_close, run_ranks

CLASSES = 13  # uneven over a tp of 3 (5 / 5 / 3)
TOL = 1e-12

# (mesh shape, mesh dim names, logits shape, logits placements): the class dim is 1.
LAYOUTS = {
    "dp x tp": ((2, 2), ("dp", "tp"), (8, CLASSES), [Shard(0), Shard(1)]),
    "tp x dp": ((2, 2), ("tp", "dp"), (8, CLASSES), [Shard(1), Shard(0)]),
    "cp x tp, 3-D": ((2, 2), ("cp", "tp"), (3, CLASSES, 6), [Shard(2), Shard(1)]),
    "rep x tp": ((2, 2), ("rep", "tp"), (8, CLASSES), [Replicate(), Shard(1)]),
    "dp x tp, uneven batch": ((2, 2), ("dp", "tp"), (7, CLASSES), [Shard(0), Shard(1)]),
    "dp 2 x tp 3": ((2, 3), ("dp", "tp"), (8, CLASSES), [Shard(0), Shard(1)]),
}


def _row_placements(placements, class_dim):
    out = []
    for p in placements:
        if isinstance(p, Shard) and p.dim == class_dim:
            out.append(Replicate())
        elif isinstance(p, Shard):
            out.append(Shard(p.dim - 1 if p.dim > class_dim else p.dim))
        else:
            out.append(p)
    return out


def _inputs(gen, shape, prob):
    logits = torch.randn(shape, dtype=torch.float64, generator=gen) * 3
    rows_shape = shape[:1] + shape[2:]
    if prob:
        target = torch.softmax(torch.randn(shape, dtype=torch.float64, generator=gen), 1)
    else:
        target = torch.randint(0, CLASSES, rows_shape, generator=gen)
        target.view(-1)[::4] = 3  # ignored below
    weight = torch.rand(CLASSES, dtype=torch.float64, generator=gen) + 0.5
    return logits, target, weight


def _dp_tp(seed):
    """A dp 2 x tp 2 mesh, float64 logits and index targets, the logits [Shard(0), Shard(1)]."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    logits, target, _ = _inputs(torch.Generator().manual_seed(seed), (8, CLASSES), False)
    return mesh, logits, target, distribute_tensor(logits, mesh, [Shard(0), Shard(1)])


def _partial_on_dp(logits, mesh):
    """The logits as [Partial("sum"), Shard(1)]: halves on each dp rank."""
    half = distribute_tensor(logits, mesh, [Replicate(), Shard(1)]).to_local() / 2
    return DTensor.from_local(half, mesh, [Partial("sum"), Shard(1)], run_check=False, shape=logits.shape,
                              stride=logits.stride())


def _counts():
    c = _C.collective_counts()
    _C.reset_collective_counts()
    return c


def exact_on_every_layout(rank, world, name):
    mesh_shape, names, shape, placements = LAYOUTS[name]
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    gen = torch.Generator().manual_seed(17)
    row_placements = _row_placements(placements, 1)
    for reduction in ("none", "sum", "mean"):
        for prob, weighted, smoothing in [(False, False, 0.0), (False, True, 0.1), (True, True, 0.0),
                                          (True, False, 0.2)]:
            logits, target, weight = _inputs(gen, shape, prob)
            kwargs = dict(weight=weight if weighted else None, reduction=reduction, label_smoothing=smoothing)
            if not prob:
                kwargs["ignore_index"] = 3
            ref_x = logits.clone().requires_grad_()
            ref = F.cross_entropy(ref_x, target, **kwargs)
            seed = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
            (ref * seed).sum().backward()

            x = distribute_tensor(logits, mesh, placements).requires_grad_()
            dist_target = distribute_tensor(target, mesh, placements if prob else row_placements)
            what = f"{name} rank {rank}: {reduction} prob={prob} weighted={weighted} smoothing={smoothing}"
            # mean on a mesh of more than one dim: refused under strict, as PyTorch refuses it.
            strict = not (reduction == "mean")
            if reduction == "mean":
                with pytest.raises(NotImplementedError, match="one-dimensional"):
                    with hp.loss_parallel():
                        F.cross_entropy(x, dist_target, **kwargs)
            _counts()
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # nothing here is re-laid out
                with hp.loss_parallel(strict=strict):
                    loss = F.cross_entropy(x, dist_target, **kwargs)
            forward = _counts()
            assert isinstance(loss, DTensor), what
            if reduction == "none":
                assert list(loss.placements) == row_placements, f"{what}: {loss.placements}"
            else:
                want = [Partial("sum") if isinstance(p, Shard) else Replicate() for p in row_placements]
                assert list(loss.placements) == want, f"{what}: {loss.placements}"
            (loss * distribute_tensor(seed, mesh, list(loss.placements) if reduction == "none"
                                      else [Replicate()] * mesh.ndim)).sum().backward()
            backward = _counts()
            assert_close(loss.full_tensor(), ref, TOL, what + " loss")
            assert_close(x.grad.full_tensor(), ref_x.grad, TOL, what + " grad")
            assert x.grad.placements == x.placements, what
            # The library's own: the record and the statistics on the tp group; none backward. A
            # mean on a mesh of more than one dim is decided by the strictness: the ranks agree on
            # it first (one small all-gather per mesh dim).
            gathers = 2 + (mesh.ndim if reduction == "mean" else 0)
            assert forward.get("all_gather", 0) == gathers and sum(forward.values()) == gathers, f"{what}: {forward}"
            assert sum(backward.values()) == 0, f"{what}: backward {backward}"
            if not prob and not weighted and smoothing == 0 and reduction != "mean":
                # PyTorch's own on the same DTensors: the same placements and values.
                x2 = distribute_tensor(logits, mesh, placements).requires_grad_()
                with torch_loss_parallel():
                    theirs = F.cross_entropy(x2, dist_target, **kwargs)
                    (theirs * distribute_tensor(seed, mesh, list(theirs.placements) if reduction == "none"
                                                else [Replicate()] * mesh.ndim)).sum().backward()
                assert theirs.placements == loss.placements, f"{what}: PyTorch's {theirs.placements}"
                assert_close(loss.full_tensor(), theirs.full_tensor(), 1e-12, what + " vs PyTorch's")
                assert_close(x.grad.full_tensor(), x2.grad.full_tensor(), 1e-12, what + " grad vs PyTorch's")


@pytest.mark.parametrize("name", [n for n in LAYOUTS if LAYOUTS[n][0] == (2, 2)])
def test_exact_on_two_dim_meshes(name):
    run_ranks(4, exact_on_every_layout, name)


def test_exact_on_dp2_tp3_uneven_classes():
    run_ranks(6, exact_on_every_layout, "dp 2 x tp 3")


def comm_debug_mode_counts(rank, world):
    from torch.distributed.tensor.debug import CommDebugMode

    c10d = torch.ops.c10d
    gen = torch.Generator().manual_seed(5)
    for mesh_shape, names, placements, target_placements, reduction, strict, want_forward in [
        # 1-D: the call's record and the statistics, two all-gathers on the tp group.
        ((world,), ("tp",), [Shard(1)], [Replicate()], "mean", True, {c10d.allgather_: 2}),
        # dp x tp, the exact global mean: one all-reduce of its denominator over dp more.
        # (and the strictness agreed first: one all-gather per mesh dim).
        ((2, world // 2), ("dp", "tp"), [Shard(0), Shard(1)], [Shard(0), Replicate()], "mean", False,
         {c10d.allgather_: 4, c10d.allreduce_: 1}),
        ((2, world // 2), ("dp", "tp"), [Shard(0), Shard(1)], [Shard(0), Replicate()], "sum", True,
         {c10d.allgather_: 2}),
    ]:
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        logits, target, _ = _inputs(gen, (8, CLASSES), False)
        x = distribute_tensor(logits, mesh, placements).requires_grad_()
        dist_target = distribute_tensor(target, mesh, target_placements)
        what = f"rank {rank} {names} {reduction}"
        with CommDebugMode() as comm:
            with hp.loss_parallel(strict=strict):
                loss = F.cross_entropy(x, dist_target, ignore_index=3, reduction=reduction)
        assert dict(comm.get_comm_counts()) == want_forward, f"{what}: forward {dict(comm.get_comm_counts())}"
        with CommDebugMode() as comm:
            loss.backward()
        assert comm.get_total_counts() == 0, f"{what}: backward {dict(comm.get_comm_counts())}"
        ref_x = logits.clone().requires_grad_()
        ref = F.cross_entropy(ref_x, target, ignore_index=3, reduction=reduction)
        ref.backward()
        assert_close(loss.full_tensor(), ref, TOL, what + " loss")
        assert_close(x.grad.full_tensor(), ref_x.grad, TOL, what + " grad")


    # log_softmax: the record, then the max and the sum-exp all-reduced; its backward one all-reduce.
    # nll_loss on it: the record and one all-reduce, none backward.
    mesh = init_device_mesh("cpu", (world,))
    logits, target, _ = _inputs(gen, (8, CLASSES), False)
    x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
    with CommDebugMode() as comm:
        with hp.loss_parallel():
            logp = F.log_softmax(x, 1)
    assert dict(comm.get_comm_counts()) == {c10d.allgather_: 1, c10d.allreduce_: 2}, dict(comm.get_comm_counts())
    with CommDebugMode() as comm:
        with hp.loss_parallel():
            nll = F.nll_loss(logp, target, ignore_index=3)
    assert dict(comm.get_comm_counts()) == {c10d.allgather_: 1, c10d.allreduce_: 1}, dict(comm.get_comm_counts())
    with CommDebugMode() as comm:
        nll.backward()
    assert dict(comm.get_comm_counts()) == {c10d.allreduce_: 1}, dict(comm.get_comm_counts())
    ref_x = logits.clone().requires_grad_()
    F.nll_loss(F.log_softmax(ref_x, 1), target, ignore_index=3).backward()
    assert_close(x.grad.full_tensor(), ref_x.grad, TOL, "log_softmax + nll_loss gradient")


def test_comm_debug_mode_counts_the_collectives():
    run_ranks(4, comm_debug_mode_counts)


def plain_target_and_partial_logits_are_refused_as_pytorch_refuses(rank, world):
    mesh, logits, target, x = _dp_tp(8)
    for strict in (True, False):
        with hp.loss_parallel(strict=strict):
            with pytest.raises(hp.LossParallelLayoutError, match="requires a DTensor"):
                F.cross_entropy(x, target, reduction="sum")
            with pytest.raises(hp.LossParallelLayoutError, match="probability target as a DTensor.*requires a DTensor"):
                F.cross_entropy(x, torch.softmax(logits, 1), reduction="sum")
    assert issubclass(hp.LossParallelLayoutError, ValueError)
    partial = _partial_on_dp(logits, mesh)
    dist_target = distribute_tensor(target, mesh, [Replicate(), Replicate()])
    for reduction in ("sum", "none", "mean"):
        with hp.loss_parallel():
            with pytest.raises(ValueError, match="Shard or Replicate"):
                F.cross_entropy(partial, dist_target, reduction=reduction)
    # strict=False reduces the Partial first (a warning) and is exact.
    xp = _partial_on_dp(logits, mesh)
    with pytest.warns(UserWarning, match="re-laying out the logits"):
        with hp.loss_parallel(strict=False):
            loss = F.cross_entropy(xp, dist_target, ignore_index=3, reduction="sum")
    assert_close(loss.full_tensor(), F.cross_entropy(logits, target, ignore_index=3, reduction="sum"), TOL,
                 "Partial logits re-laid out")
    # A target laid out otherwise than the logits' rows: refused under strict.
    wrong = distribute_tensor(target, mesh, [Replicate(), Shard(0)])
    with hp.loss_parallel():
        with pytest.raises(hp.LossParallelLayoutError, match=r"laid out \[Shard\(dim=0\), Replicate\(\)\]"):
            F.cross_entropy(x, wrong, reduction="sum")


def test_plain_target_and_partial_logits_are_refused_as_pytorch_refuses():
    run_ranks(4, plain_target_and_partial_logits_are_refused_as_pytorch_refuses, fresh=True)


def log_softmax_nll_and_logprobs_on_dp_x_tp(rank, world):
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    gen = torch.Generator().manual_seed(11)
    logits, target, weight = _inputs(gen, (8, CLASSES), False)
    ref_x = logits.clone().requires_grad_()
    ref_lp = F.log_softmax(ref_x, 1)
    ref = F.nll_loss(ref_lp, target, weight=weight, ignore_index=3, reduction="sum") + (ref_lp * ref_lp).sum()
    ref.backward()
    x = distribute_tensor(logits, mesh, [Shard(0), Shard(1)]).requires_grad_()
    dist_target = distribute_tensor(target, mesh, [Shard(0), Replicate()])
    with hp.loss_parallel():
        lp = F.log_softmax(x, 1)
        assert lp.placements == x.placements
        nll = F.nll_loss(lp, dist_target, weight=weight, ignore_index=3, reduction="sum")
        assert list(nll.placements) == [Partial("sum"), Replicate()]
        total = nll.full_tensor() + (lp * lp).sum().full_tensor()
    total.backward()
    assert_close(total, ref, TOL, "log_softmax + nll_loss on dp x tp")
    assert_close(x.grad.full_tensor(), ref_x.grad, TOL, "log_softmax + nll_loss gradient on dp x tp")
    # Per-token log-probabilities: laid out as the target.
    y = distribute_tensor(logits, mesh, [Shard(0), Shard(1)]).requires_grad_()
    safe = target.clone()
    logprobs = hp.vocab_parallel_logprobs(y, distribute_tensor(safe, mesh, [Shard(0), Replicate()]), temperature=0.7)
    assert list(logprobs.placements) == [Shard(0), Replicate()]
    want = torch.log_softmax(logits / 0.7, 1).gather(1, safe.unsqueeze(1)).squeeze(1)
    want[safe == -100] = 0
    assert_close(logprobs.full_tensor(), want, 1e-12, "logprobs on dp x tp")


def test_log_softmax_nll_loss_and_logprobs_on_dp_x_tp():
    run_ranks(4, log_softmax_nll_and_logprobs_on_dp_x_tp)


def strictness_that_differs_between_ranks(rank, world):
    # What the strictness alone decides (a mean on dp x tp, Partial logits) is agreed first: a
    # strictness that differs between ranks is the same named error on every rank, at once.
    mesh, logits, target, x = _dp_tp(21)
    dist_target = distribute_tensor(target, mesh, [Shard(0), Replicate()])
    partial = _partial_on_dp(logits, mesh)
    replicated = distribute_tensor(target, mesh, [Replicate(), Replicate()])
    for strict_ranks in ({0}, {0, 1}, {1, 3}):
        for logits_, target_ in ((x, dist_target), (partial, replicated)):
            with pytest.raises(hp.LossParallelLayoutError, match="loss_parallel strictness"):
                with hp.loss_parallel(strict=rank in strict_ranks):
                    F.cross_entropy(logits_, target_, reduction="mean")


def test_a_strictness_that_differs_between_ranks_is_the_same_named_error():
    run_ranks(4, strictness_that_differs_between_ranks, timeout=120)
