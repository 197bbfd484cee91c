"""Followers copy their leaders' logs: Kafka's ReplicaFetcherManager and ReplicaFetcherThread.

A broker follows a partition by fetching it from the leader's broker, with
Fetch requests that name the follower (``replica_state``), so the leader
serves it up to its log end and learns the follower's log end offset from
the fetch offset. That is how the leader's high watermark and ISR move.

Partitions are spread over ``num.replica.fetchers`` tasks per leader broker
(Kafka's ``abs(31 * topic.hashCode + partition) % numFetchers``), each with
one connection. A partition joins its task in the *truncating* state: after
any leadership change the follower asks the leader, with
OffsetForLeaderEpoch, where the log of its latest leader epoch ends, and cuts
its own log there (KIP-101, KIP-279), repeating with an older epoch when the
leader does not know ours. Only then does it fetch. Fetches also carry the
last fetched epoch, so a divergence the leader spots later (``diverging_epoch``)
is cut the same way.

Each fetcher keeps an incremental fetch session (KIP-227) with its
leader: after the first request it names only the partitions whose log end,
epochs or limits moved, and the leader answers only what changed.

A partition named in ``follower.replication.throttled.replicas`` for this
broker is left out of the fetches while it lags the leader's high watermark
and the follower throttle is exceeded (KIP-73); its appended bytes count
towards that throttle.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import anyio
import anyio.abc
import attrs
from kio.schema.errors import ErrorCode

from josef.config import Config
from josef.log import LogDirError
from josef.metadata.records import uuid_to_text
from josef.metrics.topics import REPLICATION_BYTES_IN, BrokerTopicMetrics
from josef.replication.partition import Partition
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.sasl_client import outbound_sasl
from josef.protocol.tls import outbound_context
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError
from josef.protocol.fetch_session_handler import FetchSessionHandler
from josef.protocol.records import CorruptRecordError, InvalidRecordError
from josef.protocol.topic_partition import TopicPartition
from josef.remote_storage import RemoteStorageError
from josef.replication.replication_quota import ReplicationQuota

log = logging.getLogger(__name__)

#: Errors that mean our metadata is behind the leader's: wait for the next metadata change.
STALE = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch,
                   ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id})


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (for BMP text), so partitions land on the same fetcher as in Kafka."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def fetcher_id(tp: TopicPartition, fetchers: int) -> int:
    h = (31 * java_string_hash(tp.topic) + tp.partition) & 0xFFFFFFFF
    h = h - (1 << 32) if h & 0x80000000 else h
    return (h & 0x7FFFFFFF) % fetchers


@attrs.define
class FetchState:
    """One followed partition: the leader epoch it follows and whether its log still needs cutting."""

    partition: Partition
    leader_epoch: int
    truncating: bool = True
    #: After an error: not fetched again before this (monotonic seconds).
    delayed_until: float = 0.0
    #: Our log reached the leader's high watermark at the last fetch (Kafka's isReplicaInSync): never throttled then.
    in_sync: bool = False
    #: The leader answered OFFSET_MOVED_TO_TIERED_STORAGE: what we lack is only in remote storage now, so we start
    #: over at the leader's local log start (Kafka's buildRemoteLogAuxState), asked for with ListOffsets.
    tiered: bool = False
    #: The leader's high watermark less our log end at the last fetch (Kafka's FetcherLagMetrics ConsumerLag).
    lag: int = 0


class ReplicaFetcher:
    """Fetches the partitions that one leader broker leads, over one connection, in one task."""

    def __init__(self, manager: ReplicaFetchers, leader_id: int, index: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.index = index
        self.partitions: dict[TopicPartition, FetchState] = {}
        self._changed = anyio.Event()
        self._conn: Connection | None = None
        #: Said once in the log until a connection works again.
        self._unreachable = False
        self.scope = anyio.CancelScope()
        #: The incremental fetch session (KIP-227) with the leader, on the current connection.
        self._session = FetchSessionHandler()
        #: Topic ids of the partitions followed, also of those just removed (their session entries are forgotten by id).
        self._topic_ids: dict[str, str] = {}

    def add(self, partition: Partition) -> None:
        self.partitions[partition.tp] = FetchState(partition, partition.leader_epoch)
        self._topic_ids[partition.tp.topic] = partition.topic_id
        self._changed.set()

    def remove(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)

    async def run(self) -> None:
        with self.scope:
            try:
                while True:
                    if not self.partitions:
                        self._changed = anyio.Event()
                        await self._changed.wait()
                        continue
                    try:
                        conn = await self._connection()
                        if any(s.tiered and s.delayed_until <= time.monotonic() for s in self.partitions.values()):
                            await self._start_at_local_log_start(conn)
                        elif any(s.truncating for s in self.partitions.values()):
                            await self._truncate(conn)
                        elif not await self._fetch(conn):
                            await self._wait_for_work()
                    except (KafkaConnectionError, KafkaTimeoutError, OSError) as exc:
                        log.log(logging.DEBUG if self._unreachable else logging.INFO,
                                "replica fetcher %d-%d: leader %d unreachable (%s); retrying every %.0f ms",
                                self.leader_id, self.index, self.leader_id, exc, self.manager.backoff_s * 1000)
                        self._unreachable = True
                        await self._close()
                        await anyio.sleep(self.manager.backoff_s)
                    except Exception:  # a bug must not stop replication of every other partition, nor the broker
                        log.exception("replica fetcher %d-%d failed; retrying", self.leader_id, self.index)
                        await self._close()
                        await anyio.sleep(self.manager.backoff_s)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._close()

    async def _wait_for_work(self) -> None:
        """Nothing is fetchable now (backing off, or throttled): sleep until one may be, or partitions change.

        A throttled partition is looked at again after ``replica.fetch.backoff.ms``, as Kafka's fetcher does.
        """
        now = time.monotonic()
        wake = min((s.delayed_until if s.delayed_until > now else now + self.manager.backoff_s
                    for s in self.partitions.values()), default=now)
        self._changed = anyio.Event()
        with anyio.move_on_after(max(wake - now, 0.01)):
            await self._changed.wait()

    async def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            endpoint = self.manager.endpoint_of(self.leader_id)
            if endpoint is None:
                raise KafkaConnectionError(f"broker {self.leader_id} has no {self.manager.listener} listener")
            self._session.reset()  # a session lives on in the leader, but our view of it went with the connection
            self._conn = await Connection.open(
                *endpoint, client_id=f"broker-{self.manager.broker_id}-fetcher-{self.index}",
                request_timeout_ms=self.manager.config["replica.socket.timeout.ms"],
                ssl_context=outbound_context(self.manager.config, self.manager.listener),
                sasl=outbound_sasl(self.manager.config, self.manager.listener, "sasl.mechanism.inter.broker.protocol"))
            self._unreachable = False
        return self._conn

    async def _close(self) -> None:
        self._session.reset()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    # Truncation ------------------------------------------------------------------

    async def _truncate(self, conn: Connection) -> None:
        """Ask the leader where our latest epoch ends, for every truncating partition, and cut there."""
        states = {tp: s for tp, s in self.partitions.items() if s.truncating}
        without_epoch = [s for s in states.values() if s.partition.latest_epoch() < 0]
        for state in without_epoch:  # nothing to compare: only what the high watermark covers is certainly the leader's
            state.partition.truncate_to(state.partition.high_watermark)
            state.truncating = False
        asking = {tp: s for tp, s in states.items() if s.truncating}
        if not asking:
            return
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, state in asking.items():
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "current_leader_epoch": state.leader_epoch,
                "leader_epoch": state.partition.latest_epoch()})
        response = await conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, {
            "replica_id": self.manager.broker_id,
            "topics": [{"topic": name, "partitions": parts} for name, parts in topics.items()]})
        for topic in response.topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                state = asking.get(tp)
                if state is None or self.partitions.get(tp) is not state:
                    continue
                if part.error_code != ErrorCode.none:
                    self._failed(tp, state, part.error_code)
                    continue
                self._cut(state, part.leader_epoch, part.end_offset)

    async def _start_at_local_log_start(self, conn: Connection) -> None:
        """Start the partitions whose missing records are in remote storage only at the leader's local log start
        (ListOffsets EARLIEST_LOCAL, -4): their logs are emptied there, and what is below stays remote, from the
        leader's log start (EARLIEST, -2) on, as Kafka's buildRemoteLogAuxState."""
        now = time.monotonic()
        states = {tp: s for tp, s in self.partitions.items() if s.tiered and s.delayed_until <= now}
        if not states:
            return
        local_starts = await self._list_offsets(conn, states, -4)
        log_starts = await self._list_offsets(conn, states, -2)
        for tp, part in local_starts.items():
            state = states[tp]
            if self.partitions.get(tp) is not state:
                continue
            start = log_starts.get(tp)
            errors = [p.error_code for p in (part, start) if p is not None and p.error_code != ErrorCode.none]
            if errors:
                state.tiered = False
                self._failed(tp, state, errors[0])
                continue
            partition = state.partition
            if partition.log.log_end_offset < part.offset:
                # The producer state at the leader's local log start is in remote storage, with what is below.
                try:
                    snapshot = await partition.log.remote_producer_snapshot(part.offset)
                except (RemoteStorageError, LogDirError) as exc:
                    log.warning("%s: the producer state at offset %d is not to be had from remote storage yet "
                                "(%s); trying again", tp, part.offset, exc)
                    self._delay(state)
                    continue
                if self.partitions.get(tp) is not state:
                    continue
                log.info("%s: the leader holds locally from %d on, past our end %d (the rest is in remote "
                         "storage); starting over there%s", tp, part.offset, partition.log.log_end_offset,
                         " with the producer state kept there" if snapshot is not None else "")
                try:
                    partition.truncate_fully_and_start_at(part.offset, snapshot,
                                                          part.offset if start is None else start.offset)
                except ValueError as exc:  # started there without it: what it replicates is all it knows
                    log.error("%s: the remote producer snapshot at %d is unreadable (%s)", tp, part.offset, exc)
                if part.leader_epoch >= 0:
                    partition.log.assign_epoch(part.leader_epoch, part.offset)
            state.tiered = False
            state.truncating = True

    async def _list_offsets(self, conn: Connection, states: dict[TopicPartition, FetchState],
                            timestamp: int) -> dict[TopicPartition, Any]:
        """The leader's answer to ListOffsets ``timestamp`` for each of ``states``' partitions."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, state in states.items():
            topics.setdefault(tp.topic, []).append({"partition_index": tp.partition,
                                                    "current_leader_epoch": state.leader_epoch, "timestamp": timestamp})
        response = await conn.request(ApiKey.LIST_OFFSETS, {
            "replica_id": self.manager.broker_id, "isolation_level": 0,
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}, version=8)
        return {tp: part for topic in response.topics for part in topic.partitions
                if (tp := TopicPartition(topic.name, part.partition_index)) in states}

    def _cut(self, state: FetchState, leader_epoch: int, leader_end_offset: int) -> None:
        partition = state.partition
        offset, done = partition.truncation_point(leader_epoch, leader_end_offset)
        if offset < partition.log.log_end_offset:
            log.info("truncating %s from %d to %d: the leader's epoch %d ends at %d", partition.tp,
                     partition.log.log_end_offset, offset, leader_epoch, leader_end_offset)
            partition.truncate_to(offset)
        state.truncating = not done

    # Fetching ----------------------------------------------------------------------

    async def _fetch(self, conn: Connection) -> bool:
        """One Fetch for every partition not backing off nor throttled; False when there was none to fetch."""
        now = time.monotonic()
        quota = self.manager.quota
        wanted = {tp: s for tp, s in self.partitions.items()
                  if s.delayed_until <= now and not quota.should_throttle(tp, s.in_sync)}
        if not wanted:
            return False
        config = self.manager.config
        entries = {tp: {"partition": tp.partition, "current_leader_epoch": state.leader_epoch,
                        "fetch_offset": state.partition.log.log_end_offset,
                        "last_fetched_epoch": state.partition.latest_epoch(),
                        "log_start_offset": state.partition.log.log_start_offset,
                        "partition_max_bytes": config["replica.fetch.max.bytes"]} for tp, state in wanted.items()}
        session = self._session
        send, forget = session.build(entries)
        topics: dict[str, dict[str, Any]] = {}
        for tp in send:
            topic = topics.setdefault(tp.topic, {"topic": tp.topic, "topic_id": self._topic_ids.get(tp.topic),
                                                 "partitions": []})
            topic["partitions"].append(entries[tp])
        forgotten: dict[str, dict[str, Any]] = {}
        for tp in forget:
            forgotten.setdefault(tp.topic, {"topic": tp.topic, "topic_id": self._topic_ids.get(tp.topic),
                                            "partitions": []})["partitions"].append(tp.partition)
        broker_id = self.manager.broker_id
        try:
            response = await conn.request(ApiKey.FETCH, {
                "replica_id": broker_id, "replica_state": {"replica_id": broker_id,
                                                           "replica_epoch": self.manager.broker_epoch()},
                "max_wait": config["replica.fetch.wait.max.ms"], "min_bytes": config["replica.fetch.min.bytes"],
                "max_bytes": config["replica.fetch.response.max.bytes"], "isolation_level": 0,
                "session_id": session.session_id, "session_epoch": session.epoch, "topics": list(topics.values()),
                "forgotten_topics_data": list(forgotten.values()), "rack_id": config["broker.rack"] or ""})
        except BaseException:
            session.reset()
            raise
        if not session.handle_response(response.error_code, response.session_id):
            log.info("replica fetcher %d-%d: fetch session %s: %s; starting a new one", self.leader_id, self.index,
                     session.session_id, response.error_code.name)
            return True
        if response.error_code != ErrorCode.none:
            session.reset()
            raise KafkaConnectionError(f"the leader refused the fetch: {response.error_code.name}")
        by_id = {s.partition.topic_id: tp.topic for tp, s in wanted.items()}
        for topic in response.responses:
            topic_id = getattr(topic, "topic_id", None)
            name = getattr(topic, "topic", None) or by_id.get(uuid_to_text(topic_id) if topic_id else "", "")
            for part in topic.partitions:
                tp = TopicPartition(name, part.partition_index)
                state = wanted.get(tp)
                if state is not None and self.partitions.get(tp) is state:
                    self._fetched(tp, state, part)
        return True

    def _fetched(self, tp: TopicPartition, state: FetchState, part: Any) -> None:
        partition = state.partition
        code = part.error_code
        if code == ErrorCode.none:
            diverging = part.diverging_epoch
            if diverging is not None and diverging.epoch >= 0:
                self._cut(state, diverging.epoch, diverging.end_offset)
                return
            try:
                appended = partition.append_as_follower(part.records or b"", part.high_watermark, part.log_start_offset)
            except (CorruptRecordError, InvalidRecordError) as exc:
                log.error("replica fetcher: %s from leader %d cannot be appended: %s", tp, self.leader_id, exc)
                self._delay(state)
                return
            except LogDirError as exc:
                log.error("replica fetcher: appending %s failed: %s", tp, exc)
                self._delay(state)
                return
            state.in_sync = partition.log.log_end_offset >= part.high_watermark
            state.lag = max(0, part.high_watermark - partition.log.log_end_offset)
            if self.manager.quota.is_throttled(tp):
                self.manager.quota.record(appended)
            if appended:
                self.manager.appended(tp)
                self.manager.meters.of(tp.topic)[REPLICATION_BYTES_IN] += appended
        elif code == ErrorCode.offset_out_of_range:
            self._out_of_range(state, part)
        elif code == ErrorCode.offset_moved_to_tiered_storage:
            state.tiered = True
        else:
            self._failed(tp, state, code)

    def _out_of_range(self, state: FetchState, part: Any) -> None:
        """Our log end is outside the leader's log: behind its start (retention moved on), or past its end."""
        partition = state.partition
        if partition.log.log_end_offset < part.log_start_offset:
            log.info("%s: the leader's log starts at %d, past our end %d; starting over there", partition.tp,
                     part.log_start_offset, partition.log.log_end_offset)
            partition.truncate_fully_and_start_at(part.log_start_offset)
        else:
            state.truncating = True

    def _failed(self, tp: TopicPartition, state: FetchState, code: ErrorCode) -> None:
        if code not in STALE:
            log.warning("replica fetcher: %s from leader %d failed with %s", tp, self.leader_id, code.name)
        self._delay(state)

    def _delay(self, state: FetchState) -> None:
        state.delayed_until = time.monotonic() + self.manager.backoff_s


class ReplicaFetchers:
    """Every fetcher of this broker: which partition is followed from which leader, and their tasks."""

    def __init__(self, broker_id: int, config: Config, endpoint_of: Callable[[int], tuple[str, int] | None],
                 broker_epoch: Callable[[], int], appended: Callable[[TopicPartition], None], listener: str,
                 quota: ReplicationQuota, meters: BrokerTopicMetrics) -> None:
        self.broker_id = broker_id
        self.meters = meters
        self.config = config
        self.endpoint_of = endpoint_of
        self.broker_epoch = broker_epoch
        self.appended = appended
        self.listener = listener
        self.quota = quota
        self.backoff_s = config["replica.fetch.backoff.ms"] / 1000
        self._fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self._following: dict[TopicPartition, ReplicaFetcher] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for fetcher in self._fetchers.values():
                    tg.start_soon(fetcher.run)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            # Stopped (the broker is shutting down): a partition followed from now on, as logs still being
            # opened are installed, is only recorded, like one followed before the fetchers started.
            self._tg = None

    def follow(self, partition: Partition) -> None:
        """Fetch ``partition`` from its leader from now on, starting with truncation (a new leader or epoch)."""
        tp = partition.tp
        self.stop_following(tp)
        if partition.leader_id < 0 or partition.is_leader:
            return
        key = (partition.leader_id, fetcher_id(tp, self.config["num.replica.fetchers"]))
        fetcher = self._fetchers.get(key)
        if fetcher is None:
            fetcher = self._fetchers[key] = ReplicaFetcher(self, *key)
            if self._tg is not None:
                self._tg.start_soon(fetcher.run)
        fetcher.add(partition)
        self._following[tp] = fetcher

    def lags(self) -> list[tuple[str, TopicPartition, int]]:
        """Each followed partition's lag behind its leader's high watermark at its last fetch, in offsets, with
        its fetcher's name as Kafka's ``clientId`` (``ReplicaFetcherThread-<index>-<leader>``)."""
        return [(f"ReplicaFetcherThread-{fetcher.index}-{fetcher.leader_id}", tp, fetcher.partitions[tp].lag)
                for tp, fetcher in self._following.items() if tp in fetcher.partitions]

    def stop_following(self, tp: TopicPartition) -> None:
        fetcher = self._following.pop(tp, None)
        if fetcher is None:
            return
        fetcher.remove(tp)
        if not fetcher.partitions:
            del self._fetchers[(fetcher.leader_id, fetcher.index)]
            fetcher.scope.cancel()
