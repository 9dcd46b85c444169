"""Vocabulary-parallel losses as torch.library ops on plain local tensors.

Each rank of a process group holds the ``torch.chunk`` piece of the classes that DTensor's
``Shard`` of the class dim gives it (uneven pieces allowed). The ops have fake kernels and
autograd formulas, so ``torch.compile(fullgraph=True)`` traces them as single nodes; the
process group travels as its name (``group.group_name``), as PyTorch's functional
collectives pass it. Every kernel is the C++ library's.

Collectives: cross-entropy one all-gather forward (which also carries the input checks, so
bad input is the same error on every rank), none backward; log_softmax two all-reduces
forward, one backward; nll_loss one all-reduce forward, none backward. Each forward first
all-gathers one small fixed-size record in which the ranks agree on the call (rows, dtype,
vocabulary, options; nll_loss's checks ride in it), so a difference is the same
LossParallelLayoutError (a ValueError) on every rank. A ``vocab_size`` of None is learnt in
that record for the cross-entropies, and costs log_softmax and nll_loss one small all-gather
more (the pieces' sizes).
"""

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from ._extension import _C

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}
_EMPTY = torch.empty(0)  # "none" for the kernels' optional tensors


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _rows(t: Tensor, class_dim: int) -> int:
    n = 1
    for i, s in enumerate(t.shape):
        if i != class_dim % t.dim():
            n *= s
    return n


# --- cross-entropy ------------------------------------------------------------------------


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_cross_entropy", mutates_args=())
def _cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    group_name: str,
    vocab_size: int,
    class_dim: int,
    ignore_index: int,
    reduction: int,
    label_smoothing: float,
    z_loss_weight: float,
    logit_softcap: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # A vocab_size < 0 is learnt from the ranks' class counts in the call's record.
    loss, row_max, log_sum, row_weight, _, vocab_size = _C.cross_entropy_forward(
        logits, class_dim, target, weight, group_name, vocab_size, ignore_index, reduction,
        label_smoothing, z_loss_weight, logit_softcap, False, True,
    )
    return loss, row_max, log_sum, row_weight, torch.tensor(vocab_size, dtype=torch.int64)


def _check_devices(op: str, logits: Tensor, **others: Optional[Tensor]) -> None:
    # The kernels' own check, also in the fake kernel: the dispatcher sends a call with any
    # meta tensor among its inputs to the fake kernel, which must refuse it as the real one does.
    for what, t in others.items():
        if t is not None and t.device != logits.device:
            what = what.replace("_", " ")
            raise RuntimeError(f"{op}: expected all tensors on the same device, but the {what} is on {t.device} "
                               f"and the logits on {logits.device} (move the {what} with .to({logits.device}))")


@_cross_entropy.register_fake
def _(logits, target, weight, group_name, vocab_size, class_dim, ignore_index, reduction,
      label_smoothing, z_loss_weight, logit_softcap):
    _check_devices("vocab_parallel_cross_entropy", logits, target=target, class_weight=weight)
    ct = _compute_dtype(logits.dtype)
    rows = _rows(logits, class_dim)
    shape = [s for i, s in enumerate(logits.shape) if i != class_dim % logits.dim()]
    loss = logits.new_empty(shape if reduction == 0 else [])
    stat = logits.new_empty([rows], dtype=ct)
    row_weight = logits.new_empty([rows if target.is_floating_point() else 0], dtype=ct)
    return loss, stat, stat.clone(), row_weight, torch.empty([], dtype=torch.int64)


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_cross_entropy_backward", mutates_args=())
def _cross_entropy_backward(
    grad: Tensor,
    logits: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    row_max: Tensor,
    log_sum: Tensor,
    row_weight: Tensor,
    vocab_size: Tensor,
    group_name: str,
    class_dim: int,
    ignore_index: int,
    reduction: int,
    label_smoothing: float,
    z_loss_weight: float,
    logit_softcap: float,
) -> Tensor:
    return _C.cross_entropy_backward(
        grad, logits, class_dim, target, weight, row_max, log_sum, row_weight, _EMPTY, group_name,
        int(vocab_size), ignore_index, reduction, label_smoothing, z_loss_weight, logit_softcap,
    )


@_cross_entropy_backward.register_fake
def _(grad, logits, *args):
    return torch.empty_like(logits)


def _cross_entropy_setup(ctx, inputs, output):
    logits, target, weight, group_name, _, class_dim, ignore_index, reduction, smoothing, z, cap = inputs
    _, row_max, log_sum, row_weight, vocab = output
    ctx.save_for_backward(logits, target, weight, row_max, log_sum, row_weight, vocab)
    ctx.args = (group_name, class_dim, ignore_index, reduction, smoothing, z, cap)


def _cross_entropy_grad(ctx, grad_loss, *unused):
    logits, target, weight, row_max, log_sum, row_weight, vocab = ctx.saved_tensors
    grad = None
    if ctx.needs_input_grad[0]:
        grad = _cross_entropy_backward(grad_loss, logits, target, weight, row_max, log_sum, row_weight, vocab,
                                       *ctx.args)
    return (grad,) + (None,) * 10


_cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# --- log_softmax and nll_loss ---------------------------------------------------------------


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_log_softmax", mutates_args=())
def _log_softmax(local: Tensor, class_dim: int, group_name: str, vocab_size: int) -> Tensor:
    return _C.log_softmax(local, class_dim, group_name, vocab_size, None)


@_log_softmax.register_fake
def _(local, class_dim, group_name, vocab_size):
    return torch.empty_like(local)


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_log_softmax_backward", mutates_args=())
def _log_softmax_backward(grad: Tensor, output: Tensor, class_dim: int, group_name: str, vocab_size: int) -> Tensor:
    return _C.log_softmax_backward(grad, output, class_dim, group_name, vocab_size, output.dtype)


@_log_softmax_backward.register_fake
def _(grad, output, class_dim, group_name, vocab_size):
    return torch.empty_like(output)


def _log_softmax_setup(ctx, inputs, output):
    _, class_dim, group_name, vocab_size = inputs
    ctx.save_for_backward(output)
    ctx.args = (class_dim, group_name, vocab_size)


def _log_softmax_grad(ctx, grad):
    (output,) = ctx.saved_tensors
    return _log_softmax_backward(grad, output, *ctx.args), None, None, None


_log_softmax.register_autograd(_log_softmax_grad, setup_context=_log_softmax_setup)


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_nll_loss", mutates_args=())
def _nll_loss(
    logp: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    class_dim: int,
    reduction: int,
    ignore_index: int,
    group_name: str,
    vocab_size: int,
) -> Tuple[Tensor, Tensor]:
    return _C.nll_loss_forward(logp, class_dim, target, weight, reduction, ignore_index, group_name, vocab_size)


@_nll_loss.register_fake
def _(logp, target, weight, class_dim, reduction, ignore_index, group_name, vocab_size):
    _check_devices("vocab_parallel_nll_loss", logp, target=target, class_weight=weight)
    out = logp.new_empty(target.shape if reduction == 0 else [])
    return out, logp.new_empty([])


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_nll_loss_backward", mutates_args=())
def _nll_loss_backward(
    grad: Tensor,
    logp: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    total_weight: Tensor,
    class_dim: int,
    reduction: int,
    ignore_index: int,
    group_name: str,
    vocab_size: int,
) -> Tensor:
    return _C.nll_loss_backward(grad, logp, class_dim, target, weight, reduction, ignore_index, total_weight,
                                group_name, vocab_size)


@_nll_loss_backward.register_fake
def _(grad, logp, *args):
    return torch.empty_like(logp)


def _nll_loss_setup(ctx, inputs, output):
    logp, target, weight, class_dim, reduction, ignore_index, group_name, vocab_size = inputs
    ctx.save_for_backward(logp, target, weight, output[1])
    ctx.args = (class_dim, reduction, ignore_index, group_name, vocab_size)


def _nll_loss_grad(ctx, grad, _unused):
    logp, target, weight, total_weight = ctx.saved_tensors
    return (_nll_loss_backward(grad, logp, target, weight, total_weight, *ctx.args),) + (None,) * 7


_nll_loss.register_autograd(_nll_loss_grad, setup_context=_nll_loss_setup)


# --- fused linear + cross-entropy (the logits never exist) ---------------------------------


@torch.library.custom_op("hyper_parallel_cpp::fused_linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(
    hidden: Tensor,
    local_weight: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    group_name: str,
    vocab_size: int,
    ignore_index: int,
    reduction: int,
    label_smoothing: float,
    z_loss_weight: float,
    logit_softcap: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    # A vocab_size < 0 is learnt from the ranks' class counts in the call's record.
    loss, row_max, log_sum, vocab_size = _C.linear_cross_entropy_forward(
        hidden, local_weight, target, weight, group_name, vocab_size, ignore_index, reduction, label_smoothing,
        z_loss_weight, logit_softcap)
    return loss, row_max, log_sum, torch.tensor(vocab_size, dtype=torch.int64)


@_linear_cross_entropy.register_fake
def _(hidden, local_weight, target, weight, group_name, vocab_size, ignore_index, reduction, label_smoothing,
      z_loss_weight, logit_softcap):
    _check_devices("fused_linear_cross_entropy", hidden, weight_rows=local_weight, target=target, class_weight=weight)
    rows = hidden.shape[0]
    stat = hidden.new_empty([rows], dtype=_compute_dtype(hidden.dtype))
    return (hidden.new_empty([rows] if reduction == 0 else []), stat, stat.clone(),
            torch.empty([], dtype=torch.int64))


@torch.library.custom_op("hyper_parallel_cpp::fused_linear_cross_entropy_backward", mutates_args=())
def _linear_cross_entropy_backward(
    grad: Tensor,
    hidden: Tensor,
    local_weight: Tensor,
    target: Tensor,
    weight: Optional[Tensor],
    row_max: Tensor,
    log_sum: Tensor,
    vocab_size: Tensor,
    group_name: str,
    ignore_index: int,
    reduction: int,
    label_smoothing: float,
    z_loss_weight: float,
    logit_softcap: float,
) -> Tuple[Tensor, Tensor]:
    return _C.linear_cross_entropy_backward(
        grad, hidden, local_weight, target, weight, row_max, log_sum, group_name, int(vocab_size), ignore_index,
        reduction, label_smoothing, z_loss_weight, logit_softcap, True, True)


@_linear_cross_entropy_backward.register_fake
def _(grad, hidden, local_weight, *args):
    return torch.empty_like(hidden), torch.empty_like(local_weight)


def _linear_cross_entropy_setup(ctx, inputs, output):
    hidden, local_weight, target, weight, group_name, _, ignore_index, reduction, smoothing, z, cap = inputs
    _, row_max, log_sum, vocab = output
    ctx.save_for_backward(hidden, local_weight, target, weight, row_max, log_sum, vocab)
    ctx.args = (group_name, ignore_index, reduction, smoothing, z, cap)


def _linear_cross_entropy_grad(ctx, grad_loss, *unused):
    hidden, local_weight, target, weight, row_max, log_sum, vocab = ctx.saved_tensors
    grad_h, grad_w = _linear_cross_entropy_backward(grad_loss, hidden, local_weight, target, weight, row_max,
                                                    log_sum, vocab, *ctx.args)
    return (grad_h if ctx.needs_input_grad[0] else None, grad_w if ctx.needs_input_grad[1] else None) + (None,) * 9


_linear_cross_entropy.register_autograd(_linear_cross_entropy_grad, setup_context=_linear_cross_entropy_setup)


# --- per-token log-probabilities and entropy at a temperature ------------------------------
# Outputs: logprobs, entropy (empty unless asked), row_max, log_sum, the entropy backward keeps
# (compute type; empty unless asked), the vocabulary used. Backward takes either gradient.


def _logprobs_fake_outputs(like: Tensor, rows_shape, return_entropy: bool):
    ct = _compute_dtype(like.dtype)
    rows = 1
    for s in rows_shape:
        rows *= s
    stat = like.new_empty([rows], dtype=ct)
    kept = like.new_empty([rows if return_entropy else 0], dtype=ct)
    return (like.new_empty(rows_shape), like.new_empty(rows_shape if return_entropy else [0]), stat, stat.clone(),
            kept, torch.empty([], dtype=torch.int64))


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_logprobs", mutates_args=())
def _logprobs(logits: Tensor, target: Tensor, group_name: str, vocab_size: int, class_dim: int, temperature: float,
              return_entropy: bool, ignore_index: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    lp, entropy, row_max, log_sum, kept, vocab = _C.logprobs_forward(
        logits, class_dim, target, group_name, vocab_size, temperature, return_entropy, ignore_index)
    return lp, entropy, row_max, log_sum, kept, torch.tensor(vocab, dtype=torch.int64)


@_logprobs.register_fake
def _(logits, target, group_name, vocab_size, class_dim, temperature, return_entropy, ignore_index):
    _check_devices("vocab_parallel_logprobs", logits, target=target)
    shape = [s for i, s in enumerate(logits.shape) if i != class_dim % logits.dim()]
    return _logprobs_fake_outputs(logits, shape, return_entropy)


@torch.library.custom_op("hyper_parallel_cpp::vocab_parallel_logprobs_backward", mutates_args=())
def _logprobs_backward(grad_logprobs: Optional[Tensor], grad_entropy: Optional[Tensor], logits: Tensor,
                       target: Tensor, row_max: Tensor, log_sum: Tensor, entropy: Tensor, vocab_size: Tensor,
                       group_name: str, class_dim: int, temperature: float, ignore_index: int) -> Tensor:
    return _C.logprobs_backward(grad_logprobs, grad_entropy, logits, class_dim, target, row_max, log_sum, entropy,
                                group_name, int(vocab_size), temperature, ignore_index)


@_logprobs_backward.register_fake
def _(grad_logprobs, grad_entropy, logits, *args):
    return torch.empty_like(logits)


def _logprobs_setup(ctx, inputs, output):
    logits, target, group_name, _, class_dim, temperature, return_entropy, ignore_index = inputs
    _, _, row_max, log_sum, kept, vocab = output
    ctx.save_for_backward(logits, target, row_max, log_sum, kept, vocab)
    ctx.args = (group_name, class_dim, temperature, ignore_index)
    ctx.return_entropy = return_entropy


def _logprobs_grad(ctx, grad_logprobs, grad_entropy, *unused):
    logits, target, row_max, log_sum, kept, vocab = ctx.saved_tensors
    grad = None
    if ctx.needs_input_grad[0]:
        grad = _logprobs_backward(grad_logprobs, grad_entropy if ctx.return_entropy else None, logits, target,
                                  row_max, log_sum, kept, vocab, *ctx.args)
    return (grad,) + (None,) * 7


_logprobs.register_autograd(_logprobs_grad, setup_context=_logprobs_setup)


@torch.library.custom_op("hyper_parallel_cpp::fused_linear_logprobs", mutates_args=())
def _linear_logprobs(hidden: Tensor, local_weight: Tensor, target: Tensor, group_name: str, vocab_size: int,
                     temperature: float, return_entropy: bool,
                     ignore_index: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    lp, entropy, row_max, log_sum, kept, vocab = _C.linear_logprobs_forward(
        hidden, local_weight, target, group_name, vocab_size, temperature, return_entropy, ignore_index)
    return lp, entropy, row_max, log_sum, kept, torch.tensor(vocab, dtype=torch.int64)


@_linear_logprobs.register_fake
def _(hidden, local_weight, target, group_name, vocab_size, temperature, return_entropy, ignore_index):
    _check_devices("fused_linear_logprobs", hidden, weight_rows=local_weight, target=target)
    return _logprobs_fake_outputs(hidden, [hidden.shape[0]], return_entropy)


@torch.library.custom_op("hyper_parallel_cpp::fused_linear_logprobs_backward", mutates_args=())
def _linear_logprobs_backward(grad_logprobs: Optional[Tensor], grad_entropy: Optional[Tensor], hidden: Tensor,
                              local_weight: Tensor, target: Tensor, row_max: Tensor, log_sum: Tensor,
                              entropy: Tensor, vocab_size: Tensor, group_name: str, temperature: float,
                              ignore_index: int) -> Tuple[Tensor, Tensor]:
    return _C.linear_logprobs_backward(grad_logprobs, grad_entropy, hidden, local_weight, target, row_max, log_sum,
                                       entropy, group_name, int(vocab_size), temperature, ignore_index, True, True)


@_linear_logprobs_backward.register_fake
def _(grad_logprobs, grad_entropy, hidden, local_weight, *args):
    return torch.empty_like(hidden), torch.empty_like(local_weight)


def _linear_logprobs_setup(ctx, inputs, output):
    hidden, local_weight, target, group_name, _, temperature, return_entropy, ignore_index = inputs
    _, _, row_max, log_sum, kept, vocab = output
    ctx.save_for_backward(hidden, local_weight, target, row_max, log_sum, kept, vocab)
    ctx.args = (group_name, temperature, ignore_index)
    ctx.return_entropy = return_entropy


def _linear_logprobs_grad(ctx, grad_logprobs, grad_entropy, *unused):
    hidden, local_weight, target, row_max, log_sum, kept, vocab = ctx.saved_tensors
    grad_h, grad_w = _linear_logprobs_backward(grad_logprobs, grad_entropy if ctx.return_entropy else None, hidden,
                                               local_weight, target, row_max, log_sum, kept, vocab, *ctx.args)
    return (grad_h if ctx.needs_input_grad[0] else None, grad_w if ctx.needs_input_grad[1] else None) + (None,) * 6


_linear_logprobs.register_autograd(_linear_logprobs_grad, setup_context=_linear_logprobs_setup)


# --- the public functions -------------------------------------------------------------------


GroupLike = Union[None, str, "dist.ProcessGroup"]


def group_name_of(group: GroupLike) -> str:
    """The name an op carries for ``group``: "" for one process (no group at all)."""
    if isinstance(group, str):
        return group
    if group is None:
        if not dist.is_available() or not dist.is_initialized():
            return ""
        group = dist.group.WORLD
    if not hasattr(group, "group_name"):
        # dist.new_group hands ranks outside the group a placeholder (GroupMember.NON_GROUP_MEMBER).
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        raise ValueError(f"this rank ({rank}) is not a member of the process group it was given ({group!r}): "
                         "expected a process group this rank belongs to, its name, or None (the default group)")
    return group.group_name


def reduction_code(reduction: str, op: str) -> int:
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{op}: reduction must be one of 'none', 'mean', 'sum', got {reduction!r}") from None


def vocab_parallel_cross_entropy(
    local_logits: Tensor,
    target: Tensor,
    group: GroupLike = None,
    *,
    vocab_size: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    z_loss_weight: float = 0.0,
    logit_softcap: float = 0.0,
    return_lse: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Cross-entropy of logits whose last dim holds this rank's piece of the vocabulary.

    ``local_logits``: ``[..., V_local]``, the ``torch.chunk`` piece of ``group``'s rank (what
    ``Shard(-1)`` gives it). ``target``: class indices of shape ``[...]``, the same on every
    rank, or probabilities of the local logits' shape (this rank's classes). ``weight``:
    ``[V]`` class weights. ``group``: a process group, its name, or None (the default group,
    or one process when torch.distributed is not initialised). ``vocab_size``: V; None learns
    it from the ranks' pieces (in the collective that compares the ranks' calls). Returns the
    loss as ``F.cross_entropy`` on the full logits would, and with ``return_lse`` also the
    log-sum-exp per row (``[...]``, float32 for 16-bit logits, not differentiable).

    ``z_loss_weight`` adds ``z * lse**2`` per counted row (its mean over counted rows with
    'mean'); ``logit_softcap`` > 0 replaces each logit x by ``cap * tanh(x / cap)`` first.
    """
    if local_logits.dim() < 1:
        raise ValueError("vocab_parallel_cross_entropy: expected logits with a class dim, got a 0-dim tensor")
    loss, row_max, log_sum, _, _ = _cross_entropy(
        local_logits, target, weight, group_name_of(group), -1 if vocab_size is None else int(vocab_size),
        local_logits.dim() - 1, int(ignore_index), reduction_code(reduction, "vocab_parallel_cross_entropy"),
        float(label_smoothing), float(z_loss_weight), float(logit_softcap),
    )
    if not return_lse:
        return loss
    return loss, (row_max + log_sum).reshape(local_logits.shape[:-1])


def vocab_parallel_log_softmax(local_logits: Tensor, group: GroupLike = None, *, vocab_size: Optional[int] = None,
                               dim: int = -1) -> Tensor:
    """log_softmax over the whole vocabulary of class-sharded logits; the result is sharded alike.

    Its backward is right for any use of the result (a gather, a weighted sum, KL ...).
    """
    name = group_name_of(group)
    dim = dim % local_logits.dim()
    if vocab_size is None:
        vocab_size = _C.vocab_size(local_logits.shape[dim], name)
    return _log_softmax(local_logits, dim, name, int(vocab_size))


def vocab_parallel_nll_loss(local_logp: Tensor, target: Tensor, group: GroupLike = None, *,
                            vocab_size: Optional[int] = None, weight: Optional[Tensor] = None,
                            ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """nll_loss of class-sharded log-probabilities (class dim last), as F.nll_loss on the whole."""
    name = group_name_of(group)
    class_dim = local_logp.dim() - 1
    if vocab_size is None:
        vocab_size = _C.vocab_size(local_logp.shape[class_dim], name)
    out, _ = _nll_loss(local_logp, target, weight, class_dim, reduction_code(reduction, "vocab_parallel_nll_loss"),
                       int(ignore_index), name, int(vocab_size))
    return out


def fused_linear_cross_entropy(
    hidden: Tensor,
    local_weight: Tensor,
    target: Tensor,
    group: GroupLike = None,
    *,
    vocab_size: Optional[int] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    weight: Optional[Tensor] = None,
    z_loss_weight: float = 0.0,
    logit_softcap: float = 0.0,
) -> Tensor:
    """Cross-entropy of ``hidden @ W.T`` without the logits ever existing.

    ``hidden``: ``[..., dim]``, the same on every rank; ``local_weight``: this rank's
    ``torch.chunk`` rows of the ``[V, dim]`` output head (a ColwiseParallel head's local
    weight); ``target``: ``[...]`` class indices. The logits are formed one block at a time in
    forward (statistics only) and again in backward; hidden's gradient is summed over the group
    (one all-reduce), the weight's is this rank's rows. Options as vocab_parallel_cross_entropy.
    """
    if hidden.dim() < 1:
        raise ValueError("fused_linear_cross_entropy: expected hidden [..., dim], got a 0-dim tensor")
    lead = hidden.shape[:-1]
    loss, _, _, _ = _linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), local_weight, target.reshape(-1), weight, group_name_of(group),
        -1 if vocab_size is None else int(vocab_size), int(ignore_index),
        reduction_code(reduction, "fused_linear_cross_entropy"), float(label_smoothing), float(z_loss_weight),
        float(logit_softcap))
    return loss.reshape(lead) if reduction == "none" else loss


def vocab_parallel_logprobs(
    logits: Tensor,
    target: Tensor,
    group: GroupLike = None,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
    vocab_size: Optional[int] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Per-token log-probabilities (and entropy) at a temperature, of class-sharded logits.

    ``logits``: ``[..., V_local]``, this rank's ``torch.chunk`` piece of the vocabulary (then
    ``group`` is its process group), or PyTorch's DTensor ``[..., V]`` sharded along its last
    dim (``Shard(-1)``, as TorchTitan's head leaves it; the group is its mesh's, the results are
    replicated DTensors); ``target``: the sampled tokens ``[...]``, the same on every rank. Returns
    ``log_softmax(logits / temperature)`` at the target over the whole vocabulary (``[...]``,
    the logits' dtype) and, with ``return_entropy``, also the entropy of
    ``softmax(logits / temperature)``; both 0 with no gradient where the target is
    ``ignore_index``. Differentiable for any mix of the two (a PPO / GRPO loss). One all-gather
    of four numbers per token forward (beside the call's small record), none backward; the
    temperature is applied as the kernel reads the logits. At temperature 1 the
    log-probabilities equal ``-vocab_parallel_cross_entropy(..., reduction="none")`` exactly.
    """
    if logits.dim() < 1:
        raise ValueError("vocab_parallel_logprobs: expected logits with a class dim, got a 0-dim tensor")
    if isinstance(logits, DTensor):
        from .loss_parallel import logprobs_of_dtensor  # the layout rules (that module imports this one)
        return logprobs_of_dtensor(logits, target, float(temperature), bool(return_entropy), int(ignore_index))
    lp, entropy, _, _, _, _ = _logprobs(logits, target, group_name_of(group),
                                        -1 if vocab_size is None else int(vocab_size), logits.dim() - 1,
                                        float(temperature), bool(return_entropy), int(ignore_index))
    return (lp, entropy) if return_entropy else lp


def fused_linear_logprobs(
    hidden: Tensor,
    local_weight: Tensor,
    target: Tensor,
    group: GroupLike = None,
    *,
    temperature: float = 1.0,
    return_entropy: bool = False,
    ignore_index: int = -100,
    vocab_size: Optional[int] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """vocab_parallel_logprobs of ``hidden @ local_weight.T`` without the logits ever existing.

    ``hidden``: ``[..., dim]``, the same on every rank; ``local_weight``: this rank's
    ``torch.chunk`` rows of the ``[V, dim]`` output head. The logits are formed one block at
    a time in forward (statistics only) and again in backward; hidden's gradient is summed
    over the group (one all-reduce), the weight's is this rank's rows.
    """
    if hidden.dim() < 1:
        raise ValueError("fused_linear_logprobs: expected hidden [..., dim], got a 0-dim tensor")
    lead = hidden.shape[:-1]
    lp, entropy, _, _, _, _ = _linear_logprobs(
        hidden.reshape(-1, hidden.shape[-1]), local_weight, target.reshape(-1), group_name_of(group),
        -1 if vocab_size is None else int(vocab_size), float(temperature), bool(return_entropy), int(ignore_index))
    if return_entropy:
        return lp.reshape(lead), entropy.reshape(lead)
    return lp.reshape(lead)


__all__ = ["fused_linear_cross_entropy", "fused_linear_logprobs", "vocab_parallel_cross_entropy",
           "vocab_parallel_log_softmax", "vocab_parallel_logprobs", "vocab_parallel_nll_loss"]
