"""Fetch (API key 1) read and written without kio: the request a consumer or follower sends with every poll.

A consumer of 100 partitions sends a request naming all 100 and gets an
entry for each back, many times a second. This module reads the request into
small slotted objects (field names as kio's, so handlers read either) and
writes the response as a list of buffers: fixed-size fields packed in one
call per partition, record data passed through as the buffer storage gave
(never copied into the response). :class:`josef.protocol.messages` still
builds the kio form for tests and in-process callers; the two agree byte for
byte (``tests/test_fetch_codec.py``).
"""

from __future__ import annotations

import struct
import uuid
from functools import lru_cache
from typing import Any, Iterable, NamedTuple, Sequence

import attrs

from josef.protocol.messages import MalformedRequestError
from josef.protocol.wire import (
    I32,
    I64,
    Buffer,
    array_length,
    read_uuid,
    skip_tags,
    string,
    unpack,
    write_length,
    write_node_endpoints,
    write_string,
    write_tags,
    write_uuid,
)

#: Versions from which the request and response use tagged fields and compact lengths.
FLEXIBLE_VERSION = 12
#: From this version topics are named by id.
TOPIC_ID_VERSION = 13
#: From this version the follower's id moves from a field into the ReplicaState tag.
REPLICA_STATE_VERSION = 15
#: From this version a partition's tag 1 is the follower's high watermark (KIP-1166); before, an unknown tag.
HIGH_WATERMARK_VERSION = 18
NO_HIGH_WATERMARK = 2**63 - 1


class FetchPartition(NamedTuple):
    """A named tuple: a fetch names hundreds of these many times a second, and a tuple is the cheapest to build."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int
    #: The follower's high watermark (v18, KIP-1166), or ``NO_HIGH_WATERMARK``.
    high_watermark: int = NO_HIGH_WATERMARK


@attrs.define(slots=True)
class FetchTopic:
    topic: str | None
    topic_id: uuid.UUID | None
    partitions: list[FetchPartition]


@attrs.define(slots=True)
class ForgottenTopic:
    topic: str | None
    topic_id: uuid.UUID | None
    partitions: list[int]


@attrs.define(slots=True)
class FetchRequest:
    replica_id: int
    replica_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    topics: list[FetchTopic]
    forgotten_topics_data: list[ForgottenTopic]
    rack_id: str
    cluster_id: str | None = None
    #: Topics the broker refuses to read (authorization): their partitions answer TOPIC_AUTHORIZATION_FAILED.
    refused_topics: frozenset[str] = frozenset()


_PARTITION = {4: struct.Struct(">iqi"), 5: struct.Struct(">iqqi"), 9: struct.Struct(">iiqqi"),
              12: struct.Struct(">iiqiqi")}


def _partition_format(version: int) -> struct.Struct:
    return _PARTITION[12 if version >= 12 else 9 if version >= 9 else 5 if version >= 5 else 4]


def decode_request(version: int, buf: Buffer, pos: int) -> FetchRequest:
    """The request body at ``pos`` of ``buf`` (a frame after its header)."""
    flexible = version >= FLEXIBLE_VERSION
    replica_id, replica_epoch = -1, -1
    if version < REPLICA_STATE_VERSION:
        (replica_id,), pos = unpack(I32, buf, pos)
    (max_wait_ms, min_bytes, max_bytes, isolation), pos = unpack(_TOP, buf, pos)
    session_id, session_epoch = 0, -1
    if version >= 7:
        (session_id, session_epoch), pos = unpack(_SESSION, buf, pos)
    fmt = _partition_format(version)
    by_id = version >= TOPIC_ID_VERSION
    n_topics, pos = array_length(buf, pos, flexible)
    topics = []
    for _ in range(max(n_topics, 0)):
        name, topic_id = None, None
        if by_id:
            topic_id, pos = read_uuid(buf, pos)
        else:
            name, pos = string(buf, pos, flexible)
        n_parts, pos = array_length(buf, pos, flexible, fmt.size)
        partitions, pos = _partitions(version, buf, pos, max(n_parts, 0), fmt)
        if flexible:
            _, pos = skip_tags(buf, pos)
        topics.append(FetchTopic(name, topic_id, partitions))
    forgotten = []
    if version >= 7:
        n_forgotten, pos = array_length(buf, pos, flexible)
        for _ in range(max(n_forgotten, 0)):
            name, topic_id = None, None
            if by_id:
                topic_id, pos = read_uuid(buf, pos)
            else:
                name, pos = string(buf, pos, flexible)
            n_parts, pos = array_length(buf, pos, flexible, 4)
            indexes = []
            for _ in range(max(n_parts, 0)):
                (index,), pos = unpack(I32, buf, pos)
                indexes.append(index)
            if flexible:
                _, pos = skip_tags(buf, pos)
            forgotten.append(ForgottenTopic(name, topic_id, indexes))
    rack_id = ""
    if version >= 11:
        rack, pos = string(buf, pos, flexible)
        rack_id = rack or ""
    cluster_id = None
    if flexible:
        tags, pos = skip_tags(buf, pos)
        if 0 in tags:
            cluster_id, _ = string(tags[0], 0, True)
        if 1 in tags and version >= REPLICA_STATE_VERSION:
            (replica_id, replica_epoch), _ = unpack(_REPLICA_STATE, tags[1], 0)
    return FetchRequest(replica_id, replica_epoch, max_wait_ms, min_bytes, max_bytes, isolation, session_id,
                        session_epoch, topics, forgotten, rack_id, cluster_id)


def _partitions(version: int, buf: Buffer, pos: int, n: int, fmt: struct.Struct) -> tuple[list[FetchPartition], int]:
    """``n`` partition entries at ``pos``: unpacked in one C call while they have the fixed size
    (no tagged field set, which is every consumer's request), one by one otherwise."""
    if version >= FLEXIBLE_VERSION:
        end = pos + n * _FLEXIBLE_ROW.size
        if end <= len(buf):
            rows = list(_FLEXIBLE_ROW.iter_unpack(memoryview(buf)[pos:end]))
            if not any(row[6] for row in rows):
                return [_new(FetchPartition, (*row[:6], NO_HIGH_WATERMARK)) for row in rows], end
    else:
        end = pos + n * fmt.size
        if end > len(buf):
            raise MalformedRequestError(f"{n} partitions do not fit in the {len(buf) - pos} bytes left")
        rows = fmt.iter_unpack(memoryview(buf)[pos:end])
        if version >= 9:
            return [_new(FetchPartition, (index, epoch, offset, -1, log_start, max_part, NO_HIGH_WATERMARK))
                    for index, epoch, offset, log_start, max_part in rows], end
        if version >= 5:
            return [_new(FetchPartition, (index, -1, offset, -1, log_start, max_part, NO_HIGH_WATERMARK))
                    for index, offset, log_start, max_part in rows], end
        return [_new(FetchPartition, (index, -1, offset, -1, -1, max_part, NO_HIGH_WATERMARK))
                for index, offset, max_part in rows], end
    partitions = []
    for _ in range(n):
        fields, pos = unpack(fmt, buf, pos)
        tags, pos = skip_tags(buf, pos)
        part = FetchPartition(*fields)
        if 1 in tags and version >= HIGH_WATERMARK_VERSION:
            (high_watermark,), _ = unpack(I64, tags[1], 0)
            part = part._replace(high_watermark=high_watermark)
        partitions.append(part)
    return partitions, pos


#: Builds a FetchPartition from a tuple of all its fields, without the keyword handling of its constructor.
_new = tuple.__new__
#: A flexible version's partition entry with no tagged field: the fixed fields and a zero tag count.
_FLEXIBLE_ROW = struct.Struct(">iiqiqiB")
_TOP = struct.Struct(">iiib")
_SESSION = struct.Struct(">ii")
_REPLICA_STATE = struct.Struct(">iq")

# ---------------------------------------------------------------------- response

@lru_cache(maxsize=None)
def response_encoder(version: int) -> ResponseEncoder:
    """The encoder of a version (it holds no state of a response)."""
    return ResponseEncoder(version)


_NO_TAGS = b"\x00"
_ABORTED = struct.Struct(">qq")
_EPOCH_END = struct.Struct(">iq")
_LEADER = struct.Struct(">ii")
_SNAPSHOT = struct.Struct(">qi")


class ResponseEncoder:
    """Writes one version's FetchResponse as buffers: :meth:`partition` per entry, :meth:`topic`, then :meth:`response`."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= FLEXIBLE_VERSION
        # Fixed fields from the partition index to the log start offset.
        self._head = struct.Struct(">ihqqq" if version >= 5 else ">ihqq")
        self._preferred = version >= 11
        self._empty_aborted = write_length(-1, self.flexible)
        self._empty_records = write_length(0, self.flexible)
        # Everything after the fixed fields of an entry with no records, no error and no tagged field,
        # the answer for most partitions a consumer names: for aborted None (read_uncommitted) or [].
        preferred = I32.pack(-1) if self._preferred else b""
        tail = self._empty_records + (_NO_TAGS if self.flexible else b"")
        self._caught_up = {None: self._empty_aborted + preferred + tail,
                           0: write_length(0, self.flexible) + preferred + tail}

    def partition(self, out: list[Any], index: int, error_code: int, high_watermark: int, last_stable_offset: int,
                  log_start_offset: int, records: Any, aborted: Sequence[tuple[int, int]] | None = None,
                  preferred_read_replica: int = -1, diverging_epoch: tuple[int, int] | None = None,
                  current_leader: tuple[int, int] | None = None, snapshot_id: tuple[int, int] | None = None) -> None:
        """Append one partition's entry to ``out``; ``records`` (bytes-like, or any object with ``len`` the
        connection knows how to send) is appended as it is. A tuple given for a tagged field equal to its
        default (-1, -1) is left out, as kio leaves it out."""
        if (not error_code and not len(records) and not aborted and preferred_read_replica == -1
                and diverging_epoch is None and current_leader is None and snapshot_id is None and self.version >= 5):
            out.append(self._head.pack(index, 0, high_watermark, last_stable_offset, log_start_offset)
                       + self._caught_up[None if aborted is None else 0])
            return
        flexible = self.flexible
        if self.version >= 5:
            head = self._head.pack(index, error_code, high_watermark, last_stable_offset, log_start_offset)
        else:
            head = self._head.pack(index, error_code, high_watermark, last_stable_offset)
        if aborted is None:
            head += self._empty_aborted
        else:
            head += write_length(len(aborted), flexible)
            tail = _NO_TAGS if flexible else b""
            head += b"".join(_ABORTED.pack(pid, first) + tail for pid, first in aborted)
        if self._preferred:
            head += I32.pack(preferred_read_replica)
        size = len(records)
        if not size:
            head += self._empty_records
            if flexible:
                head += self._tags(diverging_epoch, current_leader, snapshot_id)
            out.append(head)
            return
        out.append(head + write_length(size, flexible))
        out.append(records)
        if flexible:
            out.append(self._tags(diverging_epoch, current_leader, snapshot_id))

    @staticmethod
    def _tags(diverging: tuple[int, int] | None, leader: tuple[int, int] | None,
              snapshot: tuple[int, int] | None) -> bytes:
        tags = []
        if diverging is not None and diverging != (-1, -1):
            tags.append((0, _EPOCH_END.pack(*diverging) + _NO_TAGS))
        if leader is not None and leader != (-1, -1):
            tags.append((1, _LEADER.pack(*leader) + _NO_TAGS))
        if snapshot is not None and snapshot != (-1, -1):
            tags.append((2, _SNAPSHOT.pack(*snapshot) + _NO_TAGS))
        return write_tags(tags)

    def topic(self, out: list[Any], name: str | None, topic_id: uuid.UUID | None, count: int) -> None:
        """Append a topic's head: its name (or id) and the count of partition entries that follow it."""
        key = write_uuid(topic_id) if self.version >= TOPIC_ID_VERSION else write_string(name or "", self.flexible)
        out.append(key + write_length(count, self.flexible))

    def topic_end(self, out: list[Any]) -> None:
        if self.flexible:
            out.append(_NO_TAGS)

    def response(self, topics: list[Any], n_topics: int, *, throttle_time_ms: int = 0, error_code: int = 0,
                 session_id: int = 0, node_endpoints: Iterable[tuple[int, str, int, str | None]] = ()) -> list[Any]:
        """The whole body: the top-level fields, ``n_topics`` topics already written to ``topics``, the tags."""
        head = I32.pack(throttle_time_ms)
        if self.version >= 7:
            head += _TOP_RESPONSE.pack(error_code, session_id)
        chunks = [head + write_length(n_topics, self.flexible)]
        chunks += topics
        if self.flexible:
            endpoints = list(node_endpoints) if self.version >= 16 else []
            chunks.append(write_tags([(0, write_node_endpoints(endpoints))] if endpoints else []))
        return chunks


_TOP_RESPONSE = struct.Struct(">hi")
