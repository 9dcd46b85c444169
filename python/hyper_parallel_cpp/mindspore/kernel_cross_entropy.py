"""The vocabulary-parallel cross-entropy on the C kernels, as MindSpore AOT custom ops (CPU).

Forward: this rank's statistics (``hpms_cross_entropy_stats``) -> one gather of every rank's
packet -> the loss and the values backward needs (``hpms_cross_entropy_combine``). Backward
(the Cell's ``bprop``): the gradient of this rank's logits from those values, no
collective. The packets are float32 whatever the logits: MindSpore's CPU collectives carry
float32 only (AllGather rounds float64 and int64 to float32; AllReduce takes float32 and float16);
a float64 value travels as four float32s, exactly (mindspore_aot_ops.c: encode_float64).
"""

from mindspore import nn, ops
import mindspore as ms

from .native_library import aot_library_path, packet_header_size
from .process_group import ProcessGroup
from .statistics_gather import StatisticsGather

# The primitive, not ops.zeros_like: GRAPH_MODE fails to compile the function inside a bprop
# ("The func graph is empty ... zeros_like", MindSpore 2.10).
_zeros_like = ops.ZerosLike()

STATS_PER_ROW = 5  # HPK_STATS
SAVED_PER_ROW = 6  # HPK_CE_SAVED
PARTS_PER_FLOAT64 = 4  # float32s per float64 value in a packet (mindspore_aot_ops.c: HPMS_PARTS)


def _element(dtype):
    """A dtype from a tensor's dtype or from the TensorType ops.Custom's dtype functions get."""
    return dtype.element_type() if hasattr(dtype, "element_type") else dtype


def compute_dtype(logits_dtype):
    """float64 logits compute in float64, the others in float32 (the kernels' rule)."""
    return ms.float64 if _element(logits_dtype) == ms.float64 else ms.float32




def loss_size(rows: int, reduction_none: bool) -> int:
    """Values of the loss at the front of the combined output."""
    return rows if reduction_none else 1


class KernelCrossEntropy(nn.Cell):
    """construct(logits [rows, local], target, weight, options) -> (loss, saved)."""

    def __init__(self, group: ProcessGroup, reduction_none: bool) -> None:
        super().__init__()
        self.gather = StatisticsGather(group)
        self.stats32, self.combine32 = self._forward_ops(reduction_none, ms.float32)
        self.stats64, self.combine64 = self._forward_ops(reduction_none, ms.float64)
        self.backward = ops.Custom(
            f"{aot_library_path()}:hpms_cross_entropy_backward",
            out_shape=lambda logits, target, weight, options, saved, grad: logits,
            out_dtype=lambda logits, target, weight, options, saved, grad: logits,
            func_type="aot")

    @staticmethod
    def _forward_ops(reduction_none: bool, compute):
        """The stats and combine ops of one compute type (the packet's length depends on it)."""
        library = aot_library_path()
        header = packet_header_size()
        parts = PARTS_PER_FLOAT64 if compute == ms.float64 else 1
        # A function name per shape rule: MindSpore keeps the first shape function it meets for a
        # "lib:function" (PyNative, 2.10), so a [1] loss would be taken for a [rows] one.
        suffix = "float64" if compute == ms.float64 else "float32"
        stats = ops.Custom(
            f"{library}:hpms_cross_entropy_stats_{suffix}",
            out_shape=lambda logits, target, weight, options: [(header + STATS_PER_ROW * logits[0]) * parts],
            out_dtype=lambda logits, target, weight, options: ms.float32,
            func_type="aot")

        def combine_shapes(packets, target, weight, options):
            rows = (packets[1] // parts - header) // STATS_PER_ROW
            return [loss_size(rows, reduction_none)], [SAVED_PER_ROW, rows]

        combine = ops.Custom(f"{library}:hpms_cross_entropy_combine_{suffix}_{'none' if reduction_none else 'reduced'}",
                             out_shape=combine_shapes,
                             out_dtype=lambda packets, target, weight, options: (compute, compute), func_type="aot")
        return stats, combine

    def construct(self, logits, target, weight, options):
        if logits.dtype == ms.float64:
            return self.combine64(self.gather(self.stats64(logits, target, weight, options)), target, weight, options)
        return self.combine32(self.gather(self.stats32(logits, target, weight, options)), target, weight, options)

    def bprop(self, logits, target, weight, options, out, dout):
        grad = self.backward(logits, target, weight, options, out[1], dout[0])
        return grad, _zeros_like(target), _zeros_like(weight), _zeros_like(options)
