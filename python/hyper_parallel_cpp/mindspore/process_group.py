"""The communication group a vocabulary-parallel loss runs over: its name, size and this rank."""

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ProcessGroup:
    name: Optional[str]  # None: one process, no communication
    size: int
    rank: int
    is_world: bool  # on CPU only the world group can AllGather


def process_group_of(group: Optional[str]) -> ProcessGroup:
    """``group``: a MindSpore communication group name, or None for the world group (or one
    process where ``mindspore.communication.init()`` has not run)."""
    from mindspore.communication import GlobalComm, get_group_size, get_rank

    initialised = bool(getattr(GlobalComm, "INITED", False))
    if not initialised:
        if group is not None:
            raise RuntimeError(f"group {group!r} given, but mindspore.communication.init() has not run")
        return ProcessGroup(None, 1, 0, True)
    world = GlobalComm.WORLD_COMM_GROUP
    name = world if group is None else str(group)
    return ProcessGroup(name, int(get_group_size(name)), int(get_rank(name)), name == world)
