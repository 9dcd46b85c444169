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
same ones, nests), and any order of exits restores it (loss_parallel_state.py). Backward needs
no context: the gradients are the kernels' own autograd formulas (eager_kernels.py). Where the
classes live is decided by class_layout.py and acted on by torch_dtensor_layout.py; the handlers
are torch_dtensor_route.py's; this module holds the context and the mode.
"""

import contextlib
import threading
from typing import Iterator, Optional

from torch.distributed.tensor import DeviceMesh, DTensor, Shard
from torch._C import _len_torch_function_stack, _pop_torch_function_stack, _push_on_torch_function_stack
from torch.overrides import TorchFunctionMode

from .config import parallelism_config
from .errors import LossParallelLayoutError, LossParallelUnsupportedError, warn_once
from .loss_parallel_state import Entry, LossParallelOptions, active_entries, is_loss_parallel_active
from .torch_dtensor_route import ROUTES


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


def _is_foreign(args, kwargs) -> bool:
    return bool(_foreign_dtensor_types) and any(
        isinstance(v, _foreign_dtensor_types) for v in list(args) + list(kwargs.values()))


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
        warn_once("disabled", "loss_parallel(): ParallelismConfig.disable_loss_parallel is set, so this "
                               "context activates nothing (the model should produce replicated logits)")
        yield
        return
    options = LossParallelOptions(mesh, strict, float(z_loss_weight), float(logit_softcap), gradient_in_forward)
    outer = active_entries.get()
    if outer and options != LossParallelOptions() and options != outer[0].options:
        raise LossParallelLayoutError(
            f"loss_parallel: a nested context's options ({options}) contradict the enclosing one's "
            f"({outer[0].options}); nest with no options or the same ones")
    entry = Entry(options if not outer else outer[0].options)
    active_entries.set(outer + (entry,))
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
        active_entries.set(tuple(e for e in active_entries.get() if e is not entry))


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
        route = ROUTES.get(func)
        if route is None:
            if _extra_names and getattr(func, "__name__", "") in _extra_names and active_entries.get() \
                    and _first_class_sharded(args, kwargs) is not None:
                raise LossParallelUnsupportedError(
                    f"loss_parallel: '{func.__name__}' is in the loss_parallel op names but has no loss_parallel "
                    f"kernel")
            return func(*args, **kwargs)
        entries = active_entries.get()
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
