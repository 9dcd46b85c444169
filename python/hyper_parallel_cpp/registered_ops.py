"""The package's vocabulary-parallel ops as registered in C++ (python/csrc/library_ops.cpp), and
their fake kernels, which give torch.compile the outputs' shapes and dtypes.

Each loss is a forward op (its result and what its backward needs; the vocabulary it used as a
0-dim int64 tensor) and a backward op, which the C++ autograd calls: a compiled graph holds both
as single nodes. The fake kernels also refuse what the real kernels refuse before any shape is
known (tensors on other devices).
"""

from typing import Optional

import torch
from torch import Tensor

from ._extension import _C  # noqa: F401  (loading _C registers the ops)
from .loss_arguments import rows_of


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


_ops = torch.ops.hyper_parallel_cpp
cross_entropy_op = _ops.vocab_parallel_cross_entropy.default
log_softmax_op = _ops.vocab_parallel_log_softmax.default
nll_loss_op = _ops.vocab_parallel_nll_loss.default
linear_cross_entropy_op = _ops.fused_linear_cross_entropy.default
logprobs_op = _ops.vocab_parallel_logprobs.default
linear_logprobs_op = _ops.fused_linear_logprobs.default


def _check_devices(op: str, logits: Tensor, **others: Optional[Tensor]) -> None:
    # The kernels' own check, also in the fake kernel: the dispatcher sends a call with any
    # meta tensor among its inputs to the fake kernel, which must refuse it as the real one does.
    for what, t in others.items():
        if t is not None and t.device != logits.device:
            what = what.replace("_", " ")
            raise RuntimeError(f"{op}: expected all tensors on the same device, but the {what} is on {t.device} "
                               f"and the logits on {logits.device} (move the {what} with .to({logits.device}))")


def _fake(op: str):
    return torch.library.register_fake(f"hyper_parallel_cpp::{op}")


def _vocab_fake() -> Tensor:
    return torch.empty([], dtype=torch.int64)


@_fake("vocab_parallel_cross_entropy")
def _(logits, target, weight, group_name, vocab_size, class_dim, ignore_index, reduction,
      label_smoothing, z_loss_weight, logit_softcap):
    _check_devices("vocab_parallel_cross_entropy", logits, target=target, class_weight=weight)
    ct = _compute_dtype(logits.dtype)
    rows = rows_of(logits.shape, class_dim)
    shape = [s for i, s in enumerate(logits.shape) if i != class_dim % logits.dim()]
    loss = logits.new_empty(shape if reduction == 0 else [])
    stat = logits.new_empty([rows], dtype=ct)
    row_weight = logits.new_empty([rows if target.is_floating_point() else 0], dtype=ct)
    return loss, stat, stat.clone(), row_weight, _vocab_fake()


@_fake("vocab_parallel_cross_entropy_backward")
def _(grad, logits, *args):
    return torch.empty_like(logits)


@_fake("vocab_parallel_log_softmax")
def _(local, class_dim, group_name, vocab_size):
    return torch.empty_like(local)


@_fake("vocab_parallel_log_softmax_backward")
def _(grad, output, class_dim, group_name, vocab_size):
    return torch.empty_like(output)


@_fake("vocab_parallel_nll_loss")
def _(logp, target, weight, class_dim, reduction, ignore_index, group_name, vocab_size):
    _check_devices("vocab_parallel_nll_loss", logp, target=target, class_weight=weight)
    out = logp.new_empty(target.shape if reduction == 0 else [])
    return out, logp.new_empty([])


@_fake("vocab_parallel_nll_loss_backward")
def _(grad, logp, *args):
    return torch.empty_like(logp)


@_fake("fused_linear_cross_entropy")
def _(hidden, local_weight, target, weight, group_name, vocab_size, ignore_index, reduction, label_smoothing,
      z_loss_weight, logit_softcap):
    _check_devices("fused_linear_cross_entropy", hidden, weight_rows=local_weight, target=target, class_weight=weight)
    rows = hidden.shape[0]
    stat = hidden.new_empty([rows], dtype=_compute_dtype(hidden.dtype))
    return hidden.new_empty([rows] if reduction == 0 else []), stat, stat.clone(), _vocab_fake()


@_fake("fused_linear_cross_entropy_backward")
def _(grad, hidden, local_weight, *args):
    return torch.empty_like(hidden), torch.empty_like(local_weight)


# The log-probabilities' outputs: logprobs, entropy (empty unless asked), row_max, log_sum, the
# entropy's mean difference backward keeps (compute type; empty unless asked), the vocabulary
# used. Their backward takes either incoming gradient (None: none).
def _logprobs_fake_outputs(like: Tensor, rows_shape, return_entropy: bool):
    ct = _compute_dtype(like.dtype)
    rows = 1
    for s in rows_shape:
        rows *= s
    stat = like.new_empty([rows], dtype=ct)
    kept = like.new_empty([rows if return_entropy else 0], dtype=ct)
    return (like.new_empty(rows_shape), like.new_empty(rows_shape if return_entropy else [0]), stat, stat.clone(),
            kept, _vocab_fake())


@_fake("vocab_parallel_logprobs")
def _(logits, target, group_name, vocab_size, class_dim, temperature, return_entropy, ignore_index):
    _check_devices("vocab_parallel_logprobs", logits, target=target)
    shape = [s for i, s in enumerate(logits.shape) if i != class_dim % logits.dim()]
    return _logprobs_fake_outputs(logits, shape, return_entropy)


@_fake("vocab_parallel_logprobs_backward")
def _(grad_logprobs, grad_entropy, logits, *args):
    return torch.empty_like(logits)


@_fake("fused_linear_logprobs")
def _(hidden, local_weight, target, group_name, vocab_size, temperature, return_entropy, ignore_index):
    _check_devices("fused_linear_logprobs", hidden, weight_rows=local_weight, target=target)
    return _logprobs_fake_outputs(hidden, [hidden.shape[0]], return_entropy)


@_fake("fused_linear_logprobs_backward")
def _(grad_logprobs, grad_entropy, hidden, local_weight, *args):
    return torch.empty_like(hidden), torch.empty_like(local_weight)


__all__ = ["cross_entropy_op", "linear_cross_entropy_op", "linear_logprobs_op", "log_softmax_op", "logprobs_op",
           "nll_loss_op"]
