"""Where a loss's classes live: the one resolution of the class axis for every Python front end.

Both DTensor routes (PyTorch's, loss_parallel.py; HyperParallel's, integrations/hyperparallel.py)
describe their logits' layout in neutral terms (a LayoutView: one Placement per mesh dim, the tensor's
dims, the route's words for it) and this module decides, with one wording per decision, which mesh
dim shards the classes, whether the logits must be re-laid out first, or which error every rank
raises. The route then acts on that (a redistribute, a process group, this rank's piece) and hands
the kernels the neutral result: the class dim, the group's name, the vocabulary.

The contract (PyTorch 2.15's loss_parallel, torch/distributed/tensor/parallel/loss.py): exactly one
mesh dim shards the class dim (the tensor-parallel dim, anywhere in the mesh); every other mesh dim is
Replicate or shards another tensor dim (batch, sequence). Under strict (the default) that is what is
taken; strict=False re-lays out the rest, where the route can (a warning). A route that cannot lay out
rows sharded along other mesh dims (HyperParallel's: its loss is replicated) takes a mesh of more than
one dim under strict=False only, its other dims Replicate.
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .errors import LossParallelLayoutError, LossParallelUnsupportedError


@dataclass(frozen=True)
class Placement:
    """A mesh dim's placement in neutral terms: 'shard' (exactly a Shard of `dim`), 'replicate',
    'partial', or 'other' (a placement that holds other pieces than torch.chunk's: a strided shard)."""
    kind: str
    dim: int = -1

    @property
    def is_shard(self) -> bool:
        return self.kind == "shard"


REPLICATE = Placement("replicate")


def shard(dim: int) -> Placement:
    return Placement("shard", dim)


def placement_of(p, ndim: int, torch_chunk_piece: bool = True) -> Placement:
    """A framework's placement (with is_shard / is_replicate / is_partial, as PyTorch's and
    HyperParallel's have) in neutral terms. `torch_chunk_piece`: whether a shard of it holds
    torch.chunk's piece (False for PyTorch's _StridedShard: other pieces, so 'other')."""
    if p.is_shard():
        return shard(p.dim % ndim) if torch_chunk_piece else Placement("other")
    if p.is_replicate():
        return REPLICATE
    return Placement("partial" if p.is_partial() else "other")


@dataclass(frozen=True)
class LayoutView:
    """A DTensor's layout as the resolver reads it, whatever framework made it."""
    placements: Tuple[Placement, ...]  # one per mesh dim, shard dims non-negative
    ndim: int  # the tensor's dims
    described: str  # the route's words for the layout, for messages
    on_mesh: Callable[[Any, int], bool]  # (loss_parallel(mesh=...), the class mesh dim): is it that mesh?


@dataclass(frozen=True)
class Route:
    """What a front end can do with logits off the contract."""
    tensor: str  # how messages name its DTensor
    relayout: bool  # it can re-lay out the logits (strict=False)
    rows_sharded: bool  # it can lay out per-row results sharded along the other mesh dims


@dataclass(frozen=True)
class Resolution:
    mesh_dim: int  # the mesh dim that shards the class dim
    want: Tuple[Placement, ...]  # the contract layout; differs from the view's where it must be re-laid out
    relayout: bool


def expected_layout(route: Route, class_dim: int) -> str:
    others = ("its other mesh dims Shard or Replicate (a Shard of another dim)" if route.rows_sharded else
              "its other mesh dims Replicate (or the tensor-parallel mesh alone)")
    return (f"{route.tensor} sharded along its class dim {class_dim} on exactly one mesh dim (Shard({class_dim})), "
            f"{others}")


def mesh_dims_sharding(placements: Sequence[Placement], class_dim: int) -> List[int]:
    return [i for i, p in enumerate(placements) if p.is_shard and p.dim == class_dim]


def contract_placements(placements: Sequence[Placement], class_dim: int) -> Optional[Tuple[Placement, ...]]:
    """The placements closest to these that the contract takes (the class dim on the last mesh dim
    that shards it; Partial reduced; other shardings of the class dim and strided shards gathered),
    or None where nothing shards the class dim."""
    dims = mesh_dims_sharding(placements, class_dim)
    if not dims:
        return None
    return tuple(shard(class_dim) if i == dims[-1] else p if p.is_shard and p.dim != class_dim else REPLICATE
                 for i, p in enumerate(placements))


def resolve(view: Optional[LayoutView], class_dim: int, op: str, route: Route, strict: Callable[[], bool],
            options_mesh: Any = None, plain_shape: Optional[Sequence[int]] = None) -> Resolution:
    """Where the classes of logits laid out as `view` (None: a plain tensor) live, or the named
    error for a layout the route cannot take. `strict` gives the context's strictness; it is asked
    only where the decision depends on it (a route may make the ranks agree on it first)."""
    expected = expected_layout(route, class_dim)
    prefix = f"{op} under loss_parallel"
    if view is None:
        shape = "" if plain_shape is None else f" of shape {list(plain_shape)}"
        raise LossParallelLayoutError(f"{prefix}: expected the input to be {expected}, got a plain tensor{shape}")
    got = view.described
    want = contract_placements(view.placements, class_dim)
    partial = any(p.kind == "partial" for p in view.placements)
    relayout = partial or (want is not None and tuple(view.placements) != want)
    # Where the contract is not met and the route could re-lay out, the strictness decides: asked once.
    refuse = strict() if relayout and route.relayout else True
    if partial and refuse:
        how = " (strict)" if route.relayout else ""
        fix = ", or use strict=False" if route.relayout else ""
        raise LossParallelLayoutError(f"{prefix}{how}: expected the input to be {expected}, got {got}: reduce the "
                                      f"Partial first{fix}")
    if want is None:
        raise LossParallelLayoutError(f"{prefix}: expected the input to be {expected}, got {got}: the class dim "
                                      f"{class_dim} is not sharded")
    if relayout and not route.relayout:
        dims = mesh_dims_sharding(view.placements, class_dim)
        raise LossParallelUnsupportedError(f"{prefix}: the class dim is sharded by {len(dims)} mesh dims ({got}); "
                                           f"expected exactly one")
    if relayout and refuse:
        raise LossParallelLayoutError(f"{prefix} (strict): expected the input to be {expected} (PyTorch's "
                                      f"loss_parallel contract), got {got}: gather the other shardings first, or use "
                                      f"strict=False")
    mesh_dim = want.index(shard(class_dim))
    if not route.rows_sharded and len(want) > 1:
        if strict():
            raise LossParallelLayoutError(f"{prefix} (strict): expected {expected}, got {got}. Use the 1-D "
                                          f"tensor-parallel sub-mesh or strict=False")
        if any(p != REPLICATE for i, p in enumerate(want) if i != mesh_dim):
            raise LossParallelLayoutError(
                f"{prefix} (strict=False): expected every mesh axis but the class axis to be Replicate, got {got}; "
                f"put the logits on the tensor-parallel sub-mesh (DTensor.from_local(local, mesh['tp'], "
                f"[Shard({class_dim})]))")
    if options_mesh is not None and not view.on_mesh(options_mesh, mesh_dim):
        raise LossParallelLayoutError(f"{prefix}(mesh = {options_mesh}): expected the input on that mesh, got {got}")
    return Resolution(mesh_dim, want, relayout)


def row_placements(want: Sequence[Placement], mesh_dim: int, class_dim: int) -> Tuple[Placement, ...]:
    """The placements of a tensor over the logits' rows (target, per-row loss): the class dim's
    Shard made Replicate, a Shard of a later dim moved down one."""
    return tuple(REPLICATE if i == mesh_dim or not p.is_shard else shard(p.dim - 1 if p.dim > class_dim else p.dim)
                 for i, p in enumerate(want))


def row_mesh_dims(want: Sequence[Placement], mesh_dim: int) -> List[int]:
    """The mesh dims other than the class dim's that shard the rows."""
    return [i for i, p in enumerate(want) if i != mesh_dim and p.is_shard]


__all__ = ["LayoutView", "Placement", "REPLICATE", "Resolution", "Route", "contract_placements", "expected_layout",
           "mesh_dims_sharding", "placement_of", "resolve", "row_mesh_dims", "row_placements", "shard"]
