"""TorchTitan 0.3's own trainer (its llama3 debug model, TP 2, CPU/Gloo) trained a few steps with
its loss and with ours (hyper_parallel_cpp.integrations.torchtitan.use_vocab_parallel_loss), from
the same seed and batches: per-step losses and the last step's gradients agree; both loss functions
on what each SPMD backend hands the loss; TorchTitan's command line taking a config function that
uses ours; the refusals. One launch of 2 ranks. The tokenizer and the corpus are made here (no hub
access); skipped where torchtitan is not installed."""

import importlib.util
import json
import os
import random

import pytest
import torch

from ranks import run_ranks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                                reason="torchtitan is not installed (pip install torchtitan==0.3.0 to run this)")

STEPS = 3
WORDS = 1500  # tokens of the tokenizer: targets land in both halves of the debug model's 2048 classes


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A word-level tokenizer (tokenizer.json + tokenizer_config.json, what TorchTitan's
    HuggingFaceTokenizer reads) and a corpus folder of JSON lines with a "text" field."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("torchtitan")
    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({f"w{i}": i + 3 for i in range(WORDS)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)
    # A few repeated phrases in random order: learnable, so the loss moves in a few steps.
    phrases = [" ".join(f"w{rng.randrange(WORDS)}" for _ in range(12)) for _ in range(40)]
    with open(corpus / "train.json", "w") as f:
        for _ in range(400):
            f.write(json.dumps({"text": " ".join(rng.choice(phrases) for _ in range(6))}) + "\n")
    return str(root)


class _CpuDevice:
    """What TorchTitan 0.3 asks of its device module (torch.cuda's API), for the CPU: it takes
    CUDA when torch reports no accelerator (tools/utils.py: `_get_available_device_type() or
    "cuda"`). Memory figures are not measured (-1, as TorchTitan shows a missing figure)."""

    class _Properties:
        name = "cpu"
        total_memory = 1 << 30

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def set_device(self, device): pass
    def current_device(self): return 0
    def device_count(self): return 1
    def get_device_name(self, device=None): return "cpu"
    def get_device_properties(self, device=None): return self._Properties()
    def reset_peak_memory_stats(self, device=None): pass
    def empty_cache(self): pass
    def memory_stats(self, device=None): return {}
    def synchronize(self, device=None): pass


def _run_torchtitan_on_cpu():
    """Imports TorchTitan with "cpu" as its device type and module (before any of its modules
    binds them). Returns the module whose names were set."""
    import torch._utils
    import sys
    if "torchtitan.tools.utils" in sys.modules:
        return sys.modules["torchtitan.tools.utils"]
    found = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: "cpu"
    try:
        import torchtitan.tools.utils as titan_utils
    finally:
        torch._utils._get_available_device_type = found
    titan_utils.device_type = "cpu"
    titan_utils.device_module = _CpuDevice()
    return titan_utils


def _debug_config(assets, backend, folder):
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = llama3_debugmodel()
    config.hf_assets_path = os.path.join(assets, "tokenizer")
    config.dataloader.dataset_path = os.path.join(assets, "corpus")
    config.dump_folder = folder
    config.training.local_batch_size = 2
    config.training.seq_len = 64  # ChunkedLossWrapper's 8 chunks, sequence parallel's 2 pieces
    config.training.steps = STEPS
    config.parallelism.tensor_parallel_degree = 2
    config.parallelism.spmd_backend = backend
    config.training.mixed_precision_param = "float32"  # float32 throughout: the runs differ by rounding only
    config.checkpoint.enable = False
    config.validator.enable = False
    config.debug.seed = 0
    config.debug.deterministic = True
    config.model_spec.model.layers = config.model_spec.model.layers[:2]  # the debug model, shorter
    # FlexAttention (what TorchTitan 0.3 gives language models) has no backward on the CPU in
    # torch 2.15: causal SDPA stands in, in both runs (the corpus's documents then see each other).
    for _, _, parent, attr in list(config.model_spec.model.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    return config


def _train(config):
    """Runs TorchTitan's Trainer.train(); returns the logged loss of each step and the last step's
    gradients (local pieces, by parameter name)."""
    trainer = config.build()
    losses = []
    log = trainer.metrics_processor.log

    def record(step, global_avg_loss, *args, **kwargs):
        losses.append(global_avg_loss)
        return log(step, global_avg_loss, *args, **kwargs)

    trainer.metrics_processor.log = record
    try:
        trainer.train()
        grads = {}
        for name, p in trainer.model_parts[0].named_parameters():
            g = p.grad
            if g is not None:
                grads[name] = (g.to_local() if hasattr(g, "to_local") else g).detach().clone()
    finally:
        trainer.close()
    return losses, grads


def train_both(rank, world, assets, folder):
    """TorchTitan's trainer with its loss, then with ours (partial_dtensor: the backend whose TP
    runs on PyTorch 2.15's CPU; see compare_loss_paths for the others)."""
    # What TorchTitan reads of a launcher's environment; and no hub: datasets reads the corpus folder.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), HF_HUB_OFFLINE="1",
                      HF_DATASETS_OFFLINE="1")
    _run_torchtitan_on_cpu()
    from hyper_parallel_cpp import ops
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan
    from torchtitan.components.loss import ChunkedLossWrapper

    backend = "partial_dtensor"
    theirs = _debug_config(assets, backend, folder)
    ours = hp_titan.use_vocab_parallel_loss(_debug_config(assets, backend, folder))
    assert isinstance(ours.loss, ChunkedLossWrapper.Config)
    assert type(ours.loss.loss_fn).__qualname__ == "VocabParallelCrossEntropyLoss.Config", ours.loss
    assert ours.loss.loss_fn.global_vocab_size == theirs.loss.loss_fn.global_vocab_size == 2048

    their_losses, their_grads = _train(theirs)
    kernel = ops.vocab_parallel_cross_entropy
    calls = []
    ops.vocab_parallel_cross_entropy = lambda *a, **k: calls.append(1) or kernel(*a, **k)
    try:
        our_losses, our_grads = _train(ours)
    finally:
        ops.vocab_parallel_cross_entropy = kernel
    assert len(calls) == STEPS * ours.loss.num_chunks, len(calls)  # every chunk of every step took ours
    assert len(our_losses) == STEPS, our_losses
    for a, b in zip(their_losses, our_losses):
        assert abs(a - b) <= 4e-6 * abs(a), (their_losses, our_losses)
    assert our_losses[-1] < our_losses[0], our_losses  # it trained
    assert their_grads.keys() == our_grads.keys() and our_grads
    worst = max((a - our_grads[n]).abs().max().item() for n, a in their_grads.items())
    largest = max(a.abs().max().item() for a in their_grads.values())
    assert worst <= 1e-5 * largest, (worst, largest)
    if rank == 0:
        print(f"{backend}: losses {our_losses} (TorchTitan's {their_losses}), "
              f"largest gradient difference {worst:.2e} of {largest:.2e}")
    compare_loss_paths(rank, world)


def compare_loss_paths(rank, world):
    """TorchTitan's cross_entropy_loss and ours on the logits each SPMD backend hands the loss
    (TorchTitan 0.3.0's trainer at TP 2 stops in FSDP's setup on PyTorch 2.15 under spmd_types
    and full_dtensor, before any loss: "Expected param's DTensor mesh to be the same mesh"):
    spmd_types (plain local pieces; also under its type checker), full_dtensor (logits and labels
    DTensors; also with the batch sharded on a dp axis), partial_dtensor (a Shard(-1) DTensor); an
    uneven vocabulary (19 + 18) and ignored labels."""
    from contextlib import nullcontext

    import spmd_types as spmd
    from spmd_types.checker import typecheck as spmd_typecheck
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torchtitan.components.loss import cross_entropy_loss as their_loss
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.spmd_types import set_current_spmd_mesh
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan

    vocab = 37
    our_config = hp_titan.VocabParallelCrossEntropyLoss.Config(global_vocab_size=vocab)
    our_loss = our_config.build().fn
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, vocab, generator=gen) * 3
    labels = torch.randint(0, vocab, (2, 5), generator=gen)
    labels[0, 1] = labels[1, 4] = -100
    piece = logits.chunk(world, dim=-1)[rank]
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))

    def loss_and_grad(fn, backend, **kwargs):
        dist_utils.set_spmd_backend(backend.split()[0])
        local = piece.clone().requires_grad_()
        if backend.startswith("spmd_types"):
            typechecked = backend.endswith("typechecking")
            target = labels.clone()  # typed below, when checked
            with set_current_spmd_mesh(mesh), spmd_typecheck(local=False) if typechecked else nullcontext():
                if typechecked:  # the inputs' types, as TorchTitan's trainer annotates them
                    spmd.assert_type(local, {mesh.get_group("tp"): spmd.S(2)})
                    spmd.assert_type(target, {mesh.get_group("tp"): spmd.I})
                loss = fn(local, target, **kwargs)
        else:
            pred = DTensor.from_local(local, mesh, [Shard(2)], shape=logits.shape, stride=logits.stride())
            if backend == "full_dtensor":
                loss = fn(pred, DTensor.from_local(labels, mesh, [Replicate()]), **kwargs)
            else:
                loss = fn(pred, labels, **kwargs)
        loss.backward()
        value = loss.full_tensor() if isinstance(loss, DTensor) else loss
        return value.detach(), local.grad

    try:
        for backend in ("spmd_types", "spmd_types with debug.spmd_typechecking", "full_dtensor", "partial_dtensor"):
            want, want_grad = loss_and_grad(their_loss, backend, global_vocab_size=vocab)
            got, got_grad = loss_and_grad(our_loss, backend, global_vocab_size=vocab)
            torch.testing.assert_close(got, want, rtol=2e-6, atol=0, msg=backend)
            torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7, msg=backend)
        # Without global_vocab_size (TorchTitan's own needs it there), ours learns it from the pieces.
        got, _ = loss_and_grad(our_loss, "spmd_types", global_vocab_size=None)
        torch.testing.assert_close(got, want, rtol=2e-6, atol=0)

        # full_dtensor with the batch sharded on another mesh axis (dp 2 x tp 1 here): the loss is
        # a Partial sum on that axis, as TorchTitan's.
        dist_utils.set_spmd_backend("full_dtensor")
        mesh_2d = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
        results = []
        for fn in (their_loss, our_loss):
            local = logits[rank:rank + 1].clone().requires_grad_()
            pred = DTensor.from_local(local, mesh_2d, [Shard(0), Shard(2)], shape=logits.shape, stride=logits.stride())
            target = DTensor.from_local(labels[rank:rank + 1], mesh_2d, [Shard(0), Replicate()])
            loss = fn(pred, target, global_vocab_size=vocab)
            assert tuple(loss.placements) == (Partial(), Replicate()), loss.placements
            loss.backward()
            results.append((loss.full_tensor().detach(), local.grad))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=2e-6, atol=0)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
    finally:
        dist_utils.set_spmd_backend("spmd_types")


def test_torchtitans_trainer_trains_the_same_with_our_loss(assets, tmp_path):
    run_ranks(2, train_both, assets, str(tmp_path), timeout=600, fresh=True)


def test_an_unknown_torchtitan_is_refused_with_the_versions_known(monkeypatch):
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan

    monkeypatch.setattr(hp_titan, "torchtitan_version", lambda: "0.2.2")
    with pytest.raises(hp_titan.UnsupportedTorchTitanError, match=r"knows TorchTitan 0\.3\.0, found 0\.2\.2"):
        hp_titan.check_torchtitan_version()
    monkeypatch.setattr(hp_titan, "torchtitan_version", lambda: "0.4.0")
    with pytest.raises(hp_titan.UnsupportedTorchTitanError, match=r"found 0\.4\.0"):
        hp_titan.use_vocab_parallel_loss(object())


def test_a_config_without_cross_entropy_is_refused():
    _run_torchtitan_on_cpu()
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan
    from torchtitan.components.loss import MSELoss
    from torchtitan.trainer import Trainer

    with pytest.raises(ValueError, match="holds no CrossEntropyLoss.Config"):
        hp_titan.use_vocab_parallel_loss(Trainer.Config(loss=MSELoss.Config()))


def llama3_debugmodel_with_our_loss():
    """A config function as a user writes one (TorchTitan's CLI: --module <module> --config <function>)."""
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return hp_titan.use_vocab_parallel_loss(llama3_debugmodel())


def test_torchtitans_command_line_takes_a_config_with_our_loss():
    _run_torchtitan_on_cpu()
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args(["--module", __name__, "--config", "llama3_debugmodel_with_our_loss",
                                         "--parallelism.tensor_parallel_degree", "2",
                                         "--loss.loss_fn.global_vocab_size", "2000"])
    assert type(config.loss.loss_fn).__qualname__ == "VocabParallelCrossEntropyLoss.Config"
    assert config.loss.loss_fn.global_vocab_size == 2000 and config.parallelism.tensor_parallel_degree == 2


def test_a_plain_loss_config_is_replaced_too_and_a_second_call_changes_nothing():
    _run_torchtitan_on_cpu()
    from hyper_parallel_cpp.integrations import torchtitan as hp_titan
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.models.llama3.config_registry import llama3_debugmodel_ce_loss

    config = hp_titan.use_vocab_parallel_loss(llama3_debugmodel_ce_loss())  # Trainer.Config.loss itself
    ours = config.loss
    assert isinstance(ours, hp_titan.VocabParallelCrossEntropyLoss.Config) and ours.global_vocab_size == 2048
    assert hp_titan.use_vocab_parallel_loss(config).loss is ours
    with pytest.raises(ValueError, match="pass the config that holds the loss"):
        hp_titan.use_vocab_parallel_loss(CrossEntropyLoss.Config())
