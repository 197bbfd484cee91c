"""Migrating a ZooKeeper-backed cluster to KRaft (KIP-866): ZooKeeper's side.

``josef metadata migrate`` calls :meth:`ZooKeeperMigration.take_over`: one
multi-op bumps ``/controller_epoch`` (so the controller's next write is
refused), deletes ``/controller`` and creates ``/josef/migration``, which
keeps every ZooKeeper-mode node from being elected again (their election
multi-op creates and deletes that path, and fails while it is there). The
log is then read to its end: the KRaft controllers start from it.

On each KRaft controller started with
``zookeeper.metadata.migration.enable=true``, the active one claims
``/controller`` as a ZooKeeper-mode controller is elected (bumped epoch,
its controller listener in the JSON, conditioned on ``/josef/migration``
being there), so the brokers still on ZooKeeper send it their heartbeats,
AlterPartition and forwarded requests. It then mirrors every commit into
the ZooKeeper log at the KRaft offsets (a commit after one of Raft's own
control records says which offset it follows), and keeps Kafka's layout
current, each write conditioned on its epoch like a ZooKeeper controller's;
a new active controller that finds the log behind its image writes a
snapshot first. So the ZooKeeper brokers follow the metadata until each is
restarted as a KRaft broker, and ZooKeeper stays a whole copy until the
controllers are restarted without the migration: until then,
``josef metadata migrate --rollback`` gives the cluster back to ZooKeeper.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from josef.config import Config, ConfigError
from josef.metadata.image import MetadataImage
from josef.metadata.migration import MigratedMetadata, MigrationError
from josef.metadata.quorum import MetadataListener
from josef.metadata.records import MetadataRecord
from josef_metadata_zk.commits import encode_commit, encode_snapshot
from josef_metadata_zk.kafka_layout import Write, changed_layout, full_layout
from josef_metadata_zk.metadata_znodes import Deposed, MetadataZNodes, layout_batch
from josef_metadata_zk.zk_client import ZooKeeperClientSettings, stop, stop_in_thread
from josef_metadata_zk.znodes import (
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    MIGRATION,
    cluster_id_of,
    controller_json,
    split_connect,
)

log = logging.getLogger(__name__)

#: How often a controller looks whether it became (or stopped being) the active one, and waits after a failure.
POLL_S = 0.5


def _bump_epoch(zk: KazooClient, root: str, change: Callable[[Any], None]) -> tuple[int, int]:
    """One multi-op that bumps /controller_epoch (checking its version), deletes /controller if anyone holds it, and
    makes ``change`` to the transaction: the controller in office can write nothing more. The new epoch, and the
    version of /controller_epoch that holds it."""
    for _ in range(10):  # the controller may change under us: read again
        data, stat = zk.get(root + CONTROLLER_EPOCH)
        epoch = int(data or b"0") + 1
        holder = zk.exists(root + CONTROLLER)
        tx = zk.transaction()
        tx.set_data(root + CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
        if holder is not None:
            tx.delete(root + CONTROLLER, version=holder.version)
        change(tx)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return epoch, results[0].version
    raise MigrationError("the controller kept changing in ZooKeeper: try again")


class ZooKeeperMigration:
    """ZooKeeper as the source of a migration to KRaft; see the module's docstring."""

    def __init__(self, config: Config) -> None:
        self._connect = config["zookeeper.connect"]
        if not self._connect:
            raise ConfigError("zookeeper.metadata.migration.enable=true needs zookeeper.connect: the ensemble and "
                              "chroot of the cluster being migrated")
        try:
            hosts, self._root = split_connect(self._connect)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._settings = ZooKeeperClientSettings.from_config(config, hosts)
        self._snapshot_bytes: int = config["metadata.log.max.record.bytes.between.snapshots"]
        self._controller_listeners = set(config["controller.listener.names"])
        self.node_id: int = config["node.id"]
        self._zk: KazooClient | None = None
        self._store: MetadataZNodes | None = None
        self._listener: MetadataListener | None = None
        self._active: Callable[[], bool] = lambda: False
        #: Commits to mirror, in order, while this node holds /controller: (offset, records, before, after).
        self._queue: collections.deque[tuple[int, Sequence[MetadataRecord], MetadataImage, MetadataImage]] = (
            collections.deque())
        self._queued = anyio.Event()
        #: The version of /controller_epoch this node set when it claimed /controller; None while it holds none.
        self._version: int | None = None
        self._epoch = -1
        #: The offset of the last record in ZooKeeper's log, and its commit's sequence, once this node holds /controller.
        self._mirrored = -1
        self._sequence = -1
        #: Bytes mirrored since ZooKeeper's last snapshot: past metadata.log.max.record.bytes.between.snapshots,
        #: a snapshot trims the mirrored log, as the ZooKeeper quorum's controller does.
        self._since_snapshot = 0
        self._layout: list[Write] = []
        #: /josef/migration was found gone (said once).
        self._rolled_back = False
        self._closed = False

    # Taking over (josef metadata migrate) --------------------------------------------------------------

    def take_over(self) -> MigratedMetadata:
        zk = self._settings.connect(self._connect)
        try:
            try:
                cluster_id = cluster_id_of(zk.get(self._root + CLUSTER_ID)[0])
            except NoNodeError:
                raise MigrationError(f"ZooKeeper at zookeeper.connect={self._connect} holds no cluster "
                                     f"({CLUSTER_ID} is missing): check the chroot") from None
            if zk.exists(self._root + MIGRATION):
                raise MigrationError(f"the cluster at zookeeper.connect={self._connect} is already migrating to KRaft "
                                     f"({MIGRATION}: {zk.get(self._root + MIGRATION)[0].decode()})")
            marker = {"version": 1, "state": "migrating", "timestamp": str(int(time.time() * 1000))}
            epoch, _ = _bump_epoch(zk, self._root,
                                   lambda tx: tx.create(self._root + MIGRATION, json.dumps(marker).encode()))
            offset, records = MetadataZNodes(zk, self._root, self._settings.max_in_flight).read_all()
            log.info("ZooKeeper's controllers fenced (controller epoch %d); its metadata log ends at offset %d "
                     "(%d records in the image)", epoch, offset, len(records))
            return MigratedMetadata(cluster_id, offset, records)
        finally:
            stop(zk)

    def roll_back(self) -> int:
        """Bump the epoch (the KRaft controller's next write is refused), delete /controller and /josef/migration,
        so ZooKeeper-mode nodes stand again."""
        zk = self._settings.connect(self._connect)
        try:
            if not zk.exists(self._root + MIGRATION):
                raise MigrationError(f"the cluster at zookeeper.connect={self._connect} is not migrating "
                                     f"({MIGRATION} is missing)")
            return _bump_epoch(zk, self._root, lambda tx: tx.delete(self._root + MIGRATION))[0]
        finally:
            stop(zk)

    # Mirroring, on a KRaft controller -------------------------------------------------------------------

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup, active: Callable[[], bool]) -> None:
        self._listener, self._active = listener, active
        self._zk = await anyio.to_thread.run_sync(self._settings.connect, self._connect)
        self._store = MetadataZNodes(self._zk, self._root, self._settings.max_in_flight)
        tg.start_soon(self._mirror)

    def on_commit(self, offset: int, records: Sequence[MetadataRecord], before: MetadataImage,
                  after: MetadataImage) -> None:
        if self._version is not None and not self._closed:
            self._queue.append((offset, records, before, after))
            self._queued.set()

    async def close(self) -> None:
        self._closed = True
        self._version = None
        zk, self._zk = self._zk, None
        await stop_in_thread(zk)

    async def _mirror(self) -> None:
        while not self._closed:
            with anyio.move_on_after(POLL_S):
                await self._queued.wait()
            self._queued = anyio.Event()
            if not self._active():
                self._resign()
                continue
            try:
                if self._version is None and not await self._claim():
                    continue
                await self._write_queued()
            except Deposed as exc:
                log.warning("node %d no longer mirrors the metadata into ZooKeeper: %s", self.node_id, exc)
                self._resign()
            except KazooException as exc:
                if self._closed:
                    return
                # A write of unknown outcome (the connection lost after sending it): claim again, which reads where
                # ZooKeeper's log really ends and brings it up to the image, rather than write a commit twice.
                log.warning("mirroring the metadata into ZooKeeper failed (%r); claiming /controller again in %.1f s",
                            exc, POLL_S)
                self._resign()
                await anyio.sleep(POLL_S)

    def _resign(self) -> None:
        self._version = None
        self._queue.clear()
        self._layout.clear()

    async def _claim(self) -> bool:
        """Become the controller ZooKeeper names; bring its log up to this node's image. False if it cannot now."""
        assert self._listener is not None and self._store is not None
        endpoints = [e for e in self._listener.endpoints() if e.name in self._controller_listeners]
        claimed = await anyio.to_thread.run_sync(self._try_claim, controller_json(self.node_id, endpoints))
        if claimed is None:
            return False
        self._epoch, self._version = claimed
        # Commits from here on are queued; what is in the image and not in ZooKeeper goes as a snapshot.
        image = self._listener.current_image()
        last, sequence = await anyio.to_thread.run_sync(self._store.log_end)
        if image.offset > last:
            encoded = await anyio.to_thread.run_sync(
                lambda: encode_snapshot(image.offset, sequence, list(image.records())))
            await anyio.to_thread.run_sync(self._store.write_snapshot, encoded, self._version, sequence)
            last = image.offset
        self._mirrored, self._sequence, self._since_snapshot = last, sequence, 0
        self._layout = full_layout(image, self._epoch)
        log.info("node %d is the controller ZooKeeper names (controller epoch %d): mirroring the metadata from "
                 "offset %d", self.node_id, self._epoch, last)
        return True

    def _try_claim(self, data: bytes) -> tuple[int, int] | None:
        """/controller taken, /controller_epoch bumped, in one multi-op that checks /josef/migration is there."""
        assert self._zk is not None
        zk = self._zk
        if not zk.exists(self._root + MIGRATION):
            if not self._rolled_back:
                log.error("the migration to KRaft was rolled back (%s is gone): node %d does not mirror into "
                          "ZooKeeper; stop the KRaft controllers", MIGRATION, self.node_id)
            self._rolled_back = True
            return None

        def claim(tx: Any) -> None:
            tx.check(self._root + MIGRATION, -1)
            tx.create(self._root + CONTROLLER, data, ephemeral=True)

        try:
            return _bump_epoch(zk, self._root, claim)
        except MigrationError:
            return None  # others claimed it meanwhile (or the migration was rolled back): looked at again later

    async def _write_queued(self) -> None:
        assert self._store is not None
        while self._queue and self._version is not None and not self._closed:
            offset, records, before, after = self._queue[0]
            if offset > self._mirrored:
                base = offset - len(records) + 1
                commit = encode_commit(base, records, previous=self._mirrored)
                self._sequence = await anyio.to_thread.run_sync(self._store.write_commit, commit, self._version)
                self._mirrored = offset
                self._layout += changed_layout(before, after, records, self._epoch)
                self._since_snapshot += len(commit.data) + sum(len(data) for _, data in commit.parts)
                if self._since_snapshot >= self._snapshot_bytes:
                    sequence = self._sequence
                    encoded = await anyio.to_thread.run_sync(
                        lambda: encode_snapshot(offset, sequence, list(after.records())))
                    await anyio.to_thread.run_sync(self._store.write_snapshot, encoded, self._version,
                                                   self._sequence)
                    self._since_snapshot = 0
            self._queue.popleft()
        while self._layout and self._version is not None and not self._closed:
            batch = layout_batch(self._layout)
            await anyio.to_thread.run_sync(self._store.write_layout, batch, self._version)
            del self._layout[:len(batch)]


def migration_from_zookeeper(config: Config) -> ZooKeeperMigration | None:
    """The migration a KRaft controller's configuration asks for: ``zookeeper.metadata.migration.enable=true``."""
    return ZooKeeperMigration(config) if config["zookeeper.metadata.migration.enable"] else None
