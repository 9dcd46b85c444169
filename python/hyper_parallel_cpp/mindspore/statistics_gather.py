"""The one collective of the forward: every rank's statistics packet, in rank order.

AllGather where the group is the world group. On CPU MindSpore can AllGather only over the world
group, so elsewhere each rank fills its own row of a [ranks, packet] buffer of zeros and one
AllReduce sums them (adding zeros is exact, -inf included; a multiply by a 0/1 mask would turn
-inf into NaN, hence a select).
"""

import numpy as np
from mindspore import Tensor, nn, ops

from .process_group import ProcessGroup

# The primitive, not ops.zeros_like: GRAPH_MODE fails to compile the function inside a bprop
# ("The func graph is empty ... zeros_like", MindSpore 2.10).
_zeros_like = ops.ZerosLike()


class StatisticsGather(nn.Cell):
    def __init__(self, group: ProcessGroup) -> None:
        super().__init__()
        self.size = group.size
        self.use_all_gather = group.is_world
        if group.size > 1 and group.is_world:
            self.all_gather = ops.AllGather(group.name)
        elif group.size > 1:
            self.all_reduce = ops.AllReduce(ops.ReduceOp.SUM, group.name)
            slot = np.zeros((group.size, 1), dtype=np.bool_)
            slot[group.rank, 0] = True
            self.slot = Tensor(slot)

    def construct(self, packet):
        row = packet.reshape(1, -1)
        if self.size == 1:
            return row
        if self.use_all_gather:
            return self.all_gather(row)
        spread = ops.broadcast_to(row, (self.size, row.shape[1]))
        return self.all_reduce(ops.select(ops.broadcast_to(self.slot, spread.shape), spread, _zeros_like(spread)))
