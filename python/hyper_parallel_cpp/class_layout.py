"""Where a loss's classes live, for every Python front end: the one class-axis decision of the C++
library (src/loss/class_axis.h), called through libhyper_parallel_kernels' hpk_resolve_class_axis
(and hpk_class_axis_mean: whether reduction='mean' is taken on the layout).

Each DTensor route (PyTorch's, torch_dtensor_layout.py; HyperParallel's torch DTensor,
integrations/hyperparallel_layout.py; HyperParallel's MindSpore DTensor, mindspore/loss_parallel.py)
describes its logits' layout in neutral terms (a LayoutView: one Placement per mesh dim, the tensor's
dims, the route's words for it) and its capabilities (a Route); the decision says which mesh dim
shards the classes, whether the logits must be re-laid out first, the placements of a tensor over
their rows, or which error every rank raises with which words. The C++ DTensor route makes the same
call, so every front end decides alike. The route then acts on the answer (a redistribute, a
process group, this rank's piece).

The contract (PyTorch 2.15's loss_parallel, torch/distributed/tensor/parallel/loss.py): exactly one
mesh dim shards the class dim (the tensor-parallel dim, anywhere in the mesh); every other mesh dim is
Replicate or shards another tensor dim (batch, sequence). Under strict (the default) that is what is
taken; strict=False re-lays out the rest, where the route can (a warning). A route that cannot lay out
rows sharded along other mesh dims (HyperParallel's: its loss is replicated) takes a mesh of more than
one dim under strict=False only, its other dims Replicate.

Needs neither torch nor MindSpore (the MindSpore front end imports it without torch).
"""

import ctypes
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .kernels_library import Error, kernels_library


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
    """A DTensor's layout as the decision reads it, whatever framework made it."""
    placements: Tuple[Placement, ...]  # one per mesh dim, shard dims non-negative
    ndim: int  # the tensor's dims
    described: str  # the route's words for the layout, for messages
    on_mesh: Callable[[Any, int], bool]  # (loss_parallel(mesh=...), the class mesh dim): is it that mesh?


@dataclass(frozen=True)
class Route:
    """What a front end can do with logits off the contract, and its words and errors."""
    tensor: str  # how messages name its DTensor
    relayout: bool  # it can re-lay out the logits (strict=False)
    rows_sharded: bool  # it can lay out per-row results sharded along the other mesh dims
    relax: str = "strict=False"  # how its messages spell "not strict"; "" where it has no strictness
    layout_error: Optional[type] = None  # its LossParallelLayoutError (None: hyper_parallel_cpp's, needs torch)
    unsupported_error: Optional[type] = None  # its LossParallelUnsupportedError (likewise)


@dataclass(frozen=True)
class Resolution:
    mesh_dim: int  # the mesh dim that shards the class dim
    want: Tuple[Placement, ...]  # the contract layout; differs from the view's where it must be re-laid out
    relayout: bool
    rows: Tuple[Placement, ...] = ()  # a tensor over the logits' rows (target, per-row loss)

    @property
    def row_mesh_dims(self) -> List[int]:
        """The mesh dims other than the class dim's that shard the rows."""
        return row_mesh_dims(self.rows)


# ---- libhyper_parallel_kernels' structs (include/hyper_parallel_kernels/loss_kernels.h) ----

_MAX_MESH_DIMS = 16
_KINDS = ("shard", "replicate", "partial", "other")  # hpk_placement_kind, in order
_STRICTNESS_UNKNOWN, _NEEDS_STRICTNESS = -1, 1
_LAYOUT_ERROR, _UNSUPPORTED_ERROR = 8, 9


class _Placement(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("dim", ctypes.c_int64)]


class _Query(ctypes.Structure):
    _fields_ = [("is_dtensor", ctypes.c_int32), ("mesh_ndim", ctypes.c_int64),
                ("placements", _Placement * _MAX_MESH_DIMS), ("ndim", ctypes.c_int64),
                ("class_dim", ctypes.c_int64), ("can_relayout", ctypes.c_int32), ("rows_sharded", ctypes.c_int32),
                ("strictness", ctypes.c_int32), ("has_options_mesh", ctypes.c_int32),
                ("options_mesh_fits", ctypes.c_int32 * _MAX_MESH_DIMS), ("op", ctypes.c_char_p),
                ("tensor", ctypes.c_char_p), ("relax", ctypes.c_char_p), ("found", ctypes.c_char_p),
                ("options_mesh", ctypes.c_char_p)]


class _Axis(ctypes.Structure):
    _fields_ = [("outcome", ctypes.c_int32), ("mesh_dim", ctypes.c_int64), ("relayout", ctypes.c_int32),
                ("want", _Placement * _MAX_MESH_DIMS), ("rows", _Placement * _MAX_MESH_DIMS),
                ("message", ctypes.c_void_p), ("message_capacity", ctypes.c_int64),
                ("message_length", ctypes.c_int64)]


def _placements(ps, n: int) -> Tuple[Placement, ...]:
    return tuple(shard(ps[i].dim) if _KINDS[ps[i].kind] == "shard" else Placement(_KINDS[ps[i].kind])
                 for i in range(n))


def _raise(route: Route, code: int, message: str):
    if code in (_LAYOUT_ERROR, _UNSUPPORTED_ERROR):
        error = route.layout_error if code == _LAYOUT_ERROR else route.unsupported_error
        if error is None:
            from . import errors
            error = errors.LossParallelLayoutError if code == _LAYOUT_ERROR else errors.LossParallelUnsupportedError
        raise error(message)
    raise RuntimeError(f"the class-axis decision (libhyper_parallel_kernels) refused its query: {message}")


def _ask(query: _Query, route: Route, question: str = "hpk_resolve_class_axis") -> _Axis:
    """One of the decision's questions (hpk_resolve_class_axis, hpk_class_axis_mean), with room for
    the whole of a long message."""
    capacity = 4096
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        axis, error = _Axis(), Error()
        axis.message = ctypes.addressof(buffer)
        axis.message_capacity = capacity
        code = getattr(kernels_library(), question)(ctypes.byref(query), ctypes.byref(axis), ctypes.byref(error))
        if code == 0:
            return axis
        if axis.message_length >= capacity:
            capacity = axis.message_length + 1
            continue
        message = buffer.value if code in (_LAYOUT_ERROR, _UNSUPPORTED_ERROR) else error.message
        _raise(route, code, message.decode("utf-8", "replace"))


def _ask_with_strictness(query: _Query, route: Route, strict: Callable[[], bool], question: str) -> _Axis:
    """The answer, the strictness asked (and given) only where the decision says it depends on it."""
    query.strictness = _STRICTNESS_UNKNOWN
    axis = _ask(query, route, question)
    if axis.outcome == _NEEDS_STRICTNESS:
        query.strictness = int(bool(strict()))
        axis = _ask(query, route, question)
    return axis


def _words(text: str) -> bytes:
    return text.encode("utf-8")


def _query(view: Optional[LayoutView], class_dim: int, op: str, route: Route) -> _Query:
    q = _Query()
    q.is_dtensor = view is not None
    q.class_dim = class_dim
    q.ndim = max(class_dim + 1, 1) if view is None else view.ndim
    q.can_relayout, q.rows_sharded = route.relayout, route.rows_sharded
    q.op, q.tensor, q.relax = _words(op), _words(route.tensor), _words(route.relax)
    if view is not None:
        if len(view.placements) > _MAX_MESH_DIMS:
            raise ValueError(f"{op} under loss_parallel: a mesh of at most {_MAX_MESH_DIMS} dims expected, got "
                             f"{len(view.placements)} ({view.described})")
        q.found = _words(view.described)
        q.mesh_ndim = len(view.placements)
        for i, p in enumerate(view.placements):
            q.placements[i] = _Placement(_KINDS.index(p.kind), p.dim if p.is_shard else -1)
    return q


def resolve(view: Optional[LayoutView], class_dim: int, op: str, route: Route, strict: Callable[[], bool],
            options_mesh: Any = None, plain_shape: Optional[Sequence[int]] = None) -> Resolution:
    """Where the classes of logits laid out as `view` (None: a plain tensor) live, or the named
    error for a layout the route cannot take. `strict` gives the context's strictness; it is asked
    only where the decision depends on it (a route may make the ranks agree on it first)."""
    q = _query(view, class_dim, op, route)
    if view is None:
        q.found = _words("" if plain_shape is None else str(list(plain_shape)))
    elif options_mesh is not None:
        q.has_options_mesh = 1
        q.options_mesh = _words(str(options_mesh))
        for i in mesh_dims_sharding(view.placements, class_dim):  # the only dims the decision reads
            q.options_mesh_fits[i] = bool(view.on_mesh(options_mesh, i))
    axis = _ask_with_strictness(q, route, strict, "hpk_resolve_class_axis")
    n = len(view.placements)
    return Resolution(axis.mesh_dim, _placements(axis.want, n), bool(axis.relayout), _placements(axis.rows, n))


def check_mean(view: LayoutView, class_dim: int, op: str, route: Route, strict: Callable[[], bool]) -> None:
    """reduction='mean' on logits laid out as `view`: the route's unsupported error where the
    decision refuses it (a mesh of more than one dim under strict, PyTorch's contract); `strict` is
    asked only on such a mesh."""
    _ask_with_strictness(_query(view, class_dim, op, route), route, strict, "hpk_class_axis_mean")


def expected_layout(route: Route, class_dim: int) -> str:
    """The layout the route takes, in the words of the decision's messages."""
    buffer = ctypes.create_string_buffer(1024)
    kernels_library().hpk_class_axis_expected(ctypes.c_int32(route.rows_sharded), _words(route.tensor),
                                              ctypes.c_int64(class_dim), buffer, ctypes.c_int64(len(buffer)))
    return buffer.value.decode("utf-8", "replace")


def mesh_dims_sharding(placements: Sequence[Placement], class_dim: int) -> List[int]:
    """The mesh dims that shard the class dim (none: the logits are not class-sharded, and no route
    takes them)."""
    return [i for i, p in enumerate(placements) if p.is_shard and p.dim == class_dim]


def row_mesh_dims(rows: Sequence[Placement]) -> List[int]:
    """The mesh dims that shard a tensor over the rows (the row placements' Shards)."""
    return [i for i, p in enumerate(rows) if p.is_shard]


__all__ = ["LayoutView", "Placement", "REPLICATE", "Resolution", "Route", "check_mean", "expected_layout",
           "mesh_dims_sharding", "placement_of", "resolve", "row_mesh_dims", "shard"]
