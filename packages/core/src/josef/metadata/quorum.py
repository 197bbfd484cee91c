"""The contract of a metadata quorum backend (KRaft, ZooKeeper).

A quorum is a replicated, ordered log of :mod:`josef.metadata.records`. The
core's :class:`josef.metadata.controller.Controller` decides what to write;
the quorum makes it durable and tells every listener, in order, once it is
committed. Everything is called on the broker's event loop.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from josef.metadata.records import MetadataRecord

#: Called with the offset of the last record and the records of one commit.
CommitListener = Callable[[int, Sequence[MetadataRecord]], None]


class NotControllerError(Exception):
    """This node is not the active controller: NOT_CONTROLLER to clients, who retry elsewhere."""


class MetadataQuorum(Protocol):
    @property
    def cluster_id(self) -> str:
        """The cluster id this quorum's storage was formatted with."""

    @property
    def controller_id(self) -> int:
        """Node id of the active controller, -1 while there is none."""

    async def start(self, listener: CommitListener) -> None:
        """Load the log and replay every committed record through ``listener`` before returning.

        After ``start`` returns, ``listener`` keeps receiving each new commit,
        in order, exactly once.
        """

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        """Append ``records`` atomically and return their last offset once committed and delivered.

        Raises :class:`NotControllerError` when this node may not write.
        """

    async def close(self) -> None:
        """Stop and release storage; committed records stay durable."""
