"""Our vocabulary-parallel cross-entropy in TorchTitan 0.3's trainer, through its loss config.

TorchTitan up to 0.2.2 entered PyTorch's ``loss_parallel()`` in its train context, so
``hyper_parallel_cpp.get_train_context`` stood in for its ``get_train_context``. TorchTitan 0.3
calls neither: its trainer builds the loss from ``Trainer.Config.loss`` (a ``BaseLoss.Config``;
the debug and model configs hold a ``CrossEntropyLoss.Config``, alone or as the ``loss_fn`` of a
``ChunkedLossWrapper.Config``), and ``CrossEntropyLoss`` runs its own ``_LossParallelCrossEntropy``
on the local vocabulary pieces (three all-reduces forward, the logits upcast to float32 first).

``use_vocab_parallel_loss(config)`` puts ``VocabParallelCrossEntropyLoss.Config`` where each
``CrossEntropyLoss.Config`` was, keeping its fields: the same sum-reduced loss, ``ignore_index``
-100, and the same scaling by the global count of valid tokens, but computed by our kernel in one
all-gather of per-row statistics forward (beside the call's small record) and none backward.
Logits TorchTitan computes with the whole vocabulary (TP off, or not vocabulary-sharded) go to
TorchTitan's own function, as before. Nothing of TorchTitan is patched: the trainer builds our
class from the config, as it builds any loss.

torchtitan is imported when one of the two is first used, not with this module.
"""

import importlib
import threading
from typing import Any, Optional

from .. import ops

# The releases whose loss classes, configs and SPMD backends this module was written against
# and tested with (tests/python/test_torchtitan.py).
KNOWN_TORCHTITAN_VERSIONS = ("0.3.0",)


class UnsupportedTorchTitanError(RuntimeError):
    """The installed TorchTitan is not one this integration knows how to plug into."""


def torchtitan_version() -> str:
    """The installed TorchTitan's version (its distribution metadata), or an ImportError saying so."""
    from importlib import metadata
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        try:
            module = importlib.import_module("torchtitan")
        except ImportError as e:
            raise ImportError("hyper_parallel_cpp.integrations.torchtitan: TorchTitan is not installed "
                              f"(pip install torchtitan=={KNOWN_TORCHTITAN_VERSIONS[-1]})") from e
        return str(getattr(module, "__version__", "unknown"))


def check_torchtitan_version() -> str:
    """The installed TorchTitan's version when it is one of KNOWN_TORCHTITAN_VERSIONS, else
    UnsupportedTorchTitanError naming both."""
    found = torchtitan_version()
    if found.split("+", 1)[0] in KNOWN_TORCHTITAN_VERSIONS:
        return found
    known = ", ".join(KNOWN_TORCHTITAN_VERSIONS)
    hint = ""
    if found.startswith("0.1.") or found.startswith("0.2."):
        hint = (" TorchTitan up to 0.2.2 enters loss_parallel() in its train context: pass "
                "hyper_parallel_cpp.get_train_context where it builds its own.")
    raise UnsupportedTorchTitanError(
        f"hyper_parallel_cpp.integrations.torchtitan knows TorchTitan {known}, found {found}: its loss "
        f"classes and SPMD backends are what this integration plugs into, and they change between "
        f"releases.{hint}")


_lock = threading.Lock()
_loss_class: Optional[type] = None


def _vocab_parallel_loss_class() -> type:
    """Defines VocabParallelCrossEntropyLoss on first use (it subclasses TorchTitan's class)."""
    global _loss_class
    check_torchtitan_version()  # on every call: one metadata read
    with _lock:
        if _loss_class is None:
            _loss_class = _define_loss_class()
        return _loss_class


def __getattr__(name: str) -> Any:
    # `from hyper_parallel_cpp.integrations.torchtitan import VocabParallelCrossEntropyLoss`
    # imports TorchTitan then, not when the package is imported.
    if name == "VocabParallelCrossEntropyLoss":
        return _vocab_parallel_loss_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def use_vocab_parallel_loss(config: Any) -> Any:
    """Makes TorchTitan's trainer compute cross-entropy with our kernel: every
    ``CrossEntropyLoss.Config`` in ``config`` (a ``Trainer.Config``, or any config holding one,
    e.g. a ``ChunkedLossWrapper.Config``) becomes a ``VocabParallelCrossEntropyLoss.Config``
    with the same fields. Returns ``config``, changed in place; idempotent.

    Raises UnsupportedTorchTitanError on a TorchTitan release it does not know, and ValueError
    when ``config`` holds no cross-entropy loss at all (nothing would change)."""
    ours = _vocab_parallel_loss_class()
    from torchtitan.components.loss import CrossEntropyLoss

    found = 0
    if isinstance(config, CrossEntropyLoss.Config):
        raise ValueError("use_vocab_parallel_loss: pass the config that holds the loss (e.g. the Trainer.Config), "
                         "or use VocabParallelCrossEntropyLoss.Config(...) in place of CrossEntropyLoss.Config")
    for _, loss_config, parent, attr in list(config.traverse(CrossEntropyLoss.Config)):
        found += 1
        if isinstance(loss_config, ours.Config):
            continue
        replacement = ours.Config(**{f: getattr(loss_config, f) for f in _fields(loss_config)})
        if isinstance(parent, list):
            parent[attr] = replacement
        else:
            setattr(parent, attr, replacement)
    if not found:
        loss = getattr(config, "loss", None)
        raise ValueError(f"use_vocab_parallel_loss: this config holds no CrossEntropyLoss.Config to replace "
                         f"(its loss: {type(loss).__qualname__ if loss is not None else 'none'})")
    return config


def _fields(config: Any) -> list:
    import dataclasses
    return [f.name for f in dataclasses.fields(config) if f.init]


def _define_loss_class() -> type:
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import local_map
    from dataclasses import dataclass

    from torchtitan.components import loss as titan_loss
    from torchtitan.distributed.utils import get_spmd_backend

    ignore_index = titan_loss.IGNORE_INDEX

    def local_loss(local_logits, labels, group, vocab_size):
        # TorchTitan's logits are [batch, seq, V_local]; the sum over tokens, float32 as TorchTitan's.
        return ops.vocab_parallel_cross_entropy(
            local_logits.flatten(0, 1).float(), labels.flatten(0, 1), group, vocab_size=vocab_size,
            ignore_index=ignore_index, reduction="sum")

    def spmd_local_loss(pred, labels, group, vocab_size):
        # Under debug.spmd_typechecking, spmd_types sees our op as an unknown op mixing a varying
        # and an invariant operand; so, as TorchTitan's own loss declares: logits S(-1) and
        # labels I on the TP axis in, the loss I on it out (other axes pass through).
        import spmd_types as spmd
        if not spmd.is_type_checking():
            return local_loss(pred, labels, group, vocab_size)
        spmd.assert_type(pred, {group: spmd.S(pred.dim() - 1)})
        spmd.assert_type(labels, {group: spmd.I})
        loss_type = dict(spmd.get_local_type(pred))
        with spmd.no_typecheck():
            loss = local_loss(pred, labels, group, vocab_size)
        loss_type[group] = spmd.I
        spmd.assert_type(loss, loss_type)
        return loss

    def vocab_axis(pred):
        # The one mesh axis that shards the class (last) dim, or None.
        axes = [i for i, p in enumerate(pred.placements) if isinstance(p, Shard) and p.dim % pred.ndim == pred.ndim - 1]
        return axes[0] if len(axes) == 1 else None

    def dtensor_loss(pred, labels):
        # full_dtensor: logits and labels are DTensors on the same mesh. The vocabulary axis takes
        # our kernel; an axis sharding batch or sequence leaves a partial sum there (the loss is a sum).
        axis = vocab_axis(pred)
        if axis is None:
            return None
        mesh = pred.device_mesh
        expected = tuple(Replicate() if i == axis else p for i, p in enumerate(pred.placements))
        if tuple(labels.placements) != expected:
            raise ValueError(f"VocabParallelCrossEntropyLoss: expected labels placements {expected} for logits "
                             f"placed {tuple(pred.placements)}, got {tuple(labels.placements)}")
        out = [Replicate() if i == axis or not isinstance(p, Shard) else Partial()
               for i, p in enumerate(pred.placements)]
        group = mesh.get_group(axis)
        vocab_size = pred.shape[-1]

        @local_map(out_placements=out, in_placements=(pred.placements, labels.placements),
                   in_grad_placements=(pred.placements, labels.placements), device_mesh=mesh)
        def loss_of_pieces(local_logits, local_labels):
            return local_loss(local_logits, local_labels, group, vocab_size)

        return loss_of_pieces(pred, labels)

    def cross_entropy_loss(pred, labels, *, global_vocab_size=None):
        """TorchTitan's cross_entropy_loss contract (sum over tokens, ignore_index -100) with our
        kernel wherever the logits are vocabulary-sharded, TorchTitan's own function elsewhere."""
        if isinstance(pred, DTensor):
            if isinstance(labels, DTensor):
                result = dtensor_loss(pred, labels)
            elif tuple(pred.placements) == (Shard(pred.ndim - 1),):  # partial_dtensor: a TP-only mesh
                result = local_loss(pred.to_local(), labels, pred.device_mesh.get_group(), pred.shape[-1])
            else:
                result = None
            if result is not None:
                return result
        elif get_spmd_backend() == "spmd_types":
            from torchtitan.distributed.spmd_types import current_spmd_mesh, spmd_mesh_size
            if spmd_mesh_size("tp") > 1:
                # Plain local pieces; None learns V from the pieces in the call's record.
                return spmd_local_loss(pred, labels, current_spmd_mesh().get_group("tp"), global_vocab_size)
        return titan_loss.cross_entropy_loss(pred, labels, global_vocab_size=global_vocab_size)

    class VocabParallelCrossEntropyLoss(titan_loss.CrossEntropyLoss):
        """TorchTitan's CrossEntropyLoss with hyper_parallel_cpp's vocabulary-parallel kernel:
        the same loss, scaling and fields; two small all-gathers forward (the call's record, the
        per-row statistics), none backward."""

        @dataclass(kw_only=True, slots=True)
        class Config(titan_loss.CrossEntropyLoss.Config):
            pass

        def __init__(self, config, *, compile_config=None):
            # TorchTitan's __init__ with our function (its own would compile its function first).
            self.fn = cross_entropy_loss
            self._maybe_compile(compile_config)
            self.global_vocab_size = config.global_vocab_size

    # Named as if defined at the module's top (which its __getattr__ serves): reprs, pickling.
    VocabParallelCrossEntropyLoss.__module__ = VocabParallelCrossEntropyLoss.Config.__module__ = __name__
    VocabParallelCrossEntropyLoss.__qualname__ = "VocabParallelCrossEntropyLoss"
    VocabParallelCrossEntropyLoss.Config.__qualname__ = "VocabParallelCrossEntropyLoss.Config"
    return VocabParallelCrossEntropyLoss


__all__ = ["KNOWN_TORCHTITAN_VERSIONS", "UnsupportedTorchTitanError", "VocabParallelCrossEntropyLoss",
           "check_torchtitan_version", "torchtitan_version", "use_vocab_parallel_loss"]
