"""loss_parallel on HyperParallel's own DTensor (mindspore-ai/hyper-parallel), through its dispatcher.

After ``install()``, inside ``hyper_parallel_cpp.loss_parallel()`` (the context that serves PyTorch's
DTensor), ``F.cross_entropy`` / ``nn.CrossEntropyLoss``, ``F.nll_loss`` and ``log_softmax`` on
HyperParallel DTensors sharded along the class dim run our kernels on the local piece, over the
process group of the mesh axis that shards the classes: cross-entropy in two small all-gathers forward
(the call's record, the per-row statistics) and none backward, with every option of the PyTorch path.

How it plugs in (the spec's scheme A, in HyperParallel's terms): its DTensor sends every torch
function to ``OpDispatcher.dispatch``, which looks the function's bare name up in the table its
YAML files fill (``layout_infer_ops``) and in the ``DistributedOp`` registry. ``install()`` adds,
in memory, one ``DistributedOp`` and one table entry per name. The dispatcher caches (output
layout, implementation) per name and input layouts for the life of the process, and its key holds
no context flag: so nothing here decides by the context at inference time. The implementation
returned checks the context, the options and the sizes each time it runs.

Outside the context, class-sharded logits raise ``LossParallelLayoutError`` naming loss_parallel
(or, with ``ParallelismConfig.loss_parallel_fallback_on_layout_error``, are all-gathered with a
warning and the loss computed whole); logits replicated on every mesh axis get the ordinary loss on
every rank, which is exact. Any other layout is an error that names it.
"""

import importlib
import importlib.util
import inspect
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from .. import class_layout, ops
from .._extension import _C
from ..class_layout import REPLICATE, Placement, shard
from ..config import parallelism_config
from ..eager_kernels import LogSoftmax, NllLoss
from ..errors import LossParallelLayoutError, LossParallelUnsupportedError, warn_once
from ..loss_arguments import (CROSS_ENTROPY, NLL_LOSS, check_probability_shape, log_softmax_args, reduction_code,
                              reduction_of, refuse_other_mesh, refuse_unless_replicated,
                              reject_cross_entropy_only_options)
from ..loss_parallel import register_foreign_dtensor
from ..loss_parallel_state import LossParallelOptions, active_options

# The bare names HyperParallel's dispatcher keys F.cross_entropy (and nn.CrossEntropyLoss, which
# calls it), F.nll_loss and every log_softmax spelling by.
ROUTED_NAMES = ("cross_entropy", "nll_loss", "log_softmax")

_lock = threading.Lock()
_installed = False

# HyperParallel picks its framework once, when hyper_parallel is first imported
# (hyper_parallel/platform/platform.py): this variable if it names one, else MindSpore whenever
# mindspore imports, else torch. Our route serves its torch platform only.
PLATFORM_VARIABLE = "HYPER_PARALLEL_PLATFORM"


class HyperParallelPlatformError(RuntimeError):
    """install() found HyperParallel on (or about to pick) a platform other than torch."""


def is_installed() -> bool:
    return _installed


def install() -> None:
    """Routes HyperParallel's dispatcher to our kernels for ROUTED_NAMES. Opt-in and idempotent.

    Raises HyperParallelPlatformError when HyperParallel has selected (or, not yet imported, would
    select) a platform other than torch: set HYPER_PARALLEL_PLATFORM=torch before hyper_parallel is
    first imported. Raises ImportError naming what is missing when HyperParallel is not importable,
    and RuntimeError when this HyperParallel already has a rule of its own for one of the names or
    ships its own loss_parallel (either would decide those calls before or instead of ours)."""
    global _installed
    with _lock:
        if _installed:
            return
        _refuse_another_platform()  # before the import: importing it would load MindSpore
        try:
            import hyper_parallel  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "hyper_parallel_cpp.integrations.hyperparallel.install(): HyperParallel is not importable "
                f"({e}). It is not on PyPI: put a checkout of mindspore-ai/hyper-parallel on PYTHONPATH") from e
        _refuse_another_platform()  # what the import selected decides
        _refuse_own_loss_parallel()
        hp = _HyperParallel.load()
        for name in ROUTED_NAMES:
            if name in hp.dispatcher.layout_infer_ops or hp.get_distributed_op(name) is not None:
                raise RuntimeError(
                    f"hyper_parallel_cpp.integrations.hyperparallel.install(): this HyperParallel already has a "
                    f"rule for '{name}' ({hp.dispatcher.layout_infer_ops.get(name)}); refusing to replace it")
        route_class = _route_class(hp)
        for name in ROUTED_NAMES:
            route_class(name)  # DistributedOp.__init__ registers it under `name`
            hp.dispatcher.layout_infer_ops[name] = {"distributed_op_class": route_class.__name__,
                                                    "distributed_op_module": __name__}
            hp.layout_cache.pop(name, None)
        register_foreign_dtensor(hp.DTensor, hp.DeviceMesh)
        _installed = True


@dataclass
class _HyperParallel:
    """The parts of HyperParallel the route uses, imported on install()."""
    DTensor: type
    DeviceMesh: type
    DistributedOp: type
    dispatcher: Any
    layout_cache: dict
    get_distributed_op: Any

    @staticmethod
    def load() -> "_HyperParallel":
        try:
            from hyper_parallel.core.device_mesh import DeviceMesh
            from hyper_parallel.core.dtensor import DTensor
            from hyper_parallel.core.shard._op_dispatch import _OP_DISPATCHER, LayoutCacheManager
            from hyper_parallel.core.shard.ops.parallel_ops import DistributedOp
            from hyper_parallel.core.shard.ops.parallel_ops_register import get_distributed_op
        except ImportError as e:
            raise ImportError(
                "hyper_parallel_cpp.integrations.hyperparallel.install(): this HyperParallel lacks a part the route "
                f"plugs into ({e}); the route is tested against the tree whose dispatcher is "
                "hyper_parallel.core.shard._op_dispatch") from e
        return _HyperParallel(DTensor, DeviceMesh, DistributedOp, _OP_DISPATCHER,
                              LayoutCacheManager.get_instance().get_layout_cache(), get_distributed_op)


def _selected_platform() -> Optional[type]:
    """The class of the platform HyperParallel selected in this process, or None before it chose."""
    module = sys.modules.get("hyper_parallel.platform.platform")
    chosen = getattr(module, "platform", None) if module is not None else None
    return None if chosen is None else type(chosen)


def _is_torch_platform(cls: type) -> bool:
    return cls.__module__.startswith("hyper_parallel.platform.torch.")


def _refuse_another_platform() -> None:
    """HyperParallelPlatformError unless HyperParallel runs (or, not yet imported, will run) on torch:
    on MindSpore its DTensor holds MindSpore tensors and torch functions never reach its dispatcher."""
    where = "hyper_parallel_cpp.integrations.hyperparallel.install()"
    remedy = (f"Set {PLATFORM_VARIABLE}=torch in the environment before hyper_parallel is first imported (needed "
              f"wherever MindSpore is installed beside torch)")
    selected = _selected_platform()
    if selected is not None:
        if not _is_torch_platform(selected):
            raise HyperParallelPlatformError(
                f"{where}: HyperParallel in this process runs on the platform {selected.__module__}."
                f"{selected.__name__}, not on torch; this route serves its torch platform only. {remedy}")
        return
    chosen = os.environ.get(PLATFORM_VARIABLE)
    if chosen is not None and chosen.lower() == "torch":
        return
    if chosen is not None and chosen.lower() == "mindspore":
        raise HyperParallelPlatformError(
            f"{where}: {PLATFORM_VARIABLE}={chosen} selects HyperParallel's MindSpore platform; this route serves "
            f"its torch platform only. {remedy}")
    try:
        mindspore = importlib.util.find_spec("mindspore")
    except (ImportError, ValueError):
        mindspore = None
    if mindspore is not None:
        unset = "is unset" if chosen is None else f"is {chosen!r}, which HyperParallel does not recognise"
        raise HyperParallelPlatformError(
            f"{where}: mindspore is importable here ({mindspore.origin}) and {PLATFORM_VARIABLE} {unset}, so "
            f"HyperParallel would select its MindSpore platform (it prefers MindSpore whenever it can import it); "
            f"this route serves its torch platform only. {remedy}")


def _refuse_own_loss_parallel() -> None:
    # Detected by what the tree contains, not by a version: newer HyperParallel dispatchers send
    # cross-entropy names to their own kernel inside their own context before any DistributedOp.
    found = []
    try:
        module = importlib.import_module("hyper_parallel.core.tensor_parallel.loss_parallel")
        if hasattr(module, "loss_parallel"):
            found.append("hyper_parallel.core.tensor_parallel.loss_parallel.loss_parallel")
    except ModuleNotFoundError:
        pass
    if found:
        raise RuntimeError(
            "hyper_parallel_cpp.integrations.hyperparallel.install(): this HyperParallel ships its own "
            f"loss_parallel ({', '.join(found)}); its dispatcher decides cross-entropy calls inside its context "
            "before any registered rule, so the two would split the calls between them. Use HyperParallel's "
            "loss_parallel() with this tree, or our route with a HyperParallel tree without its own")


# --- layouts -------------------------------------------------------------------------------------


@dataclass
class _ClassAxis:
    """Where the classes of a HyperParallel DTensor live: the mesh axis that shards them."""
    group_name: str
    size: int  # ranks on the axis
    rank: int  # this rank's piece


def _describe(layout) -> str:
    return f"placements {list(layout.placements)} on a mesh {tuple(layout.mesh.mesh_shape)} " \
           f"{tuple(layout.mesh.mesh_dim_names or ())}"


# The route's capabilities: it cannot re-lay out the logits (HyperParallel's even pieces only, and
# no redistribute of ours), and its loss is replicated, so rows sharded along another axis are refused.
ROUTE = class_layout.Route("a HyperParallel DTensor", relayout=False, rows_sharded=False)


def _neutral(p, ndim: int) -> Placement:
    if p.is_shard():
        return shard(p.dim % ndim)
    if p.is_replicate():
        return REPLICATE
    return Placement("partial" if p.is_partial() else "other")


def _view(layout, ndim: int) -> class_layout.LayoutView:
    mesh = layout.mesh

    def on_mesh(option_mesh, axis: int) -> bool:  # the mesh itself, or the 1-D mesh of the class axis' ranks
        return option_mesh is mesh or (option_mesh.ndim == 1 and list(option_mesh.rank_list) == _axis_ranks(mesh, axis))

    return class_layout.LayoutView(tuple(_neutral(p, ndim) for p in layout.placements), ndim, _describe(layout),
                                   on_mesh)


def _class_axes(layout, class_dim: int, ndim: int) -> List[int]:
    return class_layout.mesh_dims_sharding(_view(layout, ndim).placements, class_dim)


def _all_replicated(layout) -> bool:
    return all(p.is_replicate() for p in layout.placements)


def _class_axis(layout, class_dim: int, ndim: int, op: str, options: LossParallelOptions) -> _ClassAxis:
    """The class axis of logits inside the context (the one resolution, class_layout.resolve), or
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
    return _ClassAxis(group.group_name, mesh.mesh_shape[axis], coordinate)


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


def _on_logits_mesh(layout, x, what: str, op: str) -> None:
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


def _named_layouts(signature: inspect.Signature, layouts, args, kwargs) -> dict:
    """The input layouts by parameter name: the dispatcher lists one per positional argument, then
    one per keyword in order."""
    positions = signature.bind(*range(len(args)), **{k: len(args) + i for i, k in enumerate(kwargs)}).arguments
    return {name: layouts[i] if i < len(layouts) else None for name, i in positions.items()}


def _replicated_value(value, layout, x, what: str, op: str):
    _on_logits_mesh(layout, x, what, op)
    if layout is not None:
        refuse_unless_replicated(_all_replicated(layout), what, op, _describe(layout))
    return value


# --- the route -----------------------------------------------------------------------------------


class _Replicated:
    """An output layout for the dispatcher to wrap a loss with: Replicate on every axis of `mesh`."""

    def __init__(self, mesh, replicate):
        self.mesh = mesh
        self.placements = tuple(replicate() for _ in range(mesh.ndim))


def _route_class(hp: _HyperParallel) -> type:
    from hyper_parallel.core.placement_types import Replicate

    class VocabParallelRoute(hp.DistributedOp):
        """HyperParallel's rule for one of ROUTED_NAMES: our kernels inside loss_parallel()."""

        def infer_layout(self, layouts, extra_args):
            x = layouts[0] if layouts else None
            if x is None:
                return None  # the implementation raises: the logits are not a DTensor
            # A loss is replicated on the logits' mesh; log_softmax keeps its input's layout.
            return x if self.op_name == "log_softmax" else _Replicated(x.mesh, Replicate)

        def get_expand_impl(self, func, output_layout, layouts, extra_args):
            layouts = list(layouts)
            run = {"cross_entropy": _cross_entropy, "nll_loss": _nll_loss, "log_softmax": _log_softmax}[self.op_name]
            return lambda *args, **kwargs: run(func, layouts, args, kwargs)

    return VocabParallelRoute


def _outside_context(func, layouts, args, kwargs, op: str, x, class_dim: int, ndim: int):
    """A call the context does not own: exact whole-tensor arithmetic, or a named error."""
    if x is None:
        raise LossParallelLayoutError(f"{op}: expected the input to be a HyperParallel DTensor, got a plain tensor "
                                      f"beside DTensor arguments")
    if _all_replicated(x) and all(lay is None or _all_replicated(lay) for lay in layouts):
        return func(*args, **kwargs)  # every rank holds everything: the ordinary op is exact
    if any(p.is_partial() for p in x.placements):
        raise LossParallelLayoutError(f"{op} on HyperParallel DTensor input: expected no Partial placement, got "
                                      f"{_describe(x)} (reduce it first)")
    axes = _class_axes(x, class_dim, ndim)
    if axes and active_options() is None:
        # First the record the ranks inside the context send first (one small all-gather, on this
        # refusal or fallback path only): a context entered on some ranks only is then the same
        # named error on every rank, not an error here and a wait in the all-gather there.
        like = next(v for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor))
        _C.agree_outside_loss_parallel("vocab_parallel_" + op, x.mesh.get_group(axes[0]).group_name, like)
        config = parallelism_config()
        if config.loss_parallel_fallback_on_layout_error:
            warn_once("hyperparallel-gather:" + op,
                          f"{op} on class-sharded HyperParallel DTensor logits outside loss_parallel: all-gathering "
                          f"the classes (loss_parallel_fallback_on_layout_error is set)")
            return _gathered(func, layouts, args, kwargs, x, class_dim, ndim)
        raise LossParallelLayoutError(
            f"{op} on HyperParallel DTensor logits sharded along the class dim ({_describe(x)}) outside "
            f"loss_parallel: each rank holds only its piece of the classes. Call it inside `with "
            f"hyper_parallel_cpp.loss_parallel():` (integrations.hyperparallel installed)")
    raise LossParallelLayoutError(f"{op} on HyperParallel DTensor input laid out as {_describe(x)}: no exact rule "
                                  f"for this layout; expected {class_layout.expected_layout(ROUTE, class_dim)} inside "
                                  f"loss_parallel, or every input replicated")


class _GatherClasses(torch.autograd.Function):
    """The whole class dim from every rank's even piece; backward keeps this rank's piece of the
    gradient (the result is replicated, so no collective)."""

    @staticmethod
    def forward(ctx, local, class_dim, axis):
        pieces = [torch.empty_like(local) for _ in range(axis.size)]
        dist.all_gather(pieces, local.contiguous(), group=_group(axis))
        ctx.args = (class_dim, axis.rank * local.shape[class_dim], local.shape[class_dim])
        return torch.cat(pieces, class_dim)

    @staticmethod
    def backward(ctx, grad):
        class_dim, start, length = ctx.args
        return grad.narrow(class_dim, start, length), None, None


def _group(axis: _ClassAxis):
    return torch.distributed.distributed_c10d._resolve_process_group(axis.group_name)


def _gathered(func, layouts, args, kwargs, x, class_dim: int, ndim: int):
    axis = _class_axis(x, class_dim, ndim, getattr(func, "__name__", "loss"), LossParallelOptions(strict=False))

    def whole(value, layout):
        if layout is x or (layout is not None and list(layout.placements) == list(x.placements)):
            return _GatherClasses.apply(value, class_dim, axis)
        return value

    n = len(args)
    args = [whole(a, layouts[i] if i < len(layouts) else None) for i, a in enumerate(args)]
    kwargs = {k: whole(v, layouts[n + i] if n + i < len(layouts) else None) for i, (k, v) in enumerate(kwargs.items())}
    return func(*args, **kwargs)


@dataclass
class _LossCall:
    """A loss call (cross_entropy, nll_loss) the context owns: its arguments by name (local
    values), their layouts by name, and where the classes live."""
    op: str
    arguments: dict
    layouts: dict
    class_dim: int
    axis: _ClassAxis
    options: LossParallelOptions

    def replicated(self, name: str, what: str):
        """The value of a target or class weight, which must be replicated on the logits' mesh."""
        value = self.arguments.get(name)
        if value is None:
            return None
        return _replicated_value(value, self.layouts.get(name), self.layouts["input"], what, self.op)

    @property
    def vocab_size(self) -> int:
        return self.arguments["input"].shape[self.class_dim] * self.axis.size

    @property
    def ignore_index(self) -> int:
        return int(self.arguments.get("ignore_index", -100))

    def reduction_code(self) -> int:
        return reduction_code(reduction_of(self.arguments), self.op)


def _loss_call(op: str, signature: inspect.Signature, func, layouts, args, kwargs):
    """The call's _LossCall, or (outside the context or for logits it does not own) the call's
    result by _outside_context, or the context's named error for the logits' layout."""
    named = _named_layouts(signature, layouts, args, kwargs)
    a = signature.bind(*args, **kwargs).arguments
    ndim = a["input"].dim()
    class_dim = 1 if ndim >= 2 else 0  # where F.cross_entropy / F.nll_loss read the classes
    options = active_options()
    x = named.get("input")
    if options is None or x is None or not _class_axes(x, class_dim, ndim):
        if options is not None and options.effective_strict():
            _class_axis(x, class_dim, ndim, op, options)  # raises the context's error for this layout
        return _outside_context(func, layouts, args, kwargs, op, x, class_dim, ndim)
    return _LossCall(op, a, named, class_dim, _class_axis(x, class_dim, ndim, op, options), options)


def _cross_entropy(func, layouts, args, kwargs):
    call = _loss_call("cross_entropy", CROSS_ENTROPY, func, layouts, args, kwargs)
    if not isinstance(call, _LossCall):
        return call
    if call.options.gradient_in_forward:
        raise LossParallelUnsupportedError("cross_entropy under loss_parallel(gradient_in_forward=True) on "
                                           "HyperParallel's DTensor: not available on this route; leave it off")
    a = call.arguments
    target = _probability_target_local(call) if a["target"].is_floating_point() else call.replicated("target", "target")
    loss, *_ = ops._cross_entropy(
        a["input"], target, call.replicated("weight", "class weight"), call.axis.group_name, call.vocab_size,
        call.class_dim, call.ignore_index, call.reduction_code(), float(a.get("label_smoothing", 0.0)),
        call.options.z_loss_weight, call.options.logit_softcap)
    return loss


def _probability_target_local(call: _LossCall):
    op, target, layout, x = call.op, call.arguments["target"], call.layouts.get("target"), call.layouts["input"]
    _on_logits_mesh(layout, x, "probability target", op)
    if layout is not None and list(layout.placements) == list(x.placements):
        return target  # laid out like the logits: already this rank's classes
    if layout is not None and not _all_replicated(layout):
        raise LossParallelLayoutError(f"{op} under loss_parallel: expected probability targets replicated or laid out "
                                      f"like the logits ({list(x.placements)}), got {_describe(layout)}")
    logits, class_dim = call.arguments["input"], call.class_dim
    whole = list(logits.shape)
    whole[class_dim] = call.vocab_size
    check_probability_shape(target.shape, whole, op)
    local = logits.shape[class_dim]
    return target.narrow(class_dim, call.axis.rank * local, local)


def _nll_loss(func, layouts, args, kwargs):
    call = _loss_call("nll_loss", NLL_LOSS, func, layouts, args, kwargs)
    if not isinstance(call, _LossCall):
        return call
    # A floating-point target is refused by the kernel in the call's record, on every rank; the
    # context's z-loss / soft-cap ride in that record too, refused on every rank alike.
    target = call.replicated("target", "target")
    weight = call.replicated("weight", "class weight")
    out, _ = NllLoss.apply(call.arguments["input"], target, weight, call.class_dim, call.reduction_code(),
                           call.ignore_index, call.axis.group_name, call.vocab_size, call.options.z_loss_weight,
                           call.options.logit_softcap)
    reject_cross_entropy_only_options(call.options, call.op)
    return out


def _log_softmax(func, layouts, args, kwargs):
    op = "log_softmax"
    local, dim, dtype = log_softmax_args(func, args, kwargs)
    x = layouts[0] if layouts else None
    if x is None or dim is None or not isinstance(dim, int):
        raise LossParallelLayoutError(f"{op} on HyperParallel DTensors: expected the input as a DTensor and an "
                                      f"integer dim, got {type(local).__name__} and dim={dim!r}")
    ndim = local.dim()
    dim = dim % max(ndim, 1)
    if any(p.is_partial() for p in x.placements):
        raise LossParallelLayoutError(f"{op} on HyperParallel DTensor input: expected no Partial placement, got "
                                      f"{_describe(x)} (reduce it first)")
    if not _class_axes(x, dim, ndim):
        return func(*args, **kwargs)  # no mesh axis splits `dim`: each rank's rows are whole
    options = active_options()
    if options is None:
        return _outside_context(func, layouts, args, kwargs, op, x, dim, ndim)
    axis = _class_axis(x, dim, ndim, op, options)
    if dtype is not None:
        local = local.to(dtype)
    vocab_size = local.shape[dim] * axis.size
    out = LogSoftmax.apply(local, dim, axis.group_name, vocab_size, options.z_loss_weight, options.logit_softcap)
    reject_cross_entropy_only_options(options, op)
    return out


__all__ = ["HyperParallelPlatformError", "PLATFORM_VARIABLE", "ROUTED_NAMES", "install", "is_installed"]
