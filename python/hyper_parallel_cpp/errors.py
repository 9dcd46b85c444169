"""What loss_parallel tells the user: the C++ library's exceptions as Python classes, and its
warnings (each said once per process).

``LossParallelLayoutError`` (a ``ValueError``): the logits, target or weight do not have the
layout loss_parallel needs; the message names the layout expected and the one found.
``LossParallelUnsupportedError`` (a ``NotImplementedError``): a combination loss_parallel
does not support. Errors raised by the kernels are the same on every rank of the group.
"""

import warnings

from ._extension import _C

LossParallelLayoutError = _C.LossParallelLayoutError
LossParallelUnsupportedError = _C.LossParallelUnsupportedError

_warned: set = set()


def warn_once(key: str, message: str) -> None:
    """A UserWarning the first time `key` is seen in this process (a re-layout, a fallback)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, UserWarning, stacklevel=4)


__all__ = ["LossParallelLayoutError", "LossParallelUnsupportedError", "warn_once"]
