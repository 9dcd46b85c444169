"""get_train_context: the TrainContext protocol of TorchTitan up to 0.2.2, entering our loss_parallel.

TorchTitan 0.3 has no train context that enters loss_parallel(): integrations.torchtitan serves it.
"""

import contextlib
from typing import Callable, ContextManager, Iterator, Optional

from .config import parallelism_config
from .loss_parallel import loss_parallel

TrainContext = Callable[..., ContextManager[None]]


def get_train_context(enable_loss_parallel: bool) -> TrainContext:
    """A callable whose every call is a ``with`` target for one step's forward and backward
    (and the validator's forward): loss_parallel() when ``enable_loss_parallel`` and
    ParallelismConfig.disable_loss_parallel is not set, nothing otherwise. As TorchTitan's did,
    it takes an optional context of its own (context parallelism) to enter inside it.

    The trainer's ``enable_loss_parallel`` is ``tp_enabled and not disable_loss_parallel``.
    """
    enabled = bool(enable_loss_parallel)

    @contextlib.contextmanager
    def context(cp_context: Optional[ContextManager] = None) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if enabled and not parallelism_config().disable_loss_parallel:
                stack.enter_context(loss_parallel())
            if cp_context is not None:
                stack.enter_context(cp_context)
            yield

    return context


__all__ = ["TrainContext", "get_train_context"]
