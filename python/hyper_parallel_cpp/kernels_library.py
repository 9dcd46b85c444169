"""libhyper_parallel_kernels (include/hyper_parallel_kernels/loss_kernels.h) through ctypes: where
the package's native libraries lie, the kernels library loaded once, and its error struct.

Needs neither torch nor MindSpore, and imports nothing of the package: the MindSpore front end and
the class-axis decision (class_layout.py) load it through the package, the torch-free test of the C
interface (tests/python/test_kernels_c_api.py) by its file path.
"""

import ctypes
import functools
import os
import sys

KERNELS_LIBRARY_NAME = "libhyper_parallel_kernels.so"
HPK_MESSAGE_SIZE = 512


class Error(ctypes.Structure):
    """hpk_error: the status code and a NUL-terminated message."""
    _fields_ = [("code", ctypes.c_int32), ("message", ctypes.c_char * HPK_MESSAGE_SIZE)]


def package_library_path(name: str, override_variable: str = "") -> str:
    """The path of the package's native library `name`: $override_variable where set, else beside
    this file (the installed package, the build tree's build/python/hyper_parallel_cpp/), else in
    the first hyper_parallel_cpp folder on sys.path holding it (a source tree ahead of the build's)."""
    override = os.environ.get(override_variable) if override_variable else None
    if override:
        candidates = [override]
    else:
        candidates = [os.path.join(os.path.dirname(os.path.abspath(__file__)), name)]
        candidates += [os.path.join(entry or ".", "hyper_parallel_cpp", name) for entry in sys.path]
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    where = candidates[0] if override else "the package folder nor any hyper_parallel_cpp folder on sys.path"
    raise ImportError(f"hyper_parallel_cpp needs {name} (built with the package: the build tree's "
                      f"build/python/hyper_parallel_cpp/, or the installed package folder); it is not in {where}")


def kernels_library_path() -> str:
    """libhyper_parallel_kernels' path (HYPER_PARALLEL_CPP_KERNELS overrides it)."""
    return package_library_path(KERNELS_LIBRARY_NAME, "HYPER_PARALLEL_CPP_KERNELS")


@functools.lru_cache(maxsize=None)
def kernels_library() -> ctypes.CDLL:
    """The library, loaded once per process; its exported functions return an int32 status unless
    declared otherwise here."""
    library = ctypes.CDLL(kernels_library_path())
    library.hpk_version.restype = ctypes.c_char_p
    library.hpk_capability.restype = ctypes.c_char_p
    for name in ("hpk_cross_entropy_stats", "hpk_cross_entropy_combine", "hpk_cross_entropy_backward",
                 "hpk_resolve_class_axis", "hpk_class_axis_mean"):
        getattr(library, name).restype = ctypes.c_int32
    library.hpk_class_axis_expected.restype = ctypes.c_int64
    return library


__all__ = ["Error", "HPK_MESSAGE_SIZE", "KERNELS_LIBRARY_NAME", "kernels_library", "kernels_library_path",
           "package_library_path"]
