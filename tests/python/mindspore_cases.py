"""A MindSpore rank of test_mindspore.py: every case of the MindSpore front end in one launch.

Each case runs ours on this rank's piece of the classes and one-process ops.cross_entropy on the
full float64 logits (the same seed on every rank), and records the largest differences of the
loss and of this rank's gradient columns; expected errors record their type and message. The
test asserts on every rank's records. HYPER_PARALLEL_CHECKOUT adds the cases on HyperParallel's
MindSpore DTensor (mindspore_hyperparallel_fixture.py makes its platform work on CPU).
"""

import os
import time
import traceback

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

ms.set_device("CPU")
from mindspore.communication import create_group, get_group_size, get_rank, init  # noqa: E402

init()
import mindspore_ranks  # noqa: E402
from hyper_parallel_cpp.mindspore import VocabParallelCrossEntropy, vocab_parallel_cross_entropy  # noqa: E402

RANK, WORLD = get_rank(), get_group_size()
DTYPES = {"float64": ms.float64, "float32": ms.float32}
# MindSpore's cross-entropy multiplies by label_smoothing / classes as a float32 scalar: 0.25 / 8
# is exact in float32, so the float64 reference stays exact.
SMOOTHING = 0.25
records = []


def data(vocab, rows, kind, seed):
    rng = np.random.default_rng(seed)
    full = rng.standard_normal((rows, vocab)) * 3.0
    if kind == "index":
        target = rng.integers(0, vocab, rows)
        target[1::4] = -100
    else:  # probabilities; MindSpore's cross-entropy takes float32 (or float16) targets as such
        p = rng.random((rows, vocab)).astype(np.float32)
        target = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    return full, target, rng.random(vocab) + 0.5, rng.standard_normal(rows)


def piece_range(vocab, vocab_size_arg):
    if vocab_size_arg is None:
        local = vocab // WORLD
        return RANK * local, local
    chunk = -(-vocab // WORLD)
    start = min(RANK * chunk, vocab)
    return start, min(chunk, vocab - start)


def reference(full, target, weight, sens, reduction, smoothing):
    w = None if weight is None else Tensor(weight)

    def loss_of(x):
        loss = ops.cross_entropy(x, Tensor(target), w, -100, reduction, smoothing)
        return (loss * Tensor(sens)).sum() if reduction == "none" else loss

    loss, grad = ms.value_and_grad(loss_of)(Tensor(full))
    return loss.asnumpy(), grad.asnumpy()


class _Loss(nn.Cell):
    def __init__(self, cell, reduction):
        super().__init__()
        self.cell = cell
        self.reduction = reduction

    def construct(self, local, target, weight, sens):
        loss = self.cell(local, target, weight)
        if self.reduction == "none":
            return (loss * sens).sum()
        return loss


def case(name, *, dtype="float64", backend="kernel", mode="pynative", reduction="mean", smoothing=0.0,
         weighted=False, kind="index", vocab=8, rows=12, vocab_size_arg=None, group=None, seed=1):
    started = time.time()
    if vocab % WORLD and vocab_size_arg is None:
        vocab_size_arg = vocab  # torch.chunk's uneven pieces (at 3 ranks: 3 + 3 + 2 of 8)
    full, target, weight, sens = data(vocab, rows, kind, seed)
    weight = weight if weighted else None
    ref_loss, ref_grad = reference(full, target, weight, sens, reduction, smoothing)
    start, local = piece_range(vocab, vocab_size_arg)
    t = DTYPES[dtype]
    local_x = Tensor(np.ascontiguousarray(full[:, start:start + local]), t)
    local_t = Tensor(target) if kind == "index" else Tensor(np.ascontiguousarray(target[:, start:start + local]), t)
    w = None if weight is None else Tensor(weight, t)
    s = Tensor(sens, ms.float64 if dtype == "float64" else ms.float32)
    options = dict(vocab_size=vocab_size_arg, reduction=reduction, label_smoothing=smoothing, backend=backend)
    try:
        if mode == "graph":
            ms.set_context(mode=ms.GRAPH_MODE)
            net = _Loss(VocabParallelCrossEntropy(group, **options), reduction)
            loss, grad = ms.value_and_grad(net)(local_x, local_t, w, s)
            ms.set_context(mode=ms.PYNATIVE_MODE)
        else:
            def loss_of(x):
                loss = vocab_parallel_cross_entropy(x, local_t, group, weight=w, **options)
                return (loss * s).sum() if reduction == "none" else loss

            loss, grad = ms.value_and_grad(loss_of)(local_x)
        records.append({
            "case": name, "dtype": dtype,
            "loss_err": float(np.max(np.abs(loss.asnumpy().astype(np.float64) - ref_loss))),
            "grad_err": float(np.max(np.abs(grad.asnumpy().astype(np.float64) - ref_grad[:, start:start + local]))),
            "loss_scale": float(np.max(np.abs(ref_loss))), "grad_scale": float(np.max(np.abs(ref_grad))),
            "seconds": round(time.time() - started, 2)})
    except Exception as error:  # recorded; the test says which case failed and why
        ms.set_context(mode=ms.PYNATIVE_MODE)
        records.append({"case": name, "dtype": dtype, "unexpected": f"{type(error).__name__}: {error}",
                        "trace": traceback.format_exc()[-3000:]})


def expect_error(name, call):
    try:
        call()
        records.append({"case": name, "raised": None})
    except Exception as error:
        records.append({"case": name, "raised": type(error).__name__, "message": str(error)})


def plain_cases():
    # The C kernels (the CPU route): every option, both dtypes, both modes.
    for dtype in ("float64", "float32"):
        for reduction in ("mean", "sum", "none"):
            for smoothing in (0.0, SMOOTHING):
                for weighted in (False, True):
                    case(f"kernel/{dtype}/index/{reduction}/ls{smoothing}/w{int(weighted)}", dtype=dtype,
                         reduction=reduction, smoothing=smoothing, weighted=weighted)
            case(f"kernel/{dtype}/probabilities/{reduction}/ls0.0/w1", dtype=dtype, reduction=reduction, weighted=True,
                 kind="probabilities")
            case(f"kernel/{dtype}/probabilities/{reduction}/ls{SMOOTHING}/w1", dtype=dtype, reduction=reduction,
                 smoothing=SMOOTHING, weighted=True, kind="probabilities")
        # GRAPH_MODE: the Cell and its bprop compiled.
        case(f"kernel/{dtype}/graph/index/mean/ls{SMOOTHING}/w1", dtype=dtype, mode="graph", smoothing=SMOOTHING,
             weighted=True)
        case(f"kernel/{dtype}/graph/index/none", dtype=dtype, mode="graph", reduction="none")
        case(f"kernel/{dtype}/graph/probabilities/sum", dtype=dtype, mode="graph", reduction="sum",
             kind="probabilities")
    # Uneven pieces: torch.chunk's pieces of 7 (2 ranks: 4 + 3; 3 ranks: 3 + 3 + 1).
    case("kernel/float64/uneven/mean/w1", vocab=7, vocab_size_arg=7, weighted=True)
    case("kernel/float64/graph/uneven/sum", mode="graph", vocab=7, vocab_size_arg=7, reduction="sum")
    # A group that is not the world group by name: an AllReduce of per-rank slots on CPU.
    case("kernel/float64/named_group/mean", group="hpc_all_ranks", weighted=True)
    case("kernel/float64/graph/named_group/none", mode="graph", group="hpc_all_ranks", reduction="none")
    # MindSpore's own ops (the accelerator route), run on CPU: each option once (its PyNative
    # cases cost ~2 s and its graphs ~7 s to compile here, against ~0.3 s and ~1 s for the kernels').
    for reduction in ("mean", "sum", "none"):
        case(f"ops/float64/index/{reduction}/ls{SMOOTHING}/w1", backend="ops", reduction=reduction,
             smoothing=SMOOTHING, weighted=True)
    case("ops/float64/index/mean/ls0.0/w0", backend="ops")
    case("ops/float64/probabilities/sum/ls0.0/w1", backend="ops", reduction="sum", weighted=True,
         kind="probabilities")
    case(f"ops/float32/index/mean/ls{SMOOTHING}/w1", dtype="float32", backend="ops", smoothing=SMOOTHING,
         weighted=True)
    case(f"ops/float64/graph/index/mean/ls{SMOOTHING}/w1", backend="ops", mode="graph", smoothing=SMOOTHING,
         weighted=True)
    case("ops/float32/graph/probabilities/none", dtype="float32", backend="ops", mode="graph", reduction="none",
         kind="probabilities")
    case("ops/float64/uneven/mean/w1", backend="ops", vocab=7, vocab_size_arg=7, weighted=True)
    case("ops/float64/named_group/none", backend="ops", group="hpc_all_ranks", reduction="none")


def error_cases():
    vocab = 4 * WORLD
    full, target, _, _ = data(vocab, 6, "index", 3)
    x = Tensor(full[:, RANK * 4:(RANK + 1) * 4])
    bad = target.copy()
    if RANK == 0:
        bad[0] = 8 + 5  # on rank 0 only: every rank must still raise the same error
    expect_error("target_out_of_range_on_rank_0", lambda: vocab_parallel_cross_entropy(x, Tensor(bad)).asnumpy())
    expect_error("target_out_of_range_ops", lambda: vocab_parallel_cross_entropy(
        x, Tensor(np.full(6, 8 + 5)), backend="ops").asnumpy())
    # Uneven pieces without vocab_size: rank 0 holds 5 classes, the others 1 each.
    mine = 5 if RANK == 0 else 1
    expect_error("uneven_without_vocab_size", lambda: vocab_parallel_cross_entropy(
        Tensor(np.zeros((6, mine))), Tensor(np.zeros(6, np.int64))).asnumpy())
    expect_error("target_shape", lambda: vocab_parallel_cross_entropy(x, Tensor(target[:3])))
    expect_error("weight_length", lambda: vocab_parallel_cross_entropy(x, Tensor(target),
                                                                      weight=Tensor(np.ones(5))).asnumpy())
    expect_error("bad_reduction", lambda: vocab_parallel_cross_entropy(x, Tensor(target), reduction="avg"))
    # A good call afterwards: the group is still usable.
    case("after_errors/float64/mean", weighted=True)


def main():
    create_group("hpc_all_ranks", list(range(WORLD)))
    plain_cases()
    error_cases()
    if os.environ.get("HYPER_PARALLEL_CHECKOUT") and WORLD == 2:
        import mindspore_hyperparallel_cases
        records.extend(mindspore_hyperparallel_cases.run(RANK, WORLD))
    mindspore_ranks.write_results({"rank": RANK, "world": WORLD, "mindspore": ms.__version__, "records": records})


if __name__ == "__main__":
    main()
