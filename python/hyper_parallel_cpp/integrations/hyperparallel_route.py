"""HyperParallel's DistributedOp for the routed names, and what it runs: our kernels on the local
pieces inside loss_parallel(), exact whole-tensor arithmetic or a named error outside it.

The dispatcher caches (output layout, implementation) per name and input layouts for the life of
the process, and its key holds no context flag: so nothing here decides by the context at inference
time. The implementation returned checks the context, the options and the sizes each time it runs.
"""

import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import class_layout
from .._extension import _C
from ..config import parallelism_config
from ..eager_kernels import LogSoftmax, NllLoss
from ..errors import LossParallelLayoutError, LossParallelUnsupportedError, warn_once
from ..loss_arguments import (CROSS_ENTROPY, NLL_LOSS, check_probability_shape, log_softmax_args, reduction_code,
                              reduction_of, reject_cross_entropy_only_options)
from ..loss_parallel_state import LossParallelOptions, active_options
from ..registered_ops import cross_entropy_op
from .hyperparallel_layout import (ROUTE, ClassAxis, all_replicated, class_axes, class_axis, describe,
                                   named_layouts, on_logits_mesh, replicated_value)


class _Replicated:
    """An output layout for the dispatcher to wrap a loss with: Replicate on every axis of `mesh`."""

    def __init__(self, mesh, replicate):
        self.mesh = mesh
        self.placements = tuple(replicate() for _ in range(mesh.ndim))


def route_class(distributed_op: type) -> type:
    """The DistributedOp subclass install() registers for each of ROUTED_NAMES."""
    from hyper_parallel.core.placement_types import Replicate

    class VocabParallelRoute(distributed_op):
        """HyperParallel's rule for a routed name: our kernels inside loss_parallel()."""

        def infer_layout(self, layouts, extra_args):
            x = layouts[0] if layouts else None
            if x is None:
                return None  # the implementation raises: the logits are not a DTensor
            # A loss is replicated on the logits' mesh; log_softmax keeps its input's layout.
            return x if self.op_name == "log_softmax" else _Replicated(x.mesh, Replicate)

        def get_expand_impl(self, func, output_layout, layouts, extra_args):
            layouts = list(layouts)
            run = {"cross_entropy": _cross_entropy, "nll_loss": _nll_loss, "log_softmax": _log_softmax}[self.op_name]
            return lambda *args, **kwargs: run(func, layouts, args, kwargs)

    return VocabParallelRoute


def _refuse_partial(x, op: str) -> None:
    """Partial logits: no route here reduces them, and the ordinary op would read a summand as the whole."""
    if any(p.is_partial() for p in x.placements):
        raise LossParallelLayoutError(f"{op} on HyperParallel DTensor input: expected no Partial placement, got "
                                      f"{describe(x)} (reduce it first)")


def _outside_context(func, layouts, args, kwargs, op: str, x, class_dim: int, ndim: int):
    """A call the context does not own: exact whole-tensor arithmetic, or a named error."""
    if x is None:
        raise LossParallelLayoutError(f"{op}: expected the input to be a HyperParallel DTensor, got a plain tensor "
                                      f"beside DTensor arguments")
    if all_replicated(x) and all(lay is None or all_replicated(lay) for lay in layouts):
        return func(*args, **kwargs)  # every rank holds everything: the ordinary op is exact
    _refuse_partial(x, op)
    axes = class_axes(x, class_dim, ndim)
    if axes and active_options() is None:
        # First the record the ranks inside the context send first (one small all-gather, on this
        # refusal or fallback path only): a context entered on some ranks only is then the same
        # named error on every rank, not an error here and a wait in the all-gather there.
        like = next(v for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor))
        _C.agree_outside_loss_parallel("vocab_parallel_" + op, x.mesh.get_group(axes[0]).group_name, like)
        config = parallelism_config()
        if config.loss_parallel_fallback_on_layout_error:
            warn_once("hyperparallel-gather:" + op,
                          f"{op} on class-sharded HyperParallel DTensor logits outside loss_parallel: all-gathering "
                          f"the classes (loss_parallel_fallback_on_layout_error is set)")
            return _gathered(func, layouts, args, kwargs, x, class_dim, ndim)
        raise LossParallelLayoutError(
            f"{op} on HyperParallel DTensor logits sharded along the class dim ({describe(x)}) outside "
            f"loss_parallel: each rank holds only its piece of the classes. Call it inside `with "
            f"hyper_parallel_cpp.loss_parallel():` (integrations.hyperparallel installed)")
    raise LossParallelLayoutError(f"{op} on HyperParallel DTensor input laid out as {describe(x)}: no exact rule "
                                  f"for this layout; expected {class_layout.expected_layout(ROUTE, class_dim)} inside "
                                  f"loss_parallel, or every input replicated")


class _GatherClasses(torch.autograd.Function):
    """The whole class dim from every rank's even piece; backward keeps this rank's piece of the
    gradient (the result is replicated, so no collective)."""

    @staticmethod
    def forward(ctx, local, class_dim, axis):
        pieces = [torch.empty_like(local) for _ in range(axis.size)]
        dist.all_gather(pieces, local.contiguous(), group=_group(axis))
        ctx.args = (class_dim, axis.rank * local.shape[class_dim], local.shape[class_dim])
        return torch.cat(pieces, class_dim)

    @staticmethod
    def backward(ctx, grad):
        class_dim, start, length = ctx.args
        return grad.narrow(class_dim, start, length), None, None


def _group(axis: ClassAxis):
    return torch.distributed.distributed_c10d._resolve_process_group(axis.group_name)


def _gathered(func, layouts, args, kwargs, x, class_dim: int, ndim: int):
    axis = class_axis(x, class_dim, ndim, getattr(func, "__name__", "loss"), LossParallelOptions(strict=False))

    def whole(value, layout):
        if layout is x or (layout is not None and list(layout.placements) == list(x.placements)):
            return _GatherClasses.apply(value, class_dim, axis)
        return value

    n = len(args)
    args = [whole(a, layouts[i] if i < len(layouts) else None) for i, a in enumerate(args)]
    kwargs = {k: whole(v, layouts[n + i] if n + i < len(layouts) else None) for i, (k, v) in enumerate(kwargs.items())}
    return func(*args, **kwargs)


@dataclass
class _LossCall:
    """A loss call (cross_entropy, nll_loss) the context owns: its arguments by name (local
    values), their layouts by name, and where the classes live."""
    op: str
    arguments: dict
    layouts: dict
    class_dim: int
    axis: ClassAxis
    options: LossParallelOptions

    def replicated(self, name: str, what: str):
        """The value of a target or class weight, which must be replicated on the logits' mesh."""
        value = self.arguments.get(name)
        if value is None:
            return None
        return replicated_value(value, self.layouts.get(name), self.layouts["input"], what, self.op)

    @property
    def vocab_size(self) -> int:
        return self.arguments["input"].shape[self.class_dim] * self.axis.size

    @property
    def ignore_index(self) -> int:
        return int(self.arguments.get("ignore_index", -100))

    def reduction_code(self) -> int:
        return reduction_code(reduction_of(self.arguments), self.op)


def _loss_call(op: str, signature: inspect.Signature, func, layouts, args, kwargs):
    """The call's _LossCall, or (outside the context or for logits it does not own) the call's
    result by _outside_context, or the context's named error for the logits' layout."""
    named = named_layouts(signature, layouts, args, kwargs)
    a = signature.bind(*args, **kwargs).arguments
    ndim = a["input"].dim()
    class_dim = 1 if ndim >= 2 else 0  # where F.cross_entropy / F.nll_loss read the classes
    options = active_options()
    x = named.get("input")
    if options is None or x is None or not class_axes(x, class_dim, ndim):
        if options is not None and options.effective_strict():
            class_axis(x, class_dim, ndim, op, options)  # raises the context's error for this layout
        return _outside_context(func, layouts, args, kwargs, op, x, class_dim, ndim)
    return _LossCall(op, a, named, class_dim, class_axis(x, class_dim, ndim, op, options), options)


def _cross_entropy(func, layouts, args, kwargs):
    call = _loss_call("cross_entropy", CROSS_ENTROPY, func, layouts, args, kwargs)
    if not isinstance(call, _LossCall):
        return call
    if call.options.gradient_in_forward:
        raise LossParallelUnsupportedError("cross_entropy under loss_parallel(gradient_in_forward=True) on "
                                           "HyperParallel's DTensor: not available on this route; leave it off")
    a = call.arguments
    target = _probability_target_local(call) if a["target"].is_floating_point() else call.replicated("target", "target")
    loss, *_ = cross_entropy_op(
        a["input"], target, call.replicated("weight", "class weight"), call.axis.group_name, call.vocab_size,
        call.class_dim, call.ignore_index, call.reduction_code(), float(a.get("label_smoothing", 0.0)),
        call.options.z_loss_weight, call.options.logit_softcap)
    return loss


def _probability_target_local(call: _LossCall):
    op, target, layout, x = call.op, call.arguments["target"], call.layouts.get("target"), call.layouts["input"]
    on_logits_mesh(layout, x, "probability target", op)
    if layout is not None and list(layout.placements) == list(x.placements):
        return target  # laid out like the logits: already this rank's classes
    if layout is not None and not all_replicated(layout):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected probability targets replicated or laid out "
                                      f"like the logits ({list(x.placements)}), got {describe(layout)}")
    logits, class_dim = call.arguments["input"], call.class_dim
    whole = list(logits.shape)
    whole[class_dim] = call.vocab_size
    check_probability_shape(target.shape, whole, op)
    local = logits.shape[class_dim]
    return target.narrow(class_dim, call.axis.rank * local, local)


def _nll_loss(func, layouts, args, kwargs):
    call = _loss_call("nll_loss", NLL_LOSS, func, layouts, args, kwargs)
    if not isinstance(call, _LossCall):
        return call
    # A floating-point target is refused by the kernel in the call's record, on every rank; the
    # context's z-loss / soft-cap ride in that record too, refused on every rank alike.
    target = call.replicated("target", "target")
    weight = call.replicated("weight", "class weight")
    out, _ = NllLoss.apply(call.arguments["input"], target, weight, call.class_dim, call.reduction_code(),
                           call.ignore_index, call.axis.group_name, call.vocab_size, call.options.z_loss_weight,
                           call.options.logit_softcap)
    reject_cross_entropy_only_options(call.options, call.op)
    return out


def _log_softmax(func, layouts, args, kwargs):
    op = "log_softmax"
    local, dim, dtype = log_softmax_args(func, args, kwargs)
    x = layouts[0] if layouts else None
    if x is None or dim is None or not isinstance(dim, int):
        raise LossParallelLayoutError(f"{op} on HyperParallel DTensors: expected the input as a DTensor and an "
                                      f"integer dim, got {type(local).__name__} and dim={dim!r}")
    ndim = local.dim()
    dim = dim % max(ndim, 1)
    _refuse_partial(x, op)
    if not class_axes(x, dim, ndim):
        return func(*args, **kwargs)  # no mesh axis splits `dim`: each rank's rows are whole
    options = active_options()
    if options is None:
        return _outside_context(func, layouts, args, kwargs, op, x, dim, ndim)
    axis = class_axis(x, dim, ndim, op, options)
    if dtype is not None:
        local = local.to(dtype)
    vocab_size = local.shape[dim] * axis.size
    out = LogSoftmax.apply(local, dim, axis.group_name, vocab_size, options.z_loss_weight, options.logit_softcap)
    reject_cross_entropy_only_options(options, op)
    return out
