"""loss_parallel() on PyTorch's own DTensor: a drop-in for
``torch.distributed.tensor.parallel.loss_parallel`` that runs the C++ library's kernels.

Inside the context, ``F.cross_entropy`` / ``nn.CrossEntropyLoss``, ``F.nll_loss`` and
``log_softmax`` on DTensor logits sharded along the class dim run on the local shards over
the process group of the mesh dim that shards them: cross-entropy in one all-gather forward
and no collective backward, exact under ignore_index, class weights, every reduction, label
smoothing and probability targets. The loss is a replicated DTensor.

The hook: a ``TorchFunctionMode``, entered with the outermost context. It sees
``F.cross_entropy`` whole, before it decomposes into ATen ops (the level where PyTorch's own
loss_parallel hooks DTensor's op handlers, and so never sees label smoothing or probability
targets as one loss). The active state is a ``contextvars.ContextVar``: local to the thread
and to the context, re-entrant (an inner context with no options, or the same ones, nests).
Backward needs no context: the gradients are the ops' own autograd formulas.
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
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard
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


@dataclass(frozen=True)
class _Active:
    depth: int
    options: LossParallelOptions


_active: ContextVar[Optional[_Active]] = ContextVar("hyper_parallel_cpp.loss_parallel", default=None)

_BUILT_IN_NAMES = frozenset({"cross_entropy", "log_softmax", "nll_loss"})
_extra_names_lock = threading.Lock()
_extra_names: frozenset = frozenset()


def is_loss_parallel_active() -> bool:
    """Whether the calling thread, in its current contextvars context, is inside loss_parallel()."""
    return _active.get() is not None


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
    state = _active.get()
    return None if state is None else state.options


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
    if outer is not None and options != LossParallelOptions() and options != outer.options:
        raise LossParallelLayoutError(
            f"loss_parallel: a nested context's options ({options}) contradict the enclosing one's "
            f"({outer.options}); nest with no options or the same ones")
    token = _active.set(_Active(1 if outer is None else outer.depth + 1,
                                options if outer is None else outer.options))
    mode = _LossParallelMode() if outer is None else None
    if mode is not None:
        mode.__enter__()
    try:
        yield
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
        _active.reset(token)


# --- layouts ------------------------------------------------------------------------------


@dataclass
class _ClassSharding:
    logits: DTensor  # possibly re-laid-out (strict=False on a mesh of more than one dim)
    class_dim: int
    mesh_dim: int
    group_name: str
    vocab_size: int
    offset: int  # first class held here
    local: int  # classes held here


def _expected(class_dim: int) -> str:
    return (f"a DTensor sharded along its class dim: placements [Shard({class_dim})] on a 1-D "
            f"tensor-parallel mesh")


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


def _resolve(t: Any, class_dim: int, op: str, options: LossParallelOptions) -> _ClassSharding:
    if not isinstance(t, DTensor):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the input to be {_expected(class_dim)}, "
                                      f"got a plain tensor of shape {list(t.shape)}")
    mesh = t.device_mesh
    if any(p.is_partial() for p in t.placements):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the input to be {_expected(class_dim)}, "
                                      f"got {_describe(t)} (reduce the Partial first)")
    dims = [i for i, p in enumerate(t.placements) if _shards_dim(p, class_dim, t.ndim)]
    if not dims:
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected the input to be {_expected(class_dim)}, "
                                      f"got {_describe(t)}: the class dim {class_dim} is not sharded")
    if len(dims) > 1:
        raise LossParallelUnsupportedError(f"{op} under loss_parallel: the class dim is sharded by {len(dims)} "
                                           f"mesh dims ({_describe(t)}); expected exactly one")
    m = dims[0]
    if options.mesh is not None:
        whole = options.mesh == mesh
        that_dim = options.mesh.ndim == 1 and options.mesh.mesh.flatten().tolist() == _group_ranks(mesh, m)
        if not whole and not that_dim:
            raise LossParallelLayoutError(f"{op} under loss_parallel(mesh = {options.mesh}): expected the input on "
                                          f"that mesh, got {_describe(t)}")
    if mesh.ndim != 1:
        if options.effective_strict():
            raise LossParallelLayoutError(f"{op} under loss_parallel (strict): expected {_expected(class_dim)}, got "
                                          f"{_describe(t)}. Use the 1-D sub-mesh (mesh[\"tp\"]) or strict=False")
        want = [Replicate()] * mesh.ndim
        want[m] = Shard(class_dim)
        if list(t.placements) != want:
            _warn_once("gather", f"loss_parallel (strict=False): gathering the logits' non-class mesh dims "
                                 f"({_describe(t)} -> {want})")
            t = t.redistribute(mesh, want)
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


def _probability_target_local(target: Any, cs: _ClassSharding, op: str) -> torch.Tensor:
    logits = cs.logits
    if isinstance(target, DTensor):
        if target.device_mesh != logits.device_mesh:
            raise LossParallelLayoutError(f"{op} under loss_parallel: expected the probability target on the "
                                          f"logits' mesh {logits.device_mesh}, got one on {target.device_mesh}")
        if list(target.placements) == list(logits.placements):
            return target.to_local()
        if all(p.is_replicate() for p in target.placements):
            return target.to_local().narrow(cs.class_dim, cs.offset, cs.local)
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected probability targets replicated or laid "
                                      f"out like the logits ({list(logits.placements)}), got "
                                      f"{list(target.placements)}")
    if tuple(target.shape) != tuple(logits.shape):
        raise ValueError(f"{op}: probability targets must have the logits' shape {list(logits.shape)}, got "
                         f"{list(target.shape)}")
    return target.narrow(cs.class_dim, cs.offset, cs.local)


def _replicated_result(local: torch.Tensor, mesh: DeviceMesh) -> DTensor:
    return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim, run_check=False)


def logprobs_of_dtensor(logits: DTensor, target: Any, temperature: float, return_entropy: bool,
                        ignore_index: int):
    """ops.vocab_parallel_logprobs on PyTorch DTensor logits sharded along their last dim (the
    layout rules of loss_parallel(), in or outside it): replicated DTensors out, the gradient
    back to the logits' shards through to_local()."""
    op = "vocab_parallel_logprobs"
    options = active_options() or LossParallelOptions()
    cs = _resolve(logits, logits.ndim - 1, op, options)
    mesh = cs.logits.device_mesh
    local_target = _replicated_local(target, "target", op, mesh)
    out = ops.vocab_parallel_logprobs(cs.logits.to_local(), local_target, cs.group_name, temperature=temperature,
                                      return_entropy=return_entropy, ignore_index=ignore_index,
                                      vocab_size=cs.vocab_size)
    if return_entropy:
        return _replicated_result(out[0], mesh), _replicated_result(out[1], mesh)
    return _replicated_result(out, mesh)


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
        if not options.effective_strict() and parallelism_config().loss_parallel_fallback_on_layout_error:
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
    return _replicated_result(out, mesh)


# --- the handlers -----------------------------------------------------------------------------


_CROSS_ENTROPY = inspect.signature(F.cross_entropy)
_NLL_LOSS = inspect.signature(F.nll_loss)


def _cross_entropy(options: LossParallelOptions, args, kwargs):
    a = _CROSS_ENTROPY.bind(*args, **kwargs).arguments
    logits, target, weight = a["input"], a["target"], a.get("weight")
    op = "cross_entropy"
    class_dim = 1 if logits.ndim >= 2 else 0
    if not _is_class_sharded(logits, class_dim) and not options.effective_strict():
        _warn_once("unsharded", f"loss_parallel (strict=False): logits are not sharded along the class dim "
                                f"({_describe(logits) if isinstance(logits, DTensor) else 'plain tensor'}); "
                                f"computing cross_entropy the ordinary way")
        return NotImplemented
    cs = _resolve_or_fallback(logits, class_dim, op, options)
    if cs is None:
        return _gathered(F.cross_entropy, logits.device_mesh, args, kwargs)
    mesh = cs.logits.device_mesh
    reduction = _legacy_reduction(a.get("size_average"), a.get("reduce"), a.get("reduction", "mean"))
    if target.is_floating_point():
        target_local = _probability_target_local(target, cs, op)
    else:
        target_local = _replicated_local(target, "target", op, mesh)
    weight_local = None if weight is None else _replicated_local(weight, "class weight", op, mesh)
    args = (cs.group_name, cs.vocab_size, class_dim, int(a.get("ignore_index", -100)),
            ops.reduction_code(reduction, op), float(a.get("label_smoothing", 0.0)), options.z_loss_weight,
            options.logit_softcap)
    local = cs.logits.to_local()
    if options.gradient_in_forward and torch.is_grad_enabled() and cs.logits.grad_fn is not None:
        # Not for leaves: their values are the caller's, and their .grad would alias them.
        loss = _CrossEntropyGradientInForward.apply(local, target_local, weight_local, *args, [cs.logits])
    else:
        loss, *_ = ops._cross_entropy(local, target_local, weight_local, *args)
    return _replicated_result(loss, mesh)


class _CrossEntropyGradientInForward(torch.autograd.Function):
    """cross_entropy that writes its gradient over the logits' local piece in forward."""

    @staticmethod
    def forward(ctx, local, target, weight, group_name, vocab_size, class_dim, ignore_index, reduction, smoothing,
                z, cap, owner):
        # owner: [the DTensor whose local piece `local` is]. A DTensor has a version counter of
        # its own, which autograd checks for its saved users and which in-place DTensor ops bump
        # (not the local piece's): both are bumped here and both checked in backward.
        loss, row_max, log_sum, row_weight, grad_rows = _C.cross_entropy_forward(
            local, class_dim, target, weight, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap,
            True)
        ctx.args = (class_dim, group_name, vocab_size, ignore_index, reduction, smoothing, z, cap)
        ctx.written = grad_rows.numel() > 0
        if ctx.written:
            # The logits now hold the gradient: any other saved user of them must raise.
            (dtensor,) = owner
            for t in (local, dtensor):
                torch.autograd.graph.increment_version(t)
            ctx.local, ctx.dtensor, ctx.grad_rows = local, dtensor, grad_rows
            ctx.versions = (local._version, dtensor._version)
        else:  # not written (rows without a unit class stride, or no classes here): as without it
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
        return (grad,) + (None,) * 11


def _reject_cross_entropy_only_options(options: LossParallelOptions, op: str) -> None:
    if options.z_loss_weight != 0 or options.logit_softcap != 0:
        raise LossParallelUnsupportedError(
            f"{op} under loss_parallel(z_loss_weight={options.z_loss_weight}, logit_softcap={options.logit_softcap})"
            f": those options apply to cross_entropy only; {op} would silently ignore them")


def _settle_cross_entropy_only_options(options: LossParallelOptions, op: str, forward) -> None:
    """log_softmax and nll_loss refuse z-loss and soft-cap, on every rank alike: ``forward(z, cap)``
    runs the op's C++ forward with them in the call's record, which names a context that differs
    between ranks on all of them and otherwise refuses the options on all of them."""
    if options.z_loss_weight == 0 and options.logit_softcap == 0:
        return
    forward(options.z_loss_weight, options.logit_softcap)
    _reject_cross_entropy_only_options(options, op)  # reached only where the C++ guard is off


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
    _settle_cross_entropy_only_options(
        options, op, lambda z, cap: _C.log_softmax(local, dim, cs.group_name, cs.vocab_size, None, z, cap))
    out = ops._log_softmax(local, dim, cs.group_name, cs.vocab_size)
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
    mesh = cs.logits.device_mesh
    if target.is_floating_point():
        raise LossParallelUnsupportedError("nll_loss under loss_parallel: expected class-index targets (as "
                                           "F.nll_loss), got floating-point ones")
    reduction = _legacy_reduction(a.get("size_average"), a.get("reduce"), a.get("reduction", "mean"))
    target_local = _replicated_local(target, "target", op, mesh)
    weight_local = None if weight is None else _replicated_local(weight, "class weight", op, mesh)
    local = cs.logits.to_local()
    code, ignore_index = ops.reduction_code(reduction, op), int(a.get("ignore_index", -100))
    _settle_cross_entropy_only_options(options, op, lambda z, cap: _C.nll_loss_forward(
        local, class_dim, target_local, weight_local, code, ignore_index, cs.group_name, cs.vocab_size, z, cap))
    out, _ = ops._nll_loss(local, target_local, weight_local, class_dim, code, ignore_index, cs.group_name,
                           cs.vocab_size)
    return _replicated_result(out, mesh)


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
            if _extra_names and getattr(func, "__name__", "") in _extra_names and _active.get() is not None \
                    and _first_class_sharded(args, kwargs) is not None:
                raise LossParallelUnsupportedError(
                    f"loss_parallel: '{func.__name__}' is in the loss_parallel op names but has no loss_parallel "
                    f"kernel")
            return func(*args, **kwargs)
        state = _active.get()
        if state is not None and not _is_foreign(args, kwargs):
            result = route(state.options, args, kwargs, func)
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
