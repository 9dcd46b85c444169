"""Vocabulary-parallel losses as torch.library ops on plain local tensors.

Each rank of a process group holds the ``torch.chunk`` piece of the classes that DTensor's
``Shard`` of the class dim gives it (uneven pieces allowed). The ops are registered in C++
with their autograd (one dispatcher call per Python call) and have fake kernels
(registered_ops.py), so
``torch.compile(fullgraph=True)`` traces them as single nodes; the
process group travels as its name (``group.group_name``), as PyTorch's functional
collectives pass it. Every kernel is the C++ library's.

Collectives: cross-entropy one all-gather of per-row statistics forward (which also carries
the input checks, so bad input is the same error on every rank), none backward; log_softmax two all-reduces
forward, one backward; nll_loss one all-reduce forward, none backward. Each forward first
all-gathers one small fixed-size record in which the ranks agree on the call (rows, dtype,
vocabulary and whether it was given, the logits' shape and class dim, the target's kind and
shape, the hidden size, options; nll_loss's checks ride in it), so a difference is the same
LossParallelLayoutError (a ValueError) on every rank. A ``vocab_size`` of None is learnt in
that record, and costs nll_loss one small all-gather more (a record of its own before its
checks, which need the vocabulary).
"""

from typing import Optional, Tuple, Union

import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from . import torch_dtensor_layout as layout
from ._extension import _C
from .registered_ops import cross_entropy_op, linear_cross_entropy_op, linear_logprobs_op, log_softmax_op, \
    logprobs_op, nll_loss_op
from .loss_arguments import reduction_code
from .loss_parallel_state import LossParallelOptions, active_options


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


def _require_a_dim(t: Tensor, op: str, expected: str) -> None:
    # Before the kernel, which would index the class (or hidden) dim of a 0-dim tensor.
    if t.dim() < 1:
        raise ValueError(f"{op}: expected {expected}, got a 0-dim tensor")


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
    _require_a_dim(local_logits, "vocab_parallel_cross_entropy", "logits with a class dim")
    loss, row_max, log_sum, _, _ = cross_entropy_op(
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
    # None is learnt in the call's record (-1), the op's first collective either way.
    return log_softmax_op(local_logits, dim, name, -1 if vocab_size is None else int(vocab_size))


def vocab_parallel_nll_loss(local_logp: Tensor, target: Tensor, group: GroupLike = None, *,
                            vocab_size: Optional[int] = None, weight: Optional[Tensor] = None,
                            ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """nll_loss of class-sharded log-probabilities (class dim last), as F.nll_loss on the whole."""
    name = group_name_of(group)
    class_dim = local_logp.dim() - 1
    if vocab_size is None:
        # Learnt in a record of this op: the first collective a rank given vocab_size makes too.
        vocab_size = _C.vocab_size(local_logp.shape[class_dim], name, "vocab_parallel_nll_loss", local_logp)
    out, _ = nll_loss_op(local_logp, target, weight, class_dim, reduction_code(reduction, "vocab_parallel_nll_loss"),
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
    _require_a_dim(hidden, "fused_linear_cross_entropy", "hidden [..., dim]")
    lead = hidden.shape[:-1]
    loss, _, _, _ = linear_cross_entropy_op(
        hidden.reshape(-1, hidden.shape[-1]), local_weight, target.reshape(-1), weight, group_name_of(group),
        -1 if vocab_size is None else int(vocab_size), int(ignore_index),
        reduction_code(reduction, "fused_linear_cross_entropy"), float(label_smoothing), float(z_loss_weight),
        float(logit_softcap))
    return loss.reshape(lead) if reduction == "none" else loss


def _temperature_number(temperature, op: str) -> float:
    """The temperature as the number the kernels take. A tensor that requires grad is refused:
    the ops have no gradient for it, and float() would drop that gradient without a word. (RL
    samples at a fixed temperature; a learnt one can divide the logits itself, at T = 1 here.)"""
    if isinstance(temperature, Tensor) and temperature.requires_grad:
        raise TypeError(f"{op}: temperature requires grad, but it is taken as a number and gets no gradient; "
                        "pass a float or a tensor without grad (or divide the logits by a learnt temperature "
                        "yourself and pass temperature=1)")
    return float(temperature)


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
    ``temperature``: a number (or a tensor without grad; one that requires grad is a TypeError).
    """
    temperature = _temperature_number(temperature, "vocab_parallel_logprobs")
    _require_a_dim(logits, "vocab_parallel_logprobs", "logits with a class dim")
    if isinstance(logits, DTensor):
        return _logprobs_of_dtensor(logits, target, temperature, bool(return_entropy), int(ignore_index))
    lp, entropy, _, _, _, _ = logprobs_op(logits, target, group_name_of(group),
                                        -1 if vocab_size is None else int(vocab_size), logits.dim() - 1,
                                        temperature, bool(return_entropy), int(ignore_index))
    return (lp, entropy) if return_entropy else lp


def _logprobs_of_dtensor(logits: DTensor, target, temperature: float, return_entropy: bool, ignore_index: int):
    """vocab_parallel_logprobs on PyTorch DTensor logits sharded along their last dim (loss_parallel()'s
    layout rules, in or outside it): per-token DTensors laid out as the target (the logits' rows), the
    gradient back to the logits' shards through to_local()."""
    op = "vocab_parallel_logprobs"
    options = active_options() or LossParallelOptions()
    cs = layout.resolve(logits, logits.ndim - 1, op, options)
    local_target = layout.laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    outs = logprobs_op(cs.logits.to_local(), local_target, cs.group_name, cs.vocab_size, cs.class_dim, temperature,
                     return_entropy, ignore_index)
    lp = layout.loss_result(outs[0], cs, "none")
    return (lp, layout.loss_result(outs[1], cs, "none")) if return_entropy else lp


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
    temperature = _temperature_number(temperature, "fused_linear_logprobs")
    _require_a_dim(hidden, "fused_linear_logprobs", "hidden [..., dim]")
    lead = hidden.shape[:-1]
    lp, entropy, _, _, _, _ = linear_logprobs_op(
        hidden.reshape(-1, hidden.shape[-1]), local_weight, target.reshape(-1), group_name_of(group),
        -1 if vocab_size is None else int(vocab_size), temperature, bool(return_entropy), int(ignore_index))
    if return_entropy:
        return lp.reshape(lead), entropy.reshape(lead)
    return lp.reshape(lead)


__all__ = ["fused_linear_cross_entropy", "fused_linear_logprobs", "vocab_parallel_cross_entropy",
           "vocab_parallel_log_softmax", "vocab_parallel_logprobs", "vocab_parallel_nll_loss"]
