"""What HyperParallel's MindSpore platform needs on CPU, applied in memory by our test (never as
a change to HyperParallel's files; docs/platforms.md lists the four).

HyperParallel's MindSpore platform is written for Ascend. On a CPU-only MindSpore (2.8, 2.10),
as shipped, it fails four ways:
1. ``MindSporePlatform.init_process_group`` passes backend 'hccl': after our
   ``mindspore.communication.init()`` (mccl on CPU) it has nothing left to do.
2. ``DTensorBase.__new__`` moves every local tensor to device "Ascend" by default (the process
   dies: libge_runner.so missing): the default becomes "CPU".
3. ``_get_slice_tensor_by_layout`` (core/layout.py, imported by name into core/dtensor.py)
   copies with ``Tensor.clone``, which has no CPU kernel: ``ops.deepcopy`` instead.
4. ``MindSporePlatform.differentiable_all_gather_concat`` uses ``comm_func``, which has no CPU
   kernel: ``ops.AllGather`` (on the world group; elsewhere an AllReduce of per-rank slots,
   since CPU AllGather works on the world group only), then split and concat.
"""

import numpy as np


def apply() -> None:
    """Call after ``mindspore.communication.init()`` and before building a mesh."""
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindspore.communication import GlobalComm, get_group_size, get_rank

    import hyper_parallel.core.dtensor as hp_dtensor
    import hyper_parallel.core.layout as hp_layout
    from hyper_parallel.platform.mindspore.dtensor import DTensorBase
    from hyper_parallel.platform.mindspore.platform import MindSporePlatform

    # 1. The process group exists already (communication.init()).
    MindSporePlatform.init_process_group = staticmethod(lambda *args, **kwargs: None)

    # 2. Local tensors stay on the CPU.
    defaults = list(DTensorBase.__new__.__defaults__)
    defaults[-1] = "CPU"
    DTensorBase.__new__.__defaults__ = tuple(defaults)

    # 3. Slicing a global tensor without Tensor.clone.
    original_slice = hp_layout._get_slice_tensor_by_layout

    def slice_by_layout(global_tensor, layout):
        inner_rank = layout.rank_list.index(layout.mesh.rank)
        area = hp_layout._infer_slice_area_by_rank(layout.mesh_shape, layout.tensor_map, inner_rank,
                                                   global_tensor.shape)
        return ops.deepcopy(global_tensor[tuple(slice(begin, end) for begin, end in area)])

    slice_by_layout.__doc__ = original_slice.__doc__
    hp_layout._get_slice_tensor_by_layout = slice_by_layout
    hp_dtensor._get_slice_tensor_by_layout = slice_by_layout

    # 4. All-gather with primitives that have CPU kernels.
    def all_gather_concat(data, group, concat_size, concat_dim):
        if group == GlobalComm.WORLD_COMM_GROUP:
            gathered = ops.AllGather(group)(data)
        else:
            size, rank = get_group_size(group), get_rank(group)
            slots = np.zeros((size,) + (1,) * data.ndim, dtype=np.bool_)
            slots[rank] = True
            spread = ops.broadcast_to(data.reshape((1,) + tuple(data.shape)), (size,) + tuple(data.shape))
            gathered = ops.AllReduce(ops.ReduceOp.SUM, group)(
                ops.select(ops.broadcast_to(Tensor(slots), spread.shape), spread, ops.ZerosLike()(spread)))
            gathered = gathered.reshape((size * data.shape[0],) + tuple(data.shape[1:]))
        if concat_dim == 0:
            return gathered
        return ms.mint.concat(ops.Split(output_num=concat_size)(gathered), concat_dim)

    MindSporePlatform.differentiable_all_gather_concat = staticmethod(all_gather_concat)
