"""loss_parallel() for HyperParallel's MindSpore DTensor.

HyperParallel's MindSpore DTensor sees primitives (its ``__fallback__`` hands each one to its
dispatcher, keyed by the primitive's name), not Python functions, and MindSpore's cross-entropy
is a composition of several (``ops.cross_entropy``: x - logsumexp then nll_loss; mint's:
LogSoftmaxExt + NLLLoss) that its layout rules refuse on class-sharded logits. So the route
wraps the Python functions themselves: inside ``with loss_parallel():``, ``ops.cross_entropy``,
``mint.nn.functional.cross_entropy`` and the two ``CrossEntropyLoss`` Cells (which call them) on
a DTensor whose class dim is sharded run vocab_parallel_cross_entropy on its local piece: one
collective forward, none backward. Anything else goes to MindSpore unchanged. PyNative only
(HyperParallel's DTensor is a PyNative object).
"""

import contextlib
import functools
from contextvars import ContextVar
from typing import Iterator

import mindspore as ms

from .. import class_layout
from .cross_entropy import vocab_parallel_cross_entropy
from .errors import LossParallelLayoutError, LossParallelUnsupportedError

_FLOATING = (ms.float16, ms.bfloat16, ms.float32, ms.float64)
_DEPTH: ContextVar = ContextVar("hyper_parallel_cpp_mindspore_loss_parallel", default=0)
_INSTALLED = []


def is_loss_parallel_active() -> bool:
    return _DEPTH.get() > 0


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """Route MindSpore's cross-entropy on class-sharded HyperParallel DTensors to our kernels.

    Re-entrant. The loss is a plain Tensor, the same on every rank of the class group.
    """
    _install()
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield
    finally:
        _DEPTH.reset(token)


def _is_dtensor(value) -> bool:
    return hasattr(value, "to_local") and hasattr(value, "device_mesh") and hasattr(value, "placements")


# HyperParallel's MindSpore DTensor under the one class-axis decision (class_layout.py): it cannot
# re-lay out the logits, its loss is replicated (so its other mesh dims must be Replicate), and it has
# no strictness.
ROUTE = class_layout.Route("a HyperParallel DTensor", relayout=False, rows_sharded=False, relax="",
                           layout_error=LossParallelLayoutError, unsupported_error=LossParallelUnsupportedError)


def _neutral(p, ndim: int) -> class_layout.Placement:
    # Read by type name: HyperParallel's MindSpore placements (Shard(dim), Replicate, Partial).
    kind = type(p).__name__
    if kind == "Shard" and hasattr(p, "dim"):
        return class_layout.shard(p.dim % ndim)
    if kind == "Replicate":
        return class_layout.REPLICATE
    return class_layout.Placement("partial" if kind == "Partial" else "other")


def _view(logits) -> class_layout.LayoutView:
    ndim = len(logits.shape)
    return class_layout.LayoutView(tuple(_neutral(p, ndim) for p in logits.placements), ndim,
                                   f"placements {tuple(logits.placements)}", lambda mesh, mesh_dim: True)


def _is_class_sharded(logits) -> bool:
    """MindSpore takes the classes from the last dim of the logits it routes ([rows, classes])."""
    view = _view(logits)
    return bool(class_layout.mesh_dims_sharding(view.placements, view.ndim - 1))


def _plain(value, name, logits_placements, class_dim_ok):
    """A tensor argument as this rank's local tensor, checking a DTensor's layout."""
    if value is None or not _is_dtensor(value):
        return value
    placements = tuple(value.placements)
    if all(type(p).__name__ == "Replicate" for p in placements):
        return value.to_local()
    if class_dim_ok and placements == tuple(logits_placements):
        return value.to_local()
    raise LossParallelLayoutError(f"{name}: Replicate on every mesh dim expected"
                                  f"{' (or the logits placements for probabilities)' if class_dim_ok else ''},"
                                  f" found {placements}")


def _route(original, input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    if not is_loss_parallel_active() or not _is_dtensor(input):
        return original(input, target, weight, ignore_index, reduction, label_smoothing)
    if not _is_class_sharded(input):
        return original(input, target, weight, ignore_index, reduction, label_smoothing)
    if len(input.shape) != 2:
        raise LossParallelUnsupportedError(
            f"loss_parallel: [rows, classes] logits expected (MindSpore's cross-entropy takes the classes from dim 1), "
            f"found shape {tuple(input.shape)} sharded on its last dim: reshape the logits to [-1, classes] first")
    mesh_dim = class_layout.resolve(_view(input), 1, "cross_entropy", ROUTE, lambda: False).mesh_dim
    mesh = input.device_mesh
    group = mesh.get_group(mesh_dim) if mesh.ndim > 1 else mesh.get_group()
    local_logits = input.to_local()
    target = _plain(target, "target", input.placements, True)
    classes, local = int(input.shape[-1]), int(local_logits.shape[-1])
    if target.dtype in _FLOATING and tuple(target.shape) == tuple(input.shape) and local != classes:
        # Whole probability rows (a plain tensor, or Replicate): this rank's classes of them.
        start = mesh.get_local_rank(mesh_dim) * local
        target = target[:, start:start + local]
    return vocab_parallel_cross_entropy(
        local_logits, target, group, vocab_size=classes,
        ignore_index=ignore_index, weight=_plain(weight, "weight", input.placements, False), reduction=reduction,
        label_smoothing=label_smoothing)


def _wrap(original):
    @functools.wraps(original)
    def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        return _route(original, input, target, weight, ignore_index, reduction, label_smoothing)

    cross_entropy.__wrapped_by_hyper_parallel_cpp__ = True
    return cross_entropy


def _install() -> None:
    """Wrap the functions once: outside the context the wrappers call the originals."""
    if _INSTALLED:
        return
    import mindspore.mint.nn as mint_nn
    import mindspore.mint.nn.functional as mint_functional
    import mindspore.ops as ms_ops

    # nn.CrossEntropyLoss calls ops.cross_entropy; mint.nn.CrossEntropyLoss calls the name
    # cross_entropy its module imported: each is replaced where it is looked up.
    for module, name in ((ms_ops, "cross_entropy"), (mint_functional, "cross_entropy"), (mint_nn, "cross_entropy")):
        original = getattr(module, name)
        if not getattr(original, "__wrapped_by_hyper_parallel_cpp__", False):
            setattr(module, name, _wrap(original))
    _INSTALLED.append(True)


__all__ = ["is_loss_parallel_active", "loss_parallel"]
