"""Which producer id, epoch and sequence wrote each record of a log, read from its batch headers.

Client libraries hand over records without their batch's producer fields,
yet they are what tells a broker that appended one write twice (the same
producer epoch and sequence at two offsets) from a client that sent it again
as a new write (a bumped epoch: librdkafka renumbers a possibly written
record after an epoch bump, confluentinc/librdkafka#4953). The history
checker (:mod:`josef.testing.history`) needs the difference, so the final
read-back asks the leaders with plain Fetch requests as well.
"""

from __future__ import annotations

import socket
import time
from collections import defaultdict
from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient

#: ``(producer id, producer epoch, sequence)`` of one record; ``(-1, -1, -1)`` for a record of no producer.
Stamp = tuple[int, int, int]

_FETCH_VERSION = 12  # the last one naming topics rather than topic ids
_MAX_BYTES = 1 << 20


def read_stamps(bootstrap: str, tps: Iterable[TopicPartition], timeout: float = 30.0) -> dict[TopicPartition, dict[int, Stamp]]:
    """The stamp of every record below each partition's high watermark, by offset, asking each partition's leader.

    A partition whose leader cannot be reached by ``timeout`` keeps what was
    read of it so far: the stamps only explain violations, they judge nothing.
    """
    deadline = time.monotonic() + timeout
    stamps: dict[TopicPartition, dict[int, Stamp]] = {tp: {} for tp in tps}
    position = dict.fromkeys(stamps, 0)
    pending = set(stamps)
    while pending and time.monotonic() < deadline:
        try:
            leaders, brokers = _leaders(bootstrap, {tp.topic for tp in pending})
        except socket.gaierror:
            break  # no such host: nothing to ask
        except OSError:
            time.sleep(0.5)
            continue
        by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in pending:
            if leaders.get(tp, -1) in brokers:
                by_leader[leaders[tp]].append(tp)
        for leader, led in by_leader.items():
            try:
                client = RawClient(brokers[leader][1], brokers[leader][0], timeout=10)
            except OSError:
                continue
            try:
                for tp in led:
                    if _read(client, tp, stamps[tp], position, deadline):
                        pending.discard(tp)
            except OSError:
                pass
            finally:
                client.close()
        if pending:
            time.sleep(0.2)
    return stamps


def _leaders(bootstrap: str, topics: set[str]) -> tuple[dict[TopicPartition, int], dict[int, tuple[str, int]]]:
    """Each partition's leader and each broker's address, from the first bootstrap server that answers."""
    error: OSError = OSError(f"no bootstrap server in {bootstrap!r}")
    for server in bootstrap.split(","):
        host, port = server.strip().rsplit(":", 1)
        try:
            client = RawClient(int(port), host, timeout=10)
        except OSError as exc:
            error = exc
            continue
        try:
            answer = client.call(ApiKey.METADATA, 12, {
                "topics": [{"name": t, "topic_id": None} for t in sorted(topics)],
                "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
        finally:
            client.close()
        break
    else:
        raise error
    leaders = {TopicPartition(t.name, p.partition_index): p.leader_id for t in answer.topics for p in t.partitions}
    return leaders, {b.node_id: (b.host, b.port) for b in answer.brokers}


def _read(client: RawClient, tp: TopicPartition, into: dict[int, Stamp], position: dict[TopicPartition, int],
          deadline: float) -> bool:
    """Fetch ``tp`` from its position to the high watermark; True once there, False on an error (ask again later)."""
    while time.monotonic() < deadline:
        answer = client.call(ApiKey.FETCH, _FETCH_VERSION, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": _MAX_BYTES, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": tp.topic, "partitions": [{
                "partition": tp.partition, "current_leader_epoch": -1, "fetch_offset": position[tp],
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": _MAX_BYTES}]}]})
        data = answer.responses[0].partitions[0]
        if data.error_code == ErrorCode.offset_out_of_range:  # below the log start (retention, DeleteRecords)
            start = client.list_offset(tp.topic, -2, tp.partition)
            if start <= position[tp]:
                return False
            position[tp] = start
            continue
        if data.error_code != ErrorCode.none:
            return False
        records = data.records or b""
        for _, header in iter_batches(records):
            last = header.base_offset + header.last_offset_delta
            if not header.is_control:
                for offset in range(header.base_offset, last + 1):
                    sequence = header.base_sequence + offset - header.base_offset if header.base_sequence >= 0 else -1
                    into[offset] = (header.producer_id, header.producer_epoch, sequence)
            position[tp] = max(position[tp], last + 1)
        if position[tp] >= data.high_watermark:
            return True
        if not records:
            return False
    return False
