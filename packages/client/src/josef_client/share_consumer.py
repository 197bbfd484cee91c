"""The share consumer (KIP-932): a member of a share group, given records no other member has, acknowledging each.

::

    async with AsyncShareConsumer(bootstrap_servers="localhost:9092", group_id="workers") as consumer:
        consumer.subscribe(["jobs"])
        while True:
            for record in await consumer.poll(timeout_ms=1000):
                handle(record)     # implicit mode: accepted by the next poll (or commit)

With ``share.acknowledgement.mode=explicit`` every record of a poll must be
acknowledged (:meth:`AsyncShareConsumer.acknowledge`: ACCEPT, RELEASE for
another delivery, REJECT, or RENEW to keep holding it) before the next poll;
the acknowledgements travel with the next ShareFetch, or at once with
:meth:`AsyncShareConsumer.commit_sync`/``commit_async`` (ShareAcknowledge),
and the acknowledgement commit callback hears how each ended.

Membership is the group coordinator's (ShareGroupHeartbeat, from a background
task); records come from each partition leader through a share session
(ShareFetch with session epochs), as Kafka's share consumer does. A record
is handed out with its delivery count; one whose acquisition lock runs out
before it is acknowledged goes to another member.

:class:`ShareConsumer` is the synchronous wrapper.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from josef.protocol.records import CONTROL_BIT, decode_batch, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import Cluster
from josef_client.config import SHARE_CONSUMER, ConfigError, build_config
from josef_client.coordinator_requests import find_coordinator
from josef_client.sync import LoopThread

__all__ = ["AcknowledgeType", "AsyncShareConsumer", "ShareConsumer", "ShareConsumerRecord"]

log = logging.getLogger(__name__)

FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1


class AcknowledgeType(enum.IntEnum):
    """How a record is acknowledged, with ShareFetch/ShareAcknowledge's numbers (RENEW: v2, keep the lock)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class ShareConsumerRecord(NamedTuple):
    """A delivered record: :class:`~josef.protocol.records.ConsumerRecord`'s fields and its delivery count."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int
    delivery_count: int


class IllegalStateError(RuntimeError):
    """The call does not fit the consumer's state (explicit mode with records left unacknowledged...)."""


#: The acknowledgement commit callback: ``callback(offsets by partition, exception or None)``.
AcknowledgementCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], Any]


def _member_id() -> str:
    """A member id as Kafka's share consumer makes it: a random UUID in Kafka's base64 text."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class AsyncShareConsumer:
    """The asyncio share consumer (see the module docstring)."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = build_config("share consumer", SHARE_CONSUMER, config, kwargs)
        if not self.config["group.id"]:
            raise ConfigError("group.id is required: a share consumer is a member of a share group")
        self.explicit = self.config["share.acknowledgement.mode"] == "explicit"
        self.group_id: str = self.config["group.id"]
        self.member_id = _member_id()
        self.member_epoch = 0
        self.cluster = Cluster(self.config)
        self._subscription: tuple[str, ...] = ()
        self._subscription_changed = asyncio.Event()
        #: Partitions assigned by the group coordinator.
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._heartbeat_interval_s = 3.0
        self._heartbeat: asyncio.Task[None] | None = None
        #: The next share-session epoch at each leader (0: open one), and the partitions each session has.
        self._epochs: dict[int, int] = {}
        self._session_partitions: dict[int, set[TopicPartition]] = {}
        #: Records delivered and not yet acknowledged, by partition and offset.
        self._in_flight: dict[TopicPartition, dict[int, ShareConsumerRecord]] = {}
        #: Acknowledgements to send: partition -> offset -> type.
        self._pending: dict[TopicPartition, dict[int, int]] = {}
        #: Records renewed (RENEW): still held, to be acknowledged again later; not counted as unacknowledged.
        self._renewed: dict[TopicPartition, set[int]] = {}
        self._buffer: list[ShareConsumerRecord] = []
        self._callback: AcknowledgementCallback | None = None
        self._coordinator: tuple[str, int] | None = None
        self._closed = False

    # Lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (metadata from a bootstrap server) and start heartbeating."""
        if self._closed:
            raise IllegalStateError("the share consumer is closed")
        if self._heartbeat is None:
            await self.cluster.refresh([])
            self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    async def __aenter__(self) -> AsyncShareConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit what is acknowledged (implicit mode: everything delivered), close the share sessions (what this
        member still holds goes back to the group) and leave the group."""
        if self._closed:
            return
        try:
            if not self.explicit:
                self._accept_in_flight()
            await self._commit(final=True)
        finally:
            self._closed = True
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._heartbeat
            with contextlib.suppress(KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError):
                await self._send_heartbeat(leaving=True)
            await self.cluster.close()

    # Membership ---------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Join the share group for ``topics`` (replacing an earlier subscription)."""
        self._check_open()
        names = (topics,) if isinstance(topics, str) else tuple(topics)
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError("subscribe to at least one topic name")
        self._subscription = tuple(sorted(set(names)))
        self._subscription_changed.set()

    def unsubscribe(self) -> None:
        self._subscription = ()
        self._subscription_changed.set()

    def subscription(self) -> frozenset[str]:
        return frozenset(self._subscription)

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions the group coordinator gave this member (shared with others in a share group)."""
        return self._assignment

    async def _heartbeat_loop(self) -> None:
        while not self._closed:
            if not self._subscription and self.member_epoch > 0:  # unsubscribed: leave the group
                with contextlib.suppress(KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError):
                    await self._send_heartbeat(leaving=True)
                self.member_epoch, self._assignment = 0, frozenset()
            if self._subscription:
                try:
                    await self._send_heartbeat()
                except (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError) as exc:
                    log.debug("share group heartbeat failed: %s", exc)
                    self._coordinator = None
                    await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
                    continue
            self._subscription_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._subscription_changed.wait(), self._heartbeat_interval_s)

    async def _send_heartbeat(self, leaving: bool = False) -> None:
        if leaving and self.member_epoch == 0:
            return
        if self._coordinator is None:
            self._coordinator = await find_coordinator(self.cluster, self.group_id)
        conn = await self.cluster.connection(self._coordinator)
        joining = self.member_epoch == 0
        answer = await conn.request(ApiKey.SHARE_GROUP_HEARTBEAT, {
            "group_id": self.group_id, "member_id": self.member_id,
            "member_epoch": FINAL_EPOCH if leaving else self.member_epoch, "rack_id": self.config["client.rack"],
            "subscribed_topic_names": list(self._subscription) if joining or self._subscription_changed.is_set()
            else None})
        code = answer.error_code
        if code in (ErrorCode.unknown_member_id, ErrorCode.fenced_member_epoch):
            self.member_epoch, self._assignment = 0, frozenset()  # join again, from nothing
            return
        if code in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                    ErrorCode.coordinator_load_in_progress):
            self._coordinator = None
            return
        if code != ErrorCode.none:
            raise KafkaError(code, f"ShareGroupHeartbeat for {self.group_id!r}: {answer.error_message or ''}")
        if leaving:
            return
        self.member_epoch = answer.member_epoch
        interval = answer.heartbeat_interval
        self._heartbeat_interval_s = interval.total_seconds() if hasattr(interval, "total_seconds") \
            else int(interval) / 1000
        if answer.assignment is not None:
            await self._assign(answer.assignment.topic_partitions)

    async def _assign(self, topic_partitions: Any) -> None:
        ids = {str(tp.topic_id) for tp in topic_partitions}
        names = self.cluster.topic_names()
        if not ids <= set(names):
            await self.cluster.refresh(None)
            names = self.cluster.topic_names()
        self._assignment = frozenset(TopicPartition(names[str(tp.topic_id)], p) for tp in topic_partitions
                                     if str(tp.topic_id) in names for p in tp.partitions)

    # Consuming ----------------------------------------------------------------------------

    async def poll(self, timeout_ms: float = 0) -> list[ShareConsumerRecord]:
        """Records delivered to this member, at most ``max.poll.records``, waiting up to ``timeout_ms`` for some.

        Implicit mode accepts the previous poll's records first; explicit mode
        needs each of them acknowledged (IllegalStateError otherwise).
        """
        self._check_open()
        if self._heartbeat is None:
            await self.start()
        if self.explicit:
            left = sum(1 for tp, records in self._in_flight.items() for offset in records
                       if offset not in self._pending.get(tp, {}) and offset not in self._renewed.get(tp, ()))
            if left:
                raise IllegalStateError(f"{left} records of the last poll are not acknowledged (explicit mode)")
        else:
            self._accept_in_flight()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while not self._buffer:
            remaining = deadline - loop.time()
            await self._fetch(max(0, min(self.config["fetch.max.wait.ms"], int(remaining * 1000))))
            if self._buffer or loop.time() >= deadline:
                break
            if not self._assignment:
                await asyncio.sleep(min(0.05, max(deadline - loop.time(), 0)))
        records, self._buffer = self._buffer[:self.config["max.poll.records"]], \
            self._buffer[self.config["max.poll.records"]:]
        for record in records:
            self._in_flight.setdefault(TopicPartition(record.topic, record.partition), {})[record.offset] = record
        return records

    def _accept_in_flight(self) -> None:
        for tp, records in self._in_flight.items():
            pending = self._pending.setdefault(tp, {})
            for offset in records:
                pending.setdefault(offset, AcknowledgeType.ACCEPT)

    def acknowledge(self, record: ShareConsumerRecord, type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        """Acknowledge a delivered record (explicit mode); sent with the next poll or commit."""
        self._check_open()
        if not self.explicit:
            raise IllegalStateError("acknowledge() needs share.acknowledgement.mode=explicit")
        tp = TopicPartition(record.topic, record.partition)
        if record.offset not in self._in_flight.get(tp, {}):
            raise IllegalStateError(f"{tp}@{record.offset} is not a record this consumer holds")
        self._pending.setdefault(tp, {})[record.offset] = AcknowledgeType(type)

    def set_acknowledgement_commit_callback(self, callback: AcknowledgementCallback | None) -> None:
        """``callback(offsets by partition, exception or None)`` once the broker answered acknowledgements."""
        self._callback = callback

    async def commit_sync(self) -> dict[TopicPartition, Exception | None]:
        """Send the pending acknowledgements (implicit mode: all delivered records) and wait for the answers."""
        self._check_open()
        if not self.explicit:
            self._accept_in_flight()
        return await self._commit(final=False)

    def commit_async(self) -> asyncio.Task[dict[TopicPartition, Exception | None]]:
        """:meth:`commit_sync` in the background; the callback hears the outcome."""
        return asyncio.ensure_future(self.commit_sync())

    # Requests -----------------------------------------------------------------------------

    def _take_acks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, dict[int, int]]:
        """The pending acknowledgements of ``tps``, removed from pending (RENEW keeps the record in flight)."""
        taken = {}
        for tp in tps:
            acks = self._pending.pop(tp, None)
            if acks:
                taken[tp] = acks
                flying = self._in_flight.get(tp, {})
                renewed = self._renewed.setdefault(tp, set())
                for offset, kind in acks.items():
                    if kind == AcknowledgeType.RENEW:
                        renewed.add(offset)
                    else:
                        flying.pop(offset, None)
                        renewed.discard(offset)
        return taken

    def _by_leader(self, tps: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        out: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            leader = self.cluster.leader(tp)
            if leader >= 0:
                out.setdefault(leader, []).append(tp)
        return out

    async def _fetch(self, max_wait_ms: int) -> None:
        if not self._assignment:
            await self._commit(final=False)
            return
        missing = {tp.topic for tp in self._assignment if self.cluster.leader(tp) < 0}
        if missing:
            await self.cluster.refresh(missing)
        leaders = self._by_leader(self._assignment | set(self._pending))
        await asyncio.gather(*(self._fetch_from(node, tps, max_wait_ms) for node, tps in leaders.items()))

    async def _fetch_from(self, node: int, tps: list[TopicPartition], max_wait_ms: int) -> None:
        epoch = self._epochs.get(node, 0)
        acks = self._take_acks(tps) if epoch != 0 else {}
        fetching = [tp for tp in tps if tp in self._assignment]
        session = self._session_partitions.get(node, set())
        forgotten = [tp for tp in session if tp not in self._assignment]
        body = {
            "group_id": self.group_id, "member_id": self.member_id, "share_session_epoch": epoch,
            "max_wait": max_wait_ms, "min_bytes": self.config["fetch.min.bytes"],
            "max_bytes": self.config["fetch.max.bytes"], "max_records": self.config["max.poll.records"],
            "batch_size": self.config["max.poll.records"], "share_acquire_mode": 0, "is_renew_ack": False,
            "topics": self._topics_body(set(fetching) | set(acks), acks, fetch=True),
            "forgotten_topics_data": self._forgotten_body(forgotten)}
        try:
            conn = await self.cluster.connection(node)
            answer = await conn.request(ApiKey.SHARE_FETCH, body)
        except (KafkaConnectionError, KafkaTimeoutError, OSError) as exc:
            self._session_lost(node)
            self._report(acks, exc)
            return
        if answer.error_code != ErrorCode.none:
            self._session_lost(node)
            self._report(acks, KafkaError(answer.error_code, answer.error_message or ""))
            return
        self._epochs[node] = 1 if epoch >= MAX_EPOCH else epoch + 1
        self._session_partitions[node] = (session | set(fetching)) - set(forgotten)
        ack_results: dict[TopicPartition, Exception | None] = {}
        names = self.cluster.topic_names()
        for topic in answer.responses:
            name = names.get(str(topic.topic_id))
            if name is None:
                continue
            for part in topic.partitions:
                tp = TopicPartition(name, part.partition_index)
                if tp in acks:
                    code = part.acknowledge_error_code
                    ack_results[tp] = None if code == ErrorCode.none else KafkaError(ErrorCode(code),
                                                                                     part.acknowledge_error_message or "")
                if part.error_code in (ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
                                       ErrorCode.unknown_topic_or_partition):
                    self.cluster.partitions.get(name, {}).pop(part.partition_index, None)  # look for the leader
                elif part.error_code == ErrorCode.none and part.acquired_records:
                    self._buffer += self._records(tp, part.records, part.acquired_records)
        for tp, acked in acks.items():
            self._report({tp: acked}, ack_results.get(tp))

    def _records(self, tp: TopicPartition, data: bytes | None, acquired: Any) -> list[ShareConsumerRecord]:
        """The records of ``data`` in the acquired ranges, with their delivery counts; control batches skipped."""
        if not data:
            return []
        starts = [a.first_offset for a in acquired]
        out = []
        buf = bytes(data)
        for pos, header in iter_batches(buf):
            if header.attributes & CONTROL_BIT or header.last_offset < starts[0]:
                continue
            for record in decode_batch(buf, pos, tp.topic, tp.partition, starts[0], True,
                                       self.config["key.deserializer"], self.config["value.deserializer"]):
                i = bisect.bisect_right(starts, record.offset) - 1
                if i >= 0 and record.offset <= acquired[i].last_offset:
                    out.append(ShareConsumerRecord(*record, acquired[i].delivery_count))
        return out

    async def _commit(self, *, final: bool) -> dict[TopicPartition, Exception | None]:
        """ShareAcknowledge of the pending acknowledgements to each leader (``final``: closing the sessions)."""
        results: dict[TopicPartition, Exception | None] = {}
        nodes = self._by_leader(set(self._pending))
        if final:
            for node in self._epochs:
                nodes.setdefault(node, [])
        await asyncio.gather(*(self._acknowledge_at(node, tps, final, results) for node, tps in nodes.items()))
        return results

    async def _acknowledge_at(self, node: int, tps: list[TopicPartition], final: bool,
                              results: dict[TopicPartition, Exception | None]) -> None:
        epoch = self._epochs.get(node, 0)
        acks = self._take_acks(tps)
        if epoch == 0:  # no session there: what this member holds expires with its locks
            self._report(acks, IllegalStateError("no share session with the partition's leader") if acks else None)
            results.update({tp: IllegalStateError("no share session") for tp in acks})
            return
        try:
            conn = await self.cluster.connection(node)
            answer = await conn.request(ApiKey.SHARE_ACKNOWLEDGE, {
                "group_id": self.group_id, "member_id": self.member_id,
                "share_session_epoch": FINAL_EPOCH if final else epoch, "is_renew_ack": False,
                "topics": self._topics_body(set(acks), acks, fetch=False)})
        except (KafkaConnectionError, KafkaTimeoutError, OSError) as exc:
            self._session_lost(node)
            self._report(acks, exc)
            results.update({tp: exc for tp in acks})
            return
        if final:
            self._session_lost(node)
        elif answer.error_code == ErrorCode.none:
            self._epochs[node] = 1 if epoch >= MAX_EPOCH else epoch + 1
        if answer.error_code != ErrorCode.none:
            error = KafkaError(answer.error_code, answer.error_message or "")
            self._session_lost(node)
            self._report(acks, error)
            results.update({tp: error for tp in acks})
            return
        names = self.cluster.topic_names()
        for topic in answer.responses:
            for part in topic.partitions:
                tp = TopicPartition(names.get(str(topic.topic_id), ""), part.partition_index)
                if tp in acks:
                    error = None if part.error_code == ErrorCode.none else KafkaError(part.error_code,
                                                                                      part.error_message or "")
                    results[tp] = error
                    self._report({tp: acks[tp]}, error)

    def _session_lost(self, node: int) -> None:
        self._epochs.pop(node, None)
        self._session_partitions.pop(node, None)

    def _report(self, acks: Mapping[TopicPartition, Mapping[int, int]], error: Exception | None) -> None:
        if self._callback is not None and acks:
            try:
                self._callback({tp: set(offsets) for tp, offsets in acks.items()}, error)
            except Exception:  # noqa: BLE001 - the application's callback must not break the consumer
                log.exception("the acknowledgement commit callback raised")

    def _topics_body(self, tps: Iterable[TopicPartition], acks: Mapping[TopicPartition, Mapping[int, int]],
                     fetch: bool) -> list[dict[str, Any]]:
        ids = self.cluster.topic_ids()
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp in sorted(tps):
            part: dict[str, Any] = {"partition_index": tp.partition,
                                    "acknowledgement_batches": _ack_batches(acks.get(tp, {}))}
            if fetch:
                part["partition_max_bytes"] = self.config["max.partition.fetch.bytes"]
            by_topic.setdefault(ids[tp.topic], []).append(part)
        return [{"topic_id": uuid.UUID(topic_id), "partitions": parts} for topic_id, parts in by_topic.items()]

    def _forgotten_body(self, tps: Iterable[TopicPartition]) -> list[dict[str, Any]]:
        ids = self.cluster.topic_ids()
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            if tp.topic in ids:
                by_topic.setdefault(ids[tp.topic], []).append(tp.partition)
        return [{"topic_id": uuid.UUID(t), "partitions": sorted(p)} for t, p in by_topic.items()]

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the share consumer is closed")


def _ack_batches(acks: Mapping[int, int]) -> list[dict[str, Any]]:
    """Acknowledgements as batches of consecutive offsets of one type each (ShareFetch's AcknowledgementBatch)."""
    batches: list[dict[str, Any]] = []
    for offset in sorted(acks):
        kind = int(acks[offset])
        last = batches[-1] if batches else None
        if last is not None and last["last_offset"] + 1 == offset and last["acknowledge_types"] == [kind]:
            last["last_offset"] = offset
        else:
            batches.append({"first_offset": offset, "last_offset": offset, "acknowledge_types": [kind]})
    return batches


class ShareConsumer:
    """The synchronous share consumer: :class:`AsyncShareConsumer`'s methods, blocking, on a private loop thread."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._thread = LoopThread("josef-share-consumer")
        try:
            self._consumer = self._thread.run(self._make(config, kwargs))
            self._thread.run(self._consumer.start())
        except BaseException:
            self._thread.stop()
            raise
        self.config = self._consumer.config

    @staticmethod
    async def _make(config: Mapping[str, Any] | None, kwargs: dict[str, Any]) -> AsyncShareConsumer:
        return AsyncShareConsumer(config, **kwargs)

    def _call(self, method: Any, *args: Any) -> Any:
        async def call() -> Any:
            return method(*args)
        return self._thread.run(call())

    def subscribe(self, topics: Iterable[str] | str) -> None:
        self._call(self._consumer.subscribe, topics)

    def unsubscribe(self) -> None:
        self._call(self._consumer.unsubscribe)

    def subscription(self) -> frozenset[str]:
        return self._consumer.subscription()

    def assignment(self) -> frozenset[TopicPartition]:
        return self._consumer.assignment()

    def poll(self, timeout_ms: float = 0) -> list[ShareConsumerRecord]:
        return self._thread.run(self._consumer.poll(timeout_ms))

    def acknowledge(self, record: ShareConsumerRecord, type: AcknowledgeType = AcknowledgeType.ACCEPT) -> None:
        self._call(self._consumer.acknowledge, record, type)

    def commit_sync(self) -> dict[TopicPartition, Exception | None]:
        return self._thread.run(self._consumer.commit_sync())

    def commit_async(self) -> None:
        self._call(self._consumer.commit_async)

    def set_acknowledgement_commit_callback(self, callback: AcknowledgementCallback | None) -> None:
        self._call(self._consumer.set_acknowledgement_commit_callback, callback)

    def close(self) -> None:
        try:
            self._thread.run(self._consumer.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
