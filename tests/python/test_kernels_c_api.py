"""libhyper_parallel_kernels from Python with ctypes and numpy, torch never imported: the C
interface (include/hyper_parallel_kernels/loss_kernels.h) as a framework without LibTorch calls
it. A TP 3 cross-entropy (uneven pieces, label smoothing, ignored rows) against numpy's float64
one-process definition, values and gradients, and an error's code and message."""
import ctypes
import importlib.util
import os
import sys

import numpy as np
import pytest

HPK_FLOAT64, HPK_INT64 = 3, 5
HPK_REDUCTION_MEAN = 1
HPK_STATS, HPK_CE_SAVED = 5, 6
HPK_ERROR_TARGET = 4


class Logits(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("data", ctypes.c_void_p), ("rows", ctypes.c_int64),
                ("local_classes", ctypes.c_int64), ("row_stride", ctypes.c_int64),
                ("class_offset", ctypes.c_int64), ("total_classes", ctypes.c_int64)]


class CrossEntropy(ctypes.Structure):
    _fields_ = [("logits", Logits), ("target_kind", ctypes.c_int32), ("target_dtype", ctypes.c_int32),
                ("target", ctypes.c_void_p), ("target_row_stride", ctypes.c_int64), ("weight", ctypes.c_void_p),
                ("weight_dtype", ctypes.c_int32), ("weight_length", ctypes.c_int64),
                ("ignore_index", ctypes.c_int64), ("reduction", ctypes.c_int32), ("label_smoothing", ctypes.c_double),
                ("z_loss_weight", ctypes.c_double), ("logit_softcap", ctypes.c_double)]


def kernels_library_module():
    """The package's loader of the library (hyper_parallel_cpp/kernels_library.py, the one the
    package uses), imported by its path from the first sys.path entry holding it: the package's
    __init__ would import torch."""
    for entry in sys.path:
        path = os.path.join(entry or ".", "hyper_parallel_cpp", "kernels_library.py")
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("hyper_parallel_cpp_kernels_library", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    pytest.skip("hyper_parallel_cpp/kernels_library.py not found on sys.path (PYTHONPATH)", allow_module_level=True)


LOADER = kernels_library_module()
Error = LOADER.Error


@pytest.fixture(scope="module")
def lib():
    try:
        return LOADER.kernels_library()
    except ImportError as error:
        pytest.skip(str(error))


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def problem(x, target, offset, local, eps):
    ce = CrossEntropy()
    ce.logits = Logits(HPK_FLOAT64, x.ctypes.data + offset * 8, x.shape[0], local, x.shape[1], offset, x.shape[1])
    ce.target_dtype, ce.target, ce.ignore_index = HPK_INT64, target.ctypes.data, -100
    ce.reduction, ce.label_smoothing = HPK_REDUCTION_MEAN, eps
    return ce


def test_tp3_cross_entropy_matches_numpy_float64_without_torch(lib):
    rng = np.random.default_rng(0)
    rows, classes, eps, tp = 9, 11, 0.1, 3
    x = rng.standard_normal((rows, classes)) * 4
    target = rng.integers(0, classes, rows).astype(np.int64)
    target[[2, 5]] = -100
    # numpy's one-process definition (PyTorch's cross_entropy, mean over counted rows).
    logp = x - x.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    valid = target != -100
    t = np.where(valid, target, 0)
    rows_loss = -(1 - eps) * logp[np.arange(rows), t] - eps / classes * logp.sum(1)
    want = (rows_loss * valid).sum() / valid.sum()
    onehot = np.eye(classes)[t]
    want_grad = (np.exp(logp) - (1 - eps) * onehot - eps / classes) * valid[:, None] / valid.sum()

    pieces = [(0, 4), (4, 4), (8, 3)]  # torch.chunk of 11 classes in 3
    stats = np.full((tp, HPK_STATS, rows), np.nan)
    err = Error()
    for p, (offset, local) in enumerate(pieces):
        ce = problem(x, target, offset, local, eps)
        assert lib.hpk_cross_entropy_stats(ctypes.byref(ce), ptr(stats[p]), ctypes.byref(err)) == 0, err.message
    grad = np.full_like(x, np.nan)
    grad_loss = np.ones(1)
    for offset, local in pieces:
        ce = problem(x, target, offset, local, eps)
        loss, saved = np.empty(1), np.empty((HPK_CE_SAVED, rows))
        assert lib.hpk_cross_entropy_combine(ctypes.byref(ce), ptr(stats), ctypes.c_int64(tp), ptr(loss), ptr(saved),
                                             ctypes.byref(err)) == 0, err.message
        assert abs(loss[0] - want) <= 1e-12 * abs(want)
        assert lib.hpk_cross_entropy_backward(ctypes.byref(ce), ptr(saved), ptr(grad_loss),
                                              ctypes.c_void_p(grad.ctypes.data + offset * 8), ctypes.c_int64(classes),
                                              ctypes.byref(err)) == 0, err.message
    np.testing.assert_allclose(grad, want_grad, rtol=0, atol=1e-14)
    assert "torch" not in sys.modules, "the C interface must not need torch"
    print(f"libhyper_parallel_kernels {lib.hpk_version().decode()}, {lib.hpk_capability().decode()}: "
          f"loss {loss[0]:.15f} (numpy {want:.15f})")


def test_a_target_out_of_range_is_a_code_and_a_message(lib):
    x = np.zeros((2, 3))
    target = np.array([1, 3], dtype=np.int64)
    ce = problem(x, target, 0, 3, 0.0)
    stats, err = np.full((HPK_STATS, 2), 7.0), Error()
    assert lib.hpk_cross_entropy_stats(ctypes.byref(ce), ptr(stats), ctypes.byref(err)) == HPK_ERROR_TARGET
    assert err.code == HPK_ERROR_TARGET
    assert err.message.decode() == ("hpk_cross_entropy_stats: expected index targets in [0, 3) (total_classes) or "
                                    "equal to ignore_index (-100), got 3 at row 1")
    assert (stats == 7.0).all(), "nothing written on an error"
