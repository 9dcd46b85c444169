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
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

from ..loss_parallel import register_foreign_dtensor
from .hyperparallel_route import route_class

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
        route = route_class(hp.DistributedOp)
        for name in ROUTED_NAMES:
            route(name)  # DistributedOp.__init__ registers it under `name`
            hp.dispatcher.layout_infer_ops[name] = {"distributed_op_class": route.__name__,
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


__all__ = ["HyperParallelPlatformError", "PLATFORM_VARIABLE", "ROUTED_NAMES", "install", "is_installed"]
