"""The loss_parallel() context itself, in one process: plain tensors inside it are PyTorch's (as
under PyTorch's own loss_parallel), and its state is per entry, so any order of exits restores
it."""

import contextvars

import torch
import torch.nn as nn
import torch.nn.functional as F

import hyper_parallel_cpp as hp


def _inputs():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 11, dtype=torch.float64, generator=gen)
    target = torch.randint(0, 11, (6,), generator=gen)
    target[1] = -100
    weight = torch.rand(11, dtype=torch.float64, generator=gen) + 0.5
    return logits, target, weight


def test_plain_tensors_inside_the_context_are_pytorchs_own():
    logits, target, weight = _inputs()
    calls = [
        lambda x: F.cross_entropy(x, target, weight=weight, label_smoothing=0.1),
        lambda x: nn.CrossEntropyLoss(reduction="sum")(x, target),
        lambda x: F.cross_entropy(x, torch.softmax(logits, 1)),
        lambda x: F.nll_loss(F.log_softmax(x, 1), target, weight=weight),
        lambda x: torch.log_softmax(x, 1).sum(),
        lambda x: x.log_softmax(-1).sum(),
    ]
    for strict in (None, True, False):
        for n, call in enumerate(calls):
            want_x = logits.clone().requires_grad_()
            want = call(want_x)
            want.backward()
            x = logits.clone().requires_grad_()
            with hp.loss_parallel(strict=strict):
                got = call(x)
                got.backward()
            assert not hasattr(got, "placements"), f"call {n}: a plain result expected"
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"call {n} strict={strict}")
            torch.testing.assert_close(x.grad, want_x.grad, rtol=0, atol=0, msg=f"call {n} strict={strict}")


def _holding(options):
    with hp.loss_parallel(**options):
        yield hp.is_loss_parallel_active()


def _mode_stack_depth():
    return torch._C._len_torch_function_stack()


def test_exits_in_any_order_restore_the_context():
    depth = _mode_stack_depth()
    for order in ((0, 1), (1, 0)):
        gens = [_holding({}), _holding({})]
        assert next(gens[0]) and next(gens[1])
        gens[order[0]].close()
        assert hp.is_loss_parallel_active(), "one entry is still open"
        assert _mode_stack_depth() == depth + 1
        gens[order[1]].close()
        assert not hp.is_loss_parallel_active(), f"exits in order {order} left the context active"
        assert _mode_stack_depth() == depth, f"exits in order {order} left a mode on the stack"
    # And a later context with other options is not refused as contradicting a leftover one.
    with hp.loss_parallel(strict=False):
        assert hp.is_loss_parallel_active()
    assert not hp.is_loss_parallel_active()


def test_a_mode_entered_inside_stays_when_the_context_exits_first():
    depth = _mode_stack_depth()

    class Counting(torch.overrides.TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    gen = _holding({})
    next(gen)
    mode = Counting()
    mode.__enter__()
    gen.close()  # the context's mode sat below the counting one
    assert _mode_stack_depth() == depth + 1
    before = Counting.calls
    torch.ones(2) + 1
    assert Counting.calls > before, "the mode entered after the context was removed with it"
    mode.__exit__(None, None, None)
    assert _mode_stack_depth() == depth


def test_another_contextvars_context_sees_it_inactive():
    with hp.loss_parallel():
        assert hp.is_loss_parallel_active()
        assert not contextvars.Context().run(hp.is_loss_parallel_active)
    assert not hp.is_loss_parallel_active()
