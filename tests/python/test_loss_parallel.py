"""hyper_parallel_cpp.loss_parallel on PyTorch's DTensor against one process's F.cross_entropy
(float64, 1e-12) and PyTorch's own loss_parallel, TP 1-4 (3 and 4 shard 13 classes unevenly)."""

import itertools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from ranks import assert_close, run_ranks

CLASSES = 13
TOL = 1e-12


def _cases():
    # (logits shape with the class dim at 1, reduction, ignore_index or None, class weight,
    #  label smoothing, probability targets)
    for shape, reduction, ignore, weighted, smoothing, prob in itertools.product(
            [(7, CLASSES), (2, CLASSES, 3), (CLASSES,)], ["none", "mean", "sum"], [None, 3], [False, True],
            [0.0, 0.2], [False, True]):
        if prob and ignore is not None:
            continue  # PyTorch refuses ignore_index with probability targets
        yield shape, reduction, ignore, weighted, smoothing, prob


def _make_inputs(gen, shape, ignore, weighted, prob):
    logits = torch.randn(shape, dtype=torch.float64, generator=gen) * 3
    class_dim = 1 if len(shape) >= 2 else 0
    target_shape = shape[:class_dim] + shape[class_dim + 1:]
    if prob:
        target = torch.softmax(torch.randn(shape, dtype=torch.float64, generator=gen), class_dim)
    else:
        target = torch.randint(0, CLASSES, target_shape, generator=gen)
        if ignore is not None and target.numel() > 1:
            target.view(-1)[::3] = ignore
    weight = torch.rand(CLASSES, dtype=torch.float64, generator=gen) + 0.5 if weighted else None
    return logits, target, weight, class_dim


def _grad_seed(gen, reduction, target_shape):
    if reduction == "none":
        return torch.randn(target_shape, dtype=torch.float64, generator=gen)
    return torch.randn((), dtype=torch.float64, generator=gen)


def exactness(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(1234)  # the same data on every rank

    for n, (shape, reduction, ignore, weighted, smoothing, prob) in enumerate(_cases()):
        logits, target, weight, class_dim = _make_inputs(gen, shape, ignore, weighted, prob)
        kwargs = dict(weight=weight, reduction=reduction, label_smoothing=smoothing)
        if ignore is not None:
            kwargs["ignore_index"] = ignore
        ref_x = logits.clone().requires_grad_()
        ref = F.cross_entropy(ref_x, target, **kwargs)
        g = _grad_seed(gen, reduction, ref.shape)
        (ref * g).sum().backward()

        x = distribute_tensor(logits, mesh, [Shard(class_dim)]).requires_grad_()
        # Alternate plain and replicated DTensor targets and weights, and the module form.
        if n % 2:
            target = distribute_tensor(target, mesh, [Replicate()])
            if weight is not None:
                kwargs["weight"] = distribute_tensor(weight, mesh, [Replicate()])
        _C.reset_collective_counts()
        with hp.loss_parallel():
            loss = nn.CrossEntropyLoss(**kwargs)(x, target) if n % 3 == 0 else F.cross_entropy(x, target, **kwargs)
        forward = _C.collective_counts()
        assert isinstance(loss, DTensor) and loss.placements == (Replicate(),)
        _C.reset_collective_counts()
        (loss * distribute_tensor(g, mesh, [Replicate()])).sum().backward()  # outside the context
        backward = _C.collective_counts()
        what = f"rank {rank}/{world} case {shape} {reduction} ignore={ignore} weighted={weighted} " \
               f"smoothing={smoothing} prob={prob}"
        assert_close(loss.full_tensor(), ref, TOL, what + " loss")
        assert_close(x.grad.full_tensor(), ref_x.grad, TOL, what + " grad")
        # The call's record (fixed size, issue 55), then the per-row statistics; one rank: the latter.
        want = 1 if world == 1 else 2
        assert forward["all_gather"] == want and sum(forward.values()) == want, f"{what}: forward collectives {forward}"
        assert sum(backward.values()) == 0, f"{what}: backward collectives {backward}"



@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_option_matches_one_process_in_float64(world):
    run_ranks(world, exactness)


def against_torch_loss_parallel(rank, world):
    """Where PyTorch's loss_parallel is right (no smoothing, index targets, no weight with
    ignore_index), ours gives the same loss and gradient."""
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(7)
    for reduction, ignore, weighted in [("mean", None, False), ("sum", 3, False), ("none", None, True),
                                        ("mean", None, True)]:
        logits, target, weight, _ = _make_inputs(gen, (9, CLASSES), ignore, weighted, False)
        kwargs = dict(weight=weight, reduction=reduction)
        if ignore is not None:
            kwargs["ignore_index"] = ignore
        results = []
        for context in (torch_loss_parallel, hp.loss_parallel):
            x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
            with context():
                loss = F.cross_entropy(x, target, **kwargs)
                loss.sum().backward()
            results.append((loss.full_tensor(), x.grad.full_tensor()))
        what = f"{reduction} ignore={ignore} weighted={weighted}"
        assert_close(results[1][0], results[0][0], TOL, what + " loss vs PyTorch's loss_parallel")
        assert_close(results[1][1], results[0][1], TOL, what + " grad vs PyTorch's loss_parallel")


@pytest.mark.parametrize("world", [2, 3])
def test_same_as_pytorchs_loss_parallel_where_it_is_right(world):
    run_ranks(world, against_torch_loss_parallel)


def log_softmax_consumers(rank, world):
    """pytorch/pytorch#190746: a sharded log_softmax feeding anything but nll_loss."""
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, CLASSES, dtype=torch.float64, generator=gen) * 2
    coef = torch.randn(6, CLASSES, dtype=torch.float64, generator=gen)
    index = torch.randint(0, CLASSES, (6, 2), generator=gen)
    target = torch.randint(0, CLASSES, (6,), generator=gen)
    target[1] = -100
    weight = torch.rand(CLASSES, dtype=torch.float64, generator=gen) + 0.5

    def reference(fn):
        x = logits.clone().requires_grad_()
        out = fn(x)
        out.backward()
        return out.detach(), x.grad

    consumers = {
        "weighted sum": (lambda lp: (lp * coef).sum(),
                         lambda lp: (lp * distribute_tensor(coef, mesh, [Shard(1)])).sum()),
        "gather then sum": (lambda lp: lp.gather(1, index).sum(),
                            lambda lp: lp.full_tensor().gather(1, index).sum()),
        "nll_loss": (lambda lp: F.nll_loss(lp, target, weight=weight),
                     lambda lp: F.nll_loss(lp, target, weight=weight)),
        "nll_loss sum": (lambda lp: F.nll_loss(lp, target, reduction="sum"),
                         lambda lp: F.nll_loss(lp, target, reduction="sum")),
    }
    for name, (ref_fn, dt_fn) in consumers.items():
        want, want_grad = reference(lambda x: ref_fn(F.log_softmax(x, dim=1)))
        for form in ("F", "torch", "method"):
            x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
            with hp.loss_parallel():
                lp = {"F": lambda: F.log_softmax(x, dim=1), "torch": lambda: torch.log_softmax(x, 1),
                      "method": lambda: x.log_softmax(dim=-1)}[form]()
                assert lp.placements == (Shard(1),) and lp.shape == x.shape
                out = dt_fn(lp)
            out.backward()
            got = out.full_tensor() if isinstance(out, DTensor) else out
            assert_close(got, want, TOL, f"{name} ({form}) value")
            assert_close(x.grad.full_tensor(), want_grad, TOL, f"{name} ({form}) grad")


@pytest.mark.parametrize("world", [2, 3])
def test_log_softmax_is_right_for_every_consumer(world):
    run_ranks(world, log_softmax_consumers)


def two_dim_mesh(rank, world):
    # PyTorch 2.15's contract under strict (test_loss_parallel_meshes.py has every layout); the
    # config is the root: strict=None follows loss_parallel_strict_mesh.
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    gen = torch.Generator().manual_seed(5)
    logits, target, weight, _ = _make_inputs(gen, (8, CLASSES), 3, True, False)
    ref_x = logits.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, target, weight=weight, ignore_index=3, label_smoothing=0.1)
    ref.backward()
    x = distribute_tensor(logits, mesh, [Replicate(), Shard(1)])
    with pytest.raises(hp.LossParallelUnsupportedError, match="one-dimensional"):
        with hp.loss_parallel():
            F.cross_entropy(x, target, weight=weight, ignore_index=3)
    hp.set_parallelism_config(hp.ParallelismConfig(loss_parallel_strict_mesh=False))
    try:
        x = distribute_tensor(logits, mesh, [Replicate(), Shard(1)]).requires_grad_()
        with _no_warning():
            with hp.loss_parallel(mesh=mesh):
                loss = F.cross_entropy(x, target, weight=weight, ignore_index=3, label_smoothing=0.1)
        loss.backward()
        assert loss.placements == (Replicate(), Replicate())
        assert_close(loss.full_tensor(), ref, TOL, "strict from the config")
        assert_close(x.grad.full_tensor(), ref_x.grad, TOL, "strict from the config: gradient")
    finally:
        hp.set_parallelism_config(hp.ParallelismConfig())


class _no_warning(warnings.catch_warnings):
    """Any warning inside is an error: nothing is re-laid out."""

    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error")


def test_a_two_dim_mesh_follows_pytorchs_contract_and_the_config():
    run_ranks(4, two_dim_mesh, fresh=True)


def gradient_in_forward(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(9)
    for reduction, smoothing, weighted in [("mean", 0.0, False), ("sum", 0.1, True), ("none", 0.0, True)]:
        logits, target, weight, _ = _make_inputs(gen, (8, CLASSES), 3, weighted, False)
        ref_x = logits.clone().requires_grad_()
        ref = F.cross_entropy(ref_x, target, weight=weight, ignore_index=3, reduction=reduction,
                              label_smoothing=smoothing)
        seed = _grad_seed(gen, reduction, ref.shape)
        (ref * seed).sum().backward()
        leaf = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
        x = leaf * 1.0  # logits a model produced: not a leaf
        with hp.loss_parallel(gradient_in_forward=True):
            loss = F.cross_entropy(x, target, weight=weight, ignore_index=3, reduction=reduction,
                                   label_smoothing=smoothing)
        (loss * distribute_tensor(seed, mesh, [Replicate()])).sum().backward()
        what = f"gradient_in_forward {reduction} smoothing={smoothing} weighted={weighted}"
        assert_close(loss.full_tensor(), ref, TOL, what + " loss")
        assert_close(leaf.grad.full_tensor(), ref_x.grad, TOL, what + " grad")
    # Another user that saved the logits raises instead of reading the gradient written over them.
    leaf = distribute_tensor(torch.randn(4, CLASSES, dtype=torch.float64), mesh, [Shard(1)]).requires_grad_()
    x = leaf * 1.0
    other = (x * x).sum()
    with hp.loss_parallel(gradient_in_forward=True):
        loss = F.cross_entropy(x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss + other).backward()
    # The gradient written over the logits, changed before backward: refused, not scaled.
    x = leaf * 1.0
    with hp.loss_parallel(gradient_in_forward=True):
        loss = F.cross_entropy(x, torch.zeros(4, dtype=torch.long))
    x.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place after the forward wrote it"):
        loss.backward()
    # One backward per loss.
    x = leaf * 1.0
    with hp.loss_parallel(gradient_in_forward=True):
        loss = F.cross_entropy(x, torch.zeros(4, dtype=torch.long))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


@pytest.mark.parametrize("world", [2, 3])
def test_gradient_in_forward_gives_the_same_gradient_without_a_buffer(world):
    run_ranks(world, gradient_in_forward)
