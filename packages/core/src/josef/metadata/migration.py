"""Moving a cluster's metadata to KRaft from another backend (KIP-866), and what that backend provides for it.

Every metadata backend carries the same record stream
(:mod:`josef.metadata.records`), so a migration moves one log, not a
translation of one: ``josef metadata migrate`` asks the old backend to
:meth:`~MetadataMigration.take_over` (its controllers are stopped for good
and its whole state read), and writes that state as the first snapshot of
each new KRaft controller, at the old log's last offset, so the KRaft log
continues its offsets and every broker epoch in it stays valid. The KRaft
controllers then start with the migration on (ZooKeeper's:
``zookeeper.metadata.migration.enable=true``); the active one becomes the
controller the old backend's brokers reach, and mirrors every record it
commits back into the old backend (KIP-866's dual write,
:meth:`~MetadataMigration.on_commit`), so those brokers go on following the
metadata until each is restarted as a KRaft broker, and so the old backend
stays whole until the migration is finalized: that is the rollback point.

A backend offers this through the ``register_metadata_migrations`` hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from josef.metadata.image import MetadataImage
from josef.metadata.records import MetadataRecord
from josef.node.broker_config import metadata_quorum_name
from josef.plugins import collect

if TYPE_CHECKING:
    import anyio.abc
    import pluggy

    from josef.config import Config

    from josef.metadata.quorum import MetadataListener


class MigrationError(Exception):
    """The cluster cannot be taken over, or given back, as asked (already migrating, no cluster there): one line
    for the operator."""


@attrs.frozen
class MigratedMetadata:
    """The old backend's state when it was taken over: the first KRaft snapshot."""

    cluster_id: str
    #: The offset of the old log's last record; the KRaft log goes on after it.
    offset: int
    #: The records that rebuild the image as of :attr:`offset`.
    records: Sequence[MetadataRecord]


class MetadataMigration(Protocol):
    """A metadata backend a cluster leaves for KRaft, as one KRaft controller (or the migrate command) sees it."""

    def take_over(self) -> MigratedMetadata:
        """Stop the old backend's controllers for good (none may be elected while the migration lasts), then read
        its whole state. Blocks; called once, by ``josef metadata migrate``, before the KRaft controllers start."""

    def roll_back(self) -> int:
        """Give the cluster back to the old backend before the migration is finalized: fence the KRaft controller
        that mirrors into it and let the old backend's controllers be elected again. Blocks; returns the new
        controller epoch."""

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup, active: Callable[[], bool]) -> None:
        """Connect; run background work in ``tg``. ``listener`` is this controller's node (its image, and the
        controller listeners the old backend's brokers are to reach); ``active()`` says whether it is the active
        controller now: while it is, it is the controller the old backend names, and mirrors commits there."""

    def on_commit(self, offset: int, records: Sequence[MetadataRecord], before: MetadataImage,
                  after: MetadataImage) -> None:
        """Records committed in the KRaft log, the last at ``offset``, turning ``before`` into ``after``: mirrored
        into the old backend in order, in the background, while this node is the active controller (catching up
        first on what an earlier one left unwritten). Called on the event loop for every commit; must not block."""

    async def close(self) -> None:
        """Stop mirroring and disconnect."""


def configured_migration(pm: pluggy.PluginManager, config: Config) -> MetadataMigration | None:
    """The migration ``config`` asks for (``register_metadata_migrations``): from a backend other than the node's own
    quorum whose factory accepts the configuration; None when it asks for none."""
    own = metadata_quorum_name(config)
    for name, factory in collect(pm, "register_metadata_migrations", "metadata migration").items():
        migration = factory(config) if name != own else None
        if migration is not None:
            return migration  # type: ignore[no-any-return]
    return None
