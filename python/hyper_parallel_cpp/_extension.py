"""Loads hyper_parallel_cpp._C, the C++ library's bindings, with an error that says what to do."""

import torch  # noqa: F401  (LibTorch must be loaded before the module that links it)

try:
    from . import _C  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "hyper_parallel_cpp: its extension module hyper_parallel_cpp._C did not load "
        f"({e}). It is built for one torch version: reinstall hyper_parallel_cpp "
        "(pip install . in a clone) into this environment, or use the build tree's package "
        "(PYTHONPATH=<build>/python) with the torch it was built against "
        f"(this one is torch {torch.__version__})."
    ) from e

__all__ = ["_C"]
