"""A loss call's arguments as every front end reads them, and their checks, each written once.

The functional ops (ops.py) and both DTensor routes (loss_parallel.py, integrations/hyperparallel.py)
read F.cross_entropy / F.nll_loss / log_softmax's arguments and refuse bad ones here, in one wording.
What the kernels check themselves (the target's dtype and range, the class weight's shape and dtype,
label smoothing ...) is checked there, in the call's record, on every rank alike: not again here.
"""

import inspect
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from .errors import LossParallelLayoutError, LossParallelUnsupportedError
from .reductions import reduction_code  # noqa: F401  (the functional ops and routes read it from here)

CROSS_ENTROPY = inspect.signature(F.cross_entropy)
NLL_LOSS = inspect.signature(F.nll_loss)


def reduction_of(arguments: dict) -> str:
    """The reduction a bound F.cross_entropy / F.nll_loss call asks for (size_average / reduce first)."""
    size_average, reduce = arguments.get("size_average"), arguments.get("reduce")
    if size_average is not None or reduce is not None:
        return torch.nn._reduction.legacy_get_string(size_average, reduce)
    return arguments.get("reduction", "mean")


def rows_of(shape, class_dim: int) -> int:
    """How many rows (positions without the class dim) a tensor of `shape` holds."""
    n = 1
    for i, s in enumerate(shape):
        if i != class_dim % len(shape):
            n *= s
    return n


def log_softmax_args(func, args, kwargs) -> Tuple[Any, Optional[int], Optional[torch.dtype]]:
    """(input, dim, dtype) of a log_softmax call in any spelling: F.log_softmax(input, dim=None,
    _stacklevel=3, dtype=None); torch.log_softmax(input, dim, dtype=None); Tensor.log_softmax(dim, dtype=None)."""
    if func is F.log_softmax:
        a = inspect.signature(F.log_softmax).bind(*args, **kwargs).arguments
        return a["input"], a.get("dim"), a.get("dtype")
    rest = list(args[1:])
    dim = kwargs.get("dim", rest[0] if rest else None)
    dtype = kwargs.get("dtype", rest[1] if len(rest) > 1 else None)
    return args[0], dim, dtype


def reject_cross_entropy_only_options(options, op: str) -> None:
    """The context's z-loss / soft-cap under log_softmax or nll_loss. The C++ forward refuses them
    in the call's record on every rank; this is reached with them only where that guard is off."""
    if options.z_loss_weight != 0 or options.logit_softcap != 0:
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel(z_loss_weight={options.z_loss_weight}, logit_softcap={options.logit_softcap})"
            f": those options apply to cross_entropy only; {op} would silently ignore them")


def refuse_unless_replicated(replicated: bool, what: str, op: str, got: str) -> None:
    """A target or class weight given as a DTensor must be replicated."""
    if not replicated:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} to be replicated (a plain "
                                      f"tensor or a DTensor with [Replicate()]), got {got}")


def refuse_other_mesh(same: bool, what: str, op: str, logits_mesh: str, got_mesh: str) -> None:
    """A DTensor argument must live on the logits' mesh: Replicate on another mesh (mesh["dp"] beside
    dp x tp logits) promises nothing along the class axis."""
    if not same:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} on the logits' mesh "
                                      f"{logits_mesh} (or a plain tensor), got one on {got_mesh}")


def check_probability_shape(target_shape, logits_shape, op: str) -> None:
    """Probability targets given whole have the (whole) logits' shape."""
    if list(target_shape) != list(logits_shape):
        raise ValueError(f"{op}: probability targets must have the logits' shape {list(logits_shape)}, got "
                         f"{list(target_shape)}")


__all__ = ["CROSS_ENTROPY", "NLL_LOSS", "check_probability_shape", "log_softmax_args", "reduction_code",
           "reduction_of", "refuse_other_mesh", "refuse_unless_replicated", "reject_cross_entropy_only_options",
           "rows_of"]
