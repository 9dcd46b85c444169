#!/usr/bin/env bash
# The wheel: `pip wheel .` builds it against the venv's torch; auditwheel bundles every shared library
# it needs that is not torch's (yaml-cpp from Debian's -dev package, ...), so that installing it needs
# no compiler, CMake or Debian package. Then the checks: nothing in it lands under hyper_parallel/
# (HyperParallel's import name); its metadata requires the torch release it is built for and the
# package records that torch's whole version; it installs with pip into a new environment that sees torch and
# nothing of ours (no build tree, no Debian libraries it would need: ldd finds every library in the
# wheel or in torch); its framework-free kernel library loads there without torch; it imports there
# beside a package named hyper_parallel; a TP 2 loss runs.
#
#   bash scripts/check_wheel.sh [OUT_DIR]     (default: build/wheel)
# Prints the wheel's tag and the build and install times.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out="${1:-$HP_BUILD_DIR/wheel}"
python="$HP_VENV/bin/python"
rm -rf "$out" && mkdir -p "$out/raw" "$out/repaired"

# pip wheel compiles every source of the library and the module again, as a user's `pip install .`
# does. Beside the suite's build tree (the same depth, build type and compilers), its compile lines
# are the suite tree's (ccache writes paths under the clone relative to the tree), so the compiler
# cache serves what that tree compiled; from build/pip/<tag>, pyproject.toml's own folder, each line
# names the sources two folders further up and nothing would be served.
config=()
if [ -f "$HP_BUILD_DIR/CMakeCache.txt" ]; then
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$HP_BUILD_DIR/CMakeCache.txt"; }
  config=(-Cbuild-dir="${HP_BUILD_DIR%/}-wheel" -Ccmake.build-type="$(cached CMAKE_BUILD_TYPE)"
          -Ccmake.define.CMAKE_CXX_COMPILER="$(cached CMAKE_CXX_COMPILER)")
  [ -n "$(cached CMAKE_CUDA_COMPILER)" ] && config+=(-Ccmake.define.CMAKE_CUDA_COMPILER="$(cached CMAKE_CUDA_COMPILER)")
  echo "building beside $HP_BUILD_DIR, as it was configured (${config[*]})"
fi

t0=$(date +%s)
# --no-build-isolation: the venv has scikit-build-core (HP_VENV_REQUIREMENTS); --no-deps: torch is
# not a dependency on purpose (pyproject.toml says why).
"$python" -m pip wheel -q --no-build-isolation --no-deps "${config[@]}" -w "$out/raw" "$HP_ROOT"
t1=$(date +%s)
raw=$(ls "$out"/raw/*.whl)
# torch's own libraries and the CUDA / NCCL / OpenMP libraries torch brings stay torch's: the module
# finds them through its RPATH ($ORIGIN/../torch/lib) and torch's own loading once torch is imported.
excludes=()
for lib in 'libtorch*.so' 'libc10*.so' 'libcu*.so.*' 'libnv*.so.*' 'libnccl*.so.*' 'libgomp*.so.*'; do
  excludes+=(--exclude "$lib")
done
PATH="$HP_VENV/bin:$PATH" "$python" -m auditwheel repair -w "$out/repaired" "${excludes[@]}" "$raw" >"$out/auditwheel.log" 2>&1 ||
  { cat "$out/auditwheel.log"; exit 1; }
wheel=$(ls "$out"/repaired/*.whl)
echo "wheel: $(basename "$wheel") (built in $((t1 - t0)) s)"

"$python" - "$wheel" <<'EOF'
import sys, zipfile
import torch
wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
theirs = [n for n in names if n.split("/")[0] == "hyper_parallel"]
assert not theirs, f"the wheel puts files under hyper_parallel/ (HyperParallel's import name): {theirs[:5]}"
tops = sorted({n.split("/")[0] for n in names})
assert "hyper_parallel_cpp" in tops, tops
print("wheel top-level folders:", ", ".join(tops))
# The torch it is built for: required in the metadata (the release), recorded whole in the package.
metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
headers = metadata.split("\n\n", 1)[0].splitlines()
release = torch.__version__.split("+")[0]
required = [h for h in headers if h.startswith("Requires-Dist: torch")]
assert required == [f"Requires-Dist: torch=={release}"], required
record = wheel.read("hyper_parallel_cpp/_build_info.py").decode()
assert f'TORCH_VERSION = "{torch.__version__}"' in record, record
print(f"the wheel requires torch=={release} and records torch {torch.__version__}")
EOF

# A new environment that sees torch (the venv's site-packages, read through a .pth) and nothing of
# ours: no build tree on its path, and pip installs from the wheel alone. torch brings libgomp too
# (the OpenMP runtime the kernels share with libtorch_cpu, loaded before our module is).
env_dir="$out/fresh"
"$python" -m venv --without-pip "$env_dir"
site=$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_site" >"$site/torch_from_venv.pth"
t2=$(date +%s)
"$python" -m pip install -q --no-deps --no-index --target "$site" "$wheel"
t3=$(date +%s)
echo "installed from the wheel in $((t3 - t2)) s"
if ldd "$site"/hyper_parallel_cpp/*.so "$site"/hyper_parallel_cpp*.libs/*.so* 2>/dev/null |
   grep "not found" | grep -v -E 'libtorch|libc10|libcudart|libnccl|libgomp'; then
  echo "the installed wheel needs a library that neither it nor torch brings"; exit 1
fi

# The framework-free kernels (include/hyper_parallel_kernels/loss_kernels.h) are in the package and
# load without LibTorch: nothing of torch among what they need, loaded with ctypes, torch not imported.
kernels="$site/hyper_parallel_cpp/libhyper_parallel_kernels.so"
if ldd "$kernels" | grep -E 'libtorch|libc10'; then echo "$kernels needs LibTorch"; exit 1; fi
"$env_dir/bin/python" - "$kernels" <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.hpk_version.restype = lib.hpk_capability.restype = ctypes.c_char_p
assert "torch" not in sys.modules
print(f"libhyper_parallel_kernels {lib.hpk_version().decode()} ({lib.hpk_capability().decode()}) loads without torch")
EOF

# Beside a package named hyper_parallel, a TP 2 loss on 2 processes, against one process.
mkdir -p "$out/theirs/hyper_parallel"
echo "OWNER = 'theirs'" >"$out/theirs/hyper_parallel/__init__.py"
cat >"$out/tp2.py" <<'EOF'
import os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.nn.functional as F

def rank_main(rank, store):
    import hyper_parallel, hyper_parallel_cpp as hp
    assert hyper_parallel.OWNER == "theirs" and "fresh" in hp.__file__, (hyper_parallel.__file__, hp.__file__)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 10, dtype=torch.float64, generator=g)
    t = torch.randint(0, 10, (8,), generator=g)
    got = hp.vocab_parallel_cross_entropy(torch.chunk(x, 2, 1)[rank], t, dist.group.WORLD)
    assert abs(got.item() - F.cross_entropy(x, t).item()) < 1e-12, (got.item(), F.cross_entropy(x, t).item())
    if rank == 0:
        print(f"TP 2 loss {got.item():.12f} = one process's")
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(os.path.join(tempfile.mkdtemp(), "store"),), nprocs=2)
EOF
(cd "$out" && PYTHONPATH="$out/theirs" "$env_dir/bin/python" tp2.py)
echo "wheel check passed"
