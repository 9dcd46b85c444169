"""Which loss_parallel() contexts are open here, and their options: the state every route reads.

The active state is a ``contextvars.ContextVar`` of the open entries, outermost first: local to the
thread and to the context, re-entrant, and any order of exits restores it (loss_parallel.py enters
and exits; the routes and the functional ops only read it).
"""

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from .config import parallelism_config


@dataclass(frozen=True)
class LossParallelOptions:
    mesh: Optional[Any] = None  # a DeviceMesh (PyTorch's, or a registered framework's)
    strict: Optional[bool] = None  # None: ParallelismConfig.loss_parallel_strict_mesh
    z_loss_weight: float = 0.0
    logit_softcap: float = 0.0
    gradient_in_forward: bool = False

    def effective_strict(self) -> bool:
        return parallelism_config().loss_parallel_strict_mesh if self.strict is None else self.strict


class Entry:
    """One entry into loss_parallel(): what its exit removes, whichever entries exit before it."""

    __slots__ = ("options",)

    def __init__(self, options: LossParallelOptions):
        self.options = options


# The entries active in this contextvars context, outermost first. Each exit removes its own
# entry, so any order of exits (generators holding a context across a yield, closed in
# creation order) leaves exactly the entries still open.
active_entries: ContextVar[Tuple[Entry, ...]] = ContextVar("hyper_parallel_cpp.loss_parallel", default=())


def is_loss_parallel_active() -> bool:
    """Whether the calling thread, in its current contextvars context, is inside loss_parallel()."""
    return bool(active_entries.get())


def active_options() -> Optional[LossParallelOptions]:
    """The options of the calling context's loss_parallel(), or None outside it."""
    entries = active_entries.get()
    return entries[0].options if entries else None


__all__ = ["Entry", "LossParallelOptions", "active_entries", "active_options", "is_loss_parallel_active"]
