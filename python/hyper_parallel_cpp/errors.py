"""The loss_parallel errors: the C++ library's exceptions as Python classes.

``LossParallelLayoutError`` (a ``ValueError``): the logits, target or weight do not have the
layout loss_parallel needs; the message names the layout expected and the one found.
``LossParallelUnsupportedError`` (a ``NotImplementedError``): a combination loss_parallel
does not support. Errors raised by the kernels are the same on every rank of the group.
"""

from ._extension import _C

LossParallelLayoutError = _C.LossParallelLayoutError
LossParallelUnsupportedError = _C.LossParallelUnsupportedError

__all__ = ["LossParallelLayoutError", "LossParallelUnsupportedError"]
