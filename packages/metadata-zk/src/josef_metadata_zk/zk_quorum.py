"""The ZooKeeper metadata quorum: the same metadata log as KRaft's, kept in an Apache ZooKeeper ensemble.

What the broker sees is :class:`josef.metadata.quorum.MetadataQuorum`; what
replicates the log is ZooKeeper itself, so this backend needs no Raft and no
controller listener of its own. Each node connects with kazoo to
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
on the latest state, and numbers records on from there.

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
from kazoo.handlers.threading import KazooTimeoutError

from josef.config import Config, ConfigError
from josef.log import LogStorage
from josef.metadata import meta_properties
from josef.metadata.quorum import MetadataListener, NotControllerError
from josef.metadata.records import MetadataRecord, random_uuid
from josef_metadata_zk.commits import CommitHeader, CorruptCommitError, decode_records, encode_commit, read_header
from josef_metadata_zk.znodes import (
    CLUSTER_ID,
    COMMIT_PREFIX,
    CONTROLLER,
    CONTROLLER_EPOCH,
    METADATA_LOG,
    METADATA_PARTS,
    cluster_id_json,
    cluster_id_of,
    commit_sequence,
    controller_id_of,
    controller_json,
    split_connect,
)

log = logging.getLogger(__name__)

#: How long to wait before asking ZooKeeper again after a failed request (it is down, or the session is being replaced).
RETRY_S = 1.0


class _Deposed(Exception):
    """The controller epoch moved on: another node was elected since this one."""


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
        self._local_cluster_id = _formatted_cluster_id(config)
        self._session_s = config["zookeeper.session.timeout.ms"] / 1000
        connection_ms = config["zookeeper.connection.timeout.ms"]
        self._connection_s = (connection_ms if connection_ms is not None else config["zookeeper.session.timeout.ms"]) / 1000
        self._zk: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: MetadataListener | None = None
        self._cluster_id = ""
        self._controller_id = -1
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

    # What the broker asks ---------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        return self._controller_id

    def controllers(self) -> Mapping[int, tuple[str, int]]:
        return {}

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        return None

    def apis(self) -> Sequence[tuple[int, Any, int, int]]:
        return ()  # ZooKeeper replicates the log: no Raft APIs

    @property
    def is_controller(self) -> bool:
        return self._epoch_version is not None and not self._closed

    # Starting --------------------------------------------------------------------------------

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup) -> None:
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self._zk = await anyio.to_thread.run_sync(self._open)
        await self._deliver_new()
        tg.start_soon(self._follow)
        tg.start_soon(self._campaign)
        await anyio.to_thread.run_sync(self._watch)
        async with self._election_lock:
            await self._elect()

    def _open(self) -> KazooClient:
        """Connect, create the chroot and josef's paths when missing, and read (or make) the cluster id."""
        zk = KazooClient(hosts=self._hosts, timeout=self._session_s)
        try:
            zk.start(timeout=self._connection_s)
        except KazooTimeoutError:
            zk.close()
            raise ConfigError(f"cannot reach ZooKeeper at zookeeper.connect={self._connect} within "
                              f"{self._connection_s * 1000:.0f} ms (zookeeper.connection.timeout.ms)") from None
        try:
            for path in (METADATA_LOG, METADATA_PARTS, "/cluster"):
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

    def _on_controller(self, _data: bytes | None, _stat: Any) -> bool:
        # Only a nudge: callbacks may arrive after this node's own later writes, so the campaign reads /controller
        # afresh (a session reads its own writes in order) instead of trusting what the callback carries.
        self._call_soon(lambda: self._election.set())
        return not self._closed

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:  # our ephemeral /controller went with the session
            self._call_soon(self._resign)
        elif state == KazooState.CONNECTED:  # back (perhaps in a new session): look again at /controller and the log
            self._call_soon(lambda: (self._election.set(), self._changed.set()))

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
        """Deliver every commit not delivered yet, in order."""
        async with self._deliver_lock:
            if self._closed:
                return
            names = await anyio.to_thread.run_sync(self._list_commits)
            fresh = [n for n in names if commit_sequence(n) > self._delivered_seq]
            if not fresh:
                return
            commits = await anyio.to_thread.run_sync(self._read_commits, fresh)
            assert self._listener is not None
            for name, (header, records) in zip(fresh, commits):
                if header.base_offset != self._delivered_offset + 1:
                    raise CorruptCommitError(
                        f"ZooKeeper znode {self._root}{METADATA_LOG}/{name}: its records start at offset "
                        f"{header.base_offset}, but the log before it ends at {self._delivered_offset}")
                self._listener.on_commit(header.last_offset, records)
                self._delivered_seq = commit_sequence(name)
                self._delivered_offset = header.last_offset
            self._delivered.set()
            self._delivered = anyio.Event()

    def _list_commits(self) -> list[str]:
        assert self._zk is not None
        return sorted(self._zk.get_children(self._root + METADATA_LOG), key=commit_sequence)

    def _read_commits(self, names: list[str]) -> list[tuple[CommitHeader, list[MetadataRecord]]]:
        assert self._zk is not None
        zk = self._zk
        pending = [zk.get_async(f"{self._root}{METADATA_LOG}/{name}") for name in names]
        out = []
        for name, answer in zip(names, pending):
            where = f"ZooKeeper znode {self._root}{METADATA_LOG}/{name}"
            header = read_header(answer.get()[0], where)
            payload = header.inline
            if header.parts:
                try:
                    payload = b"".join(zk.get(f"{self._root}{METADATA_PARTS}/{part}")[0] for part in header.parts)
                except NoNodeError as exc:
                    raise CorruptCommitError(f"{where}: a part of its records is missing ({exc})") from None
            out.append((header, decode_records(header, payload, where)))
        return out

    # The controller ----------------------------------------------------------------------------------

    def _resign(self) -> None:
        self._epoch_version = None
        self._controller_id = -1
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
                self._controller_id = holder if ours or holder != self.node_id else -1
                if holder < 0:
                    await self._elect()

    def _read_controller(self) -> tuple[int, bool]:
        """The node holding /controller in ZooKeeper now (-1: nobody), and whether it is this session's."""
        assert self._zk is not None
        try:
            data, stat = self._zk.get(self._root + CONTROLLER)
        except NoNodeError:
            return -1, False
        return controller_id_of(data), stat.ephemeralOwner == self._zk.client_id[0]

    async def _elect(self) -> None:
        """Try to become the active controller; on winning, deliver the whole log before taking appends."""
        if self._closed or self._epoch_version is not None:
            return
        try:
            won = await anyio.to_thread.run_sync(self._try_elect)
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
        self._controller_id = self.node_id
        log.info("node %d is the active controller (controller epoch %d, metadata log at offset %d)",
                 self.node_id, epoch, self._delivered_offset)

    def _try_elect(self) -> tuple[int, int] | None:
        """Kafka 3.x's registration: /controller and the bumped /controller_epoch in one multi-op, or None."""
        assert self._zk is not None
        zk = self._zk
        data, stat = zk.get(self._root + CONTROLLER_EPOCH)
        epoch = int(data or b"0") + 1
        tx = zk.transaction()
        tx.create(self._root + CONTROLLER, controller_json(self.node_id), ephemeral=True)
        tx.set_data(self._root + CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            return None  # another node was elected, or the epoch moved under us: its watch tells us who
        return epoch, results[1].version

    # Appending ---------------------------------------------------------------------------------------

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        if not self.is_controller:
            raise NotControllerError(f"node {self.node_id} is not the active controller "
                                     f"(the controller is {self._controller_id})")
        async with self._append_lock:
            version = self._epoch_version
            if version is None or self._closed:
                raise NotControllerError(f"node {self.node_id} is no longer the active controller")
            base = self._next_offset
            commit = encode_commit(base, records)
            try:
                await anyio.to_thread.run_sync(self._write, commit, version)
            except _Deposed as exc:
                self._epoch_version = None
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
            return last

    def _write(self, commit: Any, version: int) -> None:
        assert self._zk is not None
        zk = self._zk
        for name, data in commit.parts:
            zk.create(f"{self._root}{METADATA_PARTS}/{name}", data)
        tx = zk.transaction()
        tx.check(self._root + CONTROLLER_EPOCH, version)
        tx.create(f"{self._root}{METADATA_LOG}/{COMMIT_PREFIX}", commit.data, sequence=True)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            for name, _ in commit.parts:
                zk.delete(f"{self._root}{METADATA_PARTS}/{name}")
            raise _Deposed(f"/controller_epoch is no longer at version {version}")

    async def _abdicate(self) -> bool:
        """Stop being the controller and delete our /controller; False if ZooKeeper could not be told."""
        self._epoch_version = None
        self._controller_id = -1
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
        if controller_id_of(data) == self.node_id and stat.ephemeralOwner == self._zk.client_id[0]:
            self._zk.delete(self._root + CONTROLLER, version=stat.version)

    # Closing -----------------------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        self._epoch_version = None
        self._controller_id = -1
        zk, self._zk = self._zk, None
        if zk is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_stop, zk)


def _formatted_cluster_id(config: Config) -> str | None:
    """The cluster id the node's metadata log directory was formatted with; None before it is formatted."""
    try:
        props = meta_properties.read(meta_properties.log_dirs(config)[0])
    except OSError:
        return None  # an unreadable disk: the broker's own start-up check reports it
    return props.cluster_id if props is not None else None


def _stop(zk: KazooClient) -> None:
    """End the session (its ephemeral znodes, /controller among them, go at once) and release the client."""
    try:
        zk.stop()
    finally:
        zk.close()
