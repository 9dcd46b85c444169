"""loss_parallel()'s handlers on PyTorch's DTensor: cross_entropy, nll_loss and log_softmax on
class-sharded logits, run on the local pieces with the C++ kernels (eager_kernels.py) over the process
group of the mesh dim that shards the classes, the loss laid out as PyTorch 2.15's loss_parallel lays
it out (torch_dtensor_layout.py). A handler returns NotImplemented for a call that is PyTorch's.
"""

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from . import torch_dtensor_layout as layout
from .eager_kernels import CrossEntropy, LogSoftmax, NllLoss
from .errors import LossParallelUnsupportedError, warn_once
from .loss_arguments import (CROSS_ENTROPY, NLL_LOSS, log_softmax_args, reduction_code, reduction_of,
                             reject_cross_entropy_only_options)
from .loss_parallel_state import LossParallelOptions


def _cross_entropy(options: LossParallelOptions, args, kwargs):
    a = CROSS_ENTROPY.bind(*args, **kwargs).arguments
    logits, target, weight = a["input"], a["target"], a.get("weight")
    if not isinstance(logits, DTensor):
        return NotImplemented  # plain tensors are PyTorch's, as under its own loss_parallel
    op = "cross_entropy"
    class_dim = 1 if logits.ndim >= 2 else 0
    if not layout.is_class_sharded(logits, class_dim) and not layout.settled_strict(op, options, logits):
        warn_once("unsharded", f"loss_parallel (strict=False): logits are not sharded along the class dim "
                               f"({layout.describe(logits)}); computing cross_entropy the ordinary way")
        return NotImplemented
    cs = layout.resolve_or_fallback(logits, class_dim, op, options)
    if cs is None:
        return _gathered(F.cross_entropy, logits, op, options, args, kwargs)
    reduction, global_mean, code = _reduction(cs, a, op, options)
    if target.is_floating_point():
        target_local = layout.probability_target_local(target, cs, op, options)
    else:
        target_local = layout.laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    weight_local = None if weight is None else layout.replicated_local(weight, "class weight", op, cs.mesh)
    ignore_index = int(a.get("ignore_index", -100))
    if global_mean and options.z_loss_weight != 0:
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel(z_loss_weight={options.z_loss_weight}): reduction='mean' on a mesh whose "
            f"other dims shard the rows ({layout.describe(cs.logits)}) divides the z-loss by another count than the "
            f"cross-entropy; use reduction='sum' and divide yourself")
    args = (cs.group_name, cs.vocab_size, class_dim, ignore_index, code, float(a.get("label_smoothing", 0.0)),
            options.z_loss_weight, options.logit_softcap)
    local = cs.logits.to_local()
    # Not for leaves: their values are the caller's, and their .grad would alias them.
    in_forward = options.gradient_in_forward and torch.is_grad_enabled() and cs.logits.grad_fn is not None
    loss, denominator = CrossEntropy.apply(local, target_local, weight_local, *args, in_forward, [cs.logits])
    if global_mean:  # the kernel's denominator (compute type), in the loss's dtype as the loss is scaled
        loss = loss * layout.global_mean_scale(cs, denominator.to(loss.dtype))
    return layout.loss_result(loss, cs, reduction)


def _reduction(cs: layout.ClassSharding, a: dict, op: str, options: LossParallelOptions):
    """(reduction, global mean, the kernel's reduction code) of cross_entropy / nll_loss: 'mean' on
    a mesh whose other dims shard the rows is the global one (the kernel sums; the denominator is
    summed over those dims), refused under strict (PyTorch's contract)."""
    reduction = reduction_of(a)
    layout.check_mean(cs, reduction, op, options)
    global_mean = reduction == "mean" and bool(cs.batch_mesh_dims())
    return reduction, global_mean, reduction_code("sum" if global_mean else reduction, op)


def _gathered(func, logits: DTensor, op: str, options: LossParallelOptions, args, kwargs):
    """The fallback (loss_parallel_fallback_on_layout_error): func on the gathered inputs."""
    if op != "cross_entropy":
        reject_cross_entropy_only_options(options, op)
    return layout.gathered(func, logits.device_mesh, args, kwargs)


def _log_softmax(options: LossParallelOptions, args, kwargs, func=None):
    logits, dim, dtype = log_softmax_args(func, args, kwargs)
    if not isinstance(logits, DTensor) or dim is None or not isinstance(dim, int):
        return NotImplemented
    dim = dim % max(logits.ndim, 1)
    if not layout.is_class_sharded(logits, dim):
        return NotImplemented
    op = "log_softmax"
    cs = layout.resolve_or_fallback(logits, dim, op, options)
    if cs is None:
        return _gathered(func, logits, op, options, args, kwargs)
    t = cs.logits
    local = t.to_local()
    if dtype is not None:
        local = local.to(dtype)
    out = LogSoftmax.apply(local, dim, cs.group_name, cs.vocab_size, options.z_loss_weight, options.logit_softcap)
    reject_cross_entropy_only_options(options, op)
    return DTensor.from_local(out, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


def _nll_loss(options: LossParallelOptions, args, kwargs):
    a = NLL_LOSS.bind(*args, **kwargs).arguments
    logp, target, weight = a["input"], a["target"], a.get("weight")
    class_dim = 1 if getattr(logp, "ndim", 0) >= 2 else 0
    if not layout.is_class_sharded(logp, class_dim):
        return NotImplemented
    op = "nll_loss"
    cs = layout.resolve_or_fallback(logp, class_dim, op, options)
    if cs is None:
        return _gathered(F.nll_loss, logp, op, options, args, kwargs)
    # A floating-point target is refused by the kernel in the call's record (on every rank, as
    # F.nll_loss refuses it), not here: a refusal on one rank alone would leave the others waiting.
    reduction, global_mean, code = _reduction(cs, a, op, options)
    target_local = layout.laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    weight_local = None if weight is None else layout.replicated_local(weight, "class weight", op, cs.mesh)
    out, total_weight = NllLoss.apply(cs.logits.to_local(), target_local, weight_local, class_dim, code,
                                      int(a.get("ignore_index", -100)), cs.group_name, cs.vocab_size,
                                      options.z_loss_weight, options.logit_softcap)
    reject_cross_entropy_only_options(options, op)
    if global_mean:  # the kernel's total weight (the loss's dtype) is what 'mean' divides this rank's rows by
        out = out * layout.global_mean_scale(cs, total_weight)
    return layout.loss_result(out, cs, reduction)


# The functions loss_parallel()'s mode routes, and their handlers: one dict lookup per torch call decides.
ROUTES = {
    F.cross_entropy: lambda options, args, kwargs, func: _cross_entropy(options, args, kwargs),
    F.nll_loss: lambda options, args, kwargs, func: _nll_loss(options, args, kwargs),
    **{f: _log_softmax for f in (F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
                                       torch.special.log_softmax)},
}


__all__ = ["ROUTES"]
