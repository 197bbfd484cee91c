"""The admin client: topics, partitions, configs, offsets and the cluster, as Kafka's AdminClient offers them.

``AsyncAdmin`` runs on the caller's event loop; ``Admin`` is the same on a
private loop thread for scripts::

    with Admin(bootstrap_servers="localhost:9092") as admin:
        admin.create_topics([NewTopic("orders", num_partitions=3)])
        admin.describe_topics(["orders"])["orders"].partitions[0].leader

Requests that change topics go to the controller (the ``controller_id`` of
Metadata), ListOffsets and DeleteRecords to each partition's leader, broker
configs to that broker. A failure is a :class:`KafkaError` carrying the
broker's error code and message. Methods that act on several items try them
all; with ``raise_errors=True`` (the default) the first failure, in the order
given, is raised once all were tried, and with ``raise_errors=False`` each
item's :class:`KafkaError` is returned in its place in the result.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import enum
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import attrs
from kio.schema.errors import ErrorCode

from josef import scram
from josef.acls import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, PatternType
from josef.acls import ResourceType as AclResourceType
from josef.config import AlterOp, ConfigSource
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    UnsupportedVersionError,
)
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import STALE_METADATA, Cluster
from josef_client.config import ADMIN, build_config
from josef_client.coordinator_requests import TRANSACTION, OffsetAndMetadata, find_coordinator, offset_fetch
from josef_client.sync import LoopThread

__all__ = [
    "AbortTransactionSpec", "AclBinding", "AclBindingFilter", "Admin", "AlterConfigOp", "AlterOp", "AsyncAdmin", "BrokerInfo", "ClusterDescription",
    "ConfigEntry", "ConfigResource", "ConfigSource", "ConfigSynonym", "CreatedTopic", "DelegationToken", "ElectionType",
    "LogDirDescription",
    "NewPartitions", "NewTopic", "OffsetInfo", "OffsetSpec", "PartitionDescription", "PartitionReassignment",
    "ProducerState", "QuotaEntity", "QuotaFilterComponent", "ReplicaInfo", "ResourceType", "ScramCredentialDeletion",
    "ScramCredentialInfo",
    "ScramCredentialUpsertion", "TopicDescription", "TopicListing", "TopicPartition",
    "TransactionDescription", "TransactionListing",
]


K = TypeVar("K")
V = TypeVar("V")


# Types ---------------------------------------------------------------------------------


class ResourceType(enum.IntEnum):
    """Kinds of config resources, numbered as in the protocol."""

    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    #: A client-metrics subscription (KIP-714): what ``josef client-metrics`` manages.
    CLIENT_METRICS = 16
    GROUP = 32


class OffsetSpec:
    """What :meth:`AsyncAdmin.list_offsets` looks up: these, or a timestamp in ms (the first offset at or after it).

    The tiered storage specs (KIP-405, KIP-1023) are those of Kafka's ``OffsetSpec`` and of
    ``kafka-get-offsets.sh --time``: where a broker's own disk starts, the last offset in remote storage, and the
    first offset not uploaded yet.
    """

    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3
    EARLIEST_LOCAL = -4
    LATEST_TIERED = -5
    EARLIEST_PENDING_UPLOAD = -6
    NAMES: ClassVar[Mapping[str, int]] = {"latest": LATEST, "earliest": EARLIEST, "max-timestamp": MAX_TIMESTAMP,
                                          "max_timestamp": MAX_TIMESTAMP, "earliest-local": EARLIEST_LOCAL,
                                          "latest-tiered": LATEST_TIERED,
                                          "earliest-pending-upload": EARLIEST_PENDING_UPLOAD}

    @classmethod
    def parse(cls, spec: int | str) -> int:
        """A spec as the protocol's number: a name, a constant, or a non-negative timestamp."""
        if isinstance(spec, str):
            if spec.lower() in cls.NAMES:
                return cls.NAMES[spec.lower()]
            try:
                spec = int(spec)
            except ValueError:
                raise ValueError(f"offset spec {spec!r} is not {cls._known()} or a timestamp") from None
        if isinstance(spec, bool) or not isinstance(spec, int) or spec < cls.EARLIEST_PENDING_UPLOAD:
            raise ValueError(f"offset spec {spec!r} is not {cls._known()} or a timestamp")
        return spec

    @classmethod
    def _known(cls) -> str:
        return ", ".join(name for name in cls.NAMES if "_" not in name)


@attrs.frozen
class NewTopic:
    """A topic to create. -1 partitions or replication factor: the broker's default.

    ``replica_assignments`` maps each partition (0..N-1) to its replicas; give
    it instead of a partition count and replication factor.
    """

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str | None] = attrs.field(factory=dict)
    replica_assignments: Mapping[int, Sequence[int]] | None = None


@attrs.frozen
class CreatedTopic:
    name: str
    topic_id: str | None
    num_partitions: int
    replication_factor: int
    #: The topic's configs as created (all of them, with defaults); empty when the broker did not say.
    configs: Mapping[str, str | None]


@attrs.frozen
class NewPartitions:
    """Grow a topic to ``total_count`` partitions, optionally placing each new one on given brokers."""

    total_count: int
    assignments: Sequence[Sequence[int]] | None = None


@attrs.frozen
class TopicListing:
    name: str
    topic_id: str | None
    is_internal: bool


@attrs.frozen
class PartitionDescription:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    #: Eligible leader replicas (KIP-966); None when the broker only answered Metadata, which has no such field.
    elr: tuple[int, ...] | None = None
    last_known_elr: tuple[int, ...] | None = None


class ElectionType(enum.IntEnum):
    """ElectLeaders' election types, as Kafka's ElectionType."""

    PREFERRED = 0
    UNCLEAN = 1


@attrs.frozen
class PartitionReassignment:
    """A move in progress: the replicas now (target then removing) and those being added or removed."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@attrs.frozen
class TopicDescription:
    name: str
    topic_id: str | None
    is_internal: bool
    partitions: tuple[PartitionDescription, ...]

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@attrs.frozen(order=True)
class ConfigResource:
    type: ResourceType = attrs.field(converter=ResourceType)
    #: A topic name, a broker id, or "" for the cluster-wide broker default.
    name: str = attrs.field(converter=str)

    @classmethod
    def topic(cls, name: str) -> ConfigResource:
        return cls(ResourceType.TOPIC, name)

    @classmethod
    def broker(cls, broker_id: int | str = "") -> ConfigResource:
        return cls(ResourceType.BROKER, str(broker_id))

    @classmethod
    def client_metrics(cls, name: str) -> ConfigResource:
        return cls(ResourceType.CLIENT_METRICS, name)


@attrs.frozen
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@attrs.frozen
class ConfigEntry:
    name: str
    #: None when the config is sensitive (the broker never returns those values) or unset.
    value: str | None
    source: ConfigSource
    is_default: bool
    read_only: bool
    is_sensitive: bool
    #: Where else the value could come from, in order of precedence (the first is the value in force).
    synonyms: tuple[ConfigSynonym, ...] = ()
    config_type: int = 0
    documentation: str | None = None


@attrs.frozen
class AlterConfigOp:
    name: str
    value: str | None = None
    op: AlterOp = attrs.field(default=AlterOp.SET, converter=AlterOp)


@attrs.frozen
class OffsetInfo:
    #: -1 when no record matches (a timestamp past the last record, or an empty partition for MAX_TIMESTAMP).
    offset: int
    timestamp: int
    leader_epoch: int


@attrs.frozen
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@attrs.frozen
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]


@attrs.frozen
class TransactionListing:
    transactional_id: str
    producer_id: int
    #: Kafka's state names: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence.
    state: str


@attrs.frozen
class TransactionDescription:
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    #: When the open transaction began; None when none is open.
    transaction_start_time_ms: int | None
    topic_partitions: tuple[TopicPartition, ...]


@attrs.frozen
class ProducerState:
    """A producer a partition's leader (or a replica) remembers, as DescribeProducers answers it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    #: None when no transaction marker was written by a coordinator for this producer yet.
    coordinator_epoch: int | None
    #: The first offset of the producer's open transaction in the partition; None when none is open.
    current_transaction_start_offset: int | None


@attrs.frozen
class AbortTransactionSpec:
    """A transaction to abort in one partition by writing its marker (Kafka's AbortTransactionSpec)."""

    topic_partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


@attrs.frozen
class ReplicaInfo:
    """One partition's log in a log dir, as DescribeLogDirs answers it (Kafka's ReplicaInfo)."""

    size: int
    offset_lag: int
    #: A copy being made by AlterReplicaLogDirs, which will replace the current log when it catches up.
    is_future: bool


@attrs.frozen
class LogDirDescription:
    """One log dir of a broker (Kafka's LogDirDescription): its error (an offline dir), its logs, its space."""

    error: KafkaError | None
    replicas: dict[TopicPartition, ReplicaInfo]
    #: Bytes of the dir's volume, and those free; None when the broker does not say (DescribeLogDirs v3 and older).
    total_bytes: int | None = None
    usable_bytes: int | None = None


def _millis(value: Any) -> int:
    """A kio timestamp or duration as milliseconds (ints pass through)."""
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


def topic_id_text(value: uuid.UUID | None) -> str | None:
    """A topic id in Kafka's text form (URL-safe base64, no padding); None for a missing or zero id."""
    if value is None or value.int == 0:
        return None
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp.partition)
    return grouped


def _optional(nodes: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if nodes is None else tuple(nodes)


def _error(code: ErrorCode, message: str | None, what: str) -> KafkaError:
    return KafkaError(code, message or what)


def _acl_filter_body(f: AclBindingFilter) -> dict[str, Any]:
    """A filter as DescribeAcls and DeleteAcls spell it (the same fields in both)."""
    return {"resource_type_filter": f.resource_type, "resource_name_filter": f.resource_name,
            "pattern_type_filter": f.pattern_type, "principal_filter": f.principal, "host_filter": f.host,
            "operation": f.operation, "permission_type": f.permission_type}


def _finish(results: dict[K, V | KafkaError], raise_errors: bool) -> dict[K, Any]:
    if raise_errors:
        for value in results.values():
            if isinstance(value, KafkaError):
                raise value
    return results


# The async client ----------------------------------------------------------------------------


@attrs.frozen
class ScramCredentialInfo:
    """A user's credential for one mechanism, as DescribeUserScramCredentials shows it (never its keys)."""

    mechanism: str
    iterations: int


@attrs.frozen(repr=False)
class ScramCredentialUpsertion:
    """Set ``user``'s password for ``mechanism`` (SCRAM-SHA-256 or SCRAM-SHA-512); salted here, sent salted."""

    user: str
    mechanism: str
    password: str
    iterations: int = scram.DEFAULT_ITERATIONS
    #: A fixed salt (tests); a random one by default, as Kafka's tools use.
    salt: bytes | None = None

    def __repr__(self) -> str:
        return f"ScramCredentialUpsertion(user={self.user!r}, mechanism={self.mechanism!r}, iterations={self.iterations})"


@attrs.frozen
class ScramCredentialDeletion:
    """Delete ``user``'s credential for ``mechanism``."""

    user: str
    mechanism: str


@attrs.frozen(repr=False)
class DelegationToken:
    """A delegation token (Kafka's DelegationToken and TokenInformation): principals as ``User:alice``, times in ms.

    ``hmac`` is the token's password: whoever holds it and the id can
    authenticate as the owner (SCRAM with ``tokenauth="true"``), so it stays out
    of the repr.
    """

    token_id: str
    hmac: bytes
    owner: str
    requester: str
    renewers: tuple[str, ...]
    issue_timestamp: int
    expiry_timestamp: int
    max_timestamp: int

    @property
    def hmac_base64(self) -> str:
        """The HMAC as Kafka's tools print it, and as a client's ``password`` for SCRAM ``tokenauth``."""
        return base64.b64encode(self.hmac).decode()

    def __repr__(self) -> str:
        return (f"DelegationToken(token_id={self.token_id!r}, owner={self.owner!r}, requester={self.requester!r}, "
                f"renewers={self.renewers!r}, expiry_timestamp={self.expiry_timestamp})")


#: Kafka's messages of the token errors (the responses carry none).
_TOKEN_MESSAGES = {
    ErrorCode.delegation_token_auth_disabled: "Delegation Token feature is not enabled.",
    ErrorCode.delegation_token_not_found: "Delegation Token is not found on server.",
    ErrorCode.delegation_token_owner_mismatch: "Specified Principal is not valid Owner/Renewer.",
    ErrorCode.delegation_token_request_not_allowed: "Delegation Token requests are not allowed on PLAINTEXT/1-way SSL "
                                                    "channels and on delegation token authenticated channels.",
    ErrorCode.delegation_token_authorization_failed: "Delegation Token authorization failed.",
    ErrorCode.delegation_token_expired: "Delegation Token is expired.",
    ErrorCode.invalid_principal_type: "Supplied principalType is not supported.",
}


def _token_error(code: ErrorCode) -> KafkaError:
    return KafkaError(code, _TOKEN_MESSAGES.get(code, code.name))


def _principal(text: str) -> tuple[str, str]:
    """``User:alice`` -> ("User", "alice"), as Kafka's SecurityUtils.parseKafkaPrincipal reads it."""
    kind, sep, name = text.partition(":")
    if not sep or not kind:
        raise ValueError(f"Invalid principal string: {text!r} (expected principalType:name, e.g. User:alice)")
    return kind, name


#: A client quota entity: (entity type, name) pairs, sorted by type; a None name is the type's default entity.
#: Types: ``user``, ``client-id`` (alone or together), or ``ip``.
QuotaEntity = tuple[tuple[str, "str | None"], ...]


@attrs.frozen
class QuotaFilterComponent:
    """One part of a DescribeClientQuotas filter (Kafka's ClientQuotaFilterComponent): an entity type and which of
    its entities: ``name`` exactly, the ``default`` one, or (neither) any named one."""

    entity_type: str
    name: str | None = None
    default: bool = False


class AsyncAdmin:
    """Kafka's admin operations on the running event loop. Use ``async with`` or ``start``/``close``."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = build_config("admin", ADMIN, config, kwargs)
        self.cluster = Cluster(self.config)
        self._timeout_ms: int = self.config["request.timeout.ms"]
        self._backoff_s: float = self.config["retry.backoff.ms"] / 1000

    async def start(self) -> None:
        """Connect and learn the brokers; raises :class:`KafkaConnectionError` if none is reachable."""
        await self.cluster.refresh([])

    async def close(self) -> None:
        await self.cluster.close()

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Routing --------------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout_ms / 1000

    async def _any(self) -> Connection:
        return await self.cluster.any_connection()

    async def _controller(self, refresh: bool = False) -> Connection:
        if refresh or self.cluster.controller_id < 0 or self.cluster.stale:
            await self.cluster.refresh([])
        controller = self.cluster.controller_id
        if controller in self.cluster.brokers:
            return await self.cluster.connection(controller)
        return await self._any()

    async def _broker(self, node: int) -> Connection:
        if node not in self.cluster.brokers:
            await self.cluster.refresh([])
        if node not in self.cluster.brokers:
            raise KafkaError(ErrorCode.broker_not_available, f"broker {node} is not in the cluster")
        return await self.cluster.connection(node)

    async def _to_controller(self, api_key: int, body: Mapping[str, Any],
                             failed: Callable[[Any], bool]) -> Any:
        """Send to the controller, again (after a metadata refresh) while it answers NOT_CONTROLLER or cannot be reached.

        A request whose connection breaks after it was sent is not repeated:
        the broker may have acted on it.
        """
        deadline = self._deadline()
        refresh = False
        while True:
            try:
                conn = await self._controller(refresh)
            except KafkaConnectionError:
                if time.monotonic() > deadline:
                    raise
            else:
                response = await conn.request(api_key, body)
                if not failed(response) or time.monotonic() > deadline:
                    return response
            refresh = True
            await asyncio.sleep(self._backoff_s)

    # Topics ---------------------------------------------------------------------------------

    async def create_topics(self, topics: Iterable[NewTopic | str], *, validate_only: bool = False,
                            timeout_ms: int | None = None, raise_errors: bool = True) -> dict[str, CreatedTopic]:
        """Create topics (a plain name takes the broker's defaults); ``validate_only`` checks without creating."""
        wanted = [NewTopic(t) if isinstance(t, str) else t for t in topics]
        if not wanted:
            return {}
        body = {
            "topics": [{
                "name": t.name,
                "num_partitions": t.num_partitions,
                "replication_factor": t.replication_factor,
                "assignments": [{"partition_index": int(p), "broker_ids": [int(b) for b in brokers]}
                                for p, brokers in sorted((t.replica_assignments or {}).items())],
                "configs": [{"name": k, "value": None if v is None else str(v)} for k, v in t.configs.items()],
            } for t in wanted],
            "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
            "validate_only": validate_only,
        }
        response = await self._to_controller(
            ApiKey.CREATE_TOPICS, body, lambda r: any(t.error_code == ErrorCode.not_controller for t in r.topics))
        answered: dict[str, CreatedTopic | KafkaError] = {}
        for topic in response.topics:
            if topic.error_code != ErrorCode.none:
                answered[topic.name] = _error(topic.error_code, topic.error_message, f"topic {topic.name!r}")
            else:
                answered[topic.name] = CreatedTopic(
                    topic.name, topic_id_text(getattr(topic, "topic_id", None)), topic.num_partitions,
                    topic.replication_factor, {c.name: c.value for c in (getattr(topic, "configs", None) or ())})
        results = {t.name: answered.get(t.name, KafkaError(ErrorCode.unknown_server_error, f"no answer for topic {t.name!r}"))
                   for t in wanted}
        return _finish(results, raise_errors)

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None,
                            raise_errors: bool = True) -> dict[str, KafkaError | None]:
        """Delete topics by name; each maps to None when deleted."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        body = {"topic_names": wanted, "topics": [{"name": n, "topic_id": None} for n in wanted],
                "timeout": self._timeout_ms if timeout_ms is None else timeout_ms}
        response = await self._to_controller(
            ApiKey.DELETE_TOPICS, body, lambda r: any(t.error_code == ErrorCode.not_controller for t in r.responses))
        answered: dict[str, KafkaError | None] = {}
        for topic in response.responses:
            answered[topic.name] = (None if topic.error_code == ErrorCode.none else
                                    _error(topic.error_code, getattr(topic, "error_message", None), f"topic {topic.name!r}"))
        results = {n: answered.get(n, KafkaError(ErrorCode.unknown_server_error, f"no answer for topic {n!r}")) for n in wanted}
        return _finish(results, raise_errors)

    async def _metadata(self, topics: Sequence[str] | None, auto_create: bool = False) -> Any:
        conn = await self._any()
        body = {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                "allow_auto_topic_creation": auto_create, "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False}
        return await conn.request(ApiKey.METADATA, body)

    async def list_topics(self, *, include_internal: bool = False) -> dict[str, TopicListing]:
        """Every topic by name (sorted); internal ones (``__consumer_offsets``...) only when asked."""
        response = await self._metadata(None)
        listings = [TopicListing(t.name, topic_id_text(getattr(t, "topic_id", None)), bool(t.is_internal))
                    for t in response.topics if t.error_code == ErrorCode.none and t.name]
        return {t.name: t for t in sorted(listings, key=lambda t: t.name) if include_internal or not t.is_internal}

    async def describe_topics(self, names: Iterable[str] | None = None, *,
                              raise_errors: bool = True) -> dict[str, TopicDescription]:
        """Partitions, leaders, replicas and ISR of the given topics (None: every topic)."""
        wanted = None if names is None else list(dict.fromkeys(names))
        if wanted == []:
            return {}
        topics = await self._describe_topic_partitions(wanted) if wanted else None
        if topics is None:
            topics = (await self._metadata(wanted)).topics
        results: dict[str, TopicDescription | KafkaError] = {}
        for t in topics:
            if t.error_code != ErrorCode.none:
                what = f"topic {t.name!r} does not exist" if t.error_code == ErrorCode.unknown_topic_or_partition else f"topic {t.name!r}"
                results[t.name] = KafkaError(t.error_code, what)
                continue
            results[t.name] = TopicDescription(
                t.name, topic_id_text(getattr(t, "topic_id", None)), bool(t.is_internal),
                tuple(PartitionDescription(p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes),
                                           tuple(p.isr_nodes), tuple(getattr(p, "offline_replicas", ())),
                                           _optional(getattr(p, "eligible_leader_replicas", None)),
                                           _optional(getattr(p, "last_known_elr", None)))
                      for p in sorted(t.partitions, key=lambda p: p.partition_index)))
        if wanted is None:
            results = dict(sorted(results.items()))
        else:
            results = {n: results.get(n, KafkaError(ErrorCode.unknown_topic_or_partition, f"topic {n!r} does not exist"))
                       for n in wanted}
        return _finish(results, raise_errors)

    async def _describe_topic_partitions(self, names: Sequence[str]) -> list[Any] | None:
        """The topics as DescribeTopicPartitions pages them (with ELR), or None from a broker without that API."""
        conn = await self._any()
        partitions: dict[str, list[Any]] = {}
        described: dict[str, Any] = {}
        cursor = None
        while True:
            try:
                response = await conn.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, {
                    "topics": [{"name": n} for n in names], "response_partition_limit": 2000, "cursor": cursor})
            except UnsupportedVersionError:
                return None
            for t in response.topics:
                described.setdefault(t.name, t)
                partitions.setdefault(t.name, []).extend(t.partitions)
            if response.next_cursor is None:
                break
            cursor = {"topic_name": response.next_cursor.topic_name,
                      "partition_index": response.next_cursor.partition_index}
        return [dataclasses.replace(t, partitions=tuple(partitions[n])) for n, t in described.items()]

    async def create_partitions(self, new_partitions: Mapping[str, NewPartitions | int], *, validate_only: bool = False,
                                timeout_ms: int | None = None, raise_errors: bool = True) -> dict[str, KafkaError | None]:
        """Grow topics to a new total partition count; each maps to None when done."""
        wanted = {name: NewPartitions(n) if isinstance(n, int) else n for name, n in new_partitions.items()}
        if not wanted:
            return {}
        body = {
            "topics": [{"name": name, "count": n.total_count,
                        "assignments": None if n.assignments is None else
                        [{"broker_ids": [int(b) for b in a]} for a in n.assignments]}
                       for name, n in wanted.items()],
            "timeout": self._timeout_ms if timeout_ms is None else timeout_ms,
            "validate_only": validate_only,
        }
        response = await self._to_controller(
            ApiKey.CREATE_PARTITIONS, body, lambda r: any(t.error_code == ErrorCode.not_controller for t in r.results))
        answered = {t.name: None if t.error_code == ErrorCode.none else _error(t.error_code, t.error_message, f"topic {t.name!r}")
                    for t in response.results}
        results = {n: answered.get(n, KafkaError(ErrorCode.unknown_server_error, f"no answer for topic {n!r}")) for n in wanted}
        return _finish(results, raise_errors)

    # Configs --------------------------------------------------------------------------------

    async def _for_resource(self, resource: ConfigResource) -> Connection:
        """Broker resources go to that broker; topics and the cluster default to the controller."""
        if resource.type == ResourceType.BROKER and resource.name:
            if not resource.name.isdigit():
                raise KafkaError(ErrorCode.invalid_request, f"broker id must be a number, got {resource.name!r}")
            return await self._broker(int(resource.name))
        return await self._controller()

    async def _by_resource(self, resources: Sequence[ConfigResource],
                           call: Callable[[Connection, list[ConfigResource]], Awaitable[dict[ConfigResource, Any]]]
                           ) -> dict[ConfigResource, Any]:
        groups: dict[tuple[str, int] | str, tuple[Connection, list[ConfigResource]]] = {}
        results: dict[ConfigResource, Any] = {}
        for resource in resources:
            try:
                conn = await self._for_resource(resource)
            except KafkaError as exc:
                if isinstance(exc, KafkaConnectionError):
                    raise
                results[resource] = exc
                continue
            groups.setdefault((conn.host, conn.port), (conn, []))[1].append(resource)
        answers = await asyncio.gather(*(call(conn, group) for conn, group in groups.values()))
        for answer in answers:
            results.update(answer)
        return {r: results.get(r, KafkaError(ErrorCode.unknown_server_error, f"no answer for {r}")) for r in resources}

    async def describe_configs(self, resources: Iterable[ConfigResource], *, keys: Iterable[str] | None = None,
                               include_synonyms: bool = True, include_documentation: bool = False,
                               raise_errors: bool = True) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """The configs of topics and brokers (``keys``: only these), each with its source and synonyms."""
        wanted = list(dict.fromkeys(resources))
        names = None if keys is None else list(keys)

        async def call(conn: Connection, group: list[ConfigResource]) -> dict[ConfigResource, Any]:
            body = {"resources": [{"resource_type": int(r.type), "resource_name": r.name, "configuration_keys": names}
                                  for r in group],
                    "include_synonyms": include_synonyms, "include_documentation": include_documentation}
            response = await conn.request(ApiKey.DESCRIBE_CONFIGS, body)
            out: dict[ConfigResource, Any] = {}
            for result in response.results:
                resource = ConfigResource(result.resource_type, result.resource_name)
                if result.error_code != ErrorCode.none:
                    out[resource] = _error(result.error_code, result.error_message, str(resource))
                    continue
                out[resource] = {c.name: ConfigEntry(
                    c.name, c.value, ConfigSource.of(c.config_source), c.config_source == ConfigSource.DEFAULT_CONFIG,
                    c.read_only, c.is_sensitive,
                    # A sensitive value stays hidden in the synonyms too, whatever the broker sends.
                    tuple(ConfigSynonym(s.name, None if c.is_sensitive else s.value, ConfigSource.of(s.source))
                          for s in getattr(c, "synonyms", ())),
                    getattr(c, "config_type", 0), getattr(c, "documentation", None)) for c in result.configs}
            return out

        return _finish(await self._by_resource(wanted, call), raise_errors)

    async def list_config_resources(self, types: Iterable[ResourceType] = ()) -> list[ConfigResource]:
        """The config resources of ``types`` (all the broker lists when none), as Kafka's Admin.listConfigResources.

        ListConfigResources v1 (KIP-1142); a broker with only v0 (Kafka's
        ListClientMetricsResources) lists client-metrics resources alone.
        """
        conn = await self._any()
        response = await conn.request(ApiKey.LIST_CONFIG_RESOURCES, {"resource_types": [int(t) for t in types]})
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, None, "list config resources")
        return [ConfigResource(getattr(r, "resource_type", ResourceType.CLIENT_METRICS), r.resource_name)
                for r in response.config_resources]

    async def alter_configs(self, changes: Mapping[ConfigResource, Iterable[AlterConfigOp] | Mapping[str, str | None]], *,
                            validate_only: bool = False, raise_errors: bool = True) -> dict[ConfigResource, KafkaError | None]:
        """Change configs incrementally; ``{name: value}`` sets (None deletes the override), or give :class:`AlterConfigOp` s."""
        ops: dict[ConfigResource, list[AlterConfigOp]] = {}
        for resource, change in changes.items():
            if isinstance(change, Mapping):
                ops[resource] = [AlterConfigOp(k, None, AlterOp.DELETE) if v is None else AlterConfigOp(k, str(v))
                                 for k, v in change.items()]
            else:
                ops[resource] = list(change)

        async def call(conn: Connection, group: list[ConfigResource]) -> dict[ConfigResource, Any]:
            body = {"resources": [{"resource_type": int(r.type), "resource_name": r.name,
                                   "configs": [{"name": o.name, "config_operation": int(o.op), "value": o.value}
                                               for o in ops[r]]} for r in group],
                    "validate_only": validate_only}
            response = await conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body)
            return {ConfigResource(r.resource_type, r.resource_name):
                    None if r.error_code == ErrorCode.none else
                    _error(r.error_code, r.error_message, f"{ResourceType(r.resource_type).name.lower()} {r.resource_name!r}")
                    for r in response.responses}

        return _finish(await self._by_resource(list(ops), call), raise_errors)

    # Offsets and records ---------------------------------------------------------------------------

    async def _by_leader(self, items: Mapping[TopicPartition, Any],
                         call: Callable[[Connection, dict[TopicPartition, Any]], Awaitable[dict[TopicPartition, Any]]]
                         ) -> dict[TopicPartition, Any]:
        """Send each partition's part to its leader; retry those whose leader moved or is unknown, until request.timeout.ms."""
        deadline = self._deadline()
        pending = dict(items)
        results: dict[TopicPartition, Any] = {}
        topics = sorted({tp.topic for tp in pending})
        await self.cluster.refresh(topics)
        while pending:
            groups: dict[int, dict[TopicPartition, Any]] = {}
            retry: dict[TopicPartition, KafkaError] = {}
            for tp, value in pending.items():
                error = self.cluster.topic_errors.get(tp.topic)
                partitions = self.cluster.partitions.get(tp.topic)
                if partitions is None or tp.partition not in partitions:
                    if error is not None and error != ErrorCode.unknown_topic_or_partition and error.retriable:
                        retry[tp] = KafkaError(error, f"topic {tp.topic!r}")
                    else:
                        results[tp] = KafkaError(ErrorCode.unknown_topic_or_partition, f"{tp.topic}-{tp.partition} does not exist")
                    continue
                leader = partitions[tp.partition].leader
                if leader < 0 or leader not in self.cluster.brokers:
                    retry[tp] = KafkaError(ErrorCode.leader_not_available, f"{tp.topic}-{tp.partition} has no leader")
                    continue
                groups.setdefault(leader, {})[tp] = value

            async def one(leader: int, group: dict[TopicPartition, Any]) -> dict[TopicPartition, Any]:
                try:
                    return await call(await self.cluster.connection(leader), group)
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    return {tp: exc for tp in group}

            for answer in await asyncio.gather(*(one(leader, group) for leader, group in groups.items())):
                for tp, outcome in answer.items():
                    if isinstance(outcome, KafkaError) and (outcome.code in STALE_METADATA and outcome.code != ErrorCode.unknown_topic_or_partition
                                                            or isinstance(outcome, KafkaConnectionError)):
                        retry[tp] = outcome
                    else:
                        results[tp] = outcome
            pending = {tp: pending[tp] for tp in retry}
            if not pending:
                break
            if time.monotonic() > deadline:
                results.update(retry)
                break
            await asyncio.sleep(self._backoff_s)
            await self.cluster.refresh(sorted({tp.topic for tp in pending}))
        return {tp: results[tp] for tp in items}

    async def list_offsets(self, specs: Mapping[TopicPartition, int | str], *, read_committed: bool = False,
                           raise_errors: bool = True) -> dict[TopicPartition, OffsetInfo]:
        """Offsets by :class:`OffsetSpec` (``earliest``, ``latest``, ``max-timestamp``, the tiered storage ones) or by
        timestamp, at each leader."""
        wanted = {tp: OffsetSpec.parse(spec) for tp, spec in specs.items()}

        async def call(conn: Connection, group: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
            by_topic: dict[str, list[dict[str, Any]]] = {}
            for tp, spec in group.items():
                by_topic.setdefault(tp.topic, []).append(
                    {"partition_index": tp.partition, "current_leader_epoch": -1, "timestamp": spec})
            body = {"replica_id": -1, "isolation_level": 1 if read_committed else 0,
                    "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}
            response = await conn.request(ApiKey.LIST_OFFSETS, body)
            out: dict[TopicPartition, Any] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    out[tp] = (OffsetInfo(p.offset, p.timestamp, getattr(p, "leader_epoch", -1))
                               if p.error_code == ErrorCode.none else KafkaError(p.error_code, f"{tp.topic}-{tp.partition}"))
            return out

        return _finish(await self._by_leader(wanted, call), raise_errors)

    async def delete_records(self, before: Mapping[TopicPartition, int], *, timeout_ms: int | None = None,
                             raise_errors: bool = True) -> dict[TopicPartition, int]:
        """Delete every record before each offset (-1: the high watermark); returns each new low watermark."""
        timeout = self._timeout_ms if timeout_ms is None else timeout_ms

        async def call(conn: Connection, group: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
            by_topic: dict[str, list[dict[str, Any]]] = {}
            for tp, offset in group.items():
                by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "offset": offset})
            body = {"topics": [{"name": t, "partitions": p} for t, p in by_topic.items()], "timeout": timeout}
            response = await conn.request(ApiKey.DELETE_RECORDS, body)
            out: dict[TopicPartition, Any] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    out[tp] = (p.low_watermark if p.error_code == ErrorCode.none else
                               KafkaError(p.error_code, f"{tp.topic}-{tp.partition}: cannot delete before offset {group.get(tp)}"))
            return out

        return _finish(await self._by_leader(dict(before), call), raise_errors)

    # Cluster ----------------------------------------------------------------------------------

    # Leadership and reassignments ------------------------------------------------------------

    async def elect_leaders(self, election_type: ElectionType, partitions: Iterable[TopicPartition] | None = None,
                            ) -> dict[TopicPartition, KafkaError | None]:
        """Preferred or unclean leader elections; None elects wherever needed (and answers only those)."""
        wanted = None if partitions is None else _by_topic(partitions)
        body = {"election_type": int(election_type), "timeout": self._timeout_ms,
                "topic_partitions": None if wanted is None else [{"topic": t, "partitions": ps}
                                                                 for t, ps in wanted.items()]}
        response = await self._to_controller(ApiKey.ELECT_LEADERS, body,
                                             lambda r: r.error_code == ErrorCode.not_controller)
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, None, "elect leaders")
        return {TopicPartition(t.topic, p.partition_id): None if p.error_code == ErrorCode.none else
                _error(p.error_code, p.error_message, f"partition {t.topic}-{p.partition_id}")
                for t in response.replica_election_results for p in t.partition_result}

    async def alter_partition_reassignments(self, targets: Mapping[TopicPartition, Sequence[int] | None],
                                            ) -> dict[TopicPartition, KafkaError | None]:
        """Move partitions to new replicas (None cancels a move in progress); each maps to None when accepted."""
        grouped: dict[str, list[dict[str, Any]]] = {}
        for tp, replicas in targets.items():
            grouped.setdefault(tp.topic, []).append(
                {"partition_index": tp.partition, "replicas": None if replicas is None else [int(b) for b in replicas]})
        body = {"timeout": self._timeout_ms, "allow_replication_factor_change": True,
                "topics": [{"name": t, "partitions": ps} for t, ps in grouped.items()]}
        response = await self._to_controller(ApiKey.ALTER_PARTITION_REASSIGNMENTS, body,
                                             lambda r: r.error_code == ErrorCode.not_controller)
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "alter partition reassignments")
        return {TopicPartition(t.name, p.partition_index): None if p.error_code == ErrorCode.none else
                _error(p.error_code, p.error_message, f"partition {t.name}-{p.partition_index}")
                for t in response.responses for p in t.partitions}

    async def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None,
                                           ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress, among ``partitions`` (None: all)."""
        wanted = None if partitions is None else _by_topic(partitions)
        body = {"timeout": self._timeout_ms, "topics": None if wanted is None else [
            {"name": t, "partition_indexes": ps} for t, ps in wanted.items()]}
        response = await self._to_controller(ApiKey.LIST_PARTITION_REASSIGNMENTS, body,
                                             lambda r: r.error_code == ErrorCode.not_controller)
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "list partition reassignments")
        return {TopicPartition(t.name, p.partition_index): PartitionReassignment(
                    tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas))
                for t in response.topics for p in t.partitions}

    # Groups -----------------------------------------------------------------------------------

    async def list_consumer_group_offsets(self, group: str, partitions: Iterable[TopicPartition] | None = None
                                          ) -> dict[TopicPartition, OffsetAndMetadata]:
        """A group's committed offsets: of ``partitions``, or (None) every one it has; partitions without one are left out.

        Only stable offsets are answered (OffsetFetch ``require_stable``):
        while a transaction that commits offsets for the group is being
        completed the coordinator answers UNSTABLE_OFFSET_COMMIT, which is
        retried, like the coordinator moving, until ``request.timeout.ms``.
        """
        wanted = None if partitions is None else sorted(set(partitions))
        deadline = self._deadline()
        while True:
            try:
                conn = await self.cluster.connection(await find_coordinator(self.cluster, group))
                found = await offset_fetch(conn, group, wanted)
                return {tp: om for tp, om in found.items() if om is not None}
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(self._backoff_s)

    # Transactions ----------------------------------------------------------------------------

    async def list_transactions(self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = (),
                                duration_ms: int | None = None) -> dict[int, list[TransactionListing]]:
        """Every broker's transactional ids (each lists those it coordinates), by broker id.

        Filters as ListTransactions has them: states, producer ids, and
        (KIP-994) transactions running longer than ``duration_ms``. A broker
        still loading its transaction state partitions
        (COORDINATOR_LOAD_IN_PROGRESS) is asked again until
        ``request.timeout.ms``, as Kafka's ListTransactionsHandler does.
        """
        await self.cluster.refresh([])
        body = {"state_filters": list(states), "producer_id_filters": list(producer_ids),
                "duration_filter": -1 if duration_ms is None else duration_ms, "transactional_id_pattern": None}
        deadline = self._deadline()

        async def one(node: int) -> list[TransactionListing]:
            while True:
                conn = await self.cluster.connection(node)
                if duration_ms is not None and conn.version(ApiKey.LIST_TRANSACTIONS) < 1:
                    raise UnsupportedVersionError(
                        f"broker {node} cannot filter transactions by duration (ListTransactions v1)")
                response = await conn.request(ApiKey.LIST_TRANSACTIONS, body)
                if response.error_code == ErrorCode.none:
                    return [TransactionListing(t.transactional_id, t.producer_id, t.transaction_state)
                            for t in response.transaction_states]
                error = _error(response.error_code, None, f"list transactions on broker {node}")
                if not error.retriable or time.monotonic() > deadline:
                    raise error
                await asyncio.sleep(self._backoff_s)

        nodes = sorted(self.cluster.brokers)
        return dict(zip(nodes, await asyncio.gather(*(one(n) for n in nodes))))

    async def describe_transactions(self, transactional_ids: Iterable[str], *,
                                    raise_errors: bool = True) -> dict[str, TransactionDescription]:
        """Each transactional id's state at its coordinator (found with FindCoordinator, key type 1)."""
        wanted = list(dict.fromkeys(transactional_ids))

        async def one(transactional_id: str) -> TransactionDescription | KafkaError:
            try:
                address = await find_coordinator(self.cluster, transactional_id, TRANSACTION)
            except KafkaError as exc:
                if isinstance(exc, KafkaConnectionError):
                    raise
                return exc
            conn = await self.cluster.connection(address)
            response = await conn.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]})
            [state] = [t for t in response.transaction_states if t.transactional_id == transactional_id]
            if state.error_code != ErrorCode.none:
                what = (f"transactional id {transactional_id!r} does not exist"
                        if state.error_code == ErrorCode.transactional_id_not_found else f"transactional id {transactional_id!r}")
                return KafkaError(state.error_code, what)
            start = -1 if state.transaction_start_time is None else _millis(state.transaction_start_time)
            coordinator = next((n for n, a in self.cluster.brokers.items() if a == address), -1)
            return TransactionDescription(
                coordinator, state.transaction_state, state.producer_id, state.producer_epoch,
                _millis(state.transaction_timeout), start if start > 0 else None,
                tuple(TopicPartition(t.topic, p) for t in state.topics for p in t.partitions))

        if wanted and not self.cluster.brokers:
            await self.cluster.refresh([])
        results = dict(zip(wanted, await asyncio.gather(*(one(t) for t in wanted))))
        return _finish(results, raise_errors)

    async def describe_producers(self, partitions: Iterable[TopicPartition], *, broker_id: int | None = None,
                                 raise_errors: bool = True) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, at its leader (or at ``broker_id``'s replica)."""

        async def call(conn: Connection, group: dict[TopicPartition, Any]) -> dict[TopicPartition, Any]:
            body = {"topics": [{"name": t, "partition_indexes": ps} for t, ps in _by_topic(group).items()]}
            response = await conn.request(ApiKey.DESCRIBE_PRODUCERS, body)
            out: dict[TopicPartition, Any] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    out[tp] = ([ProducerState(s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp,
                                              None if s.coordinator_epoch < 0 else s.coordinator_epoch,
                                              None if s.current_txn_start_offset < 0 else s.current_txn_start_offset)
                                for s in p.active_producers]
                               if p.error_code == ErrorCode.none else
                               _error(p.error_code, p.error_message, f"{tp.topic}-{tp.partition}"))
            return out

        wanted = dict.fromkeys(partitions)
        if broker_id is not None:
            answered = await call(await self._broker(broker_id), wanted)
            results = {tp: answered.get(tp, KafkaError(ErrorCode.unknown_server_error, f"no answer for {tp.topic}-{tp.partition}"))
                       for tp in wanted}
        else:
            results = await self._by_leader(wanted, call)
        return _finish(results, raise_errors)

    async def abort_transaction(self, spec: AbortTransactionSpec) -> None:
        """Write an abort marker for a (hanging) transaction in one partition, with WriteTxnMarkers to its leader."""
        tp = spec.topic_partition

        async def call(conn: Connection, group: dict[TopicPartition, Any]) -> dict[TopicPartition, Any]:
            response = await conn.request(ApiKey.WRITE_TXN_MARKERS, {"markers": [{
                "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch, "transaction_result": False,
                "topics": [{"name": tp.topic, "partition_indexes": [tp.partition]}],
                "coordinator_epoch": spec.coordinator_epoch, "transaction_version": 0}]})
            codes = {TopicPartition(t.name, p.partition_index): p.error_code
                     for m in response.markers for t in m.topics for p in t.partitions}
            code = codes.get(tp, ErrorCode.unknown_server_error)
            return {tp: None if code == ErrorCode.none else KafkaError(code, f"abort marker for {tp.topic}-{tp.partition}")}

        _finish(await self._by_leader({tp: None}, call), True)

    async def describe_log_dirs(self, brokers: Iterable[int]) -> dict[int, dict[str, LogDirDescription]]:
        """Every log dir of each broker with the partitions in it (DescribeLogDirs for all topics), by broker id."""

        async def one(node: int) -> dict[str, LogDirDescription]:
            response = await (await self._broker(node)).request(ApiKey.DESCRIBE_LOG_DIRS, {"topics": None})
            if getattr(response, "error_code", ErrorCode.none) != ErrorCode.none:
                raise _error(response.error_code, None, f"describe log dirs of broker {node}")
            dirs = {}
            for result in response.results:
                replicas = {TopicPartition(t.name, p.partition_index): ReplicaInfo(p.partition_size, p.offset_lag,
                                                                                   p.is_future_key)
                            for t in result.topics for p in t.partitions}
                total = getattr(result, "total_bytes", -1)
                usable = getattr(result, "usable_bytes", -1)
                error = None if result.error_code == ErrorCode.none else _error(result.error_code, None, result.log_dir)
                dirs[result.log_dir] = LogDirDescription(error, replicas, None if total < 0 else total,
                                                         None if usable < 0 else usable)
            return dirs

        nodes = list(dict.fromkeys(brokers))
        return dict(zip(nodes, await asyncio.gather(*(one(n) for n in nodes))))

    async def describe_cluster(self) -> ClusterDescription:
        """The cluster id, the controller and the live brokers."""
        conn = await self._any()
        try:
            response = await conn.request(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False,
                                                             "endpoint_type": 1, "include_fenced_brokers": False})
        except UnsupportedVersionError:
            response = await self._metadata([])
            brokers = tuple(BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers)
            return ClusterDescription(response.cluster_id, response.controller_id, brokers)
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "describe cluster")
        brokers = tuple(BrokerInfo(b.broker_id, b.host, b.port, b.rack) for b in response.brokers)
        return ClusterDescription(response.cluster_id, response.controller_id, brokers)

    # ACLs -----------------------------------------------------------------------------------
    # Any broker takes them, as Kafka's AdminClient sends them to the least loaded node: brokers
    # forward CreateAcls and DeleteAcls to the controller and answer DescribeAcls from their image.

    async def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The ACLs the filter matches (every ACL without one), in the broker's order.

        A broker without an ACL authorizer answers SECURITY_DISABLED, raised as a :class:`KafkaError`.
        """
        f = acl_filter or AclBindingFilter()
        response = await (await self._any()).request(ApiKey.DESCRIBE_ACLS, _acl_filter_body(f))
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "describe ACLs")
        return [AclBinding(AclResourceType(r.resource_type), r.resource_name, PatternType(r.pattern_type),
                           a.principal, a.host, AclOperation(a.operation), AclPermissionType(a.permission_type))
                for r in response.resources for a in r.acls]

    async def create_acls(self, bindings: Iterable[AclBinding], *,
                          raise_errors: bool = True) -> dict[AclBinding, KafkaError | None]:
        """Create ACLs (one request); each maps to None when created. Creating an existing ACL is no error."""
        wanted = list(dict.fromkeys(bindings))
        if not wanted:
            return {}
        body = {"creations": [{"resource_type": b.resource_type, "resource_name": b.resource_name,
                               "resource_pattern_type": b.pattern_type, "principal": b.principal, "host": b.host,
                               "operation": b.operation, "permission_type": b.permission_type} for b in wanted]}
        response = await (await self._any()).request(ApiKey.CREATE_ACLS, body)
        answers = list(response.results)
        results: dict[AclBinding, KafkaError | None] = {}
        for i, binding in enumerate(wanted):
            if i >= len(answers):
                results[binding] = KafkaError(ErrorCode.unknown_server_error, f"no answer for ACL {binding}")
            elif answers[i].error_code != ErrorCode.none:
                results[binding] = _error(answers[i].error_code, answers[i].error_message, f"create ACL {binding}")
            else:
                results[binding] = None
        return _finish(results, raise_errors)

    async def delete_acls(self, filters: Iterable[AclBindingFilter], *,
                          raise_errors: bool = True) -> dict[AclBindingFilter, list[AclBinding] | KafkaError]:
        """Delete the ACLs each filter matches (one request); each filter maps to the ACLs it deleted."""
        wanted = list(dict.fromkeys(filters))
        if not wanted:
            return {}
        response = await (await self._any()).request(
            ApiKey.DELETE_ACLS, {"filters": [_acl_filter_body(f) for f in wanted]})
        answers = list(response.filter_results)
        results: dict[AclBindingFilter, list[AclBinding] | KafkaError] = {}
        for i, f in enumerate(wanted):
            if i >= len(answers):
                results[f] = KafkaError(ErrorCode.unknown_server_error, f"no answer for ACL filter {f}")
            elif answers[i].error_code != ErrorCode.none:
                results[f] = _error(answers[i].error_code, answers[i].error_message, f"delete ACLs matching {f}")
            else:
                results[f] = [AclBinding(AclResourceType(m.resource_type), m.resource_name, PatternType(m.pattern_type),
                                         m.principal, m.host, AclOperation(m.operation),
                                         AclPermissionType(m.permission_type))
                              for m in answers[i].matching_acls if m.error_code == ErrorCode.none]
        return _finish(results, raise_errors)

    # SCRAM credentials ----------------------------------------------------------------------
    # Any broker answers DescribeUserScramCredentials from its image and forwards
    # AlterUserScramCredentials to the controller. The password never leaves this process:
    # the request carries a random salt and the salted password, as Kafka's AdminClient sends.

    async def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                              ) -> dict[str, list[ScramCredentialInfo] | KafkaError]:
        """Each user's mechanisms and iteration counts (every user with a credential when ``users`` is None).

        Users named but without any credential are left out, as Kafka's
        DescribeUserScramCredentialsResult.users() leaves them out; other
        per-user errors (a user named twice) map to a :class:`KafkaError`.
        """
        names = None if users is None else [{"name": u} for u in users]
        response = await (await self._any()).request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {"users": names})
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "describe SCRAM credentials")
        results: dict[str, list[ScramCredentialInfo] | KafkaError] = {}
        for r in response.results:
            if r.error_code == ErrorCode.resource_not_found:
                continue
            if r.error_code != ErrorCode.none:
                results[r.user] = _error(r.error_code, r.error_message, f"describe SCRAM credentials of {r.user}")
            else:
                results[r.user] = sorted((ScramCredentialInfo(scram.BY_TYPE[c.mechanism].name, c.iterations)
                                          for c in r.credential_infos if c.mechanism in scram.BY_TYPE),
                                         key=lambda info: scram.BY_NAME[info.mechanism].type)
        return results

    async def alter_user_scram_credentials(self, alterations: Iterable[ScramCredentialUpsertion | ScramCredentialDeletion],
                                           *, raise_errors: bool = True) -> dict[str, KafkaError | None]:
        """Set or delete credentials (one request); each user named maps to None on success.

        The controller refuses a user named twice in one request (even for
        two mechanisms) with DUPLICATE_RESOURCE, as Kafka's does.
        """
        deletions, upsertions = [], []
        for a in alterations:
            algorithm = scram.BY_NAME[a.mechanism]
            if isinstance(a, ScramCredentialDeletion):
                deletions.append({"name": a.user, "mechanism": algorithm.type})
            else:
                salt = a.salt or scram.random_salt()
                upsertions.append({"name": a.user, "mechanism": algorithm.type, "iterations": a.iterations, "salt": salt,
                                   "salted_password": scram.salted_password(algorithm, a.password, salt, a.iterations)})
        if not deletions and not upsertions:
            return {}
        response = await (await self._any()).request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
                                                      {"deletions": deletions, "upsertions": upsertions})
        results: dict[str, KafkaError | None] = {
            r.user: None if r.error_code == ErrorCode.none
            else _error(r.error_code, r.error_message, f"alter SCRAM credentials of {r.user}")
            for r in response.results}
        return _finish(results, raise_errors)

    # Delegation tokens (KIP-48, KIP-373): any broker answers Describe from its image and
    # forwards Create, Renew and Expire to the controller. Only over an authenticated
    # connection that was not itself authenticated with a token (Kafka refuses the rest).

    async def create_delegation_token(self, *, owner: str | None = None, renewers: Iterable[str] = (),
                                      max_lifetime_ms: int = -1) -> DelegationToken:
        """A new token for ``owner`` (``User:bob``; the requester by default: another owner needs CREATE_TOKENS on
        them), renewable by ``renewers``; ``max_lifetime_ms`` -1: the broker's ``delegation.token.max.lifetime.ms``."""
        owner_type, owner_name = _principal(owner) if owner else (None, None)
        body = {"owner_principal_type": owner_type, "owner_principal_name": owner_name,
                "renewers": [dict(zip(("principal_type", "principal_name"), _principal(r))) for r in renewers],
                "max_lifetime": max_lifetime_ms}
        response = await (await self._any()).request(ApiKey.CREATE_DELEGATION_TOKEN, body)
        if response.error_code != ErrorCode.none:
            raise _token_error(response.error_code)
        return DelegationToken(response.token_id, bytes(response.hmac),
                               f"{response.principal_type}:{response.principal_name}",
                               f"{response.token_requester_principal_type}:{response.token_requester_principal_name}",
                               tuple(renewers), _millis(response.issue_timestamp),
                               _millis(response.expiry_timestamp), _millis(response.max_timestamp))

    async def renew_delegation_token(self, hmac: bytes, *, renew_time_period_ms: int = -1) -> int:
        """Renew the token with this HMAC (its owner or a renewer may); its new expiry timestamp (ms)."""
        response = await (await self._any()).request(ApiKey.RENEW_DELEGATION_TOKEN,
                                                      {"hmac": hmac, "renew_period": renew_time_period_ms})
        if response.error_code != ErrorCode.none:
            raise _token_error(response.error_code)
        return _millis(response.expiry_timestamp)

    async def expire_delegation_token(self, hmac: bytes, *, expiry_time_period_ms: int = -1) -> int:
        """Expire the token with this HMAC that much later (-1: now, which removes it); its expiry timestamp (ms)."""
        response = await (await self._any()).request(ApiKey.EXPIRE_DELEGATION_TOKEN,
                                                      {"hmac": hmac, "expiry_time_period": expiry_time_period_ms})
        if response.error_code != ErrorCode.none:
            raise _token_error(response.error_code)
        return _millis(response.expiry_timestamp)

    async def describe_delegation_tokens(self, owners: Iterable[str] | None = None) -> list[DelegationToken]:
        """The tokens owned or renewable by ``owners`` (None: every token), of those the principal owns, renews or
        may describe (DESCRIBE on the token, DESCRIBE_TOKENS on its owner)."""
        body = {"owners": None if owners is None else [dict(zip(("principal_type", "principal_name"), _principal(o)))
                                                       for o in owners]}
        response = await (await self._any()).request(ApiKey.DESCRIBE_DELEGATION_TOKEN, body)
        if response.error_code != ErrorCode.none:
            raise _token_error(response.error_code)
        return [DelegationToken(t.token_id, bytes(t.hmac), f"{t.principal_type}:{t.principal_name}",
                                f"{t.token_requester_principal_type}:{t.token_requester_principal_name}",
                                tuple(f"{r.principal_type}:{r.principal_name}" for r in t.renewers),
                                _millis(t.issue_timestamp), _millis(t.expiry_timestamp), _millis(t.max_timestamp))
                for t in response.tokens]

    # Client quotas (KIP-546): kept in the metadata log, enforced by every broker.

    async def describe_client_quotas(self, components: Iterable[QuotaFilterComponent] = (), *,
                                     strict: bool = False) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas of every entity the filter matches (all of them without components); ``strict``: only
        entities with no other entity type than the components name."""
        match = [{"entity_type": c.entity_type, "match_type": 0 if c.name is not None else 1 if c.default else 2,
                  "match": c.name} for c in components]
        response = await (await self._any()).request(ApiKey.DESCRIBE_CLIENT_QUOTAS,
                                                      {"components": match, "strict": strict})
        if response.error_code != ErrorCode.none:
            raise _error(response.error_code, response.error_message, "describe client quotas")
        return {tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)):
                {v.key: v.value for v in entry.values} for entry in response.entries or ()}

    async def alter_client_quotas(self, changes: Mapping[QuotaEntity, Mapping[str, float | None]], *,
                                  validate_only: bool = False) -> None:
        """Set each entity's quotas (a None value removes the quota); raises the first entity's error."""
        entries = [{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                    "ops": [{"key": k, "value": 0.0 if v is None else float(v), "remove": v is None}
                            for k, v in values.items()]}
                   for entity, values in changes.items()]
        response = await (await self._any()).request(ApiKey.ALTER_CLIENT_QUOTAS,
                                                      {"entries": entries, "validate_only": validate_only})
        for entry in response.entries:
            if entry.error_code != ErrorCode.none:
                raise _error(entry.error_code, entry.error_message, "alter client quotas")


# The sync client --------------------------------------------------------------------------------


class Admin:
    """The synchronous admin client: every method of :class:`AsyncAdmin`, run on a private loop thread."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._thread = LoopThread("josef-admin")
        try:
            self._admin = AsyncAdmin(config, **kwargs)
            self._thread.run(self._admin.start())
        except BaseException:
            self._thread.run(self._close_quietly())
            self._thread.stop()
            raise
        self.config = self._admin.config

    async def _close_quietly(self) -> None:
        admin = getattr(self, "_admin", None)
        if admin is not None:
            await admin.close()

    def _run(self, coro: Awaitable[V]) -> V:
        return self._thread.run(coro)

    def create_topics(self, topics: Iterable[NewTopic | str], **options: Any) -> dict[str, CreatedTopic]:
        return self._run(self._admin.create_topics(list(topics), **options))

    def delete_topics(self, names: Iterable[str], **options: Any) -> dict[str, KafkaError | None]:
        return self._run(self._admin.delete_topics(list(names), **options))

    def list_topics(self, **options: Any) -> dict[str, TopicListing]:
        return self._run(self._admin.list_topics(**options))

    def describe_topics(self, names: Iterable[str] | None = None, **options: Any) -> dict[str, TopicDescription]:
        return self._run(self._admin.describe_topics(None if names is None else list(names), **options))

    def create_partitions(self, new_partitions: Mapping[str, NewPartitions | int], **options: Any) -> dict[str, KafkaError | None]:
        return self._run(self._admin.create_partitions(new_partitions, **options))

    def describe_configs(self, resources: Iterable[ConfigResource], **options: Any) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return self._run(self._admin.describe_configs(list(resources), **options))

    def alter_configs(self, changes: Mapping[ConfigResource, Any], **options: Any) -> dict[ConfigResource, KafkaError | None]:
        return self._run(self._admin.alter_configs(changes, **options))

    def list_offsets(self, specs: Mapping[TopicPartition, int | str], **options: Any) -> dict[TopicPartition, OffsetInfo]:
        return self._run(self._admin.list_offsets(specs, **options))

    def delete_records(self, before: Mapping[TopicPartition, int], **options: Any) -> dict[TopicPartition, int]:
        return self._run(self._admin.delete_records(before, **options))

    def elect_leaders(self, election_type: ElectionType, partitions: Iterable[TopicPartition] | None = None,
                      ) -> dict[TopicPartition, KafkaError | None]:
        return self._run(self._admin.elect_leaders(election_type, partitions))

    def alter_partition_reassignments(self, targets: Mapping[TopicPartition, Sequence[int] | None],
                                      ) -> dict[TopicPartition, KafkaError | None]:
        return self._run(self._admin.alter_partition_reassignments(targets))

    def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None,
                                     ) -> dict[TopicPartition, PartitionReassignment]:
        return self._run(self._admin.list_partition_reassignments(partitions))

    def describe_cluster(self) -> ClusterDescription:
        return self._run(self._admin.describe_cluster())

    def describe_log_dirs(self, brokers: Iterable[int]) -> dict[int, dict[str, LogDirDescription]]:
        return self._run(self._admin.describe_log_dirs(list(brokers)))

    def list_consumer_group_offsets(self, group: str, partitions: Iterable[TopicPartition] | None = None
                                    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return self._run(self._admin.list_consumer_group_offsets(group, None if partitions is None else list(partitions)))

    def list_transactions(self, **options: Any) -> dict[int, list[TransactionListing]]:
        return self._run(self._admin.list_transactions(**options))

    def describe_transactions(self, transactional_ids: Iterable[str], **options: Any) -> dict[str, TransactionDescription]:
        return self._run(self._admin.describe_transactions(list(transactional_ids), **options))

    def describe_producers(self, partitions: Iterable[TopicPartition], **options: Any) -> dict[TopicPartition, list[ProducerState]]:
        return self._run(self._admin.describe_producers(list(partitions), **options))

    def abort_transaction(self, spec: AbortTransactionSpec) -> None:
        self._run(self._admin.abort_transaction(spec))

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        return self._run(self._admin.describe_acls(acl_filter))

    def create_acls(self, bindings: Iterable[AclBinding], **options: Any) -> dict[AclBinding, KafkaError | None]:
        return self._run(self._admin.create_acls(list(bindings), **options))

    def delete_acls(self, filters: Iterable[AclBindingFilter], **options: Any,
                    ) -> dict[AclBindingFilter, list[AclBinding] | KafkaError]:
        return self._run(self._admin.delete_acls(list(filters), **options))

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> dict[str, list[ScramCredentialInfo] | KafkaError]:
        return self._run(self._admin.describe_user_scram_credentials(None if users is None else list(users)))

    def alter_user_scram_credentials(self, alterations: Iterable[ScramCredentialUpsertion | ScramCredentialDeletion],
                                     **options: Any) -> dict[str, KafkaError | None]:
        return self._run(self._admin.alter_user_scram_credentials(list(alterations), **options))

    def describe_client_quotas(self, components: Iterable[QuotaFilterComponent] = (), **options: Any,
                               ) -> dict[QuotaEntity, dict[str, float]]:
        return self._run(self._admin.describe_client_quotas(list(components), **options))

    def alter_client_quotas(self, changes: Mapping[QuotaEntity, Mapping[str, float | None]], **options: Any) -> None:
        return self._run(self._admin.alter_client_quotas(changes, **options))

    def create_delegation_token(self, **options: Any) -> DelegationToken:
        return self._run(self._admin.create_delegation_token(**options))

    def renew_delegation_token(self, hmac: bytes, **options: Any) -> int:
        return self._run(self._admin.renew_delegation_token(hmac, **options))

    def expire_delegation_token(self, hmac: bytes, **options: Any) -> int:
        return self._run(self._admin.expire_delegation_token(hmac, **options))

    def describe_delegation_tokens(self, owners: Iterable[str] | None = None) -> list[DelegationToken]:
        return self._run(self._admin.describe_delegation_tokens(None if owners is None else list(owners)))

    def close(self) -> None:
        if self._thread.loop.is_closed():
            return
        try:
            self._run(self._admin.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
