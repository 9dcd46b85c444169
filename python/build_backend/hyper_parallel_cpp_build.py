"""The PEP 517 backend of pyproject.toml: scikit-build-core, pointed at the installing
environment's torch.

pip builds in an isolated environment that hides the target environment's packages (it
puts a sitecustomize on PYTHONPATH that removes them). The interpreter is still the target
environment's, so torch is looked up by running it with that isolation undone. With
--no-build-isolation torch is importable directly. HYPER_PARALLEL_TORCH_PYTHON names
another interpreter to ask (e.g. for `python -m build`, whose isolated environment has an
interpreter of its own).
"""

import base64
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from scikit_build_core import build as _backend

_QUERY = "import sys, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(sys.executable)"


def _torch_of(python, env):
    r = subprocess.run([python, "-c", _QUERY], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    prefix, version, executable = r.stdout.strip().splitlines()[-3:]
    return prefix, version, executable


@functools.lru_cache(maxsize=None)  # one question per build, however many hooks ask
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


# --- the torch requirement -----------------------------------------------------------------------
# The module links the C++ library of the torch it is built against, so the wheel requires that
# release (torch==2.15.0: any local build of it, +cpu or +cu132, satisfies it). Known only at
# build time, so it is added to the metadata the backend writes (prepare_metadata_* and the
# wheel itself alike: pip compares the two), not listed in pyproject.toml.


def torch_requirement(torch_version):
    return "torch==" + torch_version.split("+", 1)[0]


def _with_requirement(metadata, requirement):
    """METADATA text with `Requires-Dist: <requirement>` among its headers (once)."""
    headers, blank, body = metadata.partition("\n\n")
    lines = headers.splitlines()
    if any(line.startswith("Requires-Dist: torch") for line in lines):
        return metadata
    return "\n".join(lines + ["Requires-Dist: " + requirement]) + (blank + body if blank else "\n")


def _add_to_metadata_directory(path, requirement):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(_with_requirement(text, requirement))


def _record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _add_to_wheel(wheel, requirement):
    """Rewrites the wheel's METADATA and its RECORD line (hash and size)."""
    with zipfile.ZipFile(wheel) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    metadata_name = next(i.filename for i, _ in entries if i.filename.endswith(".dist-info/METADATA"))
    record_name = metadata_name[:-len("METADATA")] + "RECORD"
    fd, temporary = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(wheel))
    os.close(fd)
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as new:
        metadata = None
        for info, data in entries:
            if info.filename == metadata_name:
                data = metadata = _with_requirement(data.decode("utf-8"), requirement).encode("utf-8")
            elif info.filename == record_name:
                ours = f"{metadata_name},{_record_hash(metadata)},{len(metadata)}"
                lines = [ours if line.startswith(metadata_name + ",") else line
                         for line in data.decode("utf-8").splitlines()]
                data = ("\n".join(lines) + "\n").encode("utf-8")
            new.writestr(info, data)
    shutil.move(temporary, wheel)


def _find_requirement():
    return torch_requirement(_find_torch()[1])


# scikit-build-core compares the metadata it writes with a prepared metadata_directory (which
# holds the requirement): it is given none, and the wheel gets the same requirement afterwards.
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _backend.build_wheel(wheel_directory, _settings(config_settings), None)
    _add_to_wheel(os.path.join(wheel_directory, name), _find_requirement())
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _backend.build_editable(wheel_directory, _settings(config_settings), None)
    _add_to_wheel(os.path.join(wheel_directory, name), _find_requirement())
    return name


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    name = _backend.prepare_metadata_for_build_wheel(metadata_directory, config_settings)
    _add_to_metadata_directory(os.path.join(metadata_directory, name, "METADATA"), _find_requirement())
    return name


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    name = _backend.prepare_metadata_for_build_editable(metadata_directory, config_settings)
    _add_to_metadata_directory(os.path.join(metadata_directory, name, "METADATA"), _find_requirement())
    return name


get_requires_for_build_wheel = _backend.get_requires_for_build_wheel
get_requires_for_build_sdist = _backend.get_requires_for_build_sdist
get_requires_for_build_editable = _backend.get_requires_for_build_editable
build_sdist = _backend.build_sdist  # a source distribution is built later against whatever torch is there
