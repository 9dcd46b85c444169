"""loss_parallel() on PyTorch's own DTensor: a drop-in for
``torch.distributed.tensor.parallel.loss_parallel`` that runs the C++ library's kernels.

Inside the context, ``F.cross_entropy`` / ``nn.CrossEntropyLoss``, ``F.nll_loss`` and
``log_softmax`` on DTensor logits sharded along the class dim run on the local shards over
the process group of the mesh dim that shards them (any mesh PyTorch 2.15's loss_parallel
takes: the other mesh dims Replicate or sharding the batch / sequence): cross-entropy in two
small all-gathers forward (the call's record, the statistics) and no collective backward,
exact under ignore_index, class weights, every reduction, label smoothing and probability
targets. The loss is laid out as PyTorch 2.15 lays it out. Plain tensors are PyTorch's.

The hook: a ``TorchFunctionMode`` on the thread while any context is open there. It sees
``F.cross_entropy`` whole, before it decomposes into ATen ops (the level where PyTorch's own
loss_parallel hooks DTensor's op handlers, and so never sees label smoothing or probability
targets as one loss). The active state is a ``contextvars.ContextVar`` of the open entries:
local to the thread and to the context, re-entrant (an inner context with no options, or the
same ones, nests), and any order of exits restores it. Backward needs no context: the
gradients are the kernels' own autograd formulas.
"""

import contextlib
import inspect
import threading
import warnings
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard
from torch._C import _len_torch_function_stack, _pop_torch_function_stack, _push_on_torch_function_stack
from torch.overrides import TorchFunctionMode

from . import ops
from ._extension import _C
from .config import parallelism_config
from .errors import LossParallelLayoutError, LossParallelUnsupportedError


@dataclass(frozen=True)
class LossParallelOptions:
    mesh: Optional[DeviceMesh] = None
    strict: Optional[bool] = None  # None: ParallelismConfig.loss_parallel_strict_mesh
    z_loss_weight: float = 0.0
    logit_softcap: float = 0.0
    gradient_in_forward: bool = False

    def effective_strict(self) -> bool:
        return parallelism_config().loss_parallel_strict_mesh if self.strict is None else self.strict


class _Entry:
    """One entry into loss_parallel(): what its exit removes, whichever entries exit before it."""

    __slots__ = ("options",)

    def __init__(self, options: LossParallelOptions):
        self.options = options


# The entries active in this contextvars context, outermost first. Each exit removes its own
# entry, so any order of exits (generators holding a context across a yield, closed in
# creation order) leaves exactly the entries still open.
_active: ContextVar[Tuple[_Entry, ...]] = ContextVar("hyper_parallel_cpp.loss_parallel", default=())


class _ThreadModes(threading.local):
    """The routing mode on this thread's torch-function mode stack, and the entries it serves."""

    def __init__(self):
        self.mode: Optional["_LossParallelMode"] = None
        self.entries = 0


_thread_modes = _ThreadModes()


def _remove_from_mode_stack(mode) -> None:
    # Modes entered after ours (and still open) stay, in their order.
    above = []
    while _len_torch_function_stack() > 0:
        top = _pop_torch_function_stack()
        if top is mode:
            break
        above.append(top)
    for m in reversed(above):
        _push_on_torch_function_stack(m)


_BUILT_IN_NAMES = frozenset({"cross_entropy", "log_softmax", "nll_loss"})
_extra_names_lock = threading.Lock()
_extra_names: frozenset = frozenset()


def is_loss_parallel_active() -> bool:
    """Whether the calling thread, in its current contextvars context, is inside loss_parallel()."""
    return bool(_active.get())


def loss_parallel_op_names() -> frozenset:
    """The function names routed to loss_parallel's kernels inside the context."""
    return _BUILT_IN_NAMES | _extra_names


def register_loss_parallel_op_names(*names: str) -> None:
    """Adds names (tests, extensions). Inside the context a function of such a name on
    class-sharded DTensor logits raises LossParallelUnsupportedError naming it, never a
    silently different result."""
    global _extra_names
    for n in names:
        if not isinstance(n, str) or not n:
            raise TypeError(f"register_loss_parallel_op_names: expected non-empty strings, got {n!r}")
    with _extra_names_lock:
        _extra_names = _extra_names | frozenset(names)


# Tensor subclasses of other frameworks whose own dispatchers route loss_parallel's functions to
# our kernels (integrations/): the mode leaves calls on them to that dispatcher, and their meshes
# are accepted as loss_parallel(mesh=...).
_foreign_dtensor_types: tuple = ()
_foreign_mesh_types: tuple = ()


def register_foreign_dtensor(dtensor_type: type, mesh_type: type) -> None:
    """For integrations: calls on `dtensor_type` pass through the mode to its own dispatcher."""
    global _foreign_dtensor_types, _foreign_mesh_types
    if dtensor_type not in _foreign_dtensor_types:
        _foreign_dtensor_types += (dtensor_type,)
        _foreign_mesh_types += (mesh_type,)


def active_options() -> Optional[LossParallelOptions]:
    """The options of the calling context's loss_parallel(), or None outside it."""
    entries = _active.get()
    return entries[0].options if entries else None


def _is_foreign(args, kwargs) -> bool:
    return bool(_foreign_dtensor_types) and any(
        isinstance(v, _foreign_dtensor_types) for v in list(args) + list(kwargs.values()))


_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


@contextlib.contextmanager
def loss_parallel(
    mesh: Optional[DeviceMesh] = None,
    strict: Optional[bool] = None,
    *,
    z_loss_weight: float = 0.0,
    logit_softcap: float = 0.0,
    gradient_in_forward: bool = False,
) -> Iterator[None]:
    """Enters loss_parallel for this thread and contextvars context.

    mesh: the tensor-parallel mesh; the logits must live on it (or on a mesh whose dim that
    shards the classes is it). None: inferred from the logits.
    strict: True: logits on a mesh of more than one dim are a LossParallelLayoutError; False:
    their other mesh dims are gathered (a warning). None: ParallelismConfig (default True).
    z_loss_weight, logit_softcap: cross-entropy only (see ops.vocab_parallel_cross_entropy);
    log_softmax / nll_loss under them raise LossParallelUnsupportedError.
    gradient_in_forward: cross_entropy writes d loss / d logits over the logits' local piece
    during forward (no logits-sized gradient buffer; backward only scales it) when the logits
    are not a leaf and their local rows have a unit class stride; reading the logits afterwards
    gives the gradient, and any other autograd user that saved them raises. Eager only (an
    autograd.Function that writes its input), one backward per loss.
    """
    if logit_softcap < 0:
        raise ValueError(f"loss_parallel: logit_softcap must be >= 0 (0: off), got {logit_softcap}")
    if mesh is not None and not isinstance(mesh, (DeviceMesh,) + _foreign_mesh_types):
        raise TypeError(f"loss_parallel: mesh must be a DeviceMesh or None, got {type(mesh).__name__}")
    if parallelism_config().disable_loss_parallel:
        _warn_once("disabled", "loss_parallel(): ParallelismConfig.disable_loss_parallel is set, so this "
                               "context activates nothing (the model should produce replicated logits)")
        yield
        return
    options = LossParallelOptions(mesh, strict, float(z_loss_weight), float(logit_softcap), gradient_in_forward)
    outer = _active.get()
    if outer and options != LossParallelOptions() and options != outer[0].options:
        raise LossParallelLayoutError(
            f"loss_parallel: a nested context's options ({options}) contradict the enclosing one's "
            f"({outer[0].options}); nest with no options or the same ones")
    entry = _Entry(options if not outer else outer[0].options)
    _active.set(outer + (entry,))
    modes = _thread_modes
    if modes.entries == 0:
        modes.mode = _LossParallelMode()
        _push_on_torch_function_stack(modes.mode)
    modes.entries += 1
    try:
        yield
    finally:
        modes.entries -= 1
        if modes.entries == 0:
            _remove_from_mode_stack(modes.mode)
            modes.mode = None
        _active.set(tuple(e for e in _active.get() if e is not entry))


# --- layouts ------------------------------------------------------------------------------
# PyTorch 2.15's contract (torch/distributed/tensor/parallel/loss.py): exactly one mesh dim
# shards the class dim (the tensor-parallel dim, anywhere in the mesh); every other mesh dim is
# Replicate or shards another tensor dim (batch, sequence). Tensors over the logits' rows (the
# target, a per-row loss) are laid out as the logits with the class dim's Shard made Replicate
# and a Shard of a later dim moved down one. Under strict (the default) that is the contract;
# strict=False re-lays out what it cannot take (a warning) and gives the exact global mean on a
# batch-sharded mesh.


@dataclass
class _ClassSharding:
    logits: DTensor  # possibly re-laid-out (strict=False)
    class_dim: int
    mesh_dim: int  # the mesh dim that shards the class dim
    group_name: str
    vocab_size: int
    offset: int  # first class held here
    local: int  # classes held here

    @property
    def mesh(self) -> DeviceMesh:
        return self.logits.device_mesh

    def row_placements(self) -> Tuple:
        """The placements of a tensor over the logits' rows (target, per-row loss)."""
        out = []
        for i, p in enumerate(self.logits.placements):
            if i == self.mesh_dim or not isinstance(p, Shard):
                out.append(Replicate())
            else:
                d = p.dim % self.logits.ndim
                out.append(Shard(d - 1 if d > self.class_dim else d))
        return tuple(out)

    def batch_mesh_dims(self) -> List[int]:
        """The mesh dims other than the class dim's that shard the rows."""
        return [i for i, p in enumerate(self.logits.placements) if i != self.mesh_dim and isinstance(p, Shard)]

    def sum_placements(self) -> Tuple:
        """A sum over the local rows: Partial on the mesh dims that shard the rows."""
        batch = self.batch_mesh_dims()
        return tuple(Partial("sum") if i in batch else Replicate() for i in range(self.mesh.ndim))


def _expected(class_dim: int) -> str:
    return (f"a DTensor sharded along its class dim {class_dim} on exactly one mesh dim (Shard({class_dim})), "
            f"its other mesh dims Shard or Replicate (a Shard of another dim)")


def _describe(t: DTensor) -> str:
    return f"{list(t.placements)} on {t.device_mesh}"


def _shards_dim(p, dim: int, ndim: int) -> bool:
    # Shard exactly: a _StridedShard (FSDP over TP) holds other pieces than torch.chunk's.
    return type(p) is Shard and p.dim % ndim == dim


def _is_class_sharded(t: Any, class_dim: int) -> bool:
    return isinstance(t, DTensor) and 0 <= class_dim < t.ndim and any(
        _shards_dim(p, class_dim, t.ndim) for p in t.placements)


def _group_ranks(mesh: DeviceMesh, mesh_dim: int) -> List[int]:
    return dist.get_process_group_ranks(mesh.get_group(mesh_dim))


def _contract_placements(t: DTensor, class_dim: int) -> Optional[List]:
    """The placements closest to t's that the contract takes (class dim on one mesh dim, the
    last that shards it; Partial reduced; other shardings of the class dim and strided shards
    gathered), or None where nothing shards the class dim."""
    dims = [i for i, p in enumerate(t.placements) if _shards_dim(p, class_dim, t.ndim)]
    if not dims:
        return None
    want = []
    for i, p in enumerate(t.placements):
        if i == dims[-1]:
            want.append(Shard(class_dim))
        elif type(p) is Shard and p.dim % t.ndim != class_dim:
            want.append(Shard(p.dim % t.ndim))
        else:
            want.append(Replicate())
    return want


def _settled_strict(op: str, options: LossParallelOptions, t: DTensor) -> bool:
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


def _resolve(t: Any, class_dim: int, op: str, options: LossParallelOptions) -> _ClassSharding:
    if not isinstance(t, DTensor):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the input to be {_expected(class_dim)}, "
                                      f"got a plain tensor of shape {list(t.shape)}")
    mesh = t.device_mesh
    want = _contract_placements(t, class_dim)
    partial = any(p.is_partial() for p in t.placements)
    # Where the contract is not met, the strictness decides: agreed once, before any refusal.
    strict = _settled_strict(op, options, t) if partial or (want is not None and list(t.placements) != want) \
        else None
    if partial and strict:
        raise LossParallelLayoutError(f"{op} under loss_parallel (strict): expected the input to be "
                                      f"{_expected(class_dim)}, got {_describe(t)}: reduce the Partial first, or use "
                                      f"strict=False")
    if want is None:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the input to be {_expected(class_dim)}, "
                                      f"got {_describe(t)}: the class dim {class_dim} is not sharded")
    if list(t.placements) != want:
        if strict:
            raise LossParallelLayoutError(
                f"{op} under loss_parallel (strict): expected the input to be {_expected(class_dim)} (PyTorch's "
                f"loss_parallel contract), got {_describe(t)}: gather the other shardings first, or use strict=False")
        _warn_once("relayout:" + str(list(t.placements)),
                   f"loss_parallel (strict=False): re-laying out the logits ({_describe(t)} -> {want})")
        t = t.redistribute(mesh, want)
    m = want.index(Shard(class_dim))
    if options.mesh is not None:
        whole = options.mesh == mesh
        that_dim = options.mesh.ndim == 1 and options.mesh.mesh.flatten().tolist() == _group_ranks(mesh, m)
        if not whole and not that_dim:
            raise LossParallelLayoutError(f"{op} under loss_parallel(mesh = {options.mesh}): expected the input on "
                                          f"that mesh, got {_describe(t)}")
    n = mesh.size(m)
    r = mesh.get_local_rank(m)
    vocab = t.shape[class_dim]
    chunk = -(-vocab // n)
    offset = min(r * chunk, vocab)
    return _ClassSharding(t, class_dim, m, mesh.get_group(m).group_name, vocab, offset,
                          max(0, min(chunk, vocab - offset)))


def _replicated_local(t: Any, what: str, op: str, mesh: DeviceMesh) -> torch.Tensor:
    if not isinstance(t, DTensor):
        return t
    if t.device_mesh != mesh:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} on the logits' mesh {mesh} "
                                      f"(or a plain tensor), got one on {t.device_mesh}")
    if not all(p.is_replicate() for p in t.placements):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} to be replicated (a plain "
                                      f"tensor or a DTensor with [Replicate()]), got {list(t.placements)}")
    return t.to_local()


def _laid_out_local(t: Any, want: Tuple, what: str, op: str, cs: _ClassSharding,
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
    if t.device_mesh != mesh:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} on the logits' mesh {mesh}, "
                                      f"got one on {t.device_mesh}")
    if tuple(t.placements) == tuple(want):
        return t.to_local()
    if all(p.is_replicate() for p in t.placements):
        return t.redistribute(mesh, list(want)).to_local()
    if _settled_strict(op, options, cs.logits):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the {what} laid out {list(want)} (or "
                                      f"replicated), got {list(t.placements)}")
    _warn_once("relayout-" + what, f"loss_parallel (strict=False): re-laying out the {what} "
                                   f"({list(t.placements)} -> {list(want)})")
    return t.redistribute(mesh, list(want)).to_local()


def _probability_target_local(target: Any, cs: _ClassSharding, op: str, options: LossParallelOptions) -> torch.Tensor:
    logits = cs.logits
    if not isinstance(target, DTensor) and tuple(target.shape) != tuple(logits.shape):
        raise ValueError(f"{op}: probability targets must have the logits' shape {list(logits.shape)}, got "
                         f"{list(target.shape)}")
    local = _laid_out_local(target, tuple(logits.placements), "probability target", op, cs, options)
    # A plain one (taken only where the rows are whole) is the whole: this rank's classes of it.
    return local if isinstance(target, DTensor) else local.narrow(cs.class_dim, cs.offset, cs.local)


def _rows_shape(cs: _ClassSharding) -> List[int]:
    return [s for i, s in enumerate(cs.logits.shape) if i != cs.class_dim]


def _contiguous_stride(shape: List[int]) -> Tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def _loss_result(local: torch.Tensor, cs: _ClassSharding, reduction: str) -> DTensor:
    """The loss as PyTorch 2.15's loss_parallel lays it out: per row ('none') as the target;
    reduced, Replicate over the class dim's mesh dim and Partial("sum") over the mesh dims that
    shard the rows (each rank summed its rows)."""
    if reduction == "none":
        shape = _rows_shape(cs)
        return DTensor.from_local(local, cs.mesh, cs.row_placements(), run_check=False, shape=torch.Size(shape),
                                  stride=_contiguous_stride(shape))
    return DTensor.from_local(local, cs.mesh, cs.sum_placements(), run_check=False)


def _check_mean(cs: _ClassSharding, reduction: str, op: str, options: LossParallelOptions) -> None:
    if reduction == "mean" and cs.mesh.ndim > 1 and _settled_strict(op, options, cs.logits):
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel (strict): reduction='mean' is only supported on a one-dimensional DeviceMesh "
            f"(PyTorch's loss_parallel contract), got a mesh with ndim={cs.mesh.ndim} ({_describe(cs.logits)}). Use "
            f"reduction='sum' or 'none', or strict=False for the exact global mean (one all-reduce of the weight "
            f"total over the mesh dims that shard the rows)")


def _mean_denominator(target_local: torch.Tensor, weight_local: Optional[torch.Tensor], ignore_index: int,
                      rows: int, dtype: torch.dtype) -> torch.Tensor:
    """What 'mean' divides this rank's rows by, as F.cross_entropy / F.nll_loss define it: the
    class weights of the counted targets (their count without weights), or the rows for
    probability targets."""
    if target_local.is_floating_point():
        return torch.tensor(float(rows), dtype=dtype)
    counted = target_local != ignore_index
    if weight_local is None:
        return counted.sum().to(dtype)
    return torch.where(counted, weight_local.to(dtype)[torch.where(counted, target_local, 0)],
                       torch.zeros((), dtype=dtype)).sum()


def _global_mean_scale(cs: _ClassSharding, denominator: torch.Tensor) -> torch.Tensor:
    """1 / the denominator summed over the mesh dims that shard the rows (one all-reduce each)."""
    total = denominator.clone()
    for d in cs.batch_mesh_dims():
        dist.all_reduce(total, group=cs.mesh.get_group(d))
    return 1.0 / total


def logprobs_of_dtensor(logits: DTensor, target: Any, temperature: float, return_entropy: bool,
                        ignore_index: int):
    """ops.vocab_parallel_logprobs on PyTorch DTensor logits sharded along their last dim (the
    layout rules of loss_parallel(), in or outside it): per-token DTensors laid out as the
    target (the logits' rows), the gradient back to the logits' shards through to_local()."""
    op = "vocab_parallel_logprobs"
    options = active_options() or LossParallelOptions()
    cs = _resolve(logits, logits.ndim - 1, op, options)
    local_target = _laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    out = ops.vocab_parallel_logprobs(cs.logits.to_local(), local_target, cs.group_name, temperature=temperature,
                                      return_entropy=return_entropy, ignore_index=ignore_index,
                                      vocab_size=cs.vocab_size)
    if return_entropy:
        return _loss_result(out[0], cs, "none"), _loss_result(out[1], cs, "none")
    return _loss_result(out, cs, "none")


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    if size_average is not None or reduce is not None:
        return torch.nn._reduction.legacy_get_string(size_average, reduce)
    return reduction


def _resolve_or_fallback(t: Any, class_dim: int, op: str, options: LossParallelOptions) -> Optional[_ClassSharding]:
    """The sharding, or None where loss_parallel_fallback_on_layout_error has the op computed
    on all-gathered inputs instead (_gathered)."""
    try:
        return _resolve(t, class_dim, op, options)
    except (LossParallelLayoutError, LossParallelUnsupportedError) as e:
        if isinstance(t, DTensor) and not _settled_strict(op, options, t) and \
                parallelism_config().loss_parallel_fallback_on_layout_error:
            _warn_once("fallback:" + op, f"{op} under loss_parallel: {e}; all-gathering the logits instead "
                                         f"(loss_parallel_fallback_on_layout_error is set)")
            return None
        raise


def _gathered(func, mesh: DeviceMesh, args, kwargs) -> DTensor:
    """func on every DTensor argument gathered whole (differentiably), as one process computes
    it; the result replicated on `mesh`."""
    def whole(v):
        if isinstance(v, DTensor):
            return v.redistribute(v.device_mesh, [Replicate()] * v.device_mesh.ndim).to_local()
        return v
    out = func(*[whole(a) for a in args], **{k: whole(v) for k, v in kwargs.items()})
    return DTensor.from_local(out, mesh, [Replicate()] * mesh.ndim, run_check=False)


# --- the handlers -----------------------------------------------------------------------------


_CROSS_ENTROPY = inspect.signature(F.cross_entropy)
_NLL_LOSS = inspect.signature(F.nll_loss)


def _cross_entropy(options: LossParallelOptions, args, kwargs):
    a = _CROSS_ENTROPY.bind(*args, **kwargs).arguments
    logits, target, weight = a["input"], a["target"], a.get("weight")
    if not isinstance(logits, DTensor):
        return NotImplemented  # plain tensors are PyTorch's, as under its own loss_parallel
    op = "cross_entropy"
    class_dim = 1 if logits.ndim >= 2 else 0
    if not _is_class_sharded(logits, class_dim) and not _settled_strict(op, options, logits):
        _warn_once("unsharded", f"loss_parallel (strict=False): logits are not sharded along the class dim "
                                f"({_describe(logits)}); computing cross_entropy the ordinary way")
        return NotImplemented
    cs = _resolve_or_fallback(logits, class_dim, op, options)
    if cs is None:
        return _gathered(F.cross_entropy, logits.device_mesh, args, kwargs)
    reduction = _legacy_reduction(a.get("size_average"), a.get("reduce"), a.get("reduction", "mean"))
    _check_mean(cs, reduction, op, options)
    if target.is_floating_point():
        target_local = _probability_target_local(target, cs, op, options)
    else:
        target_local = _laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    weight_local = None if weight is None else _replicated_local(weight, "class weight", op, cs.mesh)
    ignore_index = int(a.get("ignore_index", -100))
    global_mean = reduction == "mean" and bool(cs.batch_mesh_dims())
    if global_mean and options.z_loss_weight != 0:
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel(z_loss_weight={options.z_loss_weight}): reduction='mean' on a mesh whose "
            f"other dims shard the rows ({_describe(cs.logits)}) divides the z-loss by another count than the "
            f"cross-entropy; use reduction='sum' and divide yourself")
    kernel_reduction = "sum" if global_mean else reduction
    args = (cs.group_name, cs.vocab_size, class_dim, ignore_index, ops.reduction_code(kernel_reduction, op),
            float(a.get("label_smoothing", 0.0)), options.z_loss_weight, options.logit_softcap)
    local = cs.logits.to_local()
    # Not for leaves: their values are the caller's, and their .grad would alias them.
    in_forward = options.gradient_in_forward and torch.is_grad_enabled() and cs.logits.grad_fn is not None
    loss = _CrossEntropy.apply(local, target_local, weight_local, *args, in_forward, [cs.logits])
    if global_mean:
        loss = loss * _global_mean_scale(cs, _mean_denominator(target_local, weight_local, ignore_index,
                                                               ops._rows(local, class_dim), loss.dtype))
    return _loss_result(loss, cs, reduction)


class _CrossEntropy(torch.autograd.Function):
    """cross_entropy on the local pieces, calling the library's kernels directly rather than as
    the registered op: a registered op runs below any dispatch mode (CommDebugMode counts it as
    one op), while here the collectives it issues through the process group are the c10d ops
    that PyTorch's CommDebugMode counts. With `in_forward` the gradient is written over the
    logits' local piece in forward (gradient_in_forward)."""

    @staticmethod
    def forward(ctx, local, target, weight, group_name, vocab_size, class_dim, ignore_index, reduction, smoothing,
                z, cap, in_forward, owner):
        # owner: [the DTensor whose local piece `local` is]. A DTensor has a version counter of
        # its own, which autograd checks for its saved users and which in-place DTensor ops bump
        # (not the local piece's): both are bumped here and both checked in backward.
        loss, row_max, log_sum, row_weight, grad_rows = _C.cross_entropy_forward(
            local, class_dim, target, weight, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap,
            in_forward)
        ctx.args = (class_dim, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap)
        ctx.written = grad_rows.numel() > 0
        if ctx.written:
            # The logits now hold the gradient: any other saved user of them must raise.
            (dtensor,) = owner
            for t in (local, dtensor):
                torch.autograd.graph.increment_version(t)
            ctx.local, ctx.dtensor, ctx.grad_rows = local, dtensor, grad_rows
            ctx.versions = (local._version, dtensor._version)
        else:  # not asked, or not written (rows without a unit class stride, or no classes here)
            ctx.save_for_backward(local, target, weight, row_max, log_sum, row_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        class_dim, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap = ctx.args
        if ctx.written:
            if ctx.grad_rows is None:
                raise RuntimeError("cross_entropy with gradient_in_forward: a second backward through this loss; "
                                   "the first scaled the gradient written over the logits in place. Turn "
                                   "gradient_in_forward off to backward more than once")
            if (ctx.local._version, ctx.dtensor._version) != ctx.versions:
                raise RuntimeError("cross_entropy with gradient_in_forward: the gradient written over the logits was "
                                   "modified in place after the forward wrote it; turn gradient_in_forward off to "
                                   "use the logits' storage otherwise")
            local, grad_rows = ctx.local, ctx.grad_rows
            ctx.local = ctx.dtensor = ctx.grad_rows = None
            grad = _C.cross_entropy_backward(grad_loss, local, class_dim, ops._EMPTY.long(), None, ops._EMPTY,
                                             ops._EMPTY, ops._EMPTY, grad_rows, group_name, vocab_size, ignore_index,
                                             reduction, smoothing, z, cap)
        else:
            local, target, weight, row_max, log_sum, row_weight = ctx.saved_tensors
            grad = _C.cross_entropy_backward(grad_loss, local, class_dim, target, weight, row_max, log_sum, row_weight,
                                             ops._EMPTY, group_name, vocab_size, ignore_index, reduction, smoothing, z,
                                             cap)
        return (grad,) + (None,) * 12


def _reject_cross_entropy_only_options(options: LossParallelOptions, op: str) -> None:
    if options.z_loss_weight != 0 or options.logit_softcap != 0:
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel(z_loss_weight={options.z_loss_weight}, logit_softcap={options.logit_softcap})"
            f": those options apply to cross_entropy only; {op} would silently ignore them")


class _LogSoftmax(torch.autograd.Function):
    """log_softmax on the local pieces through the library's kernels (visible to CommDebugMode, as
    _CrossEntropy). z / cap: the context's cross-entropy-only options, which the C++ forward puts
    in the call's record and refuses on every rank alike (a context that differs between ranks
    is named there)."""

    @staticmethod
    def forward(ctx, local, dim, group_name, vocab_size, z, cap):
        out = _C.log_softmax(local, dim, group_name, vocab_size, None, z, cap)
        ctx.save_for_backward(out)
        ctx.args = (dim, group_name, vocab_size)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        dim, group_name, vocab_size = ctx.args
        return _C.log_softmax_backward(grad, out, dim, group_name, vocab_size), None, None, None, None, None


_NLL_LOSS_BACKWARD = torch.ops.hyper_parallel_cpp.vocab_parallel_nll_loss_backward.default


class _NllLoss(torch.autograd.Function):
    """nll_loss on the local pieces through the library's kernels (no collective backward)."""

    @staticmethod
    def forward(ctx, logp, target, weight, class_dim, reduction, ignore_index, group_name, vocab_size, z, cap):
        out, total_weight = _C.nll_loss_forward(logp, class_dim, target, weight, reduction, ignore_index, group_name,
                                                vocab_size, z, cap)
        ctx.save_for_backward(logp, target, weight, total_weight)
        ctx.args = (class_dim, reduction, ignore_index, group_name, vocab_size)
        return out

    @staticmethod
    def backward(ctx, grad):
        logp, target, weight, total_weight = ctx.saved_tensors
        class_dim, reduction, ignore_index, group_name, vocab_size = ctx.args
        g = _NLL_LOSS_BACKWARD(grad, logp, target, weight, total_weight, class_dim, reduction, ignore_index,
                               group_name, vocab_size)
        return (g,) + (None,) * 9


def _log_softmax_args(func, args, kwargs) -> Tuple[Any, Optional[int], Optional[torch.dtype]]:
    # F.log_softmax(input, dim=None, _stacklevel=3, dtype=None); torch.log_softmax(input, dim, dtype=None)
    # and Tensor.log_softmax(dim, dtype=None).
    if func is F.log_softmax:
        a = inspect.signature(F.log_softmax).bind(*args, **kwargs).arguments
        return a["input"], a.get("dim"), a.get("dtype")
    rest = list(args[1:])
    dim = kwargs.get("dim", rest[0] if rest else None)
    dtype = kwargs.get("dtype", rest[1] if len(rest) > 1 else None)
    return args[0], dim, dtype


def _log_softmax(options: LossParallelOptions, args, kwargs, func=None):
    logits, dim, dtype = _log_softmax_args(func, args, kwargs)
    if not isinstance(logits, DTensor) or dim is None or not isinstance(dim, int):
        return NotImplemented
    dim = dim % max(logits.ndim, 1)
    if not _is_class_sharded(logits, dim):
        return NotImplemented
    op = "log_softmax"
    cs = _resolve_or_fallback(logits, dim, op, options)
    if cs is None:
        _reject_cross_entropy_only_options(options, op)
        return _gathered(func, logits.device_mesh, args, kwargs)
    t = cs.logits
    local = t.to_local()
    if dtype is not None:
        local = local.to(dtype)
    out = _LogSoftmax.apply(local, dim, cs.group_name, cs.vocab_size, options.z_loss_weight, options.logit_softcap)
    _reject_cross_entropy_only_options(options, op)  # reached with them only where the C++ guard is off
    return DTensor.from_local(out, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


def _nll_loss(options: LossParallelOptions, args, kwargs):
    a = _NLL_LOSS.bind(*args, **kwargs).arguments
    logp, target, weight = a["input"], a["target"], a.get("weight")
    class_dim = 1 if getattr(logp, "ndim", 0) >= 2 else 0
    if not _is_class_sharded(logp, class_dim):
        return NotImplemented
    op = "nll_loss"
    cs = _resolve_or_fallback(logp, class_dim, op, options)
    if cs is None:
        _reject_cross_entropy_only_options(options, op)
        return _gathered(F.nll_loss, logp.device_mesh, args, kwargs)
    # A floating-point target is refused by the kernel in the call's record (on every rank, as
    # F.nll_loss refuses it), not here: a refusal on one rank alone would leave the others waiting.
    reduction = _legacy_reduction(a.get("size_average"), a.get("reduce"), a.get("reduction", "mean"))
    _check_mean(cs, reduction, op, options)
    target_local = _laid_out_local(target, cs.row_placements(), "target", op, cs, options)
    weight_local = None if weight is None else _replicated_local(weight, "class weight", op, cs.mesh)
    local = cs.logits.to_local()
    ignore_index = int(a.get("ignore_index", -100))
    global_mean = reduction == "mean" and bool(cs.batch_mesh_dims())
    code = ops.reduction_code("sum" if global_mean else reduction, op)
    out = _NllLoss.apply(local, target_local, weight_local, class_dim, code, ignore_index, cs.group_name,
                         cs.vocab_size, options.z_loss_weight, options.logit_softcap)
    _reject_cross_entropy_only_options(options, op)  # reached with them only where the C++ guard is off
    if global_mean:
        out = out * _global_mean_scale(cs, _mean_denominator(target_local, weight_local, ignore_index,
                                                             ops._rows(local, class_dim), out.dtype))
    return _loss_result(out, cs, reduction)


# The functions the mode routes, and their handlers: one dict lookup per torch call decides.
_ROUTES = {
    F.cross_entropy: lambda options, args, kwargs, func: _cross_entropy(options, args, kwargs),
    F.nll_loss: lambda options, args, kwargs, func: _nll_loss(options, args, kwargs),
    **{f: _log_softmax for f in (F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
                                       torch.special.log_softmax)},
}


def _first_class_sharded(args, kwargs) -> Optional[DTensor]:
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, DTensor) and any(type(p) is Shard for p in v.placements):
            return v
    return None


class _LossParallelMode(TorchFunctionMode):
    """Routes the loss functions on class-sharded DTensors to the kernels while a context is
    active. It sees every torch call inside the context (the model's forward too, under a
    train context), so a call it does not route costs one dict lookup."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is None:
            if _extra_names and getattr(func, "__name__", "") in _extra_names and _active.get() \
                    and _first_class_sharded(args, kwargs) is not None:
                raise LossParallelUnsupportedError(
                    f"loss_parallel: '{func.__name__}' is in the loss_parallel op names but has no loss_parallel "
                    f"kernel")
            return func(*args, **kwargs)
        entries = _active.get()
        if entries and not _is_foreign(args, kwargs):
            result = route(entries[0].options, args, kwargs, func)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)


__all__ = [
    "LossParallelOptions",
    "is_loss_parallel_active",
    "loss_parallel",
    "loss_parallel_op_names",
    "register_loss_parallel_op_names",
]
