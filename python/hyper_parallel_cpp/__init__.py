"""hyper_parallel_cpp: HyperParallel C++'s vocabulary-parallel losses for PyTorch.

- ``loss_parallel()``: a drop-in for ``torch.distributed.tensor.parallel.loss_parallel`` on
  PyTorch's DTensor, exact for every option of ``F.cross_entropy`` (docs/python.md).
- ``vocab_parallel_cross_entropy`` and friends: the same kernels on plain local tensors and a
  process group, as ``torch.library`` ops that ``torch.compile`` traces.
- ``hyper_parallel_cpp.mindspore``: the same losses for MindSpore (docs/mindspore.md); it
  imports without torch.

The torch API below loads with torch. Where torch cannot be imported, the package still
imports (for its MindSpore front end) and each torch name raises an ImportError naming torch.
"""

try:
    import torch as _torch  # noqa: F401  (the torch API needs it; the MindSpore front end does not)
except ImportError as _error:  # no torch: only hyper_parallel_cpp.mindspore is usable
    _TORCH_IMPORT_ERROR = _error
else:
    _TORCH_IMPORT_ERROR = None
    del _torch
    from .config import ParallelismConfig, parallelism_config, set_parallelism_config
    from .errors import LossParallelLayoutError, LossParallelUnsupportedError
    from .loss_parallel import (
        LossParallelOptions,
        is_loss_parallel_active,
        loss_parallel,
        loss_parallel_op_names,
        register_loss_parallel_op_names,
    )
    from .ops import (fused_linear_cross_entropy, fused_linear_logprobs, vocab_parallel_cross_entropy,
                      vocab_parallel_log_softmax, vocab_parallel_logprobs, vocab_parallel_nll_loss)
    from .train_context import TrainContext, get_train_context

__all__ = [
    "LossParallelLayoutError",
    "LossParallelOptions",
    "LossParallelUnsupportedError",
    "ParallelismConfig",
    "TrainContext",
    "fused_linear_cross_entropy",
    "fused_linear_logprobs",
    "get_train_context",
    "is_loss_parallel_active",
    "loss_parallel",
    "loss_parallel_op_names",
    "parallelism_config",
    "register_loss_parallel_op_names",
    "set_parallelism_config",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_log_softmax",
    "vocab_parallel_logprobs",
    "vocab_parallel_nll_loss",
]


def __getattr__(name):
    # Reached only for names not defined above: the torch API when torch did not import.
    if _TORCH_IMPORT_ERROR is not None and name in __all__:
        raise ImportError(f"hyper_parallel_cpp.{name} needs torch, which could not be imported "
                          f"({_TORCH_IMPORT_ERROR}); without torch only hyper_parallel_cpp.mindspore is "
                          f"available") from _TORCH_IMPORT_ERROR
    raise AttributeError(f"module 'hyper_parallel_cpp' has no attribute {name!r}")
