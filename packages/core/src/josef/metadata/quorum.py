"""The contract of a metadata quorum backend (KRaft, ZooKeeper).

A quorum is a replicated, ordered log of :mod:`josef.metadata.records`. The
core's :class:`josef.metadata.controller.Controller` decides what to write;
the quorum makes it durable and tells every listener, in order, once it is
committed. Everything is called on the broker's event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from josef.metadata.image import MetadataImage
from josef.metadata.records import Endpoint, MetadataRecord

if TYPE_CHECKING:
    import anyio.abc

    from josef.server.dispatch import Handler

class MetadataListener(Protocol):
    """What a quorum delivers committed metadata to: the node's image (Kafka's RaftClient.Listener)."""

    def on_commit(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        """The records of one commit, whose last is at ``offset``; each commit once, in order."""

    def on_snapshot(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        """Replace the whole state by a snapshot's records: the state after every record up to ``offset``.

        Delivered at start-up (the latest local snapshot) and when a replica
        too far behind downloads the leader's snapshot.
        """

    def current_image(self) -> MetadataImage:
        """The state as of the last delivery, which the quorum writes into its snapshots."""

    def endpoints(self) -> Sequence[Endpoint]:
        """This node's listeners as other nodes reach them, controller listeners included; bound before ``start``.

        A quorum whose voters are not configured (ZooKeeper's: any node may
        be elected) publishes them, so that brokers find the controller
        listener of whichever node it elects.
        """

    def on_broker_session_end(self, broker_id: int, epoch: int) -> None:
        """Broker ``broker_id``, registered at ``epoch``, lost its session with the quorum's store.

        Called on the active controller by a backend whose brokers hold such a
        session (ZooKeeper: the ephemeral ``/brokers/ids/<id>`` went with an
        expired session), never by KRaft, where heartbeats are the session.
        The controller fences the broker at once, as if it had missed
        heartbeats for ``broker.session.timeout.ms``, unless it registered
        again since (a later epoch); its next heartbeat unfences it.
        """


class NotControllerError(Exception):
    """This node is not the active controller: NOT_CONTROLLER to clients, who retry elsewhere."""


class MetadataQuorum(Protocol):
    @property
    def cluster_id(self) -> str:
        """The cluster id this quorum's storage was formatted with."""

    @property
    def controller_id(self) -> int:
        """Node id of the active controller, -1 while there is none."""

    def controllers(self) -> Mapping[int, tuple[str, int]]:
        """Every controller (voter) and its controller listener; empty when the only one is in-process."""

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        """Where brokers reach controller ``node_id`` (its controller listener), or None when only in-process.

        A single-node quorum has no controller listener: the broker part of
        the same process calls its controller directly.
        """

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        """``(api key, handler, lowest version, highest version)`` this backend answers on controller listeners.

        The Raft APIs for KRaft (Vote, BeginQuorumEpoch, Fetch, ...); called
        before ``start``, on nodes with the controller role.
        """

    # Optional (plugin API 1.5): ``controller_on_broker_listener``, a bool; absent means False. True when other
    # nodes reach this node's controller on its inter-broker listener, as Kafka 3.x's ZooKeeper-mode nodes were
    # (no controller listener): the node's broker listeners then answer the controller's own APIs too
    # (registration, heartbeats, AlterPartition, producer ids, Envelope), and its brokers reach the active
    # controller with the inter-broker listener's security settings.

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup) -> None:
        """Load the local snapshot and log, deliver what is known committed to ``listener``, then return.

        Background work (elections, replication) runs in ``tg`` until it is
        cancelled; ``listener`` keeps receiving each new commit, in order,
        exactly once. A replicated quorum learns what is committed from its
        leader, so right after ``start`` the image may still be behind the
        cluster's: brokers wait for their heartbeat to say they caught up.
        The node's controller listeners are already bound when it is called.
        """

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        """Append ``records`` atomically and return their last offset once committed and delivered.

        Only the active controller may write, and only once every record
        committed before its term has been delivered to ``listener``, so the
        controller decides on the latest state. Raises
        :class:`NotControllerError` otherwise.
        """

    async def close(self) -> None:
        """Stop and release storage; committed records stay durable."""
