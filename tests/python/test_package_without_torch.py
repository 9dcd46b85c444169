"""hyper_parallel_cpp imports without torch (for its MindSpore front end), and with torch nothing
changes: the torch names are the torch API, loaded at import as before.

Without torch (blocked with sys.modules['torch'] = None in a fresh process, or genuinely absent
in the MindSpore venv) the package imports, each torch name raises an ImportError naming torch,
and hyper_parallel_cpp.mindspore imports and computes a loss in one process.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import mindspore_ranks


def _run(python, code, **env):
    result = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=mindspore_ranks.package_path(), **env))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    return result.stdout


def test_torch_names_raise_an_import_error_naming_torch_when_torch_is_absent():
    out = _run(sys.executable, """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import hyper_parallel_cpp
        for name in ("loss_parallel", "vocab_parallel_cross_entropy", "LossParallelLayoutError"):
            try:
                getattr(hyper_parallel_cpp, name)
            except ImportError as error:
                assert "needs torch" in str(error) and "hyper_parallel_cpp.mindspore" in str(error), error
            else:
                raise AssertionError(f"{name} without torch did not raise")
        try:
            from hyper_parallel_cpp import loss_parallel
        except ImportError as error:
            assert "torch" in str(error), error
        else:
            raise AssertionError("from hyper_parallel_cpp import loss_parallel without torch did not raise")
        print("ok")
    """)
    assert out.strip().endswith("ok")


def test_with_torch_the_package_loads_its_torch_api_as_before():
    out = _run(sys.executable, """
        import sys
        import hyper_parallel_cpp
        assert "torch" in sys.modules and hyper_parallel_cpp._TORCH_IMPORT_ERROR is None
        from hyper_parallel_cpp import loss_parallel, vocab_parallel_cross_entropy, LossParallelLayoutError
        assert callable(loss_parallel) and callable(vocab_parallel_cross_entropy)
        assert issubclass(LossParallelLayoutError, ValueError)
        print("ok")
    """)
    assert out.strip().endswith("ok")


@pytest.mark.skipif(not mindspore_ranks.mindspore_python(), reason=mindspore_ranks.SKIP_REASON)
def test_the_mindspore_front_end_imports_and_runs_without_torch():
    out = _run(mindspore_ranks.mindspore_python(), """
        import sys
        import numpy as np
        import mindspore as ms
        ms.set_device("CPU")
        from mindspore import Tensor, ops
        import hyper_parallel_cpp
        from hyper_parallel_cpp.mindspore import vocab_parallel_cross_entropy
        assert "torch" not in sys.modules, "hyper_parallel_cpp.mindspore imported torch"
        rng = np.random.default_rng(0)
        x, t = rng.standard_normal((5, 8)), rng.integers(0, 8, 5)
        for backend in ("kernel", "ops"):
            ours = vocab_parallel_cross_entropy(Tensor(x), Tensor(t), backend=backend).asnumpy()
            reference = ops.cross_entropy(Tensor(x), Tensor(t)).asnumpy()
            assert abs(ours - reference) <= 1e-12, (backend, ours, reference)
        print("ok")
    """, GLOG_v="3")
    assert out.strip().endswith("ok")
