"""A PyTorch TP training loop (parallelize_module, the head ColwiseParallel with
output_layouts=Shard(-1), use_local_output=False) trained 20 steps with PyTorch's
loss_parallel and with ours, from the same weights and batches: float64 losses equal."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel as torch_loss_parallel,
                                               parallelize_module)

import hyper_parallel_cpp as hp
from ranks import run_ranks

VOCAB, DIM, STEPS = 37, 12, 20  # 4 * DIM splits evenly at TP 2 and 3 (PyTorch needs that), VOCAB does not


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.down(F.gelu(self.up(h)))
        return self.head(h)


def train(rank, world):
    torch.manual_seed(0)
    base = TinyLM().double()
    mesh = init_device_mesh("cpu", (world,))
    plan = {
        "up": ColwiseParallel(),
        "down": RowwiseParallel(),
        "head": ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1), use_local_output=False),
    }
    losses = {}
    for name, context in (("pytorch", torch_loss_parallel), ("ours", hp.get_train_context(True))):
        model = parallelize_module(copy.deepcopy(base), mesh, plan)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, VOCAB, (4, 9), generator=gen) for _ in range(2)]  # learnable: seen again
        losses[name] = []
        for step in range(STEPS):
            tokens = batches[step % len(batches)]
            with context():  # forward and backward inside, as TorchTitan's train step
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses[name].append(loss.full_tensor().item())
    diffs = [abs(a - b) for a, b in zip(losses["pytorch"], losses["ours"])]
    assert max(diffs) <= 1e-10, (losses, diffs)
    assert losses["ours"][-2] < losses["ours"][0] - 0.5, losses["ours"]  # it trained (same batch as step 1)
    if rank == 0:
        print(f"TP {world}: step 1 loss {losses['ours'][0]:.12f}, step {STEPS} {losses['ours'][-1]:.12f}, "
              f"largest difference from PyTorch's loss_parallel {max(diffs):.2e}")


def test_a_pytorch_tp_loop_trains_the_same_with_our_loss_parallel():
    run_ranks(2, train)


def test_the_same_at_tp3_with_an_uneven_vocabulary():
    run_ranks(3, train)
