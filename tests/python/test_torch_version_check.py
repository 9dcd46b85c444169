"""The package under another torch than the one it was built for: an ImportError naming both
versions, raised before _C is loaded (whose load would fail on an undefined symbol naming neither)."""

import os
import subprocess
import sys
import textwrap

import torch

from hyper_parallel_cpp import _extension


def test_the_build_recorded_the_torch_it_was_built_against():
    assert _extension.BUILT_FOR_TORCH == str(torch.__version__), _extension.BUILT_FOR_TORCH


def test_another_release_names_both_versions():
    message = _extension.torch_version_mismatch("2.14.1+cpu", "2.15.0+cu132")
    assert message is not None
    assert "built for torch 2.14.1+cpu" in message and "has torch 2.15.0+cu132" in message, message
    assert "torch==2.14.1" in message, message


def test_the_same_release_built_for_another_device_is_left_to_the_load():
    assert _extension.torch_version_mismatch("2.15.0+cpu", "2.15.0+cu132") is None
    assert _extension.torch_version_mismatch("2.15.0", "2.15.0") is None


def test_import_under_another_torch_refuses_before_loading_the_module():
    # The build's record as a wheel built for another torch would hold it.
    script = textwrap.dedent("""
        import sys, types
        record = types.ModuleType("hyper_parallel_cpp._build_info")
        record.TORCH_VERSION = "1.13.1+cpu"
        sys.modules[record.__name__] = record
        try:
            import hyper_parallel_cpp
        except ImportError as e:
            print("refused:", e)
        print("_C loaded:", "hyper_parallel_cpp._C" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), capture_output=True, text=True,
                       timeout=120)
    assert "refused: hyper_parallel_cpp was built for torch 1.13.1+cpu" in r.stdout, r.stdout + r.stderr
    assert f"this environment has torch {torch.__version__}" in r.stdout, r.stdout
    assert "_C loaded: False" in r.stdout, r.stdout
