"""Bad input is the named exception on every rank (never a hang), and the context's
semantics: re-entrant, local to the thread and the contextvars context, its config flags."""

import contextvars
import datetime
import os
import tempfile
import threading
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor import DTensor

import hyper_parallel_cpp as hp
from ranks import run_ranks

CLASSES = 11


def bad_inputs(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    logits = torch.randn(5, CLASSES, dtype=torch.float64)
    dist.broadcast(logits, 0)
    target = torch.randint(0, CLASSES, (5,))
    dist.broadcast(target, 0)
    x = distribute_tensor(logits, mesh, [Shard(1)])

    def expect(exc, match, fn, **options):
        with pytest.raises(exc, match=match):
            with hp.loss_parallel(**options):
                fn()

    # A plain tensor is PyTorch's own (test_loss_parallel_context.py has the rest).
    with hp.loss_parallel():
        torch.testing.assert_close(F.cross_entropy(logits, target), F.cross_entropy(logits, target), rtol=0, atol=0)
    # Replicate logits: the class dim is not sharded.
    expect(hp.LossParallelLayoutError, r"the class dim 1 is not sharded",
           lambda: F.cross_entropy(distribute_tensor(logits, mesh, [Replicate()]), target))
    # Logits on a mesh other than mesh=.
    other = init_device_mesh("cpu", (world, 1))
    expect(hp.LossParallelLayoutError, r"expected the input on that mesh", lambda: F.cross_entropy(x, target),
           mesh=other)
    # Partial logits.
    partial = DTensor.from_local(logits / world, mesh, [Partial()])
    expect(hp.LossParallelLayoutError, r"reduce the Partial first", lambda: F.cross_entropy(partial, target))
    # A target on another device (the meta device stands in for a GPU here).
    expect(RuntimeError, r"device", lambda: F.cross_entropy(x, target.to("meta")))
    # Probability targets with ignore_index.
    expect(hp.LossParallelUnsupportedError, r"ignore_index",
           lambda: F.cross_entropy(x, torch.softmax(logits, 1), ignore_index=0))
    # A target only one rank has wrong: every rank raises the same IndexError.
    bad = target.clone()
    if rank == world - 1:
        bad[2] = CLASSES + 4
    if world == 1:
        expect(IndexError, rf"Target {CLASSES + 4} is out of bounds", lambda: F.cross_entropy(x, bad))
    else:
        expect(RuntimeError, rf"refused on rank\(s\) {world - 1} .*Target {CLASSES + 4} is out of bounds",
               lambda: F.cross_entropy(x, bad))
    # A sharded target for index targets.
    expect(hp.LossParallelLayoutError, r"expected the target laid out \[Replicate\(\)\] \(or replicated\)",
           lambda: F.cross_entropy(x, distribute_tensor(target.double(), mesh, [Shard(0)]).long()))
    # Options that only cross_entropy takes, on log_softmax.
    expect(hp.LossParallelUnsupportedError, r"cross_entropy only", lambda: F.log_softmax(x, 1), z_loss_weight=1e-4)
    # Gradients of the target or weight.
    expect(hp.LossParallelUnsupportedError, r"gradients with respect to the target or the class weights",
           lambda: F.cross_entropy(x, target, weight=torch.ones(CLASSES, dtype=torch.float64, requires_grad=True)))
    # nll_loss with a floating-point target on one rank (all ranks, at world 1): refused on every rank.
    logp_target = target.double() if rank == 0 else target
    expect(RuntimeError, r"expected target dtype to be Long or Byte, but got Double",
           lambda: F.nll_loss(F.log_softmax(x, 1), logp_target))
    # After all of that the group still works: no rank is stuck in a collective.
    with hp.loss_parallel():
        loss = F.cross_entropy(x, target)
    torch.testing.assert_close(loss.full_tensor(), F.cross_entropy(logits, target), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("world", [1, 3])
def test_bad_input_is_the_named_error_on_every_rank(world):
    run_ranks(world, bad_inputs, timeout=240)


# --- one process: the context's own semantics -------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    if not dist.is_initialized():
        d = tempfile.mkdtemp()
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=60))
    yield init_device_mesh("cpu", (1,))


def test_the_context_is_reentrant_and_refuses_contradicting_options(mesh):
    assert not hp.is_loss_parallel_active()
    with hp.loss_parallel(z_loss_weight=1e-4):
        with hp.loss_parallel():  # no options: nests
            with hp.loss_parallel(z_loss_weight=1e-4):  # the same ones: nests
                assert hp.is_loss_parallel_active()
        with pytest.raises(hp.LossParallelLayoutError, match="contradict"):
            with hp.loss_parallel(z_loss_weight=2e-4):
                pass
        assert hp.is_loss_parallel_active()
    assert not hp.is_loss_parallel_active()


def test_the_context_is_local_to_the_thread_and_the_contextvars_context(mesh):
    seen = {}
    with hp.loss_parallel():
        t = threading.Thread(target=lambda: seen.setdefault("thread", hp.is_loss_parallel_active()))
        t.start()
        t.join()
        seen["fresh context"] = contextvars.Context().run(hp.is_loss_parallel_active)
        seen["copied context"] = contextvars.copy_context().run(hp.is_loss_parallel_active)
        # In a fresh context the routing is off too: a plain tensor is computed the ordinary way.
        logits, target = torch.randn(4, CLASSES), torch.randint(0, CLASSES, (4,))
        seen["plain loss in a fresh context"] = contextvars.Context().run(
            lambda: F.cross_entropy(logits, target).item())
    assert seen == {"thread": False, "fresh context": False, "copied context": True,
                    "plain loss in a fresh context": pytest.approx(F.cross_entropy(logits, target).item())}


def test_backward_runs_outside_the_context_and_in_another_thread(mesh):
    logits = torch.randn(6, CLASSES, dtype=torch.float64)
    target = torch.randint(0, CLASSES, (6,))
    x = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
    with hp.loss_parallel():
        loss = F.cross_entropy(x, target, label_smoothing=0.1)
    t = threading.Thread(target=loss.backward)
    t.start()
    t.join()
    ref_x = logits.clone().requires_grad_()
    F.cross_entropy(ref_x, target, label_smoothing=0.1).backward()
    torch.testing.assert_close(x.grad.full_tensor(), ref_x.grad, rtol=1e-12, atol=1e-12)


def test_train_context_and_the_disable_flag(mesh):
    with hp.get_train_context(True)():
        assert hp.is_loss_parallel_active()
    with hp.get_train_context(False)():
        assert not hp.is_loss_parallel_active()
    hp.set_parallelism_config(hp.ParallelismConfig(disable_loss_parallel=True))
    try:
        assert hp.parallelism_config().disable_loss_parallel
        with hp.get_train_context(True)():
            assert not hp.is_loss_parallel_active()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            with hp.loss_parallel():
                assert not hp.is_loss_parallel_active()
    finally:
        hp.set_parallelism_config(hp.ParallelismConfig())
    assert hp.parallelism_config() == hp.ParallelismConfig()


def test_a_registered_name_without_a_kernel_is_refused_not_computed(mesh):
    x = distribute_tensor(torch.randn(3, CLASSES), mesh, [Shard(1)])
    hp.register_loss_parallel_op_names("softmax")
    assert "softmax" in hp.loss_parallel_op_names()
    with pytest.raises(hp.LossParallelUnsupportedError, match="'softmax'.*no loss_parallel kernel"):
        with hp.loss_parallel():
            F.softmax(x, dim=1)
    F.softmax(x, dim=1)  # outside the context it is PyTorch's


def test_errors_derive_from_the_python_classes_the_spec_names():
    assert issubclass(hp.LossParallelLayoutError, ValueError)
    assert issubclass(hp.LossParallelUnsupportedError, NotImplementedError)


def test_the_class_dim_sharded_twice_is_refused_when_strict_and_re_laid_out_when_not():
    logits = torch.randn(4, CLASSES, dtype=torch.float64)
    target = torch.randint(0, CLASSES, (4,))
    mesh2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
    x = distribute_tensor(logits, mesh2, [Shard(1), Shard(1)])
    with pytest.raises(hp.LossParallelLayoutError, match=r"\(strict\).*exactly one mesh dim"):
        with hp.loss_parallel():
            F.cross_entropy(x, target)
    with pytest.warns(UserWarning, match="re-laying out the logits"):
        with hp.loss_parallel(strict=False):
            loss = F.cross_entropy(x, target)
    torch.testing.assert_close(loss.full_tensor(), F.cross_entropy(logits, target))


def test_fallback_on_layout_error_gathers_with_a_warning(mesh):
    logits = torch.randn(4, CLASSES, dtype=torch.float64)
    target = torch.randint(0, CLASSES, (4,))
    other = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
    x = distribute_tensor(logits, mesh, [Shard(1)])  # not on mesh=
    with pytest.raises(hp.LossParallelLayoutError, match="expected the input on that mesh"):
        with hp.loss_parallel(mesh=other, strict=False):
            F.cross_entropy(x, target)
    hp.set_parallelism_config(hp.ParallelismConfig(loss_parallel_fallback_on_layout_error=True))
    try:
        with pytest.warns(UserWarning, match="all-gathering the logits"):
            with hp.loss_parallel(mesh=other, strict=False):
                loss = F.cross_entropy(x, target)
        torch.testing.assert_close(loss.full_tensor(), F.cross_entropy(logits, target))
    finally:
        hp.set_parallelism_config(hp.ParallelismConfig())


def test_bad_arguments_are_named_where_they_are_given():
    with pytest.raises(ValueError, match="logit_softcap must be >= 0"):
        with hp.loss_parallel(logit_softcap=-1.0):
            pass
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh or None"):
        with hp.loss_parallel(mesh="tp"):
            pass
    with pytest.raises(TypeError, match="expected non-empty strings"):
        hp.register_loss_parallel_op_names("")
    with pytest.raises(TypeError, match="expected a ParallelismConfig"):
        hp.set_parallelism_config({"disable_loss_parallel": True})
    with pytest.raises(ValueError, match="reduction must be one of 'none', 'mean', 'sum', got 'avg'"):
        hp.vocab_parallel_cross_entropy(torch.randn(2, CLASSES), torch.zeros(2, dtype=torch.long), reduction="avg")
    assert not hp.is_loss_parallel_active()
