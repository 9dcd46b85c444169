"""Every rank agrees or every rank refuses (issue 55): options, row counts, dtypes and the
vocabulary that differ between the two ranks of a TP 2 group are the same named
LossParallelLayoutError (a ValueError) on both, on every loss path of the package, and nll_loss
is as strict as PyTorch's with its checks settled on every rank. The ranks are processes: a
rank that dies (a Gloo abort when the gathers' sizes differ) fails the test."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from ranks import run_ranks

VOCAB = 13  # pieces 7 and 6
ROWS = 6


def _same(rank, full):
    dist.broadcast(full, 0)
    return full


def _expect_named(field, fn):
    """fn raises LossParallelLayoutError naming `field` and rank 1, the same text on every rank."""
    with pytest.raises(hp.LossParallelLayoutError, match=rf"disagree on the {field}.*rank\(s\) 1: ") as info:
        fn()
    assert isinstance(info.value, ValueError)
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, str(info.value))
    assert all(t == texts[0] for t in texts), texts


def options_that_differ(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    target = torch.arange(ROWS) % VOCAB
    x = distribute_tensor(logits, mesh, [Shard(1)])
    piece = torch.chunk(logits, world, dim=-1)[rank]
    weight = torch.rand(VOCAB, dtype=torch.float64) + 0.5
    dist.broadcast(weight, 0)
    one = rank == 1
    # Under loss_parallel on PyTorch's DTensor: the guard's options and F.cross_entropy's.
    for field, options in [("logit_softcap", {"logit_softcap": 5.0}), ("z_loss_weight", {"z_loss_weight": 1e-3})]:
        def call(options=options):
            with hp.loss_parallel(**(options if one else {})):
                F.cross_entropy(x, target)
        _expect_named(field, call)
        # log_softmax and nll_loss refuse those options: on every rank, as a difference, not
        # on rank 1 alone while rank 0 goes on into the collectives.
        def log_softmax(options=options):
            with hp.loss_parallel(**(options if one else {})):
                F.log_softmax(x, 1)
        _expect_named(field, log_softmax)
        def nll_loss(options=options):
            with hp.loss_parallel(**(options if one else {})):
                F.nll_loss(x, target)
        _expect_named(field, nll_loss)
    for field, kwargs in [("label_smoothing", {"label_smoothing": 0.1}), ("reduction", {"reduction": "sum"}),
                          ("ignore_index", {"ignore_index": 3}), ("class weight", {"weight": weight * 2})]:
        def call(kwargs=kwargs):
            with hp.loss_parallel():
                F.cross_entropy(x, target, **(kwargs if one else {"weight": weight} if "weight" in kwargs else {}))
        _expect_named(field, call)
    # The functional op: a vocabulary of V + 1 passes rank 0's own piece check (7 of 14).
    with pytest.raises(hp.LossParallelLayoutError, match=r"disagree on the vocabulary size"):
        hp.vocab_parallel_cross_entropy(piece, target, vocab_size=VOCAB + 1 if rank == 0 else VOCAB)
    _expect_named("logit_softcap",
                  lambda: hp.vocab_parallel_cross_entropy(piece, target, logit_softcap=5.0 if one else 0.0))
    # After all of that the group still works, exactly.
    with hp.loss_parallel():
        loss = F.cross_entropy(x, target)
    torch.testing.assert_close(loss.full_tensor(), F.cross_entropy(logits, target), rtol=1e-12, atol=1e-12)


def test_options_that_differ_between_ranks_are_the_same_named_error():
    run_ranks(2, options_that_differ)


def rows_dtypes_and_vocabularies_that_differ(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    piece = torch.chunk(logits, world, dim=-1)[rank]
    rows = ROWS - 2 if rank == 1 else ROWS
    target = torch.arange(rows) % VOCAB
    short = piece[:rows]
    _expect_named("row count", lambda: hp.vocab_parallel_cross_entropy(short, target))
    _expect_named("row count", lambda: hp.vocab_parallel_log_softmax(short))
    _expect_named("row count", lambda: hp.vocab_parallel_nll_loss(short, target, reduction="none"))
    head = _same(rank, torch.randn(VOCAB, 4, dtype=torch.float64))
    hidden = torch.randn(rows, 4, dtype=torch.float64)
    _expect_named("row count",
                  lambda: hp.fused_linear_cross_entropy(hidden, torch.chunk(head, world)[rank], target))
    x = DTensor.from_local(short, mesh, [Shard(1)], shape=(rows, VOCAB), stride=(VOCAB, 1))
    with hp.loss_parallel():
        _expect_named("row count", lambda: F.cross_entropy(x, target))
        _expect_named("row count", lambda: F.log_softmax(x, 1))
    # dtypes
    mixed = piece.float() if rank == 1 else piece
    full_target = torch.arange(ROWS) % VOCAB
    _expect_named("dtype", lambda: hp.vocab_parallel_cross_entropy(mixed, full_target))
    _expect_named("dtype", lambda: hp.vocab_parallel_log_softmax(mixed))
    # from_local without shape=: rank 0 takes 14 classes, rank 1 12.
    uneven = DTensor.from_local(piece, mesh, [Shard(1)])
    with hp.loss_parallel():
        with pytest.raises(hp.LossParallelLayoutError, match=r"disagree on the vocabulary size"):
            F.cross_entropy(uneven, full_target)
    # And the group still works.
    with hp.loss_parallel():
        loss = F.cross_entropy(distribute_tensor(logits, mesh, [Shard(1)]), full_target)
    torch.testing.assert_close(loss.full_tensor(), F.cross_entropy(logits, full_target), rtol=1e-12, atol=1e-12)


def test_rows_dtypes_and_vocabularies_that_differ_are_the_same_named_error_not_a_dead_rank():
    run_ranks(2, rows_dtypes_and_vocabularies_that_differ)


def nll_loss_as_strict_as_pytorchs(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    logp = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64)).log_softmax(1)
    target = torch.arange(ROWS) % VOCAB
    x = distribute_tensor(logp, mesh, [Shard(1)])
    piece = torch.chunk(logp, world, dim=-1)[rank]
    cases = [
        (ValueError, r"Expected input batch_size \(6\) to match target batch_size \(3\)", target[:3], None),
        (ValueError, r"Expected input batch_size \(6\) to match target batch_size \(2\)", target.view(2, 3), None),
        (RuntimeError, r"expected target dtype to be Long or Byte, but got Int", target.int(), None),
        (RuntimeError, r"weight tensor should be defined either for all 13 classes",
         target, torch.ones(VOCAB - 1, dtype=torch.float64)),
        (RuntimeError, r"weight tensor should be defined either for all 13 classes",
         target, torch.ones(VOCAB + 3, dtype=torch.float64)),
        (RuntimeError, r"expected scalar type Double but found Float", target, torch.ones(VOCAB)),
    ]
    for exc, match, t, w in cases:
        with pytest.raises(exc, match=match):
            F.nll_loss(logp, t, weight=w)  # PyTorch itself
        with pytest.raises(exc, match=match):
            hp.vocab_parallel_nll_loss(piece, t, weight=w)
        with pytest.raises(exc, match=match):
            with hp.loss_parallel():
                F.nll_loss(x, t, weight=w)
    # A target out of range on rank 1 only: the same error on both, and a loop that catches
    # it and goes on finds both ranks in step.
    bad = target.clone()
    if rank == 1:
        bad[2] = VOCAB + 4
    for _ in range(2):
        with pytest.raises(RuntimeError, match=rf"refused on rank\(s\) 1 .*Target {VOCAB + 4} is out of bounds"):
            hp.vocab_parallel_nll_loss(piece, bad)
        with pytest.raises(RuntimeError, match=rf"refused on rank\(s\) 1 .*Target {VOCAB + 4} is out of bounds"):
            with hp.loss_parallel():
                F.nll_loss(x, bad)
        torch.testing.assert_close(hp.vocab_parallel_nll_loss(piece, target), F.nll_loss(logp, target),
                                   rtol=1e-12, atol=1e-12)


def test_nll_loss_is_as_strict_as_pytorchs_and_settles_its_checks_on_every_rank():
    run_ranks(2, nll_loss_as_strict_as_pytorchs)


def _chunk(full, rank, world):
    """This rank's torch.chunk piece of the last dim (empty past the last chunk), as Shard(-1)."""
    pieces = torch.chunk(full, world, dim=-1)
    return pieces[rank] if rank < len(pieces) else full.narrow(-1, full.shape[-1], 0)


def _close(got, want, what):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-12, atol=1e-12, msg=what)


def empty_vocabulary_pieces(rank, world):
    # V = 2 over 3 ranks: torch.chunk (and DTensor's Shard) give 1, 1, 0.
    vocab = 2
    gen = torch.Generator().manual_seed(3)
    full = torch.randn(ROWS, vocab, dtype=torch.float64, generator=gen) * 3
    target = torch.randint(0, vocab, (ROWS,), generator=gen)
    seed = torch.randn(ROWS, dtype=torch.float64, generator=gen)
    coef = torch.randn(ROWS, vocab, dtype=torch.float64, generator=gen)
    group = dist.group.WORLD
    ref_x = full.clone().requires_grad_()
    ref = F.cross_entropy(ref_x, target, reduction="none", label_smoothing=0.1)
    ref_grad, = torch.autograd.grad((ref * seed).sum(), ref_x)
    ref_lp = torch.log_softmax(ref_x, -1)
    ref_lp_grad, = torch.autograd.grad((ref_lp * coef).sum(), ref_x)
    for given in (vocab, None):
        x = _chunk(full, rank, world).clone().requires_grad_()
        loss = hp.vocab_parallel_cross_entropy(x, target, group, vocab_size=given, reduction="none",
                                               label_smoothing=0.1)
        (loss * seed).sum().backward()
        _close(loss, ref, f"cross-entropy vocab_size={given}")
        _close(x.grad, _chunk(ref_grad, rank, world), f"cross-entropy gradient vocab_size={given}")

        x = _chunk(full, rank, world).clone().requires_grad_()
        lp = hp.vocab_parallel_log_softmax(x, group, vocab_size=given)
        (lp * _chunk(coef, rank, world)).sum().backward()
        _close(lp, _chunk(ref_lp, rank, world), f"log_softmax vocab_size={given}")
        _close(x.grad, _chunk(ref_lp_grad, rank, world), f"log_softmax gradient vocab_size={given}")
        nll = hp.vocab_parallel_nll_loss(lp.detach(), target, group, vocab_size=given)
        _close(nll, F.nll_loss(ref_lp, target), f"nll_loss vocab_size={given}")

    # The same through PyTorch's DTensor under loss_parallel.
    mesh = init_device_mesh("cpu", (world,))
    ref_grad, = torch.autograd.grad((F.cross_entropy(ref_x, target, reduction="none") * seed).sum(), ref_x)
    x = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
    assert x.to_local().shape[1] == (0 if rank == 2 else 1)
    with hp.loss_parallel():
        loss = F.cross_entropy(x, target, reduction="none")
        (loss.to_local() * seed).sum().backward()
    _close(loss.full_tensor(), F.cross_entropy(full, target, reduction="none"), "DTensor cross-entropy")
    _close(x.grad.to_local(), _chunk(ref_grad, rank, world), "DTensor cross-entropy gradient")
    with hp.loss_parallel():
        lp = F.log_softmax(distribute_tensor(full, mesh, [Shard(1)]), -1)
        nll = F.nll_loss(lp, target)
    _close(lp.to_local(), _chunk(torch.log_softmax(full, -1), rank, world), "DTensor log_softmax")
    _close(nll.full_tensor() if isinstance(nll, DTensor) else nll, F.nll_loss(torch.log_softmax(full, -1), target),
           "DTensor nll_loss")

    # And the fused linear head: its rows are the classes, so the third rank holds none.
    hidden = torch.randn(ROWS, 4, dtype=torch.float64, generator=gen).requires_grad_()
    head = torch.randn(vocab, 4, dtype=torch.float64, generator=gen)
    ref = F.cross_entropy(hidden @ head.T, target)
    ref_h, = torch.autograd.grad(ref, hidden)
    local = torch.chunk(head, world, 0)[rank] if rank < 2 else head[:0]
    loss = hp.fused_linear_cross_entropy(hidden, local, target, group)
    got_h, = torch.autograd.grad(loss, hidden)
    _close(loss, ref, "fused linear cross-entropy")
    _close(got_h, ref_h, "fused linear hidden gradient")


def test_empty_vocabulary_pieces_are_exact_on_every_python_path():
    run_ranks(3, empty_vocabulary_pieces)


# --- issue 68: what the record did not cover -------------------------------------------------


def target_kinds_that_differ(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    probs = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64).softmax(1))
    index = torch.arange(ROWS) % VOCAB
    piece = torch.chunk(logits, world, dim=-1)[rank]
    one = rank == 1
    # Index targets on rank 0, probabilities on rank 1: a different plausible loss on each, before.
    _expect_named("target kind", lambda: hp.vocab_parallel_cross_entropy(
        piece, torch.chunk(probs, world, dim=-1)[rank] if one else index))
    x = distribute_tensor(logits, mesh, [Shard(1)])
    sharded_probs = distribute_tensor(probs, mesh, [Shard(1)])
    with hp.loss_parallel():
        _expect_named("target kind", lambda: F.cross_entropy(x, sharded_probs if one else index))


def test_index_targets_on_one_rank_and_probabilities_on_another_are_the_same_named_error():
    run_ranks(2, target_kinds_that_differ)


def hidden_sizes_that_differ(rank, world):
    dim = 4 if rank == 1 else 8
    hidden = torch.randn(ROWS, dim, dtype=torch.float64)
    head = torch.chunk(torch.randn(VOCAB, dim, dtype=torch.float64), world)[rank]
    target = torch.arange(ROWS) % VOCAB
    # Under no_grad (old / reference log-probabilities in RL) they were wrong values on both
    # ranks; with grad a Gloo abort in backward's all-reduce of hidden's gradient.
    with torch.no_grad():
        _expect_named("hidden size", lambda: hp.fused_linear_cross_entropy(hidden, head, target))
        _expect_named("hidden size", lambda: hp.fused_linear_logprobs(hidden, head, target))
    h = hidden.clone().requires_grad_()
    _expect_named("hidden size", lambda: hp.fused_linear_cross_entropy(h, head, target).backward())
    _expect_named("hidden size", lambda: hp.fused_linear_logprobs(h, head, target).sum().backward())


def test_hidden_sizes_that_differ_are_the_same_named_error_not_wrong_values_or_an_abort():
    run_ranks(2, hidden_sizes_that_differ)


def vocabulary_sources_and_ops_that_differ(rank, world):
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    piece = torch.chunk(logits, world, dim=-1)[rank]
    logp = torch.chunk(logits.log_softmax(1), world, dim=-1)[rank]
    target = torch.arange(ROWS) % VOCAB
    given = None if rank == 1 else VOCAB
    # vocab_size None on one rank only: a Gloo abort ("80 vs 4") on one rank, before.
    _expect_named("vocabulary's source", lambda: hp.vocab_parallel_log_softmax(piece, vocab_size=given))
    _expect_named("vocabulary's source", lambda: hp.vocab_parallel_nll_loss(logp, target, vocab_size=given))
    _expect_named("vocabulary's source", lambda: hp.vocab_parallel_cross_entropy(piece, target, vocab_size=given))
    # Cross-entropy on one rank, log_softmax on the other: "op with hash 0" garbled, before.
    for vocab in (None, VOCAB):
        if rank == 0:
            call = lambda: hp.vocab_parallel_cross_entropy(piece, target, vocab_size=vocab)  # noqa: E731
        else:
            call = lambda: hp.vocab_parallel_log_softmax(piece, vocab_size=vocab)  # noqa: E731
        _expect_named("loss op", call)
    # None everywhere: one process's values and gradients, log_softmax in one collective
    # forward (the record learns the vocabulary) and one backward.
    x = piece.clone().requires_grad_()
    _C.reset_collective_counts()
    lp = hp.vocab_parallel_log_softmax(x)
    forward = dict(_C.collective_counts())
    _C.reset_collective_counts()
    (lp * lp.detach().exp()).sum().backward()
    backward = dict(_C.collective_counts())
    assert forward["all_gather"] == 1 and forward["all_reduce"] == 2 and sum(forward.values()) == 3, forward
    assert backward["all_reduce"] == 1 and sum(backward.values()) == 1, backward
    ref = logits.clone().requires_grad_()
    ref_lp = ref.log_softmax(1)
    (ref_lp * ref_lp.detach().exp()).sum().backward()
    torch.testing.assert_close(lp, torch.chunk(ref_lp, world, dim=-1)[rank], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, torch.chunk(ref.grad, world, dim=-1)[rank], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hp.vocab_parallel_nll_loss(logp, target), F.nll_loss(logits.log_softmax(1), target),
                               rtol=1e-12, atol=1e-12)


def test_a_vocabulary_given_on_one_rank_only_or_another_op_is_the_same_named_error_not_an_abort():
    run_ranks(2, vocabulary_sources_and_ops_that_differ)


def shapes_that_differ_beyond_rows(rank, world):
    a = _same(rank, torch.randn(12, 12, dtype=torch.float64))
    # [12, 6] with dim 1 on rank 0, [6, 12] with dim 0 on rank 1: the same 12 rows, garbage before.
    local = a[:, :6] if rank == 0 else a[6:, :]
    _expect_named("class dim", lambda: hp.vocab_parallel_log_softmax(local.contiguous(), vocab_size=12,
                                                                      dim=1 if rank == 0 else 0))
    piece = torch.chunk(_same(rank, torch.randn(6, VOCAB, dtype=torch.float64)), world, dim=-1)[rank]
    _expect_named("logits' shape", lambda: hp.vocab_parallel_log_softmax(piece.reshape(3 if rank else 2, -1,
                                                                                        piece.shape[-1])))


def test_shapes_that_differ_beyond_the_row_count_are_the_same_named_error():
    run_ranks(2, shapes_that_differ_beyond_rows)


def check_replicated_compares_what_is_replicated(rank, world):
    import os
    mesh = init_device_mesh("cpu", (world,))
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    probs = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64).softmax(1))
    index = torch.arange(ROWS) % VOCAB
    want = F.cross_entropy(logits, probs)
    os.environ["HYPER_PARALLEL_CHECK_REPLICATED"] = "1"
    try:
        # Legitimate probability targets, refused on every rank before: this rank's piece
        # (functional), a sharded or a whole DTensor target (loss_parallel).
        got = hp.vocab_parallel_cross_entropy(torch.chunk(logits, world, dim=-1)[rank],
                                              torch.chunk(probs, world, dim=-1)[rank])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        x = distribute_tensor(logits, mesh, [Shard(1)])
        with hp.loss_parallel():
            for t in (distribute_tensor(probs, mesh, [Shard(1)]), distribute_tensor(probs, mesh, [Replicate()]), probs):
                torch.testing.assert_close(F.cross_entropy(x, t).full_tensor(), want, rtol=1e-12, atol=1e-12)
        # What is meant to be replicated is still compared: index targets that differ.
        bad = index.clone()
        if rank == 1:
            bad[0] = 5
        with pytest.raises(RuntimeError, match=r"the target differs between ranks: rank\(s\) 1"):
            hp.vocab_parallel_cross_entropy(torch.chunk(logits, world, dim=-1)[rank], bad)
    finally:
        del os.environ["HYPER_PARALLEL_CHECK_REPLICATED"]


def test_check_replicated_compares_what_is_meant_to_be_replicated_and_nothing_else():
    run_ranks(2, check_replicated_compares_what_is_replicated)


def strictness_that_differs(rank, world):
    # What loss_parallel()'s strictness decides alone on a mesh of more than one dim: the
    # ranks agree on it first (_C.agree_on_loss_strictness), so a difference is named.
    logits = torch.randn(ROWS, VOCAB, dtype=torch.float64)
    group = dist.group.WORLD.group_name
    _expect_named("loss_parallel strictness",
                  lambda: _C.agree_on_loss_strictness("vocab_parallel_cross_entropy", rank == 0, [group], logits))
    # One group: the strict rank meets a non-strict one in its call's record.
    piece = torch.chunk(logits, world, dim=-1)[rank]
    if rank == 0:
        call = lambda: _C.agree_on_loss_strictness("vocab_parallel_cross_entropy", True, [group], logits)  # noqa: E731
    else:
        call = lambda: hp.vocab_parallel_cross_entropy(piece, torch.arange(ROWS) % VOCAB)  # noqa: E731
    _expect_named("loss_parallel strictness", call)
    _C.agree_on_loss_strictness("vocab_parallel_cross_entropy", True, [group], logits)  # agreed: no error


def test_strictness_that_differs_between_ranks_is_the_same_named_error():
    run_ranks(2, strictness_that_differs)


def context_on_one_rank_only(rank, world):
    # A route that sees a loss it would own called outside loss_parallel() (the HyperParallel
    # route's _outside_context) meets the ranks inside it in their call's record
    # (_C.agree_outside_loss_parallel) before refusing: a context entered on rank 0 only is
    # named on both ranks, not an error on one and a wait in the all-gather on the other.
    logits = _same(rank, torch.randn(ROWS, VOCAB, dtype=torch.float64))
    piece = torch.chunk(logits, world, dim=-1)[rank]
    target = torch.arange(ROWS) % VOCAB
    group = dist.group.WORLD.group_name
    op = "vocab_parallel_cross_entropy"
    if rank == 0:
        call = lambda: hp.vocab_parallel_cross_entropy(piece, target, vocab_size=VOCAB)  # noqa: E731
    else:
        call = lambda: _C.agree_outside_loss_parallel(op, group, piece)  # noqa: E731
    _expect_named("loss_parallel context", call)
    _C.agree_outside_loss_parallel(op, group, piece)  # outside on every rank: agreed, the caller refuses
    torch.testing.assert_close(hp.vocab_parallel_cross_entropy(piece, target), F.cross_entropy(logits, target),
                               rtol=1e-12, atol=1e-12)


def test_a_context_entered_on_one_rank_only_is_the_same_named_error():
    run_ranks(2, context_on_one_rank_only)
