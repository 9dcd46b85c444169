"""The cases of test_mindspore.py on HyperParallel's MindSpore DTensor (HYPER_PARALLEL_CHECKOUT).

A column-sharded head, logits = x @ W with W Shard(1) over a 1-D mesh of every rank, so the
logits are Shard(-1); inside hyper_parallel_cpp.mindspore.loss_parallel() MindSpore's four
cross-entropy entry points must give one process's loss and W's gradient (float64, this rank's
columns). HyperParallel's platform is made to work on CPU by mindspore_hyperparallel_fixture.py.
"""

import os
import sys
import traceback

import numpy as np

VOCAB, HIDDEN, ROWS = 8, 5, 10
SMOOTHING = 0.25  # 0.25 / 8 is exact in float32 (MindSpore's reference multiplies by it as float32)


def run(rank, world):
    sys.path.insert(0, os.environ["HYPER_PARALLEL_CHECKOUT"])
    os.environ.setdefault("HYPER_PARALLEL_PLATFORM", "mindspore")
    import mindspore as ms
    from mindspore import Tensor, mint, nn, ops

    import mindspore_hyperparallel_fixture

    mindspore_hyperparallel_fixture.apply()
    from hyper_parallel import DTensor, init_device_mesh
    from hyper_parallel.core.placement_types import Replicate, Shard

    from hyper_parallel_cpp.mindspore import loss_parallel

    records = []
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, HIDDEN))
    full_w = rng.standard_normal((HIDDEN, VOCAB))
    target = rng.integers(0, VOCAB, ROWS)
    target[::3] = -100
    class_weight = rng.random(VOCAB) + 0.5
    p = rng.random((ROWS, VOCAB)).astype(np.float32)
    probabilities = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    local = VOCAB // world
    columns = slice(rank * local, (rank + 1) * local)
    x_dt = DTensor.from_local(Tensor(x), mesh, [Replicate()])  # the error cases

    routes = {
        "ops.cross_entropy": lambda logits, t, w, red, ls: ops.cross_entropy(logits, t, w, -100, red, ls),
        "mint.nn.functional.cross_entropy": lambda logits, t, w, red, ls: mint.nn.functional.cross_entropy(
            logits, t, weight=w, reduction=red, label_smoothing=ls),
        "nn.CrossEntropyLoss": lambda logits, t, w, red, ls: nn.CrossEntropyLoss(w, -100, red, ls)(logits, t),
        "mint.nn.CrossEntropyLoss": lambda logits, t, w, red, ls: mint.nn.CrossEntropyLoss(
            weight=w, reduction=red, label_smoothing=ls)(logits, t),
    }

    def reference(t, w, red, ls):
        def loss_of(full):
            loss = ops.cross_entropy(ops.matmul(Tensor(x), full), t, None if w is None else Tensor(w), -100, red, ls)
            return loss.sum() if red == "none" else loss

        loss, grad = ms.value_and_grad(loss_of)(Tensor(full_w))
        return loss.asnumpy(), grad.asnumpy()[:, columns]

    def ours(route, t, w, red, ls, dtype):
        x_dt = DTensor.from_local(Tensor(x, dtype), mesh, [Replicate()])

        def loss_of(w_piece):
            logits = ops.matmul(x_dt, DTensor.from_local(w_piece, mesh, [Shard(1)]))
            with loss_parallel():
                loss = routes[route](logits, t, None if w is None else Tensor(w, dtype), red, ls)
            return loss.sum() if red == "none" else loss

        loss, grad = ms.value_and_grad(loss_of)(Tensor(np.ascontiguousarray(full_w[:, columns]), dtype))
        return loss.asnumpy().astype(np.float64), grad.asnumpy().astype(np.float64)

    def case(name, route, t, w=None, red="mean", ls=0.0):
        # nn.CrossEntropyLoss takes float16 / float32 logits and weights and int32 labels only
        # (MindSpore's own checks).
        dtype = "float32" if route == "nn.CrossEntropyLoss" else "float64"
        if route == "nn.CrossEntropyLoss" and t.dtype == ms.int64:
            t = t.astype(ms.int32)
        try:
            ref_loss, ref_grad = reference(t, w, red, ls)
            loss, grad = ours(route, t, w, red, ls, ms.float32 if dtype == "float32" else ms.float64)
            records.append({"case": f"hyperparallel/{name}", "dtype": dtype,
                            "loss_err": float(np.max(np.abs(loss - ref_loss))),
                            "grad_err": float(np.max(np.abs(grad - ref_grad))),
                            "loss_scale": float(np.max(np.abs(ref_loss))),
                            "grad_scale": float(np.max(np.abs(ref_grad)))})
        except Exception as error:
            records.append({"case": f"hyperparallel/{name}", "dtype": dtype,
                            "unexpected": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-3000:]})

    index_t, weight = Tensor(target), class_weight
    for route in routes:
        case(f"{route}/mean", route, index_t)
        case(f"{route}/weight/ls{SMOOTHING}/sum", route, index_t, weight, "sum", SMOOTHING)
        case(f"{route}/none", route, index_t, weight, "none")
    # Probability targets (float32, as MindSpore takes them): whole rows, each rank uses its classes.
    case("ops.cross_entropy/probabilities/weight/mean", "ops.cross_entropy", Tensor(probabilities), weight)
    # Errors: the same named error on every rank.
    for name, call in (
            ("error/3d_logits", lambda: ops.cross_entropy(
                DTensor.from_local(Tensor(np.zeros((2, 5, local))), mesh, [Shard(2)]),
                Tensor(np.zeros((2, 5), np.int64)))),
            ("error/target_sharded_on_rows", lambda: ops.cross_entropy(
                ops.matmul(x_dt, DTensor.from_local(Tensor(full_w[:, columns]), mesh, [Shard(1)])),
                DTensor.from_local(Tensor(target[rank * 5:(rank + 1) * 5]), mesh, [Shard(0)])))):
        try:
            with loss_parallel():
                call()
            records.append({"case": f"hyperparallel/{name}", "raised": None})
        except Exception as error:
            records.append({"case": f"hyperparallel/{name}", "raised": type(error).__name__, "message": str(error)})
    return records
