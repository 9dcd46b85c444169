"""Where the MindSpore AOT adapters live, and the message of their last failure.

``libhyper_parallel_mindspore_aot.so`` (python/csrc/mindspore_aot_ops.c) sits in the package
folder beside ``libhyper_parallel_kernels.so``, the framework-free kernels it calls. An AOT op
returns only an int to MindSpore, which raises "Return value from CPU AOT kernel ... is N": the
adapter keeps the message, and ``kernel_error_from`` turns such a RuntimeError into ours.
"""

import ctypes
import functools
import re
from typing import Optional

from ..kernels_library import package_library_path
from .errors import KernelError

AOT_LIBRARY_NAME = "libhyper_parallel_mindspore_aot.so"
_AOT_FAILURE = re.compile(r"AOT kernel\(.*" + re.escape(AOT_LIBRARY_NAME) + r"\)'s function\((hpms_\w+)\) is (-?\d+)")


def aot_library_path() -> str:
    """The adapters' path (HYPER_PARALLEL_CPP_MINDSPORE_AOT overrides it), found as the package finds
    libhyper_parallel_kernels (kernels_library.py)."""
    try:
        return package_library_path(AOT_LIBRARY_NAME, "HYPER_PARALLEL_CPP_MINDSPORE_AOT")
    except ImportError as error:
        raise ImportError(f"hyper_parallel_cpp.mindspore: {error} (python/CMakeLists.txt, target "
                          f"hyper_parallel_mindspore_aot)") from None


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    library = ctypes.CDLL(aot_library_path())
    library.hpms_last_error.restype = ctypes.c_int32
    library.hpms_last_error.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    library.hpms_header_size.restype = ctypes.c_int32
    return library


def packet_header_size() -> int:
    """Values before the statistics in each rank's packet (status, class range, message)."""
    return int(_library().hpms_header_size())


def last_kernel_error() -> tuple:
    """(code, message) of the adapters' last failure in this process; (0, "") if none."""
    buffer = ctypes.create_string_buffer(1024)
    code = _library().hpms_last_error(buffer, len(buffer))
    return int(code), buffer.value.decode("utf-8", "replace")


def clear_kernel_error() -> None:
    _library().hpms_clear_error()


def kernel_error_from(error: BaseException) -> Optional[KernelError]:
    """Our error for MindSpore's RuntimeError about one of our AOT ops, else None."""
    match = _AOT_FAILURE.search(str(error))
    if match is None:
        return None
    code, message = last_kernel_error()
    return KernelError(message or f"{match.group(1)} failed with status {match.group(2)}", code or int(match.group(2)))
