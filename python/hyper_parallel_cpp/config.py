"""ParallelismConfig: the process-wide loss_parallel flags (the C++ library's, shared).

Precedence (the config is the root; ``loss_parallel(strict=...)`` overrides it):

- ``disable_loss_parallel``: ``loss_parallel()`` activates nothing (a warning once) and
  ``get_train_context(True)`` enters nothing; the model should then produce replicated logits.
- ``loss_parallel_strict_mesh``: what ``loss_parallel(strict=None)`` uses (default True).
- ``loss_parallel_fallback_on_layout_error``: inside the context, logits whose layout
  loss_parallel cannot take under ``strict=False`` are all-gathered with a warning (PyTorch's
  DTensor computes the loss) instead of raising ``LossParallelLayoutError``.
"""

from dataclasses import dataclass

from ._extension import _C


@dataclass(frozen=True)
class ParallelismConfig:
    disable_loss_parallel: bool = False
    loss_parallel_strict_mesh: bool = True
    loss_parallel_fallback_on_layout_error: bool = False


def parallelism_config() -> ParallelismConfig:
    """The configuration in force (process-wide, shared with the C++ library)."""
    return ParallelismConfig(*_C.parallelism_config())


def set_parallelism_config(config: ParallelismConfig) -> None:
    """Sets the process-wide configuration (the C++ Trainer's TOML [parallelism] fields)."""
    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"set_parallelism_config: expected a ParallelismConfig, got {type(config).__name__}")
    _C.set_parallelism_config(
        bool(config.disable_loss_parallel),
        bool(config.loss_parallel_strict_mesh),
        bool(config.loss_parallel_fallback_on_layout_error),
    )


__all__ = ["ParallelismConfig", "parallelism_config", "set_parallelism_config"]
