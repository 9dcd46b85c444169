"""vocab_parallel_logprobs and fused_linear_logprobs on real processes: against one process's
PyTorch in float64 (values and gradients for random upstream gradients on both outputs),
TP 1-4, their collective budget, -cross_entropy bit for bit at temperature 1,
torch.compile(fullgraph=True), and bfloat16 accuracy against PyTorch's own bfloat16."""

import pytest
import torch
import torch.distributed as dist

import hyper_parallel_cpp as hp
from hyper_parallel_cpp import _C
from ranks import assert_close, run_ranks

VOCAB = 13


def _piece(full, rank, world, dim=-1):
    pieces = torch.chunk(full, world, dim=dim)
    return pieces[rank] if rank < len(pieces) else full.narrow(dim, full.shape[dim], 0)


def _reference(full, target, temperature, g_lp, g_h, ignore_index=-100):
    """PyTorch on the whole logits, float64: log_softmax(x / T) at the target, the entropy."""
    x = full.detach().double().requires_grad_()
    lsm = torch.log_softmax(x / temperature, -1)
    valid = target != ignore_index
    lp = lsm.gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1) * valid
    entropy = -(lsm.exp() * lsm).sum(-1) * valid
    (lp * g_lp + entropy * g_h).sum().backward()
    return lp.detach(), entropy.detach(), x.grad


def logprobs_exactness(rank, world):
    gen = torch.Generator().manual_seed(5)
    group = dist.group.WORLD
    for temperature, vocab_size in [(1.0, VOCAB), (0.6, None), (1.7, VOCAB)]:
        full = torch.randn(3, 4, VOCAB, dtype=torch.float64, generator=gen) * 4
        target = torch.randint(0, VOCAB, (3, 4), generator=gen)
        target[1, ::2] = -100
        g_lp = torch.randn(3, 4, dtype=torch.float64, generator=gen)
        g_h = torch.randn(3, 4, dtype=torch.float64, generator=gen)
        ref_lp, ref_h, ref_grad = _reference(full, target, temperature, g_lp, g_h)
        x = _piece(full, rank, world).clone().requires_grad_()
        _C.reset_collective_counts()
        lp, h = hp.vocab_parallel_logprobs(x, target, group, temperature=temperature, return_entropy=True,
                                           vocab_size=vocab_size)
        forward = _C.collective_counts()
        _C.reset_collective_counts()
        (lp * g_lp + h * g_h).sum().backward()
        what = f"rank {rank}/{world} T={temperature}"
        assert_close(lp, ref_lp, 1e-12, what + " log-probabilities")
        assert_close(h, ref_h, 1e-12, what + " entropy")
        assert_close(x.grad, _piece(ref_grad, rank, world), 1e-12, what + " gradient")
        # The call's record, then the per-row statistics; nothing backward.
        want = 1 if world == 1 else 2
        assert forward["all_gather"] == want and sum(forward.values()) == want, (what, forward)
        assert sum(_C.collective_counts().values()) == 0, (what, "backward collectives")
        # The log-probabilities alone (no entropy asked): their own gradient.
        y = _piece(full, rank, world).clone().requires_grad_()
        (hp.vocab_parallel_logprobs(y, target, group, temperature=temperature) * g_lp).sum().backward()
        assert_close(y.grad, _piece(_reference(full, target, temperature, g_lp, 0 * g_h)[2], rank, world), 1e-12,
                     what + " gradient of the log-probabilities alone")


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_logprobs_match_one_process(world):
    run_ranks(world, logprobs_exactness)


def dtensor_logits(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    gen = torch.Generator().manual_seed(9)
    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(2, 3, VOCAB, dtype=torch.float64, generator=gen) * 3
    target = torch.randint(0, VOCAB, (2, 3), generator=gen)
    g_lp = torch.randn(2, 3, dtype=torch.float64, generator=gen)
    g_h = torch.randn(2, 3, dtype=torch.float64, generator=gen)
    ref_lp, ref_h, ref_grad = _reference(full, target, 1.4, g_lp, g_h)
    x = distribute_tensor(full, mesh, [Shard(2)]).requires_grad_()
    lp, h = hp.vocab_parallel_logprobs(x, target, temperature=1.4, return_entropy=True)
    assert lp.placements == (Replicate(),) and h.placements == (Replicate(),)
    (lp.to_local() * g_lp + h.to_local() * g_h).sum().backward()
    assert x.grad.placements == (Shard(2),)
    assert_close(lp.full_tensor(), ref_lp, 1e-12, "log-probabilities")
    assert_close(h.full_tensor(), ref_h, 1e-12, "entropy")
    assert_close(x.grad.full_tensor(), ref_grad, 1e-12, "gradient")


@pytest.mark.parametrize("world", [1, 3])
def test_pytorch_dtensor_logits_give_replicated_results(world):
    run_ranks(world, dtensor_logits)


def fused_linear_exactness(rank, world):
    gen = torch.Generator().manual_seed(6)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, generator=gen)
    weight = torch.randn(VOCAB, 8, dtype=torch.float64, generator=gen)
    target = torch.randint(0, VOCAB, (2, 5), generator=gen)
    target[0, 1] = -100
    g_lp = torch.randn(2, 5, dtype=torch.float64, generator=gen)
    g_h = torch.randn(2, 5, dtype=torch.float64, generator=gen)
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lsm = torch.log_softmax(h_ref @ w_ref.T / 0.8, -1)
    valid = target != -100
    ref_lp = lsm.gather(-1, torch.where(valid, target, 0).unsqueeze(-1)).squeeze(-1) * valid
    ref_h = -(lsm.exp() * lsm).sum(-1) * valid
    (ref_lp * g_lp + ref_h * g_h).sum().backward()
    h = hidden.clone().requires_grad_()
    w = _piece(weight, rank, world, 0).clone().requires_grad_()
    lp, ent = hp.fused_linear_logprobs(h, w, target, dist.group.WORLD, temperature=0.8, return_entropy=True)
    (lp * g_lp + ent * g_h).sum().backward()
    what = f"rank {rank}/{world}"
    assert_close(lp, ref_lp, 1e-12, what + " log-probabilities")
    assert_close(ent, ref_h, 1e-12, what + " entropy")
    assert_close(h.grad, h_ref.grad, 1e-12, what + " hidden's gradient")
    assert_close(w.grad, _piece(w_ref.grad, rank, world, 0), 1e-12, what + " weight's gradient")


@pytest.mark.parametrize("world", [1, 3])
def test_fused_linear_logprobs_match_one_process(world):
    run_ranks(world, fused_linear_exactness)


def temperature_one_and_compile(rank, world):
    gen = torch.Generator().manual_seed(7)
    group = dist.group.WORLD
    full = (torch.randn(8, 4001, generator=gen) * 3).bfloat16()
    target = torch.randint(0, 4001, (8,), generator=gen)
    x = _piece(full, rank, world).contiguous()
    lp = hp.vocab_parallel_logprobs(x, target, group)
    ce = hp.vocab_parallel_cross_entropy(x, target, group, reduction="none")
    assert torch.equal(lp, -ce), "log-probabilities at T = 1 are not -cross_entropy bit for bit"

    def grpo_like(logits, old_logp):
        logp, entropy = hp.vocab_parallel_logprobs(logits, target, group, temperature=0.7, return_entropy=True)
        ratio = torch.exp(logp.float() - old_logp)
        return -(ratio.mean() + 0.01 * entropy.float().mean())

    old = torch.randn(8, generator=gen) * 0.1 - 3
    eager_x = x.float().clone().requires_grad_()
    compiled_x = x.float().clone().requires_grad_()
    eager = grpo_like(eager_x, old)
    eager.backward()
    compiled = torch.compile(grpo_like, fullgraph=True)(compiled_x, old)
    compiled.backward()
    assert_close(compiled, eager, 1e-6, "compiled loss")
    assert_close(compiled_x.grad, eager_x.grad, 1e-6, "compiled gradient")


def test_bit_for_bit_at_temperature_one_and_torch_compile_fullgraph():
    run_ranks(2, temperature_one_and_compile, timeout=400)


def bfloat16_accuracy(rank, world):
    gen = torch.Generator().manual_seed(8)
    full = (torch.randn(32, 3001, generator=gen) * 4).bfloat16()
    target = torch.randint(0, 3001, (32,), generator=gen)
    g_lp = torch.randn(32, dtype=torch.float64, generator=gen)
    g_h = torch.randn(32, dtype=torch.float64, generator=gen) * 0.1
    ref_lp, ref_h, ref_grad = _reference(full.double(), target, 0.7, g_lp, g_h)
    # PyTorch in bfloat16 itself, as a user writes it without us.
    xt = full.clone().requires_grad_()
    lsm = torch.log_softmax(xt / 0.7, -1)
    theirs_lp = lsm.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    theirs_h = -(lsm.exp() * lsm).sum(-1)
    (theirs_lp * g_lp.bfloat16() + theirs_h * g_h.bfloat16()).sum().backward()
    x = _piece(full, rank, world).clone().requires_grad_()
    lp, h = hp.vocab_parallel_logprobs(x, target, dist.group.WORLD, temperature=0.7, return_entropy=True)
    (lp * g_lp.bfloat16() + h * g_h.bfloat16()).sum().backward()

    def err(a, b):
        return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1)).item()

    assert err(lp, ref_lp) <= err(theirs_lp, ref_lp), (err(lp, ref_lp), err(theirs_lp, ref_lp))
    assert err(h, ref_h) <= err(theirs_h, ref_h), (err(h, ref_h), err(theirs_h, ref_h))
    mine, theirs = err(x.grad, _piece(ref_grad, rank, world)), err(_piece(xt.grad, rank, world),
                                                                    _piece(ref_grad, rank, world))
    assert mine <= theirs, (mine, theirs)


def test_bfloat16_at_least_as_accurate_as_pytorch_in_bfloat16():
    run_ranks(2, bfloat16_accuracy)


def temperature_differs(rank, world):
    x = torch.randn(4, 7)
    target = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"disagree on the temperature \(rank\(s\) 0: 1; rank\(s\) 1: 0.5\)"):
        hp.vocab_parallel_logprobs(x, target, dist.group.WORLD, temperature=1.0 if rank == 0 else 0.5)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got -1"):
        hp.vocab_parallel_logprobs(x, target, dist.group.WORLD, temperature=-1.0)


def test_bad_options_are_the_same_named_error_on_every_rank():
    run_ranks(2, temperature_differs)
