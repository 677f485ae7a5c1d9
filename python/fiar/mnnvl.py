# SPDX-License-Identifier: Apache-2.0
"""``flashinfer.comm.mnnvl``'s names that engines import with the all-reduce: the ``CommBackend`` shape, its
``torch.distributed`` adapter ``TorchDistBackend``, and the mnnvl workspace class. ``from fiar.mnnvl import
TorchDistBackend`` replaces ``from flashinfer.comm.mnnvl import TorchDistBackend``.

fiar's workspaces take any object with ``Get_rank``, ``Get_size``, ``allgather`` and ``barrier`` as ``comm_backend``
(``bcast`` and ``Split`` are FlashInfer's too, for callers that use them).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from . import MNNVLAllReduceFusionWorkspace

__all__ = ["CommBackend", "TorchDistBackend", "MNNVLAllReduceFusionWorkspace"]


@runtime_checkable
class CommBackend(Protocol):
    """What a workspace's ranks meet over: this rank and the group's size, an all-gather of Python objects (one entry
    per rank, in rank order), a broadcast, a barrier, and a split into sub-groups."""

    def Get_rank(self) -> int:  # noqa: N802 - FlashInfer's (MPI's) names
        ...

    def Get_size(self) -> int:  # noqa: N802
        ...

    def allgather(self, data: Any) -> Any:
        ...

    def bcast(self, data: Any, root: int) -> Any:
        ...

    def barrier(self) -> None:
        ...

    def Split(self, color: int, key: int) -> "CommBackend":  # noqa: N802
        ...


class TorchDistBackend:
    """CommBackend over a ``torch.distributed`` process group (``group``; None: the default group). Every exchange
    runs over that group, never over WORLD unless it is WORLD (a rendezvous over WORLD deadlocks engines whose
    tensor-parallel group is a part of it)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("fiar.mnnvl.TorchDistBackend: torch.distributed is not initialized. Fix: call "
                               "torch.distributed.init_process_group() first.")
        self._dist, self._group = dist, group

    @property
    def group(self) -> Any:
        """The process group (None: the default group)."""
        return self._group

    def Get_rank(self) -> int:  # noqa: N802
        return self._dist.get_rank(self._group)

    def Get_size(self) -> int:  # noqa: N802
        return self._dist.get_world_size(self._group)

    def allgather(self, data: Any) -> tuple:
        out = [None] * self.Get_size()
        self._dist.all_gather_object(out, data, group=self._group)
        return tuple(out)

    def bcast(self, data: Any, root: int) -> Any:
        """data from the group's rank `root` (a rank of the group, not of WORLD), on every rank."""
        box = [data]
        source = self._dist.get_global_rank(self._group, root) if self._group is not None else root
        self._dist.broadcast_object_list(box, src=source, group=self._group)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def Split(self, color: int, key: int) -> "TorchDistBackend":  # noqa: N802
        """MPI_Comm_split: the ranks of one color form a group. Collective over this group: every rank creates every
        color's group, in the same order (torch names groups by a counter, so ranks that created only their own would
        not meet). torch orders a group's ranks by their global rank, so `key` orders them only where it agrees (as
        with FlashInfer's adapter)."""
        everyone = self.allgather((color, key, self._dist.get_rank()))
        colors = sorted({c for c, _, _ in everyone})
        members = [[g for _, g in sorted((k, g) for c, k, g in everyone if c == col)] for col in colors]
        mine, _ = self._dist.new_subgroups_by_enumeration(members)
        return TorchDistBackend(mine)
