"""The loss_parallel errors of the MindSpore front end.

The same names and bases as the torch front end's (``hyper_parallel_cpp.errors``, which come
from the LibTorch extension and so need torch): ``LossParallelLayoutError`` (a ``ValueError``:
the logits, target or weight do not have the layout the loss needs; the message names the one
expected and the one found) and ``LossParallelUnsupportedError`` (a ``NotImplementedError``).
``KernelError`` (a ``RuntimeError``) carries a check of the C kernels (a target outside the
classes, a weight of the wrong length ...), with its status code; the check runs on the
gathered statistics, so every rank of the group raises it with the same message.
"""


class LossParallelLayoutError(ValueError):
    """The inputs do not have the layout a vocabulary-parallel loss needs."""


class LossParallelUnsupportedError(NotImplementedError):
    """A combination the vocabulary-parallel loss does not support."""


class KernelError(RuntimeError):
    """A check of the C kernels failed; ``code`` is its hpk_status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


__all__ = ["KernelError", "LossParallelLayoutError", "LossParallelUnsupportedError"]
