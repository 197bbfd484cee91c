"""The ZooKeeper metadata quorum: the same metadata log as KRaft's, kept in an Apache ZooKeeper ensemble.

What the broker sees is :class:`josef.metadata.quorum.MetadataQuorum`; what
replicates the log is ZooKeeper itself, so this backend needs no Raft. Each
node connects with kazoo to
``zookeeper.connect`` (its chroot created when missing, as Kafka 3.x did),
reads every commit of ``/josef/metadata/log`` in order, then follows the log
through a children watch.

The active controller is elected as Kafka 3.x elected it: one multi-op
creates the ephemeral ``/controller`` and bumps ``/controller_epoch`` with a
version check. Every append is a multi-op that checks ``/controller_epoch``
is still at the version this node set and creates the commit's sequential
znode, so a deposed controller (its session expired, paused, partitioned
away) can never write: its check fails and it answers NOT_CONTROLLER. A new
controller reads the log to its end before its first append, so it decides
on the latest state, and numbers records on from there. Nodes with the
controller role stand for election; ``/controller`` also names the winner's
controller listener, where the other nodes' brokers send what they ask of
the controller (registration, heartbeats, forwarded admin requests).

Each broker keeps Kafka's ephemeral ``/brokers/ids/<id>`` in its session.
When one goes (the broker killed, paused or cut off past its session), the
active controller takes it, as Kafka 3.x's did, for a dead broker: the
node's controller fences it at once (``on_broker_session_end``) instead of
waiting out ``broker.session.timeout.ms``.

Offsets are the records' positions in the log, as in KRaft: a commit's
znode carries the offset of its first record, and they follow each other
without gaps, which the reader checks; a commit that is not what josef
wrote (bad header, CRC, a gap) stops the node with the znode's path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from josef.config import Config, ConfigError
from josef.log import LogStorage
from josef.metadata import meta_properties
from josef.metadata.quorum import MetadataListener, NotControllerError
from josef.metadata.records import Endpoint, MetadataRecord, random_uuid
from josef.node.broker_config import inter_broker_listener_name
from josef.protocol.api_keys import ApiKey
from josef.server.dispatch import RequestContext
from josef_metadata_zk.commits import (
    CorruptCommitError,
    encode_commit,
    encode_snapshot,
)
from josef_metadata_zk.describe import describe_quorum
from josef_metadata_zk.metadata_znodes import Deposed, MetadataZNodes, layout_batch
from josef_metadata_zk.kafka_layout import Write, changed_layout, full_layout
from josef_metadata_zk.znodes import (
    BROKER_IDS,
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    METADATA_LOG,
    METADATA_PARTS,
    MIGRATION,
    cluster_id_json,
    cluster_id_of,
    commit_sequence,
    ControllerZNode,
    broker_json,
    controller_json,
    controller_of,
    split_connect,
)
from josef_metadata_zk.zk_client import ZooKeeperClientSettings, stop_in_thread

log = logging.getLogger(__name__)

#: How long to wait before asking ZooKeeper again after a failed request (it is down, or the session is being replaced).
RETRY_S = 1.0


class ZooKeeperQuorum:
    """The metadata quorum on ZooKeeper; see the module's docstring."""

    def __init__(self, config: Config, log_storage: LogStorage | None = None) -> None:
        connect = config["zookeeper.connect"]
        if not connect:
            raise ConfigError("metadata.quorum=zookeeper needs zookeeper.connect (host:port[,host:port...][/chroot])")
        try:
            self._hosts, self._root = split_connect(connect)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._connect = connect
        self.node_id: int = config["node.id"]
        #: Kafka 3.x made every broker eligible; here the nodes with the controller role, as in KRaft.
        self._eligible = "controller" in config["process.roles"]
        self._controller_listeners = set(config["controller.listener.names"])
        own = {item.partition("://")[0].strip() for item in config["listeners"]}
        #: A Kafka 3.x ZooKeeper-mode node (every one may be elected) has no controller listener: its controller is
        #: reached on the inter-broker listener, which /controller then names (the broker's listeners answer the
        #: controller's APIs too). A broker-only node reaches controllers that have one as a KRaft broker does.
        self.controller_on_broker_listener = self._eligible and not own & self._controller_listeners
        self._inter_broker_listener = inter_broker_listener_name(config)
        self._local_cluster_id = _formatted_cluster_id(config)
        self._client = ZooKeeperClientSettings.from_config(config, self._hosts)
        self._zk: KazooClient | None = None
        self._store: MetadataZNodes | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: MetadataListener | None = None
        self._cluster_id = ""
        #: What /controller said when last read (None: nobody holds it, or it has not been read).
        self._controller: ControllerZNode | None = None
        #: The version of /controller_epoch this node set when elected; None while it is not the controller.
        self._epoch_version: int | None = None
        self.controller_epoch = -1
        self._delivered_seq = -1
        self._delivered_offset = -1
        self._next_offset = 0
        self._delivered = anyio.Event()
        self._changed = anyio.Event()
        self._election = anyio.Event()
        self._deliver_lock = anyio.Lock()
        self._append_lock = anyio.Lock()
        #: Held while deciding on or taking the controllership, so a watch's nudge never acts on a half-won election.
        self._election_lock = anyio.Lock()
        self._closed = False
        self._snapshot_bytes: int = config["metadata.log.max.record.bytes.between.snapshots"]
        #: Bytes this controller committed since its last snapshot (a new controller counts from 0).
        self._since_snapshot = 0
        self._snapshotting = False
        self._snapshot_done = anyio.Event()
        self._snapshot_done.set()
        self._tg: anyio.abc.TaskGroup | None = None
        #: This node's /brokers/ids znode data, from its registration in the image (None before it registered),
        #: and the registration it was made from.
        self._registration: bytes | None = None
        self._registered_from: tuple[str, int] | None = None
        self._register = anyio.Event()
        #: Kafka's layout still to write (:mod:`josef_metadata_zk.kafka_layout`), in order, while controller.
        self._layout: list[Write] = []
        #: Bumped at each election won: what an earlier term's writer does to the list no longer applies.
        self._layout_term = 0
        self._layout_queued = anyio.Event()
        #: The brokers whose /brokers/ids znode is there, with their broker epoch in the image when it appeared: the
        #: registration whose session ends when it goes.
        self._broker_sessions: dict[int, int] = {}

    # What the broker asks ---------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        """The active controller, once brokers can reach it: this node, or one whose /controller names its listener."""
        known = self._controller
        if known is None:
            return -1
        return known.node_id if known.node_id == self.node_id or known.endpoint is not None else -1

    def controllers(self) -> Mapping[int, tuple[str, int]]:
        """Only the active controller is known (ZooKeeper has no voters), and only when it is another node."""
        known = self._controller
        if known is None or known.endpoint is None or known.node_id == self.node_id:
            return {}
        return {known.node_id: known.endpoint}

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        return self.controllers().get(node_id)

    def apis(self) -> Sequence[tuple[int, Any, int, int]]:
        # ZooKeeper replicates the log: no Raft APIs; DescribeQuorum for the tools (josef_metadata_zk.describe).
        return ((ApiKey.DESCRIBE_QUORUM, self._describe_quorum, 0, 2),)

    async def _describe_quorum(self, ctx: RequestContext, request: Any) -> dict[str, Any]:
        assert self._listener is not None
        return describe_quorum(request, node_id=self.node_id,
                               controller_id=self.node_id if self.is_controller else self.controller_id,
                               controller_epoch=self.controller_epoch, high_watermark=self._delivered_offset + 1,
                               brokers=self._listener.current_image().brokers,
                               endpoints=self._controller_endpoints() or self._listener.endpoints())

    def _controller_endpoints(self) -> list[Endpoint]:
        """This node's controller listeners, as /controller names them for the other nodes."""
        assert self._listener is not None
        if self.controller_on_broker_listener:
            return [e for e in self._listener.endpoints() if e.name == self._inter_broker_listener]
        return [e for e in self._listener.endpoints() if e.name in self._controller_listeners]

    @property
    def is_controller(self) -> bool:
        return self._epoch_version is not None and not self._closed

    # Starting --------------------------------------------------------------------------------

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup) -> None:
        self._listener = listener
        self._tg = tg
        self._loop = asyncio.get_running_loop()
        self._zk = await anyio.to_thread.run_sync(self._open)
        self._store = MetadataZNodes(self._zk, self._root, self._client.max_in_flight)
        await self._deliver_new()
        tg.start_soon(self._follow)
        tg.start_soon(self._campaign)
        tg.start_soon(self._keep_registered)
        tg.start_soon(self._keep_layout)
        await anyio.to_thread.run_sync(self._watch)
        async with self._election_lock:
            await self._elect()

    def _open(self) -> KazooClient:
        """Connect, create the chroot and josef's paths when missing, and read (or make) the cluster id."""
        zk = self._client.connect(self._connect)
        try:
            for path in (METADATA_LOG, METADATA_PARTS, "/cluster", BROKER_IDS):
                zk.ensure_path(self._root + path)
            try:  # the first node defines the cluster, with the id its log directories were formatted with if any
                zk.create(self._root + CLUSTER_ID, cluster_id_json(self._local_cluster_id or random_uuid()))
            except NodeExistsError:
                pass
            self._cluster_id = cluster_id_of(zk.get(self._root + CLUSTER_ID)[0])
            if self._local_cluster_id not in (None, self._cluster_id):  # Kafka's InconsistentClusterIdException
                raise ConfigError(f"the log directories belong to cluster {self._local_cluster_id}, but ZooKeeper at "
                                  f"zookeeper.connect={self._connect} holds cluster {self._cluster_id}: point "
                                  f"zookeeper.connect at the cluster's ensemble and chroot, or format the directories "
                                  f"for it (josef storage format -t {self._cluster_id})")
            try:
                zk.create(self._root + CONTROLLER_EPOCH, b"0")  # Kafka's initial controller epoch
            except NodeExistsError:
                pass
        except BaseException:
            zk.stop()
            zk.close()
            raise
        zk.add_listener(self._on_state)
        return zk

    def _watch(self) -> None:
        assert self._zk is not None
        self._zk.ChildrenWatch(self._root + METADATA_LOG, self._on_children)
        self._zk.DataWatch(self._root + CONTROLLER, self._on_controller)
        if self._eligible:
            self._zk.ChildrenWatch(self._root + BROKER_IDS, self._on_brokers)
            # A migration to KRaft rolled back (/josef/migration gone) lets this node stand again.
            self._zk.DataWatch(self._root + MIGRATION, self._on_controller)

    # kazoo's callbacks (its thread): hand over to the event loop --------------------------------

    def _call_soon(self, callback: Any) -> None:
        if self._loop is not None and not self._closed:
            try:
                self._loop.call_soon_threadsafe(callback)
            except RuntimeError:  # the loop has closed: nothing to tell
                pass

    def _on_children(self, _children: list[str]) -> bool:
        self._call_soon(lambda: self._changed.set())
        return not self._closed

    def _on_brokers(self, children: list[str]) -> bool:
        present = {int(child) for child in children if child.isdigit()}
        self._call_soon(lambda: self._brokers_present(present))
        return not self._closed

    def _on_controller(self, _data: bytes | None, _stat: Any) -> bool:
        # Only a nudge: callbacks may arrive after this node's own later writes, so the campaign reads /controller
        # afresh (a session reads its own writes in order) instead of trusting what the callback carries.
        self._call_soon(lambda: self._election.set())
        return not self._closed

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:  # our ephemeral /controller went with the session
            self._call_soon(self._resign)
        elif state == KazooState.CONNECTED:  # back (perhaps in a new session): look again at /controller and the log,
            # and register again: a new session has lost the old one's ephemeral /brokers/ids/<id>
            self._call_soon(lambda: (self._election.set(), self._changed.set(), self._register.set()))

    def _brokers_present(self, present: set[int]) -> None:
        """Kafka 3.x's controller took a vanished /brokers/ids/<id> for a dead broker: so does the active controller
        here, telling the node's controller (which fences it) unless the broker registered again since."""
        assert self._listener is not None
        brokers = self._listener.current_image().brokers
        for broker_id in present - self._broker_sessions.keys():
            self._broker_sessions[broker_id] = brokers[broker_id].epoch if broker_id in brokers else -1
        for broker_id in self._broker_sessions.keys() - present:
            epoch = self._broker_sessions.pop(broker_id)
            if self.is_controller and epoch >= 0:
                self._listener.on_broker_session_end(broker_id, epoch)

    def _learn_broker_epochs(self) -> None:
        """A /brokers/ids znode may appear before this node's image holds the registration it was written from (the
        broker read it from ZooKeeper first): its epoch is taken from the first image that has one."""
        assert self._listener is not None
        brokers = self._listener.current_image().brokers
        for broker_id, epoch in self._broker_sessions.items():
            if epoch < 0 and broker_id in brokers:
                self._broker_sessions[broker_id] = brokers[broker_id].epoch

    # Following the log -----------------------------------------------------------------------------

    async def _follow(self) -> None:
        while not self._closed:
            await self._changed.wait()
            self._changed = anyio.Event()
            try:
                await self._deliver_new()
            except KazooException as exc:
                if self._closed:
                    return
                log.warning("reading the metadata log from ZooKeeper failed (%r); trying again in %.0f s", exc, RETRY_S)
                await anyio.sleep(RETRY_S)
                self._changed.set()

    async def _deliver_new(self) -> None:
        """Deliver every commit not delivered yet, in order; the snapshot first when the commits after what was
        delivered are gone (trimmed by a snapshot), and at start-up."""
        async with self._deliver_lock:
            if self._closed:
                return
            assert self._store is not None
            snapshot, commits = await anyio.to_thread.run_sync(self._store.read_new, self._delivered_seq,
                                                               self._delivered_offset)
            assert self._listener is not None
            if snapshot is not None:
                header, records = snapshot
                log.info("metadata snapshot at offset %d (%d records) loaded from ZooKeeper", header.offset, len(records))
                self._listener.on_snapshot(header.offset, records)
                self._delivered_seq, self._delivered_offset = header.sequence, header.offset
            for name, header, records in commits:
                if header.previous_offset != self._delivered_offset:
                    raise CorruptCommitError(
                        f"ZooKeeper znode {self._root}{METADATA_LOG}/{name}: its records start at offset "
                        f"{header.base_offset}, but the log before it ends at {self._delivered_offset}")
                before = self._listener.current_image()
                self._listener.on_commit(header.last_offset, records)
                if self.is_controller:  # what the commit changed in Kafka's layout, in order behind earlier writes
                    self._queue_layout(changed_layout(before, self._listener.current_image(), records,
                                                      self.controller_epoch))
                self._delivered_seq = commit_sequence(name)
                self._delivered_offset = header.last_offset
            if snapshot is not None or commits:
                self._delivered.set()
                self._delivered = anyio.Event()
                self._note_registration()
                self._learn_broker_epochs()

    # Kafka's layout ------------------------------------------------------------------------------------

    def _queue_layout(self, writes: list[Write]) -> None:
        if writes:
            self._layout += writes
            self._layout_queued.set()

    async def _keep_layout(self) -> None:
        """Write Kafka's layout behind the commits while this node is the controller: a multi-op at a time, each
        in a worker thread, so that closing the node never waits for more than one."""
        while not self._closed:
            await self._layout_queued.wait()
            self._layout_queued = anyio.Event()
            while self._layout and not self._closed:
                version, store = self._epoch_version, self._store
                if version is None or store is None or self._zk is None:
                    self._layout.clear()  # deposed: the next controller writes the whole view again
                    break
                batch, term = layout_batch(self._layout), self._layout_term
                try:
                    await anyio.to_thread.run_sync(store.write_layout, batch, version)
                except Deposed:
                    if term == self._layout_term:
                        self._layout.clear()
                    continue
                except KazooException as exc:
                    if self._closed:
                        return
                    log.warning("writing Kafka's znodes to ZooKeeper failed (%r); trying again in %.0f s", exc, RETRY_S)
                    await anyio.sleep(RETRY_S)
                    continue
                if term == self._layout_term:
                    del self._layout[:len(batch)]

    # Broker registration -------------------------------------------------------------------------------

    def _note_registration(self) -> None:
        """Register /brokers/ids/<id> anew when the image holds a new registration of this node's broker."""
        assert self._listener is not None
        broker = self._listener.current_image().brokers.get(self.node_id)
        if broker is None or (broker.incarnation_id, broker.epoch) == self._registered_from:
            return
        self._registered_from = (broker.incarnation_id, broker.epoch)
        self._registration = broker_json(broker)
        self._register.set()

    async def _keep_registered(self) -> None:
        """Keep the ephemeral /brokers/ids/<id> of this session holding the latest registration, as Kafka 3.x's
        brokers did; while an earlier session's (this node before a kill -9) is still there, wait for it to expire."""
        waiting = False
        while not self._closed:
            await self._register.wait()
            self._register = anyio.Event()
            zk = self._zk
            if self._registration is None or zk is None:
                continue
            try:
                done = await anyio.to_thread.run_sync(self._write_registration, zk, self._registration)
            except KazooException as exc:
                if self._closed:
                    return
                log.warning("registering /brokers/ids/%d in ZooKeeper failed (%r); trying again in %.0f s",
                            self.node_id, exc, RETRY_S)
                done = False
            if not done:
                if not waiting:
                    log.warning("/brokers/ids/%d is held by another ZooKeeper session (this node's before a restart, "
                                "until it expires; or another node with node.id %d): waiting for it to go",
                                self.node_id, self.node_id)
                waiting = True
                await anyio.sleep(RETRY_S)
                self._register.set()
            else:
                waiting = False

    def _write_registration(self, zk: KazooClient, data: bytes) -> bool:
        """Create (or update) this session's /brokers/ids/<id>; False while another session holds it."""
        path = f"{self._root}{BROKER_IDS}/{self.node_id}"
        try:
            zk.create(path, data, ephemeral=True, makepath=True)
            return True
        except NodeExistsError:
            pass
        try:
            _, stat = zk.get(path)
        except NoNodeError:
            return False  # gone meanwhile: the next try creates it
        if stat.ephemeralOwner != zk.client_id[0]:
            return False
        zk.set(path, data, version=stat.version)
        return True

    # The controller ----------------------------------------------------------------------------------

    def _resign(self) -> None:
        if self._epoch_version is not None:
            log.warning("node %d is no longer the active controller: its ZooKeeper session was lost", self.node_id)
        self._epoch_version = None
        self._controller = None
        self._election.set()

    async def _campaign(self) -> None:
        """Follow /controller: learn who holds it, notice when it is not us any more, and stand when it is free."""
        while not self._closed:
            await self._election.wait()
            self._election = anyio.Event()
            if self._closed:
                return
            async with self._election_lock:
                try:
                    holder, ours = await anyio.to_thread.run_sync(self._read_controller)
                except KazooException as exc:
                    log.warning("reading /controller from ZooKeeper failed (%r); trying again in %.0f s", exc, RETRY_S)
                    await anyio.sleep(RETRY_S)
                    self._election.set()
                    continue
                if ours and self._epoch_version is None:
                    # Given up after a write of unknown outcome, yet still ours: let it go and stand again, so the
                    # log is read to its end before the next write.
                    if not await self._abdicate():
                        await anyio.sleep(RETRY_S)
                    self._election.set()
                    continue
                if not ours:
                    self._epoch_version = None  # another node holds /controller, or nobody does
                # Our id left by an earlier session of this node (until it expires) is no controller to send to.
                self._controller = holder if holder is not None and (ours or holder.node_id != self.node_id) else None
                if holder is None:
                    await self._elect()

    def _read_controller(self) -> tuple[ControllerZNode | None, bool]:
        """What /controller in ZooKeeper says now (None: nobody holds it), and whether it is this session's."""
        assert self._zk is not None
        try:
            data, stat = self._zk.get(self._root + CONTROLLER)
        except NoNodeError:
            return None, False
        return controller_of(data), stat.ephemeralOwner == self._zk.client_id[0]

    async def _elect(self) -> None:
        """Try to become the active controller; on winning, deliver the whole log before taking appends."""
        if self._closed or self._epoch_version is not None or not self._eligible:
            return
        assert self._listener is not None
        endpoints = self._controller_endpoints()
        try:
            won = await anyio.to_thread.run_sync(self._try_elect, endpoints)
        except KazooException as exc:
            log.warning("controller election through ZooKeeper failed (%r); trying again in %.0f s", exc, RETRY_S)
            await anyio.sleep(RETRY_S)
            self._election.set()
            return
        if won is None:
            return
        epoch, version = won
        await self._deliver_new()
        self._next_offset = self._delivered_offset + 1
        self.controller_epoch = epoch
        self._epoch_version = version
        self._controller = ControllerZNode(self.node_id, None)
        log.info("node %d is the active controller (controller epoch %d, metadata log at offset %d)",
                 self.node_id, epoch, self._delivered_offset)
        assert self._listener is not None
        self._layout.clear()  # an earlier term's leftovers: the whole view is written again
        self._layout_term += 1
        self._queue_layout(full_layout(self._listener.current_image(), epoch))

    def _try_elect(self, endpoints: Sequence[Endpoint]) -> tuple[int, int] | None:
        """Kafka 3.x's registration: /controller and the bumped /controller_epoch in one multi-op, or None."""
        assert self._zk is not None
        zk = self._zk
        data, stat = zk.get(self._root + CONTROLLER_EPOCH)
        epoch = int(data or b"0") + 1
        tx = zk.transaction()
        tx.create(self._root + CONTROLLER, controller_json(self.node_id, endpoints), ephemeral=True)
        tx.set_data(self._root + CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
        # Fails while /josef/migration is there: the cluster is moving to KRaft, whose controller holds /controller.
        tx.create(self._root + MIGRATION, b"")
        tx.delete(self._root + MIGRATION)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            return None  # another node was elected, or the epoch moved under us: its watch tells us who
        return epoch, results[1].version

    # Appending ---------------------------------------------------------------------------------------

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        if not self.is_controller:
            raise NotControllerError(f"node {self.node_id} is not the active controller "
                                     f"(the controller is {self.controller_id})")
        async with self._append_lock:
            version = self._epoch_version
            if version is None or self._closed:
                raise NotControllerError(f"node {self.node_id} is no longer the active controller")
            base = self._next_offset
            commit = encode_commit(base, records)
            try:
                assert self._store is not None
                await anyio.to_thread.run_sync(self._store.write_commit, commit, version)
            except Deposed as exc:
                self._epoch_version = None
                log.warning("node %d is no longer the active controller: its write was refused, %s", self.node_id, exc)
                raise NotControllerError(f"node {self.node_id} was deposed as controller: {exc}") from None
            except KazooException as exc:
                # The outcome is unknown (a lost connection): give up the controllership, so that whoever is
                # elected next reads the log as it really is before writing.
                await self._abdicate()
                raise NotControllerError(f"writing the metadata log to ZooKeeper failed: {exc!r}") from None
            self._next_offset = base + len(records)
            last = base + len(records) - 1
            while self._delivered_offset < last:
                delivered = self._delivered
                self._changed.set()
                await delivered.wait()
            self._since_snapshot += len(commit.data) + sum(len(data) for _, data in commit.parts)
            if self._since_snapshot >= self._snapshot_bytes and not self._snapshotting and self._tg is not None:
                self._snapshotting = True
                self._snapshot_done = anyio.Event()
                self._tg.start_soon(self._snapshot, version)
            return last

    async def _snapshot(self, version: int) -> None:
        """Write a snapshot of the image as delivered now, then delete the commits it covers (their parts too).

        Written by the active controller only: the snapshot znode is set in
        the same multi-op that checks ``/controller_epoch``, as a commit is.
        The image is immutable, so a worker thread encodes it while the
        loop goes on.
        """
        try:
            assert self._listener is not None
            image, offset, sequence = self._listener.current_image(), self._delivered_offset, self._delivered_seq
            self._since_snapshot = 0
            started = anyio.current_time()
            encoded = await anyio.to_thread.run_sync(lambda: encode_snapshot(offset, sequence, list(image.records())))
            assert self._store is not None
            trimmed = await anyio.to_thread.run_sync(self._store.write_snapshot, encoded, version, sequence)
            log.info("metadata snapshot at offset %d written to ZooKeeper (%d bytes in %d znodes, %.2f s); "
                     "%d commits it covers deleted", offset, len(encoded.data) + sum(len(d) for _, d in encoded.parts),
                     1 + len(encoded.parts), anyio.current_time() - started, trimmed)
        except Deposed:
            pass  # another node leads: its own snapshots will come
        except KazooException as exc:
            if not self._closed:
                log.warning("writing a metadata snapshot to ZooKeeper failed (%r); the next one is tried later", exc)
        finally:
            self._snapshotting = False
            self._snapshot_done.set()

    async def snapshot_written(self) -> None:
        """Wait until the snapshot being written, if any, is (tests: it is written in the background)."""
        await self._snapshot_done.wait()

    async def _abdicate(self) -> bool:
        """Stop being the controller and delete our /controller; False if ZooKeeper could not be told."""
        self._epoch_version = None
        self._controller = None
        try:
            await anyio.to_thread.run_sync(self._delete_own_controller)
        except KazooException as exc:
            log.warning("could not give up /controller (%r); it goes when the session ends", exc)
            return False
        return True

    def _delete_own_controller(self) -> None:
        assert self._zk is not None
        try:
            data, stat = self._zk.get(self._root + CONTROLLER)
        except NoNodeError:
            return
        if controller_of(data).node_id == self.node_id and stat.ephemeralOwner == self._zk.client_id[0]:
            self._zk.delete(self._root + CONTROLLER, version=stat.version)

    # Closing -----------------------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        self._epoch_version = None
        self._controller = None
        zk, self._zk = self._zk, None
        await stop_in_thread(zk)


def _formatted_cluster_id(config: Config) -> str | None:
    """The cluster id the node's metadata log directory was formatted with; None before it is formatted."""
    try:
        props = meta_properties.read(meta_properties.log_dirs(config)[0])
    except OSError:
        return None  # an unreadable disk: the broker's own start-up check reports it
    return props.cluster_id if props is not None else None


