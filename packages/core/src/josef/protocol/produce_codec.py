"""Produce (API key 0) read and written without kio: the request every producer batch arrives in.

As with :mod:`josef.protocol.fetch_codec`, the request becomes small slotted
objects with kio's field names, and each partition's record data stays a
view of the frame it arrived in: the broker's only copy of it is the one it
stamps offsets into and writes to the log. Tested byte for byte against kio
(``tests/test_produce_codec.py``).
"""

from __future__ import annotations

import struct
import uuid
from functools import lru_cache
from typing import Any, Iterable, Sequence

import attrs

from josef.protocol.wire import (
    I32,
    Buffer,
    array_length,
    blob,
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

FLEXIBLE_VERSION = 9
TOPIC_ID_VERSION = 13


@attrs.define(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@attrs.define(slots=True)
class TopicProduceData:
    name: str | None
    topic_id: uuid.UUID | None
    partition_data: list[PartitionProduceData]


@attrs.define(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]
    #: Topics the broker refuses before handling the request (authorization): their partitions answer
    #: TOPIC_AUTHORIZATION_FAILED and nothing is appended to them.
    refused_topics: frozenset[str] = frozenset()


_ACKS_TIMEOUT = struct.Struct(">hi")


@lru_cache(maxsize=None)
def response_encoder(version: int) -> ResponseEncoder:
    return ResponseEncoder(version)


def decode_request(version: int, buf: Buffer, pos: int) -> ProduceRequest:
    flexible = version >= FLEXIBLE_VERSION
    transactional_id, pos = string(buf, pos, flexible)
    (acks, timeout_ms), pos = unpack(_ACKS_TIMEOUT, buf, pos)
    n_topics, pos = array_length(buf, pos, flexible)
    topics = []
    for _ in range(max(n_topics, 0)):
        name, topic_id = None, None
        if version >= TOPIC_ID_VERSION:
            topic_id, pos = read_uuid(buf, pos)
        else:
            name, pos = string(buf, pos, flexible)
        n_parts, pos = array_length(buf, pos, flexible, 5)
        partitions = []
        for _ in range(max(n_parts, 0)):
            (index,), pos = unpack(I32, buf, pos)
            records, pos = blob(buf, pos, flexible, wide=True)
            if flexible:
                _, pos = skip_tags(buf, pos)
            partitions.append(PartitionProduceData(index, records))
        if flexible:
            _, pos = skip_tags(buf, pos)
        topics.append(TopicProduceData(name, topic_id, partitions))
    if flexible:
        _, pos = skip_tags(buf, pos)
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


_NO_TAGS = b"\x00"
_LEADER = struct.Struct(">ii")


class ResponseEncoder:
    """Writes one version's ProduceResponse: :meth:`partition` per entry, :meth:`topic` around them, then :meth:`response`.

    Holds no state of a response: :func:`response_encoder` gives the one of a version.
    """

    def __init__(self, version: int) -> None:
        self.version = version
        self.flexible = version >= FLEXIBLE_VERSION
        self._head = struct.Struct(">ihqqq" if version >= 5 else ">ihqq" if version >= 2 else ">ihq")

    def partition(self, index: int, error_code: int, base_offset: int, log_append_time: int = -1,
                  log_start_offset: int = -1, record_errors: Sequence[tuple[int, str | None]] = (),
                  error_message: str | None = None, current_leader: tuple[int, int] | None = None) -> bytes:
        version, flexible = self.version, self.flexible
        if version >= 5:
            out = self._head.pack(index, error_code, base_offset, log_append_time, log_start_offset)
        elif version >= 2:
            out = self._head.pack(index, error_code, base_offset, log_append_time)
        else:
            out = self._head.pack(index, error_code, base_offset)
        if version >= 8:
            tail = _NO_TAGS if flexible else b""
            out += write_length(len(record_errors), flexible) + b"".join(
                I32.pack(batch_index) + write_string(message, flexible) + tail for batch_index, message in record_errors)
            out += write_string(error_message, flexible)
        if flexible:
            leader = current_leader if version >= 10 and current_leader not in (None, (-1, -1)) else None
            out += write_tags([(0, _LEADER.pack(*leader) + _NO_TAGS)] if leader else [])
        return out

    def topic(self, name: str | None, topic_id: uuid.UUID | None, partitions: list[bytes]) -> bytes:
        key = write_uuid(topic_id) if self.version >= TOPIC_ID_VERSION else write_string(name or "", self.flexible)
        return key + write_length(len(partitions), self.flexible) + b"".join(partitions) + (
            _NO_TAGS if self.flexible else b"")

    def throttle_offset(self, topics: list[bytes]) -> int | None:
        """Where :meth:`response` writes ``throttle_time_ms`` in its one buffer (None before v1)."""
        if self.version < 1:
            return None
        return len(write_length(len(topics), self.flexible)) + sum(len(t) for t in topics)

    def response(self, topics: list[bytes], *, throttle_time_ms: int = 0,
                 node_endpoints: Iterable[tuple[int, str, int, str | None]] = ()) -> list[Any]:
        body = write_length(len(topics), self.flexible) + b"".join(topics)
        if self.version >= 1:
            body += I32.pack(throttle_time_ms)
        if self.flexible:
            endpoints = list(node_endpoints) if self.version >= 10 else []
            body += write_tags([(0, write_node_endpoints(endpoints))] if endpoints else [])
        return [body]
