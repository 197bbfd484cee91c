"""What the client knows of the cluster: brokers, partition leaders, and a connection to each broker.

Metadata is fetched from any reachable broker (bootstrap servers first) and
refreshed on demand, when a request fails with a stale-metadata error, and
at least every ``metadata.max.age.ms``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any, Iterable

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaConnectionError, KafkaError
from josef.protocol.topic_partition import TopicPartition
from josef_client.config import sasl_credentials, ssl_context

log = logging.getLogger(__name__)

#: The newest version of each API this client writes. Newer ones exist in kio but switch
#: topics to ids (Produce 13, Fetch 13+, OffsetCommit/OffsetFetch 10), which the client does
#: not track; DescribeGroups v6 is newer than the protocol definitions josef follows.
#: AddPartitionsToTxn v4+ is for brokers only; InitProducerId v6 is KIP-939's two-phase commit.
#: A transactional producer caps Produce at 11, TxnOffsetCommit at 4 and EndTxn at 4
#: unless the cluster runs transaction.version 2 (KIP-890), where the newer versions mean more.
MAX_VERSIONS = {
    ApiKey.PRODUCE: 12, ApiKey.FETCH: 12, ApiKey.LIST_OFFSETS: 9, ApiKey.METADATA: 12, ApiKey.FIND_COORDINATOR: 4,
    ApiKey.API_VERSIONS: 3, ApiKey.CREATE_TOPICS: 7, ApiKey.DELETE_TOPICS: 5, ApiKey.DELETE_RECORDS: 2,
    ApiKey.INIT_PRODUCER_ID: 5, ApiKey.DESCRIBE_CONFIGS: 4, ApiKey.ALTER_CONFIGS: 2, ApiKey.CREATE_PARTITIONS: 3,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: 1, ApiKey.DESCRIBE_CLUSTER: 1,
    ApiKey.OFFSET_COMMIT: 9, ApiKey.OFFSET_FETCH: 9, ApiKey.DESCRIBE_GROUPS: 5,
    ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.ADD_OFFSETS_TO_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 5, ApiKey.END_TXN: 5,
}

#: Errors that mean "the client's idea of the leader is out of date".
STALE_METADATA = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition, ErrorCode.leader_not_available,
    ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch, ErrorCode.kafka_storage_error,
    ErrorCode.not_enough_replicas, ErrorCode.network_exception, ErrorCode.request_timed_out,
})


@attrs.frozen
class PartitionInfo:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


class Cluster:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        #: TLS for every connection of this client (security.protocol=SSL or SASL_SSL), else None.
        self.ssl_context = ssl_context(config)
        #: What every connection authenticates with (security.protocol=SASL_*), else None.
        self.sasl = sasl_credentials(config)
        self.bootstrap = [parse_address(s) for s in config["bootstrap.servers"]]
        self.brokers: dict[int, tuple[str, int]] = {}
        self.partitions: dict[str, dict[int, PartitionInfo]] = {}
        self._topic_ids: dict[str, str] = {}
        self.topic_errors: dict[str, ErrorCode] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._connections: dict[int | tuple[str, int], Connection] = {}
        self._connecting: dict[int | tuple[str, int], asyncio.Future[Connection]] = {}
        self._failed_at: dict[int | tuple[str, int], float] = {}
        self._refreshed_at = 0.0
        self._refresh: asyncio.Future[None] | None = None

    # Connections ---------------------------------------------------------------

    async def connection(self, node: int | tuple[str, int]) -> Connection:
        """A live connection to a broker id (or address), opened on first use and after failures."""
        conn = self._connections.get(node)
        if conn is not None and not conn.closed:
            return conn
        return await asyncio.shield(self._connect(node))

    def ready(self, node: int) -> Connection | None:
        """The live connection to ``node`` now, or None while one is opened in the background.

        For senders whose requests must reach the broker in the order they
        were made: they write only on a connection that is already up, so no
        request can overtake another that is still waiting for a connection.
        ``reconnect.backoff.ms`` spaces attempts to a broker that failed.
        """
        conn = self._connections.get(node)
        if conn is not None and not conn.closed:
            return conn
        if time.monotonic() - self._failed_at.get(node, -1e9) >= self.config["reconnect.backoff.ms"] / 1000:
            self._connect(node)
        return None

    def disconnect(self, node: int | tuple[str, int]) -> None:
        """Close the connection to ``node`` now: its requests in flight fail at once, the next use opens another.

        For a peer that stopped answering (a frozen group coordinator): waiting
        for each request's ``request.timeout.ms`` would outlast the group's session.
        """
        conn = self._connections.pop(node, None)
        if conn is not None and not conn.closed:
            asyncio.get_running_loop().create_task(conn.close())

    def connecting(self, node: int) -> asyncio.Future[Connection] | None:
        return self._connecting.get(node)

    def _connect(self, node: int | tuple[str, int]) -> asyncio.Future[Connection]:
        """The one attempt under way to open a connection to ``node``, started if there is none."""
        pending = self._connecting.get(node)
        if pending is None:
            pending = self._connecting[node] = asyncio.ensure_future(self._open(node))
            pending.add_done_callback(lambda f: self._connected(node, f))
        return pending

    def _connected(self, node: int | tuple[str, int], attempt: asyncio.Future[Connection]) -> None:
        self._connecting.pop(node, None)
        if attempt.cancelled() or attempt.exception() is not None:
            self._failed_at[node] = time.monotonic()
        else:
            self._connections[node] = attempt.result()

    async def _open(self, node: int | tuple[str, int]) -> Connection:
        address = node if isinstance(node, tuple) else self.brokers.get(node)
        if address is None:
            raise KafkaConnectionError(f"broker {node} is not in the metadata")
        return await Connection.open(address[0], address[1], client_id=self.config["client.id"],
                                     request_timeout_ms=self.config["request.timeout.ms"],
                                     connect_timeout_ms=self.config["socket.connection.setup.timeout.ms"],
                                     max_versions=MAX_VERSIONS, ssl_context=self.ssl_context, sasl=self.sasl)

    async def any_connection(self) -> Connection:
        """A connection to some broker: a known one first, else the bootstrap servers in random order."""
        for conn in self._connections.values():
            if not conn.closed:
                return conn
        candidates: list[int | tuple[str, int]] = list(self.brokers) + random.sample(self.bootstrap, len(self.bootstrap))
        errors = []
        for node in candidates:
            try:
                return await self.connection(node)
            except KafkaConnectionError as exc:
                errors.append(exc.message)
        raise KafkaConnectionError("no broker reachable: " + "; ".join(errors))

    # Metadata ------------------------------------------------------------------------

    @property
    def refresh_due_at(self) -> float:
        """The ``time.monotonic()`` after which metadata is older than ``metadata.max.age.ms``."""
        return self._refreshed_at + self.config["metadata.max.age.ms"] / 1000

    @property
    def stale(self) -> bool:
        return time.monotonic() > self.refresh_due_at

    async def refresh(self, topics: Iterable[str] | None = None, *, auto_create: bool = False) -> None:
        """Fetch metadata for ``topics`` (None: all) and merge it; concurrent callers share one request."""
        if self._refresh is not None and not self._refresh.done():
            await asyncio.shield(self._refresh)
            wanted = set(topics or ())
            if topics is not None and wanted <= set(self.partitions):
                return
        self._refresh = asyncio.ensure_future(self._fetch(None if topics is None else sorted(set(topics)), auto_create))
        await asyncio.shield(self._refresh)

    async def _fetch(self, topics: list[str] | None, auto_create: bool) -> None:
        conn = await self.any_connection()
        body = {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": auto_create, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}
        response = await conn.request(ApiKey.METADATA, body)
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        self.cluster_id = response.cluster_id
        self.controller_id = response.controller_id
        for topic in response.topics:
            if topic.error_code != ErrorCode.none:
                self.topic_errors[topic.name] = topic.error_code
                self.partitions.pop(topic.name, None)
                continue
            self.topic_errors.pop(topic.name, None)
            topic_id = str(getattr(topic, "topic_id", None) or "")
            same_topic = self._topic_ids.get(topic.name) == topic_id
            self._topic_ids[topic.name] = topic_id
            known = self.partitions.get(topic.name, {}) if same_topic else {}
            self.partitions[topic.name] = {
                p.partition_index: _newer(known.get(p.partition_index), PartitionInfo(
                    p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(p.isr_nodes)))
                for p in topic.partitions
            }
        if topics is None:
            for name in set(self.partitions) - {t.name for t in response.topics}:
                del self.partitions[name]
        self._refreshed_at = time.monotonic()
        for node, conn in list(self._connections.items()):
            if isinstance(node, int) and node in self.brokers and self.brokers[node] != (conn.host, conn.port):
                await conn.close()  # the broker moved (a restart on another port)

    async def partitions_for(self, topic: str, *, auto_create: bool = True, timeout_s: float = 60) -> dict[int, PartitionInfo]:
        """The partitions of ``topic``, waiting for metadata; :class:`KafkaError` if it does not exist."""
        deadline = time.monotonic() + timeout_s
        while True:
            known = self.partitions.get(topic)
            if known and all(p.leader >= 0 for p in known.values()):
                return known
            await self.refresh([topic], auto_create=auto_create)
            known = self.partitions.get(topic)
            if known and all(p.leader >= 0 for p in known.values()):
                return known
            error = self.topic_errors.get(topic, ErrorCode.leader_not_available)
            if not error.retriable or time.monotonic() > deadline:
                raise KafkaError(error, f"topic {topic!r}")
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)

    def topic_ids(self) -> dict[str, str]:
        """{topic name: topic id (a UUID string)} of the topics this client has metadata for."""
        return {name: topic_id for name, topic_id in self._topic_ids.items() if topic_id}

    def topic_names(self) -> dict[str, str]:
        """{topic id (a UUID string): topic name}: what share and KIP-848 responses name topics by."""
        return {topic_id: name for name, topic_id in self._topic_ids.items() if topic_id}

    def leader(self, tp: TopicPartition) -> int:
        info = self.partitions.get(tp.topic, {}).get(tp.partition)
        return info.leader if info is not None else -1

    async def close(self) -> None:
        for attempt in list(self._connecting.values()):
            attempt.cancel()
        for conn in list(self._connections.values()):
            await conn.close()
        self._connections.clear()


def _newer(known: PartitionInfo | None, answered: PartitionInfo) -> PartitionInfo:
    """What to keep of a partition: a broker behind on metadata (one just resumed, say) names an older leader epoch,
    and following it would fetch from a replica that no longer leads (its shorter log answers OFFSET_OUT_OF_RANGE,
    and the consumer resets). Kafka's clients keep the newer epoch too (KIP-320)."""
    if known is not None and answered.leader_epoch >= 0 and known.leader_epoch > answered.leader_epoch:
        log.debug("metadata names leader %d in epoch %d, older than the known epoch %d of leader %d: kept",
                  answered.leader, answered.leader_epoch, known.leader_epoch, known.leader)
        return known
    return answered
