"""The one class-axis decision every front end shares (the C++ library's, src/loss/class_axis.h),
through the Python routes' door (hyper_parallel_cpp.class_layout: libhyper_parallel_kernels'
hpk_resolve_class_axis by ctypes), read as a specification on neutral layouts: no process group, no
DTensor. The routes' own tests (test_loss_parallel*.py, test_hyperparallel.py) run the same decisions
on real meshes; tests/loss/class_axis_test.cpp reads the C interface's table."""

import pytest

from hyper_parallel_cpp import LossParallelLayoutError, LossParallelUnsupportedError
from hyper_parallel_cpp.class_layout import (REPLICATE, LayoutView, Placement, Route, check_mean, expected_layout,
                                             resolve, shard)

PYTORCH = Route("a DTensor", relayout=True, rows_sharded=True)
HYPERPARALLEL = Route("a HyperParallel DTensor", relayout=False, rows_sharded=False)
PARTIAL = Placement("partial")
STRIDED = Placement("other")


def view(*placements, ndim=2, on_mesh=lambda mesh, dim: mesh == "tp"):
    return LayoutView(tuple(placements), ndim, f"{list(placements)}", on_mesh)


class Strictness:
    """The context's strictness, counting how often a route is asked (PyTorch's agrees on it in a
    collective, so it must be asked only where it decides)."""

    def __init__(self, strict: bool):
        self.strict, self.asked = strict, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.strict


def test_the_contract_is_taken_as_it_is_without_asking_the_strictness():
    for placements, mesh_dim in [((shard(1),), 0), ((shard(0), shard(1)), 1), ((REPLICATE, shard(1)), 1)]:
        strict = Strictness(True)
        r = resolve(view(*placements), 1, "cross_entropy", PYTORCH, strict)
        assert (r.mesh_dim, r.want, r.relayout) == (mesh_dim, placements, False)
        assert strict.asked == 0


def test_off_the_contract_strict_refuses_and_not_strict_relays_out_once_asked():
    for placements, want in [((shard(1), shard(1)), (REPLICATE, shard(1))),
                             ((PARTIAL, shard(1)), (REPLICATE, shard(1))),
                             ((STRIDED, shard(1)), (REPLICATE, shard(1)))]:
        strict = Strictness(True)
        with pytest.raises(LossParallelLayoutError, match=r"\(strict\).*exactly one mesh dim"):
            resolve(view(*placements), 1, "cross_entropy", PYTORCH, strict)
        assert strict.asked == 1
        relaxed = Strictness(False)
        r = resolve(view(*placements), 1, "cross_entropy", PYTORCH, relaxed)
        assert (r.mesh_dim, r.want, r.relayout, relaxed.asked) == (1, want, True, 1)


def test_what_no_route_takes():
    for route in (PYTORCH, HYPERPARALLEL):
        with pytest.raises(LossParallelLayoutError, match="got a plain tensor of shape \\[4, 8\\]"):
            resolve(None, 1, "nll_loss", route, Strictness(False), plain_shape=[4, 8])
        with pytest.raises(LossParallelLayoutError, match="the class dim 1 is not sharded"):
            resolve(view(shard(0)), 1, "nll_loss", route, Strictness(False))
        # Partial logits whose classes are not sharded: refused whatever the strictness (not asked).
        strict = Strictness(True)
        with pytest.raises(LossParallelLayoutError, match="class dim 1 is not sharded .reduce the Partial first"):
            resolve(view(PARTIAL), 1, "nll_loss", route, strict)
        assert strict.asked == 0
        with pytest.raises(LossParallelLayoutError, match=r"loss_parallel\(mesh = dp\): expected the input on that"):
            resolve(view(shard(1)), 1, "nll_loss", route, Strictness(False), options_mesh="dp")
        assert resolve(view(shard(1)), 1, "nll_loss", route, Strictness(True), options_mesh="tp").mesh_dim == 0


def test_a_route_that_cannot_relay_out_refuses_what_the_other_relays_out():
    strict = Strictness(False)
    with pytest.raises(LossParallelLayoutError, match="reduce the Partial first"):
        resolve(view(PARTIAL, shard(1)), 1, "cross_entropy", HYPERPARALLEL, strict)
    assert strict.asked == 0
    with pytest.raises(LossParallelUnsupportedError, match="sharded by 2 mesh dims"):
        resolve(view(shard(1), shard(1)), 1, "cross_entropy", HYPERPARALLEL, Strictness(False))


def test_a_route_with_replicated_results_takes_other_mesh_dims_only_replicated_and_not_strict():
    with pytest.raises(LossParallelLayoutError, match=r"\(strict\).*1-D tensor-parallel sub-mesh"):
        resolve(view(REPLICATE, shard(1)), 1, "cross_entropy", HYPERPARALLEL, Strictness(True))
    assert resolve(view(REPLICATE, shard(1)), 1, "cross_entropy", HYPERPARALLEL, Strictness(False)).mesh_dim == 1
    with pytest.raises(LossParallelLayoutError, match="every mesh axis but the class axis"):
        resolve(view(shard(0), shard(1)), 1, "cross_entropy", HYPERPARALLEL, Strictness(False))


def test_rows_are_laid_out_as_the_logits_without_the_class_dim():
    # [batch, classes, sequence] on dp x tp x sp: the rows [batch, sequence] keep dp and sp.
    r = resolve(view(shard(0), shard(1), shard(2), ndim=3), 1, "cross_entropy", PYTORCH, Strictness(True))
    assert r.rows == (shard(0), REPLICATE, shard(1))
    assert r.row_mesh_dims == [0, 2]


def test_a_route_raises_its_own_errors_in_its_own_words():
    class LayoutError(ValueError):
        pass

    class UnsupportedError(NotImplementedError):
        pass

    mindspore = Route("a HyperParallel DTensor", relayout=False, rows_sharded=False, relax="",
                      layout_error=LayoutError, unsupported_error=UnsupportedError)
    with pytest.raises(LayoutError, match=r"^cross_entropy under loss_parallel: expected every mesh axis but the "
                                          r"class axis to be Replicate, got \[Placement"):
        resolve(view(shard(0), shard(1)), 1, "cross_entropy", mindspore, lambda: False)
    with pytest.raises(UnsupportedError, match="sharded by 2 mesh dims"):
        resolve(view(shard(1), shard(1)), 1, "cross_entropy", mindspore, lambda: False)
    assert expected_layout(PYTORCH, 1) == ("a DTensor sharded along its class dim 1 on exactly one mesh dim "
                                           "(Shard(1)), its other mesh dims Shard or Replicate (a Shard of another "
                                           "dim)")
    assert expected_layout(HYPERPARALLEL, 2).endswith("(Shard(2)), its other mesh dims Replicate (or the "
                                                      "tensor-parallel mesh alone)")


def test_mean_is_taken_on_one_mesh_dim_and_on_more_only_without_strict():
    strict = Strictness(True)
    check_mean(view(shard(1)), 1, "cross_entropy", PYTORCH, strict)
    assert strict.asked == 0
    relaxed = Strictness(False)
    check_mean(view(shard(0), shard(1)), 1, "cross_entropy", PYTORCH, relaxed)
    assert relaxed.asked == 1
    with pytest.raises(LossParallelUnsupportedError,
                       match=r"^nll_loss under loss_parallel \(strict\): reduction 'mean' is only supported on a "
                             r"one-dimensional mesh .*got a mesh of 2 dims .* or strict=False for the exact global "
                             r"mean"):
        check_mean(view(REPLICATE, shard(1)), 1, "nll_loss", PYTORCH, strict)
    assert strict.asked == 1


def test_a_long_message_comes_back_whole():
    long_words = "x" * 10000
    with pytest.raises(LossParallelLayoutError) as error:
        resolve(LayoutView((shard(0),), 2, long_words, lambda mesh, dim: True), 1, "nll_loss", PYTORCH,
                Strictness(True))
    assert str(error.value).endswith(long_words + ": the class dim 1 is not sharded")
