"""The remote storage both backends share: one object layout, and copy/fetch/delete over an obstore store.

Object layout (Kafka's ``LocalTieredStorage`` and Aiven's RSM name objects
the same way, so a bucket written by either reads the same in a listing)::

    {key.prefix}{topic}-{topic id}/{partition}/{start offset, 20 digits}-{segment id}.{suffix}

    orders-qo3Br4C3TVWRX1JmPUF5bA/0/00000000000000001200-hX2KQJeUQ0CjYSw5lzgK2g.log

Ids are Kafka's text form of a UUID (URL-safe base64, no padding), as
Kafka's tools print them. One segment id is one copy attempt, so objects of
a retried copy never meet those of the failed one, and a topic re-created
under its old name (a new topic id) never sees the objects of the old one.
The suffixes, one object each:

========================  ===================================================
``.log``                  the segment's records, exactly as on local disk
``.index``                the offset index (:attr:`IndexType.OFFSET`)
``.timeindex``            the time index (:attr:`IndexType.TIMESTAMP`)
``.txnindex``             the aborted-transaction index; absent when the
                          segment has none (:attr:`IndexType.TRANSACTION`)
``.snapshot``             the producer-state snapshot
                          (:attr:`IndexType.PRODUCER_SNAPSHOT`)
``.leader_epoch_checkpoint``  the leader epochs up to the segment's end
                          (:attr:`IndexType.LEADER_EPOCH`)
========================  ===================================================

The ``.log`` is written last: a segment whose ``.log`` object exists has all
its other objects too, which is what an operator (or a later orphan sweep)
can rely on when the remote log metadata and the bucket disagree. Nothing
else marks completion: whether a copy finished is what
``__remote_log_metadata`` says, never the store.

Reads of the ``.log`` are ranged GETs (``Range: bytes=start-end``), never a
download of the whole object: a consumer fetching 1 MiB from a 1 GiB segment
moves 1 MiB. Large files are uploaded in parts (S3 multipart uploads) read
from the local file one part at a time, so a copy holds a few parts in
memory, not the segment.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import obstore
from obstore.exceptions import BaseError as ObstoreError

from josef.metadata.records import uuid_to_text
from josef.remote_storage import (
    IndexType,
    LogSegmentData,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteResourceNotFoundError,
    RemoteStorageError,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
#: The object suffix of each companion file, by the index type Kafka names it with.
INDEX_SUFFIXES: dict[IndexType, str] = {
    IndexType.OFFSET: ".index",
    IndexType.TIMESTAMP: ".timeindex",
    IndexType.TRANSACTION: ".txnindex",
    IndexType.PRODUCER_SNAPSHOT: ".snapshot",
    IndexType.LEADER_EPOCH: ".leader_epoch_checkpoint",
}
#: How many parts of one file are uploaded at once: memory held per copy is this many parts.
UPLOAD_CONCURRENCY = 4


@attrs.frozen
class SegmentLayout:
    """Where each object of a remote segment goes (see the module's docstring)."""

    key_prefix: str = ""

    def partition_prefix(self, segment_id: RemoteLogSegmentId) -> str:
        """``{key.prefix}{topic}-{topic id}/{partition}/``: every segment of one partition of one topic id."""
        return f"{self.key_prefix}{segment_id.tp.topic}-{uuid_to_text(segment_id.topic_id)}/{segment_id.tp.partition}/"

    def stem(self, metadata: RemoteLogSegmentMetadata) -> str:
        segment_id = metadata.segment_id
        return f"{self.partition_prefix(segment_id)}{metadata.start_offset:020d}-{uuid_to_text(segment_id.id)}"

    def log_key(self, metadata: RemoteLogSegmentMetadata) -> str:
        return self.stem(metadata) + LOG_SUFFIX

    def index_key(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> str:
        return self.stem(metadata) + INDEX_SUFFIXES[index_type]

    def keys(self, metadata: RemoteLogSegmentMetadata) -> list[str]:
        """Every object the segment may have, the ``.log`` last."""
        stem = self.stem(metadata)
        return [stem + suffix for suffix in INDEX_SUFFIXES.values()] + [stem + LOG_SUFFIX]


class ObjectStoreRemoteStorage:
    """A :class:`josef.remote_storage.RemoteStorageManager` over an obstore store (S3, a local directory...).

    The backends differ only in the store they build and in how they explain
    a failure (:meth:`explain`); the layout, the order of writes, ranged
    reads and what counts as "not found" are here, once. One obstore store
    (and its connection pool) serves every worker thread of the caller: its
    stores are shareable between threads, and this class keeps no state of
    its own per call.
    """

    #: Says where objects go, for messages: ``bucket orders at http://...`` or ``directory /mnt/tiered``.
    where: str = "the remote store"

    def __init__(self, store: Any, *, layout: SegmentLayout, part_size: int) -> None:
        self._store = store
        self.layout = layout
        self.part_size = part_size
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.where}>"

    # The contract ---------------------------------------------------------------------------------------------------

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        files: list[tuple[IndexType, Path | bytes]] = [
            (IndexType.OFFSET, data.offset_index),
            (IndexType.TIMESTAMP, data.time_index),
            (IndexType.PRODUCER_SNAPSHOT, data.producer_snapshot),
            (IndexType.LEADER_EPOCH, data.leader_epoch_index),
        ]
        if data.transaction_index is not None:
            files.append((IndexType.TRANSACTION, data.transaction_index))
        for index_type, source in files:
            self._put(self.layout.index_key(metadata, index_type), source)
        self._put(self.layout.log_key(metadata), data.log_segment)  # last: see the module's docstring
        return None

    def fetch_log_segment(self, metadata: RemoteLogSegmentMetadata, start_position: int,
                          end_position: int | None = None) -> bytes:
        if start_position < 0 or end_position is not None and end_position < start_position:
            raise ValueError(f"cannot fetch bytes {start_position}..{end_position} of a segment")
        key = self.layout.log_key(metadata)
        self._check_open()
        try:
            if end_position is None:
                options = {"range": {"offset": start_position}} if start_position else None
                result = obstore.get(self._store, key, options=options).bytes()  # type: ignore[arg-type]
            else:  # obstore's end is exclusive, Kafka's inclusive; an end past the object's is cut to it
                result = obstore.get_range(self._store, key, start=start_position, end=end_position + 1)
        except FileNotFoundError as exc:
            raise self.explain(exc, f"reading bytes {start_position}..{end_position} of", key) from exc
        except ObstoreError as exc:
            if self._ends_before(key, start_position):
                return b""  # a range starting at or past the end is refused (HTTP 416), not empty
            raise self.explain(exc, f"reading bytes {start_position}..{end_position} of", key) from exc
        return bytes(result)

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> bytes:
        key = self.layout.index_key(metadata, index_type)
        self._check_open()
        try:
            return bytes(obstore.get(self._store, key).bytes())
        except (ObstoreError, FileNotFoundError) as exc:
            raise self.explain(exc, "reading", key) from exc

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        # One object at a time: a local directory refuses to delete a missing file (S3 does not), and a bulk
        # delete stops there; with one call per object, a missing one is simply skipped.
        self._check_open()
        for key in self.layout.keys(metadata):
            try:
                obstore.delete(self._store, key)
            except (ObstoreError, FileNotFoundError) as exc:
                error = self.explain(exc, "deleting", key)
                if type(error) is not RemoteResourceNotFoundError:
                    raise error from exc

    def close(self) -> None:
        """Drop the store: obstore closes its connections when the last reference goes."""
        self._closed = True
        self._store = None

    # For the backends -----------------------------------------------------------------------------------------------

    def explain(self, exc: BaseException, doing: str, key: str) -> RemoteStorageError:
        """The contract's error for an obstore failure: not found, or anything else, with what and where."""
        kind = RemoteResourceNotFoundError if isinstance(exc, FileNotFoundError) else RemoteStorageError
        return kind(f"{doing} {key} in {self.where} failed: {describe(exc)}")

    # Inside ---------------------------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteStorageError(f"the remote storage of {self.where} is closed")

    def _ends_before(self, key: str, position: int) -> bool:
        """Whether the object is there and ``position`` is at or past its end (False when that cannot be told:
        the caller then reports its own failure)."""
        try:
            return int(obstore.head(self._store, key)["size"]) <= position
        except (ObstoreError, FileNotFoundError):
            return False

    def _put(self, key: str, source: Path | bytes) -> None:
        """Upload bytes, or a local file: in one request if it fits in a part, else in parts read as they go."""
        self._check_open()
        try:
            if isinstance(source, bytes):
                obstore.put(self._store, key, source, use_multipart=False)
                return
            try:
                file = open(source, "rb")
            except OSError as exc:  # the local file, not the remote store: never "not found" in the contract's sense
                raise RemoteStorageError(f"cannot read {source} to copy it to {key}: {exc}") from exc
            with file:
                info = os.fstat(file.fileno())
                if stat.S_ISREG(info.st_mode) and info.st_size <= self.part_size:
                    obstore.put(self._store, key, file.read(), use_multipart=False)
                else:
                    obstore.put(self._store, key, _parts(file, self.part_size), use_multipart=True,
                                chunk_size=self.part_size, max_concurrency=UPLOAD_CONCURRENCY)
        except (ObstoreError, FileNotFoundError) as exc:
            raise self.explain(exc, "writing", key) from exc
        except OSError as exc:
            raise RemoteStorageError(f"writing {key} in {self.where} failed reading {source}: {exc}") from exc


def _parts(file: Any, size: int) -> Iterator[bytes]:
    """The file in pieces of ``size`` bytes (the last shorter), read only as the upload asks for them."""
    while True:
        piece = file.read(size)
        if not piece:
            return
        yield piece


def describe(exc: BaseException) -> str:
    """An obstore error in one line: its message without the Rust debug dump that follows, and an S3 error
    document (``<Error><Code>NoSuchBucket</Code><Message>...``) as ``NoSuchBucket: ...``."""
    text = str(exc).split("Debug source:")[0].strip() or type(exc).__name__
    code, message = _S3_CODE.search(text), _S3_MESSAGE.search(text)
    if code is not None:
        text = text[:text.index("<?xml")] if "<?xml" in text else text[:code.start()]
        text = f"{text.rstrip(': ')}: {code.group(1)}" + (f": {message.group(1)}" if message else "")
    return " ".join(text.split())


_S3_CODE = re.compile(r"<Code>([^<]*)</Code>")
_S3_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
