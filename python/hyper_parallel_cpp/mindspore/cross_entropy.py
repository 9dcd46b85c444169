"""vocab_parallel_cross_entropy for MindSpore: the loss of logits whose classes are split across
the ranks of a communication group, equal to one-process cross-entropy on the full logits.

Forward: one collective (an AllGather of per-row statistics); backward: none. On CPU the C
kernels run as AOT custom ops (kernel_cross_entropy.py); on an accelerator, or with
``backend="ops"``, the same algorithm in MindSpore's own ops (ops_cross_entropy.py).
"""

from typing import Optional

import mindspore as ms
from mindspore import Tensor, nn, ops

from ..reductions import reduction_code
from .errors import KernelError, LossParallelLayoutError, LossParallelUnsupportedError
from .kernel_cross_entropy import KernelCrossEntropy, compute_dtype
from .native_library import kernel_error_from
from .process_group import ProcessGroup, process_group_of

_FLOATING = (ms.float16, ms.bfloat16, ms.float32, ms.float64)
_INDEX = (ms.int32, ms.int64)


def check_options(reduction: str, label_smoothing: float, backend: Optional[str]) -> None:
    """The options every rank holds alike, checked before anything runs."""
    reduction_code(reduction, "vocab_parallel_cross_entropy")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if backend not in (None, "kernel", "ops"):
        raise ValueError(f"backend must be None (by device), 'kernel' or 'ops', got {backend!r}")


def default_backend() -> str:
    """'kernel' (the C library) on CPU, 'ops' (MindSpore's ops) on Ascend and GPU."""
    return "kernel" if ms.get_context("device_target") == "CPU" else "ops"


def check_inputs(local_logits, target, weight, ignore_index: int) -> None:
    """Dtypes and shapes (the same on every rank of a consistent call)."""
    if local_logits.dtype not in _FLOATING:
        raise LossParallelLayoutError(f"logits: a floating dtype expected, got {local_logits.dtype}")
    if local_logits.ndim < 1:
        raise LossParallelLayoutError("logits: a class dim expected, got a 0-dim tensor")
    if target.dtype in _INDEX:
        if tuple(target.shape) != tuple(local_logits.shape[:-1]):
            raise LossParallelLayoutError(f"index target: shape {tuple(local_logits.shape[:-1])} (the logits' shape "
                                          f"without the class dim) expected, got {tuple(target.shape)}")
    elif target.dtype in _FLOATING:
        if tuple(target.shape) != tuple(local_logits.shape):
            raise LossParallelLayoutError(f"probability target: this rank's classes, shape {tuple(local_logits.shape)}"
                                          f" expected, got {tuple(target.shape)}")
        if int(ignore_index) >= 0:
            raise LossParallelUnsupportedError("ignore_index is not supported for probability targets (as "
                                               "F.cross_entropy): leave it negative")
    else:
        raise LossParallelLayoutError(f"target: int32/int64 class indices or floating probabilities expected, "
                                      f"got {target.dtype}")
    if weight is not None and (weight.ndim != 1 or weight.dtype not in _FLOATING):
        raise LossParallelLayoutError(f"weight: a 1-D floating tensor of the class count expected, got "
                                      f"{weight.dtype} of shape {tuple(weight.shape)}")


def class_range(local_classes: int, group: ProcessGroup, vocab_size: Optional[int]) -> tuple:
    """(class_offset, total_classes): torch.chunk's pieces of vocab_size, or even pieces."""
    if vocab_size is None:
        return group.rank * local_classes, group.size * local_classes
    chunk = -(-int(vocab_size) // group.size)
    return min(group.rank * chunk, int(vocab_size)), int(vocab_size)


class VocabParallelCrossEntropy(nn.Cell):
    """``construct(local_logits, target, weight=None)``: the cross-entropy of the full logits.

    ``local_logits`` ``[..., V_local]``: this rank's classes (torch.chunk's piece of ``vocab_size``
    for the group's rank; even pieces when ``vocab_size`` is None). ``target``: class indices
    ``[...]``, the same on every rank, or probabilities of this rank's classes (the logits'
    shape). ``weight``: ``[V]`` class weights. Options as ``ops.cross_entropy``. Works under
    PyNative and GRAPH_MODE; the gradient of the logits comes from the ``bprop``.
    """

    def __init__(self, group: Optional[str] = None, *, vocab_size: Optional[int] = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0, backend: Optional[str] = None) -> None:
        super().__init__()
        check_options(reduction, label_smoothing, backend)
        self.group = process_group_of(group)
        self.vocab_size = vocab_size
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.reduction_code = reduction_code(reduction, "vocab_parallel_cross_entropy")
        self.label_smoothing = float(label_smoothing)
        self.backend = backend or default_backend()
        if self.backend == "kernel":
            self.core = KernelCrossEntropy(self.group, reduction == "none")
        else:
            from .ops_cross_entropy import OpsCrossEntropy
            self.core = OpsCrossEntropy(self.group, reduction)
        self.rank = self.group.rank
        self.size = self.group.size

    def loss_and_saved(self, local_logits, target, weight=None):
        """(loss, what the route saved for backward); for the ops route saved[3] counts, over all
        ranks, the index targets outside the classes."""
        local_classes = local_logits.shape[-1]
        logits = local_logits.reshape(-1, local_classes)
        probabilities = target.dtype == local_logits.dtype or target.dtype == ms.float32 or \
            target.dtype == ms.float64 or target.dtype == ms.float16 or target.dtype == ms.bfloat16
        flat_target = target.reshape(-1, local_classes) if probabilities else target.reshape(-1)
        if self.vocab_size is None:
            offset = self.rank * local_classes
            total = self.size * local_classes
        else:
            chunk = (self.vocab_size + self.size - 1) // self.size
            offset = min(self.rank * chunk, self.vocab_size)
            total = self.vocab_size
        options = Tensor([float(self.ignore_index), float(self.reduction_code), self.label_smoothing, float(offset),
                          float(local_classes), float(total), 1.0 if probabilities else 0.0,
                          0.0 if weight is None else 1.0], ms.float64)
        if weight is None:
            weight = ops.ones((total,), compute_dtype(local_logits.dtype)) if self.backend == "ops" else \
                ops.zeros((1,), compute_dtype(local_logits.dtype))
        loss, saved = self.core(logits, flat_target, weight, options)
        if self.reduction == "none":
            return loss.reshape(target.shape[:-1] if probabilities else target.shape), saved
        return loss.reshape(()), saved

    def construct(self, local_logits, target, weight=None):
        return self.loss_and_saved(local_logits, target, weight)[0]


_CELLS = {}
TARGET_OUTSIDE_CLASSES = 4  # hpk_status HPK_ERROR_TARGET, the C kernels' code for the same check


def vocab_parallel_cross_entropy(local_logits: Tensor, target: Tensor, group: Optional[str] = None, *,
                                 vocab_size: Optional[int] = None, ignore_index: int = -100,
                                 weight: Optional[Tensor] = None, reduction: str = "mean",
                                 label_smoothing: float = 0.0, backend: Optional[str] = None) -> Tensor:
    """The function form of VocabParallelCrossEntropy (PyNative; in GRAPH_MODE use the Cell).

    Checks the dtypes and shapes first (LossParallelLayoutError / LossParallelUnsupportedError);
    a check of the kernels (a target outside the classes, a weight of the wrong length, pieces
    that do not tile the classes) raises KernelError on every rank, after the one collective.
    """
    check_options(reduction, label_smoothing, backend)
    check_inputs(local_logits, target, weight, ignore_index)
    key = (group, vocab_size, int(ignore_index), reduction, float(label_smoothing), backend or default_backend())
    cell = _CELLS.get(key)
    if cell is None:
        cell = _CELLS[key] = VocabParallelCrossEntropy(group, vocab_size=vocab_size, ignore_index=ignore_index,
                                                       reduction=reduction, label_smoothing=label_smoothing,
                                                       backend=backend)
    if cell.backend == "ops":
        # MindSpore's ops have no check stage: the targets outside the classes are counted in
        # the gathered statistics (the same count on every rank), and raised on here.
        loss, saved = cell.loss_and_saved(local_logits, target, weight)
        if saved.shape[1] > 0 and target.dtype in (ms.int32, ms.int64) and float(saved[3][0].asnumpy()) > 0:
            _, total = class_range(local_logits.shape[-1], cell.group, vocab_size)
            mine = target.asnumpy().reshape(-1)
            found = [int(t) for t in mine if t != ignore_index and not 0 <= t < total]
            raise KernelError(f"expected index targets in [0, {total}) or equal to ignore_index ({ignore_index}), got "
                              f"{found[0] if found else 'one on another rank'} (the statistics of every rank of the "
                              f"group counted it)", TARGET_OUTSIDE_CLASSES)
        return loss
    try:
        loss = cell(local_logits, target, weight)
        if cell.backend == "kernel":
            # The kernels' checks surface at the next synchronisation (PyNative runs ops
            # asynchronously): wait here, so that the error is ours and raised by this call.
            ms.runtime.synchronize()
    except RuntimeError as error:
        ours = kernel_error_from(error)
        if ours is None:
            raise
        raise ours from None
    return loss


__all__ = ["KernelError", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy"]
