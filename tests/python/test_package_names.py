"""Our names never take HyperParallel's: hyper_parallel_cpp imports beside another package called
hyper_parallel (HyperParallel's import name), and our ops live in hyper_parallel_cpp:: under names
HyperParallel's dispatcher (which drops the namespace) does not route as torch's own functions."""

import os
import subprocess
import sys
import textwrap

import torch

import hyper_parallel_cpp as hp  # noqa: F401  (registers the ops)

# Function names HyperParallel's dispatcher keys routes by (torch's own losses and softmaxes).
_TORCH_NAMES = {"cross_entropy", "log_softmax", "nll_loss", "softmax", "linear", "cross_entropy_loss"}


def _our_ops():
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("hyper_parallel_cpp::"))


def test_ops_live_in_our_namespace_under_names_of_their_own():
    ours = _our_ops()
    assert "hyper_parallel_cpp::vocab_parallel_cross_entropy" in ours, ours
    assert not [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("hyper_parallel::")], \
        "an op was registered in HyperParallel's namespace hyper_parallel::"
    for name in ours:
        bare = name.split("::", 1)[1]
        assert bare not in _TORCH_NAMES, f"{name}: without its namespace it reads as torch's {bare}"


def test_imports_beside_a_package_named_hyper_parallel(tmp_path):
    # A stand-in that occupies the import name the way HyperParallel's checkout does (a regular
    # package with a core subpackage), first on the path.
    theirs = tmp_path / "hyper_parallel"
    (theirs / "core").mkdir(parents=True)
    (theirs / "__init__.py").write_text("OWNER = 'theirs'\n")
    (theirs / "core" / "__init__.py").write_text("")
    script = textwrap.dedent("""
        import hyper_parallel, hyper_parallel.core, hyper_parallel_cpp, torch
        assert hyper_parallel.OWNER == "theirs", hyper_parallel.__file__
        assert "hyper_parallel_cpp" in hyper_parallel_cpp.__file__
        x = torch.randn(4, 7, dtype=torch.float64)
        t = torch.randint(0, 7, (4,))
        got = hyper_parallel_cpp.vocab_parallel_cross_entropy(x, t, "")
        assert torch.allclose(got, torch.nn.functional.cross_entropy(x, t), rtol=0, atol=1e-12)
        print("both imported")
    """)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "both imported" in r.stdout, r.stdout + r.stderr

