"""hyper_parallel_cpp.mindspore: the vocabulary-parallel cross-entropy for MindSpore (docs/mindspore.md).

- ``vocab_parallel_cross_entropy(local_logits, target, group, ...)`` and the Cell
  ``VocabParallelCrossEntropy``: cross-entropy of class-sharded logits, exact vs one process;
  one AllGather forward, no collective backward (the Cell's bprop). On CPU the C kernels
  (libhyper_parallel_kernels) run as AOT custom ops; elsewhere MindSpore's own ops.
- ``loss_parallel()``: routes ``ops.cross_entropy``, ``mint.nn.functional.cross_entropy``,
  ``nn.CrossEntropyLoss`` and ``mint.nn.CrossEntropyLoss`` on HyperParallel's MindSpore DTensor
  sharded on the class dim to it.

Imports without torch, and needs MindSpore (``pip install hyper-parallel-cpp[mindspore]``).
"""

from .cross_entropy import VocabParallelCrossEntropy, vocab_parallel_cross_entropy
from .errors import KernelError, LossParallelLayoutError, LossParallelUnsupportedError
from .loss_parallel import is_loss_parallel_active, loss_parallel
from .native_library import last_kernel_error

__all__ = [
    "KernelError",
    "LossParallelLayoutError",
    "LossParallelUnsupportedError",
    "VocabParallelCrossEntropy",
    "is_loss_parallel_active",
    "last_kernel_error",
    "loss_parallel",
    "vocab_parallel_cross_entropy",
]
