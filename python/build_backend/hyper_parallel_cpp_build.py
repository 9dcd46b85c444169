"""The PEP 517 backend of pyproject.toml: scikit-build-core, pointed at the installing
environment's torch.

pip builds in an isolated environment that hides the target environment's packages (it
puts a sitecustomize on PYTHONPATH that removes them). The interpreter is still the target
environment's, so torch is looked up by running it with that isolation undone. With
--no-build-isolation torch is importable directly. HYPER_PARALLEL_TORCH_PYTHON names
another interpreter to ask (e.g. for `python -m build`, whose isolated environment has an
interpreter of its own).
"""

import os
import subprocess
import sys

from scikit_build_core import build as _backend

_QUERY = "import sys, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(sys.executable)"


def _torch_of(python, env):
    r = subprocess.run([python, "-c", _QUERY], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    prefix, version, executable = r.stdout.strip().splitlines()[-3:]
    return prefix, version, executable


def _find_torch():
    explicit = os.environ.get("HYPER_PARALLEL_TORCH_PYTHON")
    if explicit:
        found = _torch_of(explicit, os.environ)
        if not found:
            raise RuntimeError(f"hyper_parallel_cpp: HYPER_PARALLEL_TORCH_PYTHON={explicit} cannot import torch")
        return found
    found = _torch_of(sys.executable, os.environ)
    if found:
        return found
    unisolated = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    found = _torch_of(sys.executable, unisolated)
    if found:
        return found
    raise RuntimeError(
        "hyper_parallel_cpp builds against the torch of the environment it is installed into, and "
        f"{sys.executable} has none: install torch first (pip install torch), or name a Python that "
        "has it with HYPER_PARALLEL_TORCH_PYTHON, or build with pip install --no-build-isolation .")


def _settings(config_settings):
    prefix, version, python = _find_torch()
    settings = dict(config_settings or {})
    settings.setdefault("cmake.define.CMAKE_PREFIX_PATH", prefix)
    settings.setdefault("cmake.define.HP_PYTHON", python)
    print(f"hyper_parallel_cpp: building against torch {version} ({prefix})", file=sys.stderr)
    # Compiles from a clone hit the clone's ccache entries (scripts/common.sh sets the same).
    os.environ.setdefault("CCACHE_BASEDIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ.setdefault("CCACHE_NOHASHDIR", "1")
    return settings


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend.build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend.build_editable(wheel_directory, _settings(config_settings), metadata_directory)


get_requires_for_build_wheel = _backend.get_requires_for_build_wheel
get_requires_for_build_sdist = _backend.get_requires_for_build_sdist
get_requires_for_build_editable = _backend.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _backend.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _backend.prepare_metadata_for_build_editable
build_sdist = _backend.build_sdist
