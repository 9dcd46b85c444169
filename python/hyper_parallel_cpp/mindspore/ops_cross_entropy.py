"""The same vocabulary-parallel cross-entropy in MindSpore's own ops, for devices where the C
kernels cannot run (Ascend, GPU: an AOT op there is a device kernel, not a host library).

The algorithm of the kernels: per row this rank's max, sum of exp, the target's logit (or, for
probability targets, the weighted target-logit sums) -> one gather of those statistics ->
log-sum-exp and the loss; the backward (``bprop``) needs no collective. It uses only ops with
CPU kernels in MindSpore 2.8 - 2.10 (no LogSoftmaxExt, LogSumExp or Clone), so it is tested on
CPU too. A target outside the classes is counted in the gathered statistics; saved[3] holds the
count, the same on every rank: the loss is NaN where it is not 0, and the function form
(cross_entropy.py, PyNative) raises KernelError on every rank.

float64 statistics cross the collective as three float32 parts each (hi + mid + lo, 72 bits of
mantissa for float64's 53, exact for finite values in float32's exponent range): MindSpore's CPU
AllGather rounds float64 to float32 and its AllReduce refuses float64.
"""

import mindspore as ms
from mindspore import nn, ops

from .kernel_cross_entropy import compute_dtype
from .process_group import ProcessGroup
from .statistics_gather import StatisticsGather

# The primitive, not ops.zeros_like: GRAPH_MODE fails to compile the function inside a bprop
# ("The func graph is empty ... zeros_like", MindSpore 2.10).
_zeros_like = ops.ZerosLike()
_ones_like = ops.OnesLike()
_cumsum = ops.CumSum()

STATS_PER_ROW = 5
OPT_IGNORE_INDEX, OPT_LABEL_SMOOTHING, OPT_CLASS_OFFSET, OPT_TOTAL_CLASSES = 0, 2, 3, 5


def _index_target_parts(target, options, local_classes):
    t = target.astype(ms.int64)
    valid = t != options[OPT_IGNORE_INDEX].astype(ms.int64)
    local_t = t - options[OPT_CLASS_OFFSET].astype(ms.int64)
    in_piece = ops.logical_and(valid, ops.logical_and(local_t >= 0, local_t < local_classes))
    return t, valid, local_t, in_piece


def _columns(x):
    """[1, local_classes] int64: 0, 1, ... (primitives only: ops.arange inside a bprop's graph
    fails to compile in GRAPH_MODE, MindSpore 2.10)."""
    return _cumsum(_ones_like(x[0:1]).astype(ms.int64), 1) - 1


def _local_weights(weight, options, x, dtype):
    index = _columns(x).reshape(-1) + options[OPT_CLASS_OFFSET].astype(ms.int64)
    return ops.gather(weight.astype(dtype), index, 0)


def _split_float64(values):
    """[n] float64 -> [3, n] float32 whose float64 sum is `values` (non-finite values in hi alone)."""
    finite = ops.isfinite(values)
    hi = values.astype(ms.float32)
    rest = ops.select(finite, values - hi.astype(ms.float64), _zeros_like(values))
    mid = rest.astype(ms.float32)
    lo = (rest - mid.astype(ms.float64)).astype(ms.float32)
    return ops.stack([hi, mid, lo])


def _join_float64(parts):
    """[..., 3, n] float32 -> [..., n] float64."""
    hi = parts[:, 0].astype(ms.float64)
    return ops.select(ops.isfinite(hi), hi + parts[:, 1].astype(ms.float64) + parts[:, 2].astype(ms.float64), hi)


class OpsCrossEntropy(nn.Cell):
    """construct(logits [rows, local], target, weight [classes], options) -> (loss, saved [4, rows])."""

    def __init__(self, group: ProcessGroup, reduction: str) -> None:
        super().__init__()
        self.reduction = reduction
        self.gather = StatisticsGather(group)
        self.backward = OpsCrossEntropyBackward(reduction)

    def construct(self, logits, target, weight, options):
        dtype = compute_dtype(logits.dtype)
        x = logits.astype(dtype)
        rows, local_classes = x.shape
        total = options[OPT_TOTAL_CLASSES].astype(dtype)
        eps = options[OPT_LABEL_SMOOTHING].astype(dtype)
        local_w = _local_weights(weight, options, x, dtype)
        row_max = x.max(axis=1)
        sum_exp = ops.exp(x - row_max.reshape(-1, 1)).sum(axis=1)
        zero = ops.zeros((rows,), dtype)
        if target.dtype == ms.int64 or target.dtype == ms.int32:
            t, valid, local_t, in_piece = _index_target_parts(target, options, local_classes)
            picked = ops.gather_elements(x, 1, ops.select(in_piece, local_t, _zeros_like(local_t)).reshape(-1, 1))
            first = ops.select(in_piece, picked.reshape(-1), zero)
            second = (x * local_w.reshape(1, -1)).sum(axis=1)
            outside = ops.logical_and(valid, ops.logical_or(t < 0, t >= options[OPT_TOTAL_CLASSES].astype(ms.int64)))
            bad = outside.astype(dtype)
        else:
            q = (1 - eps) * target.astype(dtype) + eps / total
            first = (local_w.reshape(1, -1) * q * x).sum(axis=1)
            second = (local_w.reshape(1, -1) * q).sum(axis=1)
            bad = zero
        stats = ops.stack([row_max, sum_exp, first, second, bad]).reshape(-1)
        if dtype == ms.float64:
            parts = self.gather(_split_float64(stats).reshape(-1)).reshape(-1, 3, STATS_PER_ROW * rows)
            gathered = _join_float64(parts).reshape(-1, STATS_PER_ROW, rows)
        else:
            gathered = self.gather(stats).reshape(-1, STATS_PER_ROW, rows)
        top = gathered[:, 0, :].max(axis=0)
        lse = top + ops.log((gathered[:, 1, :] * ops.exp(gathered[:, 0, :] - top.reshape(1, -1))).sum(axis=0))
        first_all = gathered[:, 2, :].sum(axis=0)
        second_all = gathered[:, 3, :].sum(axis=0)
        bad_all = gathered[:, 4, :].sum()
        if target.dtype == ms.int64 or target.dtype == ms.int32:
            t, valid, _, _ = _index_target_parts(target, options, local_classes)
            in_range = ops.logical_and(valid, ops.logical_and(t >= 0, t < options[OPT_TOTAL_CLASSES].astype(ms.int64)))
            safe_t = ops.select(in_range, t, _zeros_like(t))
            target_w = ops.select(valid, ops.gather(weight.astype(dtype), safe_t, 0), zero)
            nll = target_w * (lse - first_all)
            smooth = weight.astype(dtype).sum() * lse - second_all
            per_row = ops.select(valid, (1 - eps) * nll + eps / total * smooth, zero)
            coefficient = (1 - eps) * target_w + eps / total * weight.astype(dtype).sum()
            denominator = target_w.sum()
            counted = valid.astype(dtype)
        else:
            per_row = second_all * lse - first_all
            coefficient = second_all
            denominator = ops.scalar_to_tensor(rows, dtype) if rows > 0 else ops.ones((), dtype)
            counted = ops.ones((rows,), dtype)
        poison = ops.select(bad_all > 0, ops.fill(dtype, (), float("nan")), ops.zeros((), dtype))
        if self.reduction == "none":
            loss = per_row + poison
            scale = counted
        elif self.reduction == "sum":
            loss = per_row.sum().reshape(1) + poison
            scale = counted
        else:
            loss = (per_row.sum() / denominator).reshape(1) + poison
            scale = counted / denominator
        saved = ops.stack([lse, coefficient, scale, ops.broadcast_to(bad_all.reshape(1), (rows,))])
        return loss, saved

    def bprop(self, logits, target, weight, options, out, dout):
        grad = self.backward(logits, target, weight, options, out, dout)
        return grad, _zeros_like(target), _zeros_like(weight), _zeros_like(options)


class OpsCrossEntropyBackward(nn.Cell):
    """The gradient of this rank's logits; a Cell of its own, since GRAPH_MODE does not compile
    functional ops (arange, zeros_like ...) written in a bprop itself (MindSpore 2.10)."""

    def __init__(self, reduction: str) -> None:
        super().__init__()
        self.reduction = reduction

    def construct(self, logits, target, weight, options, out, dout):
        dtype = compute_dtype(logits.dtype)
        x = logits.astype(dtype)
        rows, local_classes = x.shape
        saved = out[1]
        grad_loss = dout[0].astype(dtype)
        if self.reduction == "none":
            per_row = grad_loss * saved[2]
        else:
            per_row = ops.broadcast_to(grad_loss.reshape(1), (rows,)) * saved[2]
        total = options[OPT_TOTAL_CLASSES].astype(dtype)
        eps = options[OPT_LABEL_SMOOTHING].astype(dtype)
        local_w = _local_weights(weight, options, x, dtype).reshape(1, -1)
        p = ops.exp(x - saved[0].reshape(-1, 1))
        grad = saved[1].reshape(-1, 1) * p
        if target.dtype == ms.int64 or target.dtype == ms.int32:
            t, valid, local_t, in_piece = _index_target_parts(target, options, local_classes)
            in_range = ops.logical_and(valid, ops.logical_and(t >= 0, t < options[OPT_TOTAL_CLASSES].astype(ms.int64)))
            safe_t = ops.select(in_range, t, _zeros_like(t))
            target_w = ops.select(in_range, ops.gather(weight.astype(dtype), safe_t, 0), ops.zeros((rows,), dtype))
            columns = _columns(x)
            one_hot = ops.logical_and(columns == local_t.reshape(-1, 1), in_piece.reshape(-1, 1)).astype(dtype)
            grad = grad - (1 - eps) * target_w.reshape(-1, 1) * one_hot - eps / total * local_w
        else:
            q = (1 - eps) * target.astype(dtype) + eps / total
            grad = grad - local_w * q
        return (grad * per_row.reshape(-1, 1)).astype(logits.dtype)
