"""Reading and writing the metadata log's znodes: what a node that follows the log and the active controller do.

Reads go in pipelines of at most ``zookeeper.max.in.flight.requests``;
every write an active controller makes (a commit, a snapshot, a multi-op of
Kafka's layout) is conditioned on ``/controller_epoch`` still being at the
version its election set, so a deposed controller can never write. The
ZooKeeper quorum (:mod:`josef_metadata_zk.zk_quorum`) and a KRaft
controller mirroring its log during a migration
(:mod:`josef_metadata_zk.migration`) share these. Every method blocks: call
them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError, RolledBackError
from kazoo.interfaces import IAsyncResult

from josef.metadata.records import MetadataRecord
from josef_metadata_zk.commits import (
    CommitHeader,
    CorruptCommitError,
    EncodedCommit,
    SnapshotHeader,
    decode_records,
    read_header,
    read_snapshot_header,
)
from josef_metadata_zk.kafka_layout import Write
from josef_metadata_zk.zk_client import pipelined
from josef_metadata_zk.znodes import (
    COMMIT_PREFIX,
    CONTROLLER_EPOCH,
    METADATA_LOG,
    METADATA_PARTS,
    METADATA_SNAPSHOT,
    commit_sequence,
)

#: The most paths and data one multi-op of Kafka's layout carries: well under ZooKeeper's 1 MB request limit.
LAYOUT_BATCH_BYTES = 256 * 1024

Snapshot = tuple[SnapshotHeader, list[MetadataRecord]]
Commit = tuple[str, CommitHeader, list[MetadataRecord]]


class Missing(Exception):
    """A commit listed a moment ago, or a part of it, is gone: trimmed by a snapshot, unless none covers it."""


class Deposed(Exception):
    """The controller epoch moved on: another controller was elected since this one."""


class MetadataZNodes:
    """The metadata log under one chroot, through one kazoo client."""

    def __init__(self, zk: KazooClient, root: str, max_in_flight: int) -> None:
        self.zk = zk
        self.root = root
        self._max_in_flight = max_in_flight

    # Reading -------------------------------------------------------------------------------------------

    def read_new(self, sequence: int, offset: int) -> tuple[Snapshot | None, list[Commit]]:
        """The commits after commit ``sequence`` (whose last record is at ``offset``), with the snapshot to load
        before them when there is one newer than ``offset`` and they do not follow on from it (or nothing was
        delivered yet)."""
        snapshot = self.read_snapshot() if offset < 0 else None
        for _ in range(3):  # a snapshot written meanwhile may trim what was listed: read again from it
            if snapshot is not None:
                sequence, offset = snapshot[0].sequence, snapshot[0].offset
            names = [n for n in self.list_commits() if commit_sequence(n) > sequence]
            missing = None
            try:
                commits = self.read_commits(names)
            except Missing as exc:
                commits, missing = None, exc
            if commits is not None and (not commits or commits[0][1].previous_offset == offset):
                return snapshot, commits
            newer = self.read_snapshot()
            if newer is None or newer[0].offset <= offset:
                if missing is not None:
                    raise CorruptCommitError(f"{missing}: it, or a part of it, is missing, and no snapshot covers it")
                return snapshot, commits or []  # the caller names the commit that does not follow on
            snapshot = newer
        raise CorruptCommitError(f"ZooKeeper znodes under {self.root}{METADATA_LOG}: the log kept changing under "
                                 "three reads in a row")

    def read_all(self) -> tuple[int, list[MetadataRecord]]:
        """The whole log as one image's worth of records: the snapshot's, then every commit's, checked to follow on;
        and the offset of the last record (-1 for an empty log)."""
        snapshot, commits = self.read_new(-1, -1)
        offset, records = -1, []
        if snapshot is not None:
            offset, records = snapshot[0].offset, list(snapshot[1])
        for name, header, more in commits:
            if header.previous_offset != offset:
                raise CorruptCommitError(f"ZooKeeper znode {self.root}{METADATA_LOG}/{name}: its records start at "
                                         f"offset {header.base_offset}, but the log before it ends at {offset}")
            offset = header.last_offset
            records += more
        return offset, records

    def log_end(self) -> tuple[int, int]:
        """The offset of the log's last record and the sequence number of its last commit (-1, -1 when empty),
        from the headers of the snapshot and the last commit only."""
        offset = sequence = -1
        try:
            where = f"ZooKeeper znode {self.root}{METADATA_SNAPSHOT}"
            header = read_snapshot_header(self.zk.get(self.root + METADATA_SNAPSHOT)[0], where)
            offset, sequence = header.offset, header.sequence
        except NoNodeError:
            pass
        names = self.list_commits()
        if names:
            where = f"ZooKeeper znode {self.root}{METADATA_LOG}/{names[-1]}"
            last = read_header(self.zk.get(f"{self.root}{METADATA_LOG}/{names[-1]}")[0], where)
            offset, sequence = max(offset, last.last_offset), max(sequence, commit_sequence(names[-1]))
        return offset, sequence

    def list_commits(self) -> list[str]:
        return sorted(self.zk.get_children(self.root + METADATA_LOG), key=commit_sequence)

    def read_commits(self, names: list[str]) -> list[Commit]:
        """``(name, header, records)`` of each commit; :class:`Missing` when one, or a part of it, is gone."""
        zk = self.zk
        pending = self.pipelined(partial(zk.get_async, f"{self.root}{METADATA_LOG}/{name}") for name in names)
        out = []
        for name, answer in zip(names, pending):
            where = f"ZooKeeper znode {self.root}{METADATA_LOG}/{name}"
            try:
                header = read_header(answer.get()[0], where)
                payload = self.payload(header)
            except NoNodeError:
                raise Missing(where) from None
            out.append((name, header, decode_records(header, payload, where)))
        return out

    def payload(self, header: CommitHeader) -> bytes:
        """A commit's (or snapshot's) record bytes: inline, or its parts joined (NoNodeError if one is gone)."""
        if not header.parts:
            return header.inline
        return b"".join(self.zk.get(f"{self.root}{METADATA_PARTS}/{part}")[0] for part in header.parts)

    def read_snapshot(self) -> Snapshot | None:
        """The latest snapshot and its records; None when there is none yet."""
        where = f"ZooKeeper znode {self.root}{METADATA_SNAPSHOT}"
        for _ in range(3):  # its parts go once a newer snapshot replaced it: read the newer one
            try:
                data = self.zk.get(self.root + METADATA_SNAPSHOT)[0]
            except NoNodeError:
                return None
            header = read_snapshot_header(data, where)
            try:
                payload = self.payload(header.records)
            except NoNodeError:
                continue
            return header, decode_records(header.records, payload, where)
        raise CorruptCommitError(f"{where}: a part of its records is missing")

    # Writing, as the active controller -------------------------------------------------------------------

    def write_commit(self, commit: EncodedCommit, version: int) -> int:
        """Append one commit (its parts first); its znode's sequence number. :class:`Deposed` if the epoch moved."""
        zk = self.zk
        for name, data in commit.parts:
            zk.create(f"{self.root}{METADATA_PARTS}/{name}", data)
        tx = zk.transaction()
        tx.check(self.root + CONTROLLER_EPOCH, version)
        tx.create(f"{self.root}{METADATA_LOG}/{COMMIT_PREFIX}", commit.data, sequence=True)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            for name, _ in commit.parts:
                zk.delete(f"{self.root}{METADATA_PARTS}/{name}")
            raise Deposed(f"/controller_epoch is no longer at version {version}")
        return commit_sequence(results[1].rsplit("/", 1)[1])

    def write_snapshot(self, encoded: EncodedCommit, version: int, sequence: int) -> int:
        """Set the snapshot znode (conditioned on the controller epoch), then trim the commits up to ``sequence``;
        how many commits were deleted."""
        zk = self.zk
        path = self.root + METADATA_SNAPSHOT
        try:
            old_data, old_stat = zk.get(path)
            old = read_snapshot_header(old_data, f"ZooKeeper znode {path}")
        except NoNodeError:
            old, old_stat = None, None
        for name, data in encoded.parts:
            zk.create(f"{self.root}{METADATA_PARTS}/{name}", data)
        tx = zk.transaction()
        tx.check(self.root + CONTROLLER_EPOCH, version)
        if old_stat is None:
            tx.create(path, encoded.data)
        else:
            tx.set_data(path, encoded.data, version=old_stat.version)
        if any(isinstance(r, Exception) for r in tx.commit()):
            for name, _ in encoded.parts:
                zk.delete(f"{self.root}{METADATA_PARTS}/{name}")
            raise Deposed("/controller_epoch moved, or another snapshot was written meanwhile")
        for part in old.records.parts if old is not None else ():
            self.delete_quietly(f"{self.root}{METADATA_PARTS}/{part}")
        covered = [n for n in self.list_commits() if commit_sequence(n) <= sequence]
        pending = self.pipelined(partial(zk.get_async, f"{self.root}{METADATA_LOG}/{name}") for name in covered)
        for name, answer in zip(covered, pending):
            where = f"{self.root}{METADATA_LOG}/{name}"
            try:
                for part in read_header(answer.get()[0], where).parts:
                    self.delete_quietly(f"{self.root}{METADATA_PARTS}/{part}")
            except (NoNodeError, CorruptCommitError):
                pass  # gone already; or unreadable, and covered by the snapshot all the same
            self.delete_quietly(where)
        return len(covered)

    def write_layout(self, batch: list[Write], version: int) -> None:
        """One multi-op of Kafka's layout conditioned on /controller_epoch still at ``version``: sets, and creates
        where the znode is missing (its parents made first); or one recursive delete once the epoch is checked."""
        zk = self.zk
        epoch_path = self.root + CONTROLLER_EPOCH
        if batch[0].data is None:
            tx = zk.transaction()
            tx.check(epoch_path, version)
            if isinstance(tx.commit()[0], Exception):
                raise Deposed(f"/controller_epoch is no longer at version {version}")
            try:
                zk.delete(self.root + batch[0].path, recursive=True)
            except NoNodeError:
                pass
            return
        tx = zk.transaction()
        tx.check(epoch_path, version)
        for write in batch:
            tx.set_data(self.root + write.path, write.data)
        results = tx.commit()
        if not any(isinstance(r, Exception) for r in results):
            return
        if not isinstance(results[0], RolledBackError):
            raise Deposed(f"/controller_epoch is no longer at version {version}")
        # Parents first: one may be a znode of the batch too (a user's config above its clients'), then set.
        parents = sorted({(self.root + w.path).rsplit("/", 1)[0] for w in batch})
        for answer in self.pipelined(partial(zk.ensure_path_async, parent) for parent in parents):
            answer.get()
        present = [answer.get() is not None
                   for answer in self.pipelined(partial(zk.exists_async, self.root + w.path) for w in batch)]
        tx = zk.transaction()
        tx.check(epoch_path, version)
        for write, there in zip(batch, present):
            if there:
                tx.set_data(self.root + write.path, write.data)
            else:
                tx.create(self.root + write.path, write.data)
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):
            if not isinstance(results[0], RolledBackError):
                raise Deposed(f"/controller_epoch is no longer at version {version}")
            raise KazooException(f"Kafka's znodes changed while being written: {results}")  # asked again

    # Helpers -----------------------------------------------------------------------------------------------

    def pipelined(self, calls: Iterable[Callable[[], IAsyncResult]]) -> Iterator[IAsyncResult]:
        return pipelined(calls, self._max_in_flight)

    def delete_quietly(self, path: str) -> None:
        try:
            self.zk.delete(path)
        except NoNodeError:
            pass


def layout_batch(writes: list[Write], limit: int = LAYOUT_BATCH_BYTES) -> list[Write]:
    """The first writes of ``writes`` that go in one multi-op: a delete alone, else sets and creates of up to
    ``limit`` bytes of paths and data (a request over ZooKeeper's 1 MB ``jute.maxbuffer`` loses the connection)."""
    if writes[0].data is None:
        return writes[:1]
    batch: list[Write] = []
    size = 0
    for write in writes:
        if write.data is None:
            break
        cost = len(write.path) + len(write.data) + 64
        if batch and size + cost > limit:
            break
        batch.append(write)
        size += cost
    return batch
