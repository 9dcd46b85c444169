"""Loads hyper_parallel_cpp._C, the C++ library's bindings, with an error that says what to do.

_C links the C++ library of one torch version, whose symbols change between versions: under
another torch its load fails on an undefined symbol, naming neither version. So the torch the
build recorded (_build_info.py, written by python/CMakeLists.txt) is compared with the one found
here before _C is loaded.
"""

from typing import Optional

import torch  # LibTorch must be loaded before the module that links it


def _release(version: str) -> str:
    # "2.15.0+cu132" -> "2.15.0": builds of one release (+cpu, +cu132) differ in the libraries
    # beside LibTorch; that is left to the load, whose error then names both versions.
    return version.split("+", 1)[0]


def torch_version_mismatch(built_for: str, found: str) -> Optional[str]:
    """The ImportError message when a module built for torch `built_for` cannot load under torch
    `found` (a different release), else None."""
    if _release(built_for) == _release(found):
        return None
    return (f"hyper_parallel_cpp was built for torch {built_for}, but this environment has torch {found}: its "
            f"extension module hyper_parallel_cpp._C links the C++ library of the torch it was built against, "
            f"whose symbols change between releases. Reinstall hyper_parallel_cpp against this torch (pip install . "
            f"in a clone, or a wheel built for torch {_release(found)}), or install torch=={_release(built_for)}")


def _built_for() -> Optional[str]:
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:  # the source folder, never built: _C is not there either
        return None
    return TORCH_VERSION


BUILT_FOR_TORCH = _built_for()
_mismatch = None if BUILT_FOR_TORCH is None else torch_version_mismatch(BUILT_FOR_TORCH, str(torch.__version__))
if _mismatch is not None:
    raise ImportError(_mismatch)

try:
    from . import _C  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    built = f"built for torch {BUILT_FOR_TORCH}" if BUILT_FOR_TORCH else "built for one torch version"
    raise ImportError(
        "hyper_parallel_cpp: its extension module hyper_parallel_cpp._C did not load "
        f"({e}). It is {built}, and this environment has torch {torch.__version__}: reinstall "
        "hyper_parallel_cpp (pip install . in a clone) into this environment, or use the build tree's package "
        "(PYTHONPATH=<build>/python) with the torch it was built against."
    ) from e

__all__ = ["BUILT_FOR_TORCH", "_C", "torch_version_mismatch"]
