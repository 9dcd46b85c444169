"""The MindSpore front end (hyper_parallel_cpp.mindspore) on 2 real MindSpore ranks (mccl, CPU).

One launch runs every case (mindspore_cases.py; a launch costs 20-50 s of start-up alone): the
C kernels as AOT ops and the MindSpore-ops algorithm, float64 and float32, PyNative and
GRAPH_MODE, index and probability targets, weights, ignore_index, every reduction, label
smoothing, uneven pieces, a group that is not the world group, and errors raised alike on every
rank; with HYPER_PARALLEL_CHECKOUT also HyperParallel's MindSpore DTensor under loss_parallel().
Each against one-process ops.cross_entropy on the full float64 logits, loss and gradient.
Skips, saying so, without the MindSpore venv (mindspore_ranks.py).
"""

import os

import pytest

import mindspore_ranks

pytestmark = pytest.mark.skipif(not mindspore_ranks.mindspore_python(), reason=mindspore_ranks.SKIP_REASON)

# 2 ranks; HP_MINDSPORE_WORLD=3 runs the same cases on 3 (uneven pieces everywhere; without the
# HyperParallel cases, whose mesh needs even pieces), a second launch not run by default.
WORLD = int(os.environ.get("HP_MINDSPORE_WORLD", "2"))
HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.environ.get("HYPER_PARALLEL_CHECKOUT", "")
HAVE_CHECKOUT = bool(CHECKOUT) and os.path.isdir(os.path.join(CHECKOUT, "hyper_parallel"))
# float64: within 1e-12 of one process (relative to the largest value). float32 logits against
# the float64 reference: the rounding of float32 inputs and sums.
TOLERANCE = {"float64": 1e-12, "float32": 2e-6}
# MindSpore's own reference rounds smoothed probability targets to float32 (the target's dtype).
REFERENCE_IN_FLOAT32 = 2e-7


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    env = {} if HAVE_CHECKOUT else {"HYPER_PARALLEL_CHECKOUT": ""}
    result = mindspore_ranks.launch(os.path.join(HERE, "mindspore_cases.py"), WORLD,
                                    str(tmp_path_factory.mktemp("mindspore")), env)
    print(f"\n{WORLD}-rank MindSpore launch: {result['seconds']:.1f} s")
    return result["results"]


def _records(launch, prefix):
    by_rank = [{r["case"]: r for r in rank["records"] if r["case"].startswith(prefix)} for rank in launch]
    assert by_rank[0], f"no case starts with {prefix}"
    return by_rank


def _check_values(by_rank):
    failures = []
    for rank, records in enumerate(by_rank):
        for name, r in records.items():
            if "raised" in r:
                continue
            if "unexpected" in r:
                failures.append(f"rank {rank} {name}: {r['unexpected']}\n{r.get('trace', '')}")
                continue
            tol = TOLERANCE[r["dtype"]]
            if "probabilities" in name and "ls0.25" in name and r["dtype"] == "float64":
                tol = REFERENCE_IN_FLOAT32
            for what in ("loss", "grad"):
                if r[f"{what}_err"] > tol * max(1.0, r[f"{what}_scale"]):
                    failures.append(f"rank {rank} {name}: {what} off by {r[f'{what}_err']:.3g} (tolerance "
                                    f"{tol:g} x {max(1.0, r[f'{what}_scale']):.3g})")
    assert not failures, "\n".join(failures)


def _check_same_error(by_rank, name, error_type, words):
    raised = [records[name] for records in by_rank]
    assert raised[0]["raised"] == error_type, f"{name}: {raised[0]}"
    assert all(r["raised"] == raised[0]["raised"] and r["message"] == raised[0]["message"] for r in raised), \
        f"{name}: the ranks raised differently: {raised}"
    for word in words:
        assert word in raised[0]["message"], f"{name}: {word!r} not in {raised[0]['message']!r}"


def test_kernel_route_matches_one_process(launch):
    _check_values(_records(launch, "kernel/"))


def test_mindspore_ops_route_matches_one_process(launch):
    _check_values(_records(launch, "ops/"))


def test_a_call_after_errors_matches_one_process(launch):
    _check_values(_records(launch, "after_errors/"))


def test_bad_inputs_raise_the_same_named_error_on_every_rank(launch):
    by_rank = _records(launch, "")
    # Found on rank 0 only, before the gather: every rank raises after it.
    _check_same_error(by_rank, "target_out_of_range_on_rank_0", "KernelError", ["13", "rank 0"])
    _check_same_error(by_rank, "uneven_without_vocab_size", "KernelError", ["classes", "vocab"])
    _check_same_error(by_rank, "weight_length", "KernelError", ["5"])
    _check_same_error(by_rank, "target_shape", "LossParallelLayoutError", ["index target"])
    _check_same_error(by_rank, "bad_reduction", "ValueError", ["'avg'"])
    # MindSpore's ops route: the count gathered with the statistics raises the same error everywhere.
    _check_same_error(by_rank, "target_out_of_range_ops", "KernelError", ["[0, 8)", "got 13"])


@pytest.mark.skipif(not HAVE_CHECKOUT or WORLD != 2, reason="HYPER_PARALLEL_CHECKOUT does not name a checkout of "
                    "mindspore-ai/hyper-parallel (the folder holding hyper_parallel/): its MindSpore DTensor is "
                    "not tested (and its cases run at 2 ranks only)")
def test_hyperparallel_mindspore_dtensor_under_loss_parallel(launch):
    by_rank = _records(launch, "hyperparallel/")
    _check_values(by_rank)
    _check_same_error(by_rank, "hyperparallel/error/3d_logits", "LossParallelUnsupportedError", ["[rows, classes]"])
    _check_same_error(by_rank, "hyperparallel/error/target_sharded_on_rows", "LossParallelLayoutError",
                      ["Replicate"])
