"""Where the classes of a HyperParallel DTensor live: its layout described for the one class-axis
decision (class_layout.py, the C++ library's), and what the route needs beyond it (the class axis' process group and
this rank's place on it, the checks of a mesh whose rank list HyperParallel's groups cannot follow,
the target's and class weight's layouts).

HyperParallel's route cannot re-lay out the logits (only even pieces can be expressed, and nothing
of ours redistributes them) and returns the loss replicated, so rows sharded along another mesh
axis are refused.
"""

import inspect
from dataclasses import dataclass
from typing import List

import torch
import torch.distributed as dist

from .. import class_layout
from ..errors import LossParallelLayoutError
from ..loss_arguments import refuse_other_mesh, refuse_unless_replicated
from ..loss_parallel_state import LossParallelOptions


@dataclass
class ClassAxis:
    """Where the classes of a HyperParallel DTensor live: the mesh axis that shards them."""
    group_name: str
    size: int  # ranks on the axis
    rank: int  # this rank's piece


def describe(layout) -> str:
    return f"placements {list(layout.placements)} on a mesh {tuple(layout.mesh.mesh_shape)} " \
           f"{tuple(layout.mesh.mesh_dim_names or ())}"


# The route's capabilities: it cannot re-lay out the logits (HyperParallel's even pieces only, and
# no redistribute of ours), and its loss is replicated, so rows sharded along another axis are refused.
ROUTE = class_layout.Route("a HyperParallel DTensor", relayout=False, rows_sharded=False)


def _view(layout, ndim: int) -> class_layout.LayoutView:
    mesh = layout.mesh

    def on_mesh(option_mesh, axis: int) -> bool:  # the mesh itself, or the 1-D mesh of the class axis' ranks
        return option_mesh is mesh or (option_mesh.ndim == 1 and list(option_mesh.rank_list) == _axis_ranks(mesh, axis))

    return class_layout.LayoutView(tuple(class_layout.placement_of(p, ndim) for p in layout.placements), ndim, describe(layout),
                                   on_mesh)


def class_axes(layout, class_dim: int, ndim: int) -> List[int]:
    return class_layout.mesh_dims_sharding(_view(layout, ndim).placements, class_dim)


def all_replicated(layout) -> bool:
    return all(p.is_replicate() for p in layout.placements)


def class_axis(layout, class_dim: int, ndim: int, op: str, options: LossParallelOptions) -> ClassAxis:
    """The class axis of logits inside the context (the one decision, class_layout.resolve), or
    the named error for a layout it cannot take (raised alike on every rank: it depends on the
    layout only)."""
    view = None if layout is None else _view(layout, ndim)
    axis = class_layout.resolve(view, class_dim, op, ROUTE, options.effective_strict, options.mesh).mesh_dim
    mesh = layout.mesh
    # Decided from the rank list every rank holds alike, before any collective: a check of this
    # rank's own line only would let the ranks of an ordered line enter the kernel's all-gather
    # while the others raise (rank_list (2, 1, 0): rank 1 sits at its own group rank).
    disordered = _lines_out_of_order(mesh, axis)
    if disordered:
        raise LossParallelLayoutError(
            f"{op} under loss_parallel: the class axis {axis} of the mesh {tuple(mesh.mesh_shape)} "
            f"{tuple(mesh.mesh_dim_names or ())} (rank list {tuple(mesh.rank_list)}) orders its ranks "
            f"{disordered[0]}, but HyperParallel's process group for an "
            f"axis numbers its ranks in increasing order, so the pieces would not line up with the group's ranks; "
            f"expected a mesh whose rank list increases along each axis")
    group = mesh.get_group(axis)
    coordinate = _coordinate(mesh, axis)
    if dist.get_rank(group) != coordinate:  # not reached while groups number their ranks in order
        raise LossParallelLayoutError(
            f"{op} under loss_parallel: the mesh axis {axis} orders its ranks {_axis_ranks(mesh, axis)} differently "
            f"from its process group {dist.get_process_group_ranks(group)}; expected a mesh whose rank list "
            f"increases along each axis")
    return ClassAxis(group.group_name, mesh.mesh_shape[axis], coordinate)


def _lines_out_of_order(mesh, axis: int) -> List[List[int]]:
    """Every line of ranks along `axis` (over the whole mesh) that does not increase."""
    # A sub-mesh (mesh["tp"]) holds only this rank's line, and the layout's copy of it no longer
    # knows the mesh it was cut from: there only the ranks of a disordered line refuse, while an
    # ordered line's ranks compute over their own group, which no other rank joins.
    shape = tuple(mesh.mesh_shape)
    lines = torch.tensor(list(mesh.rank_list)).reshape(shape).movedim(axis, -1).reshape(-1, shape[axis]).tolist()
    return [line for line in lines if line != sorted(line)]


def _same_mesh(a, b) -> bool:
    # HyperParallel's DeviceMesh defines no equality: the same ranks in the same shape and names.
    return a is b or (tuple(a.mesh_shape) == tuple(b.mesh_shape) and tuple(a.rank_list) == tuple(b.rank_list)
                      and tuple(a.mesh_dim_names or ()) == tuple(b.mesh_dim_names or ()))


def _mesh_words(mesh) -> str:
    return f"{tuple(mesh.mesh_shape)} {tuple(mesh.mesh_dim_names or ())} (ranks {tuple(mesh.rank_list)})"


def on_logits_mesh(layout, x, what: str, op: str) -> None:
    if layout is not None:
        refuse_other_mesh(_same_mesh(layout.mesh, x.mesh), what, op, _mesh_words(x.mesh),
                          "the mesh " + _mesh_words(layout.mesh))


def _coordinate(mesh, axis: int) -> int:
    index = list(mesh.rank_list).index(dist.get_rank())
    for i in range(mesh.ndim - 1, axis, -1):
        index //= mesh.mesh_shape[i]
    return index % mesh.mesh_shape[axis]


def _axis_ranks(mesh, axis: int) -> List[int]:
    ranks = torch.tensor(list(mesh.rank_list)).reshape(tuple(mesh.mesh_shape))
    me = list(mesh.rank_list).index(dist.get_rank())
    coords = list(torch.unravel_index(torch.tensor(me), tuple(mesh.mesh_shape)))
    coords[axis] = slice(None)
    return ranks[tuple(coords)].flatten().tolist()


def named_layouts(signature: inspect.Signature, layouts, args, kwargs) -> dict:
    """The input layouts by parameter name: the dispatcher lists one per positional argument, then
    one per keyword in order."""
    positions = signature.bind(*range(len(args)), **{k: len(args) + i for i, k in enumerate(kwargs)}).arguments
    return {name: layouts[i] if i < len(layouts) else None for name, i in positions.items()}


def replicated_value(value, layout, x, what: str, op: str):
    on_logits_mesh(layout, x, what, op)
    if layout is not None:
        refuse_unless_replicated(all_replicated(layout), what, op, describe(layout))
    return value
