"""PyTorch's DTensor as loss_parallel reads and lays it out.

The logits are described for the one class-axis decision (class_layout.py, the C++ library's) and
re-laid out where it says so; the target and class weight are cut to this rank's rows; the loss is laid out as PyTorch
2.15's loss_parallel lays it out. Serves loss_parallel() and the functional ops given DTensor logits.
"""

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard

from . import class_layout
from ._extension import _C
from .class_layout import Placement
from .config import parallelism_config
from .errors import LossParallelLayoutError, LossParallelUnsupportedError, warn_once
from .loss_arguments import check_probability_shape, refuse_other_mesh, refuse_unless_replicated
from .loss_parallel_state import LossParallelOptions

ROUTE = class_layout.Route("a DTensor", relayout=True, rows_sharded=True)


def _neutral(p, ndim: int) -> Placement:
    # Shard exactly: a _StridedShard (FSDP over TP) holds other pieces than torch.chunk's.
    return class_layout.placement_of(p, ndim, torch_chunk_piece=type(p) is Shard)


def _torch_placements(placements) -> List:
    return [Shard(p.dim) if p.is_shard else Replicate() for p in placements]


def describe(t: DTensor) -> str:
    return f"{list(t.placements)} on {t.device_mesh}"


def _group_ranks(mesh: DeviceMesh, mesh_dim: int) -> List[int]:
    return dist.get_process_group_ranks(mesh.get_group(mesh_dim))


def view_of(t: DTensor) -> class_layout.LayoutView:
    mesh = t.device_mesh

    def on_mesh(option_mesh, mesh_dim: int) -> bool:  # the whole mesh, or the 1-D mesh of the class dim's ranks
        return option_mesh == mesh or (option_mesh.ndim == 1 and
                                       option_mesh.mesh.flatten().tolist() == _group_ranks(mesh, mesh_dim))

    return class_layout.LayoutView(tuple(_neutral(p, t.ndim) for p in t.placements), t.ndim, describe(t), on_mesh)


def is_class_sharded(t: Any, class_dim: int) -> bool:
    return isinstance(t, DTensor) and 0 <= class_dim < t.ndim and bool(
        class_layout.mesh_dims_sharding([_neutral(p, t.ndim) for p in t.placements], class_dim))


@dataclass
class ClassSharding:
    logits: DTensor  # possibly re-laid-out (strict=False)
    class_dim: int
    mesh_dim: int  # the mesh dim that shards the class dim
    group_name: str
    vocab_size: int
    offset: int  # first class held here
    local: int  # classes held here
    rows: Tuple[Placement, ...]  # a tensor over the logits' rows, neutral (the decision's)

    @property
    def mesh(self) -> DeviceMesh:
        return self.logits.device_mesh

    def row_placements(self) -> Tuple:
        """The placements of a tensor over the logits' rows (target, per-row loss)."""
        return tuple(_torch_placements(self.rows))

    def batch_mesh_dims(self) -> List[int]:
        """The mesh dims other than the class dim's that shard the rows."""
        return class_layout.row_mesh_dims(self.rows)

    def sum_placements(self) -> Tuple:
        """A sum over the local rows: Partial on the mesh dims that shard the rows."""
        batch = self.batch_mesh_dims()
        return tuple(Partial("sum") if i in batch else Replicate() for i in range(self.mesh.ndim))


def settled_strict(op: str, options: LossParallelOptions, t: DTensor) -> bool:
    """The context's strictness, where a rank is about to decide by it alone (refuse a layout,
    re-lay it out, reduce across the batch): first the mesh's ranks agree on it (one small
    all-gather per mesh dim, on these paths only), so that a strictness that differs between
    ranks is the same LossParallelLayoutError on every rank, not a refusal here and a
    collective left waiting there."""
    strict = options.effective_strict()
    mesh = t.device_mesh
    if mesh.size() > 1:
        _C.agree_on_loss_strictness(op, strict, [mesh.get_group(i).group_name for i in range(mesh.ndim)],
                                    t.to_local())
    return strict


def resolve(t: Any, class_dim: int, op: str, options: LossParallelOptions) -> ClassSharding:
    """The class sharding of logits `t` (re-laid out first where strict=False allows), or the named error."""
    if not isinstance(t, DTensor):
        class_layout.resolve(None, class_dim, op, ROUTE, options.effective_strict, plain_shape=t.shape)
    r = class_layout.resolve(view_of(t), class_dim, op, ROUTE, lambda: settled_strict(op, options, t), options.mesh)
    mesh = t.device_mesh
    if r.relayout:
        want = _torch_placements(r.want)
        warn_once("relayout:" + str(list(t.placements)),
                  f"loss_parallel (strict=False): re-laying out the logits ({describe(t)} -> {want})")
        t = t.redistribute(mesh, want)
    m = r.mesh_dim
    n = mesh.size(m)
    vocab = t.shape[class_dim]
    chunk = -(-vocab // n)
    offset = min(mesh.get_local_rank(m) * chunk, vocab)
    return ClassSharding(t, class_dim, m, mesh.get_group(m).group_name, vocab, offset,
                         max(0, min(chunk, vocab - offset)), r.rows)


def resolve_or_fallback(t: Any, class_dim: int, op: str, options: LossParallelOptions) -> Optional[ClassSharding]:
    """The sharding, or None where loss_parallel_fallback_on_layout_error has the op computed
    on all-gathered inputs instead (gathered)."""
    try:
        return resolve(t, class_dim, op, options)
    except (LossParallelLayoutError, LossParallelUnsupportedError) as e:
        if isinstance(t, DTensor) and not settled_strict(op, options, t) and \
                parallelism_config().loss_parallel_fallback_on_layout_error:
            warn_once("fallback:" + op, f"{op} under loss_parallel: {e}; all-gathering the logits instead "
                                        f"(loss_parallel_fallback_on_layout_error is set)")
            return None
        raise


def gathered(func, mesh: DeviceMesh, args, kwargs) -> DTensor:
    """func on every DTensor argument gathered whole (differentiably), as one process computes
    it; the result replicated on `mesh`."""
    def whole(v):
        if isinstance(v, DTensor):
            return v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim).to_local()
        return v
    out = func(*[whole(a) for a in args], **{k: whole(v) for k, v in kwargs.items()})
    return DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim, run_check=False)


def replicated_local(t: Any, what: str, op: str, mesh: DeviceMesh) -> torch.Tensor:
    """A class weight's value: a plain tensor, or a DTensor replicated on the logits' mesh."""
    if not isinstance(t, DTensor):
        return t
    refuse_other_mesh(t.device_mesh == mesh, what, op, str(mesh), str(t.device_mesh))
    refuse_unless_replicated(all(p.is_replicate() for p in t.placements), what, op, str(list(t.placements)))
    return t.to_local()


def laid_out_local(t: Any, want: Tuple, what: str, op: str, cs: ClassSharding,
                   options: LossParallelOptions) -> torch.Tensor:
    """This rank's piece of a tensor that must be laid out as `want` on the logits' mesh (the
    target: the rows' placements; probability targets: the logits'). A plain tensor is taken
    only where `want` shards nothing (as PyTorch: it could be the whole or a piece); a DTensor
    replicated on the mesh is cut to its piece here (no communication)."""
    mesh = cs.mesh
    if not isinstance(t, DTensor):
        if any(isinstance(p, Shard) for i, p in enumerate(want) if i != cs.mesh_dim):
            raise LossParallelLayoutError(
                f"{op} under loss_parallel: expected the {what} as a DTensor laid out {list(want)} (loss_parallel "
                f"requires a DTensor, not a plain torch.Tensor, when the logits' other mesh dims shard their rows: "
                f"a plain tensor could be the whole or this rank's piece). Wrap it with DTensor.from_local or "
                f"distribute_tensor")
        return t
    refuse_other_mesh(t.device_mesh == mesh, what, op, str(mesh), str(t.device_mesh))
    if tuple(t.placements) == tuple(want):
        return t.to_local()
    if all(p.is_replicate() for p in t.placements):
        return t.redistribute(mesh, list(want)).to_local()
    if settled_strict(op, options, cs.logits):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} laid out {list(want)} (or "
                                      f"replicated), got {list(t.placements)}")
    warn_once("relayout-" + what, f"loss_parallel (strict=False): re-laying out the {what} "
                                  f"({list(t.placements)} -> {list(want)})")
    return t.redistribute(mesh, list(want)).to_local()


def probability_target_local(target: Any, cs: ClassSharding, op: str, options: LossParallelOptions) -> torch.Tensor:
    logits = cs.logits
    if not isinstance(target, DTensor):
        check_probability_shape(target.shape, logits.shape, op)
    local = laid_out_local(target, tuple(logits.placements), "probability target", op, cs, options)
    # A plain one (taken only where the rows are whole) is the whole: this rank's classes of it.
    return local if isinstance(target, DTensor) else local.narrow(cs.class_dim, cs.offset, cs.local)


def _contiguous_stride(shape: List[int]) -> Tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def loss_result(local: torch.Tensor, cs: ClassSharding, reduction: str) -> DTensor:
    """The loss as PyTorch 2.15's loss_parallel lays it out: per row ('none') as the target;
    reduced, Replicate over the class dim's mesh dim and Partial("sum") over the mesh dims that
    shard the rows (each rank summed its rows)."""
    if reduction == "none":
        shape = [s for i, s in enumerate(cs.logits.shape) if i != cs.class_dim]
        return DTensor.from_local(local, cs.mesh, cs.row_placements(), run_check=False, shape=torch.Size(shape),
                                  stride=_contiguous_stride(shape))
    return DTensor.from_local(local, cs.mesh, cs.sum_placements(), run_check=False)


def check_mean(cs: ClassSharding, reduction: str, op: str, options: LossParallelOptions) -> None:
    """reduction='mean' on the logits' mesh: the class-axis decision's refusal, if any (a mesh of
    more than one dim under strict, PyTorch's contract); the strictness agreed on only there."""
    if reduction == "mean":
        class_layout.check_mean(view_of(cs.logits), cs.class_dim, op, ROUTE,
                                lambda: settled_strict(op, options, cs.logits))


def global_mean_scale(cs: ClassSharding, denominator: torch.Tensor) -> torch.Tensor:
    """1 / the denominator summed over the mesh dims that shard the rows (one all-reduce each)."""
    total = denominator.clone()
    for d in cs.batch_mesh_dims():
        dist.all_reduce(total, group=cs.mesh.get_group(d))
    return 1.0 / total


__all__ = ["ClassSharding", "ROUTE", "check_mean", "describe", "gathered", "global_mean_scale", "is_class_sharded",
           "laid_out_local", "loss_result", "probability_target_local", "replicated_local", "resolve",
           "resolve_or_fallback", "settled_strict", "view_of"]
