"""The C++ kernels on local pieces as autograd Functions, for the DTensor routes (eager).

They call the library's kernels directly rather than as the registered ops (ops.py): a registered op
runs below any dispatch mode (CommDebugMode counts it as one op), while here the collectives the
kernels issue through the process group are the c10d ops that PyTorch's CommDebugMode counts. Each
takes what the route resolved (the class dim, the group's name, the vocabulary) and resolves nothing.
"""

import torch

from ._extension import _C

_EMPTY = torch.empty(0)  # "none" for the kernels' optional tensors


class CrossEntropy(torch.autograd.Function):
    """cross_entropy on the local pieces. Returns the loss and the kernel's mean denominator (what
    'mean' divides this rank's rows by: the class weights of the counted targets, their count, or
    the rows for probability targets), not differentiable. With `in_forward` the gradient is
    written over the logits' local piece in forward (gradient_in_forward)."""

    @staticmethod
    def forward(ctx, local, target, weight, group_name, vocab_size, class_dim, ignore_index, reduction, smoothing,
                z, cap, in_forward, owner):
        # owner: [the DTensor whose local piece `local` is]. A DTensor has a version counter of
        # its own, which autograd checks for its saved users and which in-place DTensor ops bump
        # (not the local piece's): both are bumped here and both checked in backward.
        loss, row_max, log_sum, row_weight, grad_rows, mean_denominator = _C.cross_entropy_forward(
            local, class_dim, target, weight, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap,
            in_forward)
        ctx.args = (class_dim, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap)
        ctx.written = grad_rows.numel() > 0
        if ctx.written:
            # The logits now hold the gradient: any other saved user of them must raise.
            (dtensor,) = owner
            for t in (local, dtensor):
                torch.autograd.graph.increment_version(t)
            ctx.local, ctx.dtensor, ctx.grad_rows = local, dtensor, grad_rows
            ctx.versions = (local._version, dtensor._version)
        else:  # not asked, or not written (rows without a unit class stride, or no classes here)
            ctx.save_for_backward(local, target, weight, row_max, log_sum, row_weight)
        ctx.mark_non_differentiable(mean_denominator)
        return loss, mean_denominator

    @staticmethod
    def backward(ctx, grad_loss, _grad_mean_denominator):
        class_dim, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap = ctx.args
        if ctx.written:
            if ctx.grad_rows is None:
                raise RuntimeError("cross_entropy with gradient_in_forward: a second backward through this loss; "
                                   "the first scaled the gradient written over the logits in place. Turn "
                                   "gradient_in_forward off to backward more than once")
            if (ctx.local._version, ctx.dtensor._version) != ctx.versions:
                raise RuntimeError("cross_entropy with gradient_in_forward: the gradient written over the logits was "
                                   "modified in place after the forward wrote it; turn gradient_in_forward off to "
                                   "use the logits' storage otherwise")
            local, grad_rows = ctx.local, ctx.grad_rows
            ctx.local = ctx.dtensor = ctx.grad_rows = None
            grad = _C.cross_entropy_backward(grad_loss, local, class_dim, _EMPTY.long(), None, _EMPTY,
                                             _EMPTY, _EMPTY, grad_rows, group_name, vocab_size, ignore_index,
                                             reduction, smoothing, z, cap)
        else:
            local, target, weight, row_max, log_sum, row_weight = ctx.saved_tensors
            grad = _C.cross_entropy_backward(grad_loss, local, class_dim, target, weight, row_max, log_sum, row_weight,
                                             _EMPTY, group_name, vocab_size, ignore_index, reduction, smoothing, z,
                                             cap)
        return (grad,) + (None,) * 12


class LogSoftmax(torch.autograd.Function):
    """log_softmax on the local pieces. z / cap: the context's cross-entropy-only options, which the C++ forward puts
    in the call's record and refuses on every rank alike (a context that differs between ranks
    is named there)."""

    @staticmethod
    def forward(ctx, local, dim, group_name, vocab_size, z, cap):
        out = _C.log_softmax(local, dim, group_name, vocab_size, None, z, cap)
        ctx.save_for_backward(out)
        ctx.args = (dim, group_name, vocab_size)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        dim, group_name, vocab_size = ctx.args
        return _C.log_softmax_backward(grad, out, dim, group_name, vocab_size), None, None, None, None, None


_NLL_LOSS_BACKWARD = torch.ops.hyper_parallel_cpp.vocab_parallel_nll_loss_backward.default


class NllLoss(torch.autograd.Function):
    """nll_loss on the local pieces (no collective backward). Returns
    the loss and the kernel's total weight (what 'mean' divides by: the class weights of the counted
    targets, or their count), not differentiable."""

    @staticmethod
    def forward(ctx, logp, target, weight, class_dim, reduction, ignore_index, group_name, vocab_size, z, cap):
        out, total_weight = _C.nll_loss_forward(logp, class_dim, target, weight, reduction, ignore_index, group_name,
                                                vocab_size, z, cap)
        ctx.save_for_backward(logp, target, weight, total_weight)
        ctx.args = (class_dim, reduction, ignore_index, group_name, vocab_size)
        ctx.mark_non_differentiable(total_weight)
        return out, total_weight

    @staticmethod
    def backward(ctx, grad, _grad_total_weight):
        logp, target, weight, total_weight = ctx.saved_tensors
        class_dim, reduction, ignore_index, group_name, vocab_size = ctx.args
        g = _NLL_LOSS_BACKWARD(grad, logp, target, weight, total_weight, class_dim, reduction, ignore_index,
                               group_name, vocab_size)
        return (g,) + (None,) * 9


__all__ = ["CrossEntropy", "LogSoftmax", "NllLoss"]
