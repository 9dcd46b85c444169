"""loss_parallel on HyperParallel's own DTensor, through HyperParallel's own dispatcher, against one
process's F.cross_entropy in float64 (loss and gradient within 1e-12), on the real HyperParallel.

HyperParallel (mindspore-ai/hyper-parallel) is not on PyPI and is never committed here: point
HYPER_PARALLEL_CHECKOUT at a checkout of it (its top folder, the one holding hyper_parallel/). Without
it every test here skips, saying so. HyperParallel expresses even pieces only: TP 2 and 3 over a
vocabulary of 12.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ranks import assert_close, run_ranks

CHECKOUT = os.environ.get("HYPER_PARALLEL_CHECKOUT", "")
pytestmark = pytest.mark.skipif(
    not CHECKOUT or not os.path.isdir(os.path.join(CHECKOUT, "hyper_parallel")),
    reason="HYPER_PARALLEL_CHECKOUT does not name a checkout of mindspore-ai/hyper-parallel (the folder holding "
           "hyper_parallel/); the HyperParallel route is not tested")
if CHECKOUT:
    sys.path.insert(0, CHECKOUT)
    os.environ["PYTHONPATH"] = CHECKOUT + os.pathsep + os.environ.get("PYTHONPATH", "")

VOCAB = 12
TOL = 1e-12


def _hp():
    """HyperParallel's names, and our route installed (in a rank process)."""
    import hyper_parallel as hpar
    from hyper_parallel.core.placement_types import Replicate, Shard

    import hyper_parallel_cpp as hp
    from hyper_parallel_cpp.integrations import hyperparallel

    hyperparallel.install()
    hyperparallel.install()  # idempotent
    return hpar, hp, Shard, Replicate


def _tp_mesh(hpar, world):
    return hpar.init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))


def _piece(full, rank, world, dim):
    return torch.chunk(full, world, dim=dim)[rank].clone()


def _check(what, make_loss, reference, full, rank, world, class_dim, seed=None):
    """make_loss(local leaf) -> HyperParallel DTensor loss; reference(full leaf) -> torch loss."""
    from hyper_parallel_cpp import _C
    ref_x = full.clone().requires_grad_()
    ref = reference(ref_x)
    seed = torch.ones_like(ref) if seed is None else seed
    (ref * seed).sum().backward()
    local = _piece(full, rank, world, class_dim).requires_grad_()
    _C.reset_collective_counts()
    loss = make_loss(local)
    forward = dict(_C.collective_counts())
    out = loss.to_local()
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert_close(out, ref, TOL, f"{what} loss")
    (out * seed).sum().backward()
    backward = _C.collective_counts()
    assert_close(local.grad, _piece(ref_x.grad, rank, world, class_dim), TOL, f"{what} gradient")
    # The call's record (fixed size: every rank agrees or every rank refuses), then the per-row
    # statistics: two all-gathers, nothing else.
    assert forward["all_gather"] == 2 and sum(forward.values()) == 2, f"{what}: forward collectives {forward}"
    assert backward == forward, f"{what}: backward issued collectives ({forward} -> {backward})"


def exactness(rank, world):
    hpar, hp, Shard, Replicate = _hp()
    mesh = _tp_mesh(hpar, world)
    gen = torch.Generator().manual_seed(7)

    def dt(local, placements):
        return hpar.DTensor.from_local(local, mesh, placements)

    for reduction in ("none", "mean", "sum"):
        full = torch.randn(10, VOCAB, dtype=torch.float64, generator=gen) * 3
        target = torch.randint(0, VOCAB, (10,), generator=gen)
        target[::4] = -100
        weight = torch.rand(VOCAB, dtype=torch.float64, generator=gen) + 0.5
        seed = torch.randn(10, dtype=torch.float64, generator=gen) if reduction == "none" else None
        cases = {
            "plain": ({}, {}),
            "ignore_index=3": ({"ignore_index": 3}, {"ignore_index": 3}, target.clamp_min(3)),
            "weight": ({"weight": weight}, {"weight": weight}),
            "Replicate weight": ({"weight": dt(weight.clone(), [Replicate()])}, {"weight": weight}),
            "label_smoothing": ({"label_smoothing": 0.1}, {"label_smoothing": 0.1}),
            "smoothing+weight": ({"label_smoothing": 0.2, "weight": weight}, {"label_smoothing": 0.2, "weight": weight}),
        }
        for name, (ours, theirs, *own_target) in cases.items():
            t = own_target[0] if own_target else target

            def make(local, ours=ours, t=t):
                with hp.loss_parallel():
                    return F.cross_entropy(dt(local, [Shard(1)]), t, reduction=reduction, **ours)
            _check(f"{name}/{reduction}", make,
                   lambda x, theirs=theirs, t=t: F.cross_entropy(x, t, reduction=reduction, **theirs),
                   full, rank, world, 1, seed)

        probs = torch.softmax(torch.randn(10, VOCAB, dtype=torch.float64, generator=gen), 1)
        for name, prob_target in [("plain", lambda: probs),
                                  ("sharded like the logits", lambda: dt(_piece(probs, rank, world, 1), [Shard(1)])),
                                  ("Replicate", lambda: dt(probs.clone(), [Replicate()]))]:
            def make(local, prob_target=prob_target):
                with hp.loss_parallel():
                    return F.cross_entropy(dt(local, [Shard(1)]), prob_target(), reduction=reduction,
                                           label_smoothing=0.05)
            _check(f"probability targets ({name})/{reduction}", make,
                   lambda x: F.cross_entropy(x, probs, reduction=reduction, label_smoothing=0.05),
                   full, rank, world, 1, seed)

        # z-loss and soft-capping come from the context's options.
        def make_z(local):
            with hp.loss_parallel(z_loss_weight=1e-2, logit_softcap=4.0):
                return F.cross_entropy(dt(local, [Shard(1)]), target, reduction=reduction)

        def reference_z(x):
            y = 4.0 * torch.tanh(x / 4.0)
            counted = target != -100
            ce = F.cross_entropy(y, target, reduction="none")
            zl = torch.where(counted, 1e-2 * torch.logsumexp(y, 1) ** 2, torch.zeros_like(ce))
            per_row = ce + zl
            if reduction == "none":
                return per_row
            return per_row.sum() / (counted.sum() if reduction == "mean" else 1)
        _check(f"z-loss+softcap/{reduction}", make_z, reference_z, full, rank, world, 1, seed)

    # N-D logits: the class dim where PyTorch reads it (1), and nn.CrossEntropyLoss.
    full3 = torch.randn(3, VOCAB, 5, dtype=torch.float64, generator=gen)
    target3 = torch.randint(0, VOCAB, (3, 5), generator=gen)
    module = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def make3(local):
        with hp.loss_parallel():
            return module(dt(local, [Shard(1)]), target3)
    _check("3-D logits through nn.CrossEntropyLoss", make3, lambda x: module(x, target3), full3, rank, world, 1)

    # Backward outside the context, after it closed.
    local = _piece(full, rank, world, 1).requires_grad_()
    with hp.loss_parallel():
        loss = F.cross_entropy(dt(local, [Shard(1)]), target)
    loss.to_local().backward()
    ref_x = full.clone().requires_grad_()
    F.cross_entropy(ref_x, target).backward()
    assert_close(local.grad, _piece(ref_x.grad, rank, world, 1), TOL, "backward after the context closed")

    # log_softmax and nll_loss on class-sharded DTensors: exact, log_softmax's backward for any use.
    mix = torch.randn(10, VOCAB, dtype=torch.float64, generator=gen)
    for spelling in ("F.log_softmax", "torch.log_softmax", "Tensor.log_softmax"):
        def make_ls(local, spelling=spelling):
            with hp.loss_parallel():
                x = dt(local, [Shard(1)])
                if spelling == "F.log_softmax":
                    return F.log_softmax(x, dim=1)
                if spelling == "torch.log_softmax":
                    return torch.log_softmax(x, 1)
                return x.log_softmax(-1)
        make_ls.mix = lambda rank, world: _piece(mix, rank, world, 1)
        _check_log_softmax(spelling, make_ls, lambda x: (torch.log_softmax(x, 1) * mix).sum(), full, rank, world)
    for reduction in ("none", "mean", "sum"):
        def make_nll(local, reduction=reduction):
            with hp.loss_parallel():
                return F.nll_loss(dt(local, [Shard(1)]), target, weight=weight, reduction=reduction)
        _check_nll(reduction, make_nll, lambda x, reduction=reduction: F.nll_loss(x, target, weight=weight,
                                                                                    reduction=reduction),
                   full, rank, world)


def _check_log_softmax(what, make, reference, full, rank, world):
    """make(local leaf) -> the class-sharded log_softmax DTensor; the check sums it against a sharded
    weight over the whole vocabulary, so the gradient reaches every class."""
    ref_x = full.clone().requires_grad_()
    reference(ref_x).backward()
    local = _piece(full, rank, world, 1).requires_grad_()
    mix = make.mix(rank, world)
    part = (make(local).to_local() * mix).sum()
    whole = part.detach().clone()
    dist.all_reduce(whole)
    assert_close(whole, reference(full), TOL, f"{what}: log_softmax value")
    part.backward()  # each rank's upstream gradient is its piece of the whole one
    assert_close(local.grad, _piece(ref_x.grad, rank, world, 1), TOL, f"{what}: log_softmax gradient")


def _check_nll(reduction, make, reference, full, rank, world):
    logp_full = torch.log_softmax(full, 1)
    ref_x = logp_full.clone().requires_grad_()
    ref = reference(ref_x)
    ref.sum().backward()
    local = _piece(logp_full, rank, world, 1).requires_grad_()
    out = make(local).to_local()
    assert_close(out, ref, TOL, f"nll_loss/{reduction}")
    out.sum().backward()
    assert_close(local.grad, _piece(ref_x.grad, rank, world, 1), TOL, f"nll_loss/{reduction} gradient")


@pytest.mark.parametrize("world", [2, 3])
def test_exact_against_one_process(world):
    run_ranks(world, exactness)


def cache_and_bad_input(rank, world):
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError, parallelism_config, set_parallelism_config
    mesh = _tp_mesh(hpar, world)
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(6, VOCAB, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (6,), generator=gen)
    whole = F.cross_entropy(full, target)

    def sharded():
        return hpar.DTensor.from_local(_piece(full, rank, world, 1), mesh, [Shard(1)])

    # The layout cache: the same call inside the context, then outside, then inside again.
    with hp.loss_parallel():
        assert_close(F.cross_entropy(sharded(), target).to_local(), whole, TOL, "inside")
    with pytest.raises(LossParallelLayoutError, match="outside loss_parallel"):
        F.cross_entropy(sharded(), target)
    with hp.loss_parallel():
        assert_close(F.cross_entropy(sharded(), target).to_local(), whole, TOL, "inside again")

    # Outside, with the gathered fallback asked for: exact, by all-gathering the classes.
    saved = parallelism_config()
    set_parallelism_config(type(saved)(loss_parallel_fallback_on_layout_error=True))
    try:
        local = _piece(full, rank, world, 1).requires_grad_()
        with pytest.warns(UserWarning, match="all-gathering"):
            loss = F.cross_entropy(hpar.DTensor.from_local(local, mesh, [Shard(1)]), target)
        assert_close(loss.to_local(), whole, TOL, "gathered fallback")
        loss.to_local().backward()
        ref_x = full.clone().requires_grad_()
        F.cross_entropy(ref_x, target).backward()
        assert_close(local.grad, _piece(ref_x.grad, rank, world, 1), TOL, "gathered fallback gradient")
    finally:
        set_parallelism_config(saved)

    # Replicated logits outside the context: the ordinary loss, exact on every rank.
    assert_close(F.cross_entropy(hpar.DTensor.from_local(full.clone(), mesh, [Replicate()]), target).to_local(),
                 whole, TOL, "replicated logits outside the context")

    # Bad input: the named error on every rank, and the ranks stay in step (a good call follows).
    from hyper_parallel_cpp import LossParallelUnsupportedError
    bad = [
        ("Replicate logits", {}, lambda: F.cross_entropy(hpar.DTensor.from_local(full.clone(), mesh, [Replicate()]),
                                                         target), LossParallelLayoutError, "class dim 1 is not sharded"),
        ("rows sharded instead of classes", {},
         lambda: F.cross_entropy(hpar.DTensor.from_local(torch.chunk(full, world, 0)[rank].clone(), mesh,
                                                         [Shard(0)]), target), LossParallelLayoutError,
         "class dim 1 is not sharded"),
        ("a target on another device", {}, lambda: F.cross_entropy(sharded(), target.to("meta")), RuntimeError,
         "same device"),
        ("a sharded target", {}, lambda: F.cross_entropy(sharded(), hpar.DTensor.from_local(
            torch.chunk(target, world, 0)[rank].clone(), mesh, [Shard(0)])), LossParallelLayoutError,
         "target to be replicated"),
        ("gradient_in_forward", {"gradient_in_forward": True}, lambda: F.cross_entropy(sharded(), target),
         LossParallelUnsupportedError, "gradient_in_forward"),
        ("z-loss under log_softmax", {"z_loss_weight": 1e-3}, lambda: F.log_softmax(sharded(), dim=1),
         LossParallelUnsupportedError, "cross_entropy only"),
    ]
    for what, options, call, error, message in bad:
        with hp.loss_parallel(**options):
            with pytest.raises(error, match=message):
                call()
        with hp.loss_parallel():
            assert_close(F.cross_entropy(sharded(), target).to_local(), whole, TOL, f"the call after {what}")


def test_layout_cache_and_bad_input():
    run_ranks(2, cache_and_bad_input, fresh=True)


def two_dim_mesh(rank, world):
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError
    mesh = hpar.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    gen = torch.Generator().manual_seed(5)
    full = torch.randn(8, VOCAB, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (8,), generator=gen)
    tp = rank % 2  # rank_list 0..3 row-major: tp is the last axis
    local = torch.chunk(full, 2, 1)[tp].clone().requires_grad_()
    logits = hpar.DTensor.from_local(local, mesh, [Replicate(), Shard(1)])
    with hp.loss_parallel(strict=False):
        loss = F.cross_entropy(logits, target, label_smoothing=0.1)
    ref_x = full.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, target, label_smoothing=0.1)
    ref.backward()
    assert_close(loss.to_local(), ref, TOL, "2-D mesh loss")
    loss.to_local().backward()
    assert_close(local.grad, torch.chunk(ref_x.grad, 2, 1)[tp], TOL, "2-D mesh gradient")
    with hp.loss_parallel():
        with pytest.raises(LossParallelLayoutError, match="strict"):
            F.cross_entropy(logits, target)
    rows = hpar.DTensor.from_local(torch.chunk(torch.chunk(full, 2, 0)[rank // 2], 2, 1)[tp].clone(), mesh,
                                   [Shard(0), Shard(1)])
    with hp.loss_parallel(strict=False):
        with pytest.raises(LossParallelLayoutError, match="every mesh axis but the class axis"):
            F.cross_entropy(rows, target)


def test_two_dim_mesh():
    run_ranks(4, two_dim_mesh)


def _run(script: str, pythonpath: str):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_install_names_what_is_missing_without_hyperparallel():
    ours = os.pathsep.join(p for p in os.environ["PYTHONPATH"].split(os.pathsep) if p and p != CHECKOUT)
    r = _run("""
        from hyper_parallel_cpp.integrations import hyperparallel
        try:
            hyperparallel.install()
        except ImportError as e:
            print("refused:", e)
    """, ours)
    assert "refused:" in r.stdout and "HyperParallel is not importable" in r.stdout, r.stdout + r.stderr


def test_install_refuses_a_hyperparallel_with_its_own_loss_parallel():
    # Detected by what the tree contains: a module where newer trees keep their loss_parallel.
    r = _run("""
        import sys, types
        import hyper_parallel.core
        package = types.ModuleType("hyper_parallel.core.tensor_parallel")
        package.__path__ = []
        module = types.ModuleType("hyper_parallel.core.tensor_parallel.loss_parallel")
        module.loss_parallel = lambda **kwargs: None
        sys.modules[package.__name__] = package
        sys.modules[module.__name__] = module
        from hyper_parallel_cpp.integrations import hyperparallel
        try:
            hyperparallel.install()
        except RuntimeError as e:
            print("refused:", e)
    """, os.environ["PYTHONPATH"])
    assert "refused:" in r.stdout and "ships its own loss_parallel" in r.stdout, r.stdout + r.stderr


def target_on_another_mesh(rank, world):
    # dp 2 x tp 2: logits [Replicate(), Shard(1)] on the 2-D mesh; DTensor targets, weights and
    # probability targets Replicate on mesh["dp"] (values that differ along tp), which promises
    # nothing along the class axis: the named error on every rank, as on the PyTorch route.
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError
    mesh = hpar.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_mesh = mesh["dp"]
    tp = rank % 2
    gen = torch.Generator().manual_seed(11)
    full = torch.randn(8, VOCAB, dtype=torch.float64, generator=gen)
    targets = [torch.randint(0, VOCAB, (8,), generator=gen) for _ in range(2)]  # one per tp coordinate
    weights = [torch.rand(VOCAB, dtype=torch.float64, generator=gen) + 0.5 for _ in range(2)]
    probs = [torch.softmax(torch.randn(8, VOCAB, dtype=torch.float64, generator=gen), 1) for _ in range(2)]

    def logits():
        return hpar.DTensor.from_local(torch.chunk(full, 2, 1)[tp].clone(), mesh, [Replicate(), Shard(1)])

    def on_dp(value):
        return hpar.DTensor.from_local(value.clone(), dp_mesh, [Replicate()])

    bad = [
        ("index target", "target", lambda: F.cross_entropy(logits(), on_dp(targets[tp]))),
        ("class weight", "class weight", lambda: F.cross_entropy(logits(), targets[0], weight=on_dp(weights[tp]))),
        ("probability target", "probability target", lambda: F.cross_entropy(logits(), on_dp(probs[tp]))),
        ("nll_loss target", "target", lambda: F.nll_loss(logits(), on_dp(targets[tp]))),
        ("nll_loss weight", "class weight", lambda: F.nll_loss(logits(), targets[0], weight=on_dp(weights[tp]))),
    ]
    for what, named, call in bad:
        with hp.loss_parallel(strict=False):
            with pytest.raises(LossParallelLayoutError, match=f"expected the {named} on the logits' mesh"):
                call()
        # The ranks stayed in step: a good call follows, exact.
        with hp.loss_parallel(strict=False):
            got = F.cross_entropy(logits(), targets[0], weight=weights[0]).to_local()
        assert_close(got, F.cross_entropy(full, targets[0], weight=weights[0]), TOL, f"the call after {what}")
    # The same values on the logits' own mesh are accepted (Replicate on every axis).
    with hp.loss_parallel(strict=False):
        got = F.cross_entropy(logits(), hpar.DTensor.from_local(targets[0].clone(), mesh, [Replicate(), Replicate()]))
    assert_close(got.to_local(), F.cross_entropy(full, targets[0]), TOL, "a Replicate target on the logits' mesh")


def test_a_target_on_another_mesh_is_refused_on_every_rank():
    run_ranks(4, target_on_another_mesh, timeout=180)


def permuted_rank_list(rank, world):
    # rank_list (2, 1, 0): rank 1 sits at its own place in the group (ranks increase), ranks 0
    # and 2 do not. Every rank must refuse, from the rank list alone, before any collective.
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError
    order = (2, 1, 0)
    mesh = hpar.init_device_mesh("cpu", (3,), mesh_dim_names=("tp",), rank_list=order)
    gen = torch.Generator().manual_seed(13)
    full = torch.randn(6, VOCAB, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (6,), generator=gen)

    def logits(on):
        return hpar.DTensor.from_local(_piece(full, list(on.rank_list).index(rank), world, 1), on, [Shard(1)])

    for what, call in [("cross_entropy", lambda: F.cross_entropy(logits(mesh), target)),
                       ("nll_loss", lambda: F.nll_loss(logits(mesh), target)),
                       ("log_softmax", lambda: F.log_softmax(logits(mesh), dim=1))]:
        with hp.loss_parallel():
            with pytest.raises(LossParallelLayoutError, match=r"orders its ranks \[2, 1, 0\]"):
                call()
    # The ranks stayed in step: the same call on an ordered mesh is exact.
    ordered = _tp_mesh(hpar, world)
    with hp.loss_parallel():
        assert_close(F.cross_entropy(logits(ordered), target).to_local(), F.cross_entropy(full, target), TOL,
                     "the call after the permuted mesh")


def test_a_permuted_rank_list_is_refused_on_every_rank():
    run_ranks(3, permuted_rank_list, timeout=120, fresh=True)


def permuted_two_dim_mesh(rank, world):
    # dp 2 x tp 2 with rank_list (0, 1, 3, 2): the tp line (0, 1) is in order, (3, 2) is not.
    # Logits on the whole mesh: every rank reads every line from the rank list and refuses.
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError
    mesh = hpar.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), rank_list=(0, 1, 3, 2))
    gen = torch.Generator().manual_seed(17)
    full = torch.randn(6, VOCAB, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (6,), generator=gen)
    line = (0, 1) if rank in (0, 1) else (3, 2)
    piece = _piece(full, line.index(rank), 2, 1)
    with hp.loss_parallel(strict=False):
        with pytest.raises(LossParallelLayoutError, match=r"orders its ranks \[3, 2\]"):
            F.cross_entropy(hpar.DTensor.from_local(piece, mesh, [Replicate(), Shard(1)]), target)
    # On mesh["tp"], which holds only a rank's own line (and whose copy in the layout no longer
    # knows the mesh it was cut from), the ranks of the disordered line refuse; those of the
    # ordered one compute the exact loss over their own group, which no other rank joins: no rank
    # waits.
    tp_mesh = mesh["tp"]
    with hp.loss_parallel():
        if line == (3, 2):
            with pytest.raises(LossParallelLayoutError, match=r"orders its ranks \[3, 2\]"):
                F.cross_entropy(hpar.DTensor.from_local(piece, tp_mesh, [Shard(1)]), target)
        else:
            got = F.cross_entropy(hpar.DTensor.from_local(piece, tp_mesh, [Shard(1)]), target).to_local()
            assert_close(got, F.cross_entropy(full, target), TOL, "an ordered line of a permuted mesh")


def test_a_permuted_two_dim_mesh_is_refused_on_every_rank():
    run_ranks(4, permuted_two_dim_mesh, timeout=120)


def _fake_mindspore(tmp_path):
    """A folder holding an importable stand-in `mindspore` package (what HyperParallel probes)."""
    (tmp_path / "mindspore").mkdir()
    (tmp_path / "mindspore" / "__init__.py").write_text("STAND_IN = True\n")
    return str(tmp_path)


_INSTALL = """
    import sys
    from hyper_parallel_cpp.integrations import hyperparallel
    try:
        hyperparallel.install()
    except hyperparallel.HyperParallelPlatformError as e:
        print("refused:", e)
        print("hyper_parallel imported:", "hyper_parallel" in sys.modules)
    else:
        from hyper_parallel.platform import get_platform
        print("installed:", hyperparallel.is_installed(), type(get_platform()).__name__)
"""


def _without_platform_variable(**extra):
    env = {k: v for k, v in os.environ.items() if k != "HYPER_PARALLEL_PLATFORM"}
    env.update(extra)
    return env


def test_install_refuses_when_mindspore_would_be_selected(tmp_path):
    # HyperParallel prefers MindSpore whenever `import mindspore` works: refused before importing it.
    path = _fake_mindspore(tmp_path) + os.pathsep + os.environ["PYTHONPATH"]
    env = _without_platform_variable(PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_INSTALL)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "refused:" in r.stdout, r.stdout + r.stderr
    assert "HYPER_PARALLEL_PLATFORM=torch" in r.stdout and "mindspore is importable" in r.stdout, r.stdout
    assert "hyper_parallel imported: False" in r.stdout, r.stdout
    # HYPER_PARALLEL_PLATFORM=mindspore says so, whether or not mindspore is there.
    env = _without_platform_variable(PYTHONPATH=os.environ["PYTHONPATH"], HYPER_PARALLEL_PLATFORM="mindspore")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_INSTALL)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "refused:" in r.stdout and "HYPER_PARALLEL_PLATFORM=mindspore selects" in r.stdout, r.stdout + r.stderr


def test_install_works_beside_mindspore_with_the_torch_platform_named(tmp_path):
    path = _fake_mindspore(tmp_path) + os.pathsep + os.environ["PYTHONPATH"]
    env = _without_platform_variable(PYTHONPATH=path, HYPER_PARALLEL_PLATFORM="torch")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_INSTALL)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "installed: True TorchPlatform" in r.stdout, r.stdout + r.stderr


def test_install_refuses_a_hyperparallel_that_selected_another_platform():
    # What HyperParallel selected decides, not the variable as it reads now: a stand-in MindSpore
    # platform chosen before install().
    r = _run("""
        import hyper_parallel.platform.platform as chooser
        class MindSporePlatform:
            pass
        MindSporePlatform.__module__ = "hyper_parallel.platform.mindspore.platform"
        chooser.platform = MindSporePlatform()
        from hyper_parallel_cpp.integrations import hyperparallel
        try:
            hyperparallel.install()
        except hyperparallel.HyperParallelPlatformError as e:
            print("refused:", e)
    """, os.environ["PYTHONPATH"])
    assert "refused:" in r.stdout and "MindSporePlatform, not on torch" in r.stdout, r.stdout + r.stderr
    assert "HYPER_PARALLEL_PLATFORM=torch" in r.stdout, r.stdout


def context_on_one_rank_only(rank, world):
    # loss_parallel() entered on rank 0 only: rank 1's call outside the context used to raise
    # there while rank 0 waited in its record's all-gather until the process group's timeout.
    # Rank 1 now meets rank 0 in that record first: the same named error on both, and both in step.
    hpar, hp, Shard, Replicate = _hp()
    from hyper_parallel_cpp import LossParallelLayoutError
    mesh = _tp_mesh(hpar, world)
    gen = torch.Generator().manual_seed(17)
    full = torch.randn(6, VOCAB, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (6,), generator=gen)
    x = hpar.DTensor.from_local(_piece(full, rank, world, 1), mesh, [Shard(1)])
    for loss in (F.cross_entropy, F.nll_loss):
        with pytest.raises(LossParallelLayoutError,
                           match=r"disagree on the loss_parallel context .*rank\(s\) 1: outside loss_parallel\(\)"):
            if rank == 0:
                with hp.loss_parallel():
                    loss(x, target)
            else:
                loss(x, target)
    with hp.loss_parallel():
        assert_close(F.cross_entropy(x, target).to_local(), F.cross_entropy(full, target), TOL, "the call after")


def test_a_context_entered_on_one_rank_only_is_the_same_named_error_on_every_rank():
    run_ranks(2, context_on_one_rank_only, timeout=120)
