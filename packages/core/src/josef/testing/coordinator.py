"""The coordinator contract suite: what every :class:`josef.coordinator.runtime.Coordinator` plugin must do, as pytest tests.

A plugin runs it against itself with a test module that subclasses
:class:`CoordinatorContract` and gives it a :class:`CoordinatorHarness`: the
name it registers its coordinator under, the configuration it needs, a
scenario that writes through the coordinator, and a summary of a shard's
state to compare::

    from josef.testing.coordinator import CoordinatorContract

    class TestMyCoordinatorContract(CoordinatorContract):
        @pytest.fixture
        def coordinator_harness(self):
            return MyHarness()

The coordinator is found as the broker finds it, through its plugin's
``register_coordinators`` hook. The suite checks:

- its declarations: ``apis()`` works on a coordinator built without services
  (``josef plugins`` builds it with ``None``), each key a Kafka API within
  the versions Kafka defines, none twice, none the core answers except
  :data:`josef.server.apis.TAKEOVER_APIS`; ``key_type`` a FindCoordinator key
  type; ``internal_topic`` a legal internal topic name; ``topic_settings()``
  a topic with partitions and replicas, compacted or (plugin API 1.5) never
  deleted by time or size, for a coordinator that prunes it itself;
- its shards, driven without a broker through :class:`RecordingContext` (a
  :class:`~josef.coordinator.runtime.ShardContext` that keeps what is
  written and replays it as the runtime does) and
  :class:`ContractServices` (a :class:`~josef.services.BrokerServices`
  without a broker): after the harness's scenario, a new shard loaded from
  what the scenario wrote has the same state, and so does one loaded from
  that partition compacted (the latest record of each key), with and
  without its tombstones, or, where the shard pruned the partition
  (``delete_records_before``), from what the pruning left; every record has
  a key;
- the runtime's timeline model, for a shard that declares ``timeline``
  (plugin API 1.2): loaded from any prefix of what the scenario wrote, then
  given the rest as writes that are not committed, the shard rolls back to
  exactly the prefix's state when those writes fail; and, if the harness
  offers ``read``, reads at the committed offset do not see them meanwhile;
- on a real broker (the ``josef_broker`` fixture, which loads plugins through
  their entry points), every API it declares is advertised by ApiVersions
  with the declared versions and answered, at each version, over a socket,
  neither UNSUPPORTED_VERSION nor UNKNOWN_SERVER_ERROR (a handler that failed).

Shard state depends on time only through :mod:`josef.coordinator.clock`,
which the suite stops (:class:`josef.testing.ManualClock`). The class is
not named ``Test*``: pytest collects it only through a plugin's subclass.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import struct
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc
import attrs
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

import josef.coordinator.clock
from josef.authorizer import AllowAll
from josef.config import Config
from josef.coordinator.runtime import Coordinator, CoordinatorError, CoordinatorShard, PendingWrite, Records
from josef.coordinator.timeline import SnapshotRegistry
from josef.metadata.image import MetadataImage
from josef.metadata.records import FeatureLevelRecord, PartitionRecord, TopicRecord, random_uuid, uuid_from_text
from josef.node.server_properties import load_config
from josef.plugins import collect, get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.error_responses import error_codes
from josef.protocol.errors import KafkaConnectionError
from josef.protocol.messages import build, decode_response, request_type, response_type
from josef.protocol.records import build_batch, iter_records
from josef.protocol.topic_partition import TopicPartition
from josef.server.apis import CONTROLLER_APIS, CORE_APIS, TAKEOVER_APIS, TELEMETRY_APIS
from josef.server.apis.envelope import QUORUM_APIS_ON_BROKERS
from josef.security import Session
from josef.server.dispatch import Encoded, Later, RequestContext
from josef.testing import ManualClock, RawClient

__all__ = ["CORE_API_KEYS", "FIND_COORDINATOR_KEY_TYPES", "ContractRuntime", "ContractServices", "CoordinatorContract",
           "CoordinatorHarness", "Marker", "Record", "RecordingContext", "compacted", "minimal_request"]

#: What FindCoordinator's ``key_type`` may be: 0 group, 1 transaction, 2 share.
FIND_COORDINATOR_KEY_TYPES = (0, 1, 2)
#: API keys the core answers itself, on client or controller listeners: a coordinator may take only those of
#: :data:`josef.server.apis.TAKEOVER_APIS`.
CORE_API_KEYS = frozenset({api[0] for api in (*CORE_APIS, *TELEMETRY_APIS, *CONTROLLER_APIS)}
                          | {ApiKey.FIND_COORDINATOR} | QUORUM_APIS_ON_BROKERS)
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


# What a shard writes -------------------------------------------------------------------------------------


@attrs.frozen
class Record:
    """A record a shard wrote at ``offset``; in a producer's transaction when ``producer_id`` >= 0."""

    offset: int
    key: bytes
    value: bytes | None
    producer_id: int = -1
    producer_epoch: int = -1


@attrs.frozen
class Marker:
    """The marker that ends ``producer_id``'s transaction at ``offset``, committing or aborting it."""

    offset: int
    producer_id: int
    committed: bool


Entry = Record | Marker


def compacted(entries: Sequence[Entry], *, tombstones: bool = True) -> list[Entry]:
    """What compaction leaves of a partition: the latest record of each key, its tombstone too unless
    ``tombstones`` is False (once ``delete.retention.ms`` has passed, the cleaner drops them).

    Transactional records and markers stay as they are (their compaction
    waits for the transaction and its marker, which the suite does not model).
    """
    latest = {e.key: e.offset for e in entries if isinstance(e, Record) and e.producer_id < 0}
    return [e for e in entries
            if not isinstance(e, Record) or e.producer_id >= 0
            or (latest[e.key] == e.offset and (tombstones or e.value is not None))]


class RecordingContext:
    """A :class:`josef.coordinator.runtime.ShardContext` for a shard without a broker.

    It keeps the runtime's contract: ``append`` replays the records into a
    shard with ``timeline`` at once (``replay_transactional`` within a
    producer's transaction) and adds them to :attr:`log`, each append its own
    batch, with a snapshot of :attr:`snapshots` at every offset written up to;
    they are committed at once unless :attr:`hold` is set, then when a test
    calls :meth:`commit`. :attr:`fail_appends` makes appends fail as a
    partition refusing them does: rolled back to the snapshot before them, the
    write failed with the error clients are told. A shard of plugin API
    1.0-1.1 (no ``timeline``) is replayed at commit instead.
    :meth:`end_transaction` plays the transaction coordinator's marker.
    Timers are kept in :attr:`timers` and go off only when a test calls
    :meth:`fire`. What breaks the runtime's rules (a record without a key) is
    noted in :attr:`problems`.
    """

    def __init__(self, services: ContractServices | None, tp: TopicPartition, leader_epoch: int = 1) -> None:
        self.services = services
        self.tp = tp
        self.leader_epoch = leader_epoch
        self.lock = anyio.Lock()
        self.active = True
        self.shard: CoordinatorShard | None = None
        self.snapshots = SnapshotRegistry()
        self.snapshots.create_snapshot(0)
        self.log: list[Entry] = []
        self.committed_offset = 0
        self.timers: dict[Any, tuple[float, Callable[[], Awaitable[None]]]] = {}
        self.problems: list[str] = []
        #: While set, appends fail with this code (their partition's error, as NOT_ENOUGH_REPLICAS) and roll back.
        self.fail_appends: ErrorCode | None = None
        #: While set, appended records wait for :meth:`commit` (a follower that is not fetching).
        self.hold = False
        #: Appends made, each one batch (the runtime's ``flushes``).
        self.flushes = 0
        #: The offset below which the shard pruned the partition (:meth:`delete_records_before`).
        self.log_start = 0
        self._pending: list[PendingWrite] = []

    @property
    def end_offset(self) -> int:
        return len(self.log)

    @property
    def last_written_offset(self) -> int:
        return len(self.log)

    @property
    def timeline(self) -> bool:
        return bool(getattr(self.shard, "timeline", False))

    def loaded(self, entries: Sequence[Entry]) -> None:
        """The shard was loaded from ``entries``, all committed."""
        self.log = list(entries)
        self.committed_offset = len(self.log)
        self.snapshots.create_snapshot(len(self.log))
        self.snapshots.delete_snapshots_up_to(len(self.log))

    # Writing ---------------------------------------------------------------------------------------------------

    def append(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
               verification: object | None = None, atomic: bool = True) -> PendingWrite:
        if not self.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} moved to another broker")
        if not records:
            return self.barrier()
        base = self.end_offset
        written = []
        for key, value in records:
            if not isinstance(key, bytes) or not key:
                self.problems.append(f"a record with key {key!r}: the runtime replays only records with a key")
            if value is not None and not isinstance(value, bytes):
                self.problems.append(f"a record with value {value!r}: values are bytes, or None for a tombstone")
            written.append(Record(base + len(written), key, value, producer_id, producer_epoch))
        stored = build_batch([(r.key, r.value, 0) for r in written])
        if [(r.key, r.value) for r in iter_records(stored)] != [(key, value) for key, value in records]:
            self.problems.append("records do not survive a record batch unchanged")
        assert self.shard is not None, "the shard is set on its context before anything is written"
        pending = PendingWrite(written[-1].offset)
        if self.timeline:
            for record in written:
                _replay(self.shard, record)
        if self.fail_appends is not None:
            if self.timeline:
                self.snapshots.revert_to_snapshot(base)
            pending.complete(CoordinatorError.of_write(self.fail_appends, "injected failure"))
            return pending
        self._written(written, pending)
        return pending

    def end_transaction(self, producer_id: int, committed: bool) -> int:
        """The transaction coordinator's marker for ``producer_id``, written to this partition (and committed
        unless :attr:`hold`)."""
        marker = Marker(self.end_offset, producer_id, committed)
        assert self.shard is not None
        if self.timeline:
            _replay(self.shard, marker)
        self._written([marker], PendingWrite(marker.offset))
        return marker.offset

    def _written(self, entries: list[Entry], pending: PendingWrite) -> None:
        self.log += entries
        self.flushes += 1
        self.snapshots.create_snapshot(self.end_offset)
        self._pending.append(pending)
        if not self.hold:
            self.commit()

    def commit(self) -> None:
        """The high watermark reaches the log end: what was appended is committed, its writes done."""
        if not self.timeline:
            for entry in self.log[self.committed_offset:]:
                _replay(self.shard, entry)  # type: ignore[arg-type]
        self.committed_offset = self.end_offset
        self.snapshots.delete_snapshots_up_to(self.committed_offset)
        pending, self._pending = self._pending, []
        for write in pending:
            write.complete(committed=True)

    def fail(self, code: ErrorCode) -> None:
        """The writes not committed yet are lost (as if truncated): rolled back to the committed offset, failed."""
        if self.timeline:
            self.snapshots.revert_to_snapshot(self.committed_offset)
        del self.log[self.committed_offset:]
        pending, self._pending = self._pending, []
        for write in pending:
            write.complete(CoordinatorError.of_write(code, "injected failure"))

    def barrier(self) -> PendingWrite:
        pending = PendingWrite(self.end_offset - 1)
        if self.committed_offset < self.end_offset:
            self._pending.append(pending)
        else:
            pending.complete(committed=True)
        return pending

    async def wait(self, pending: PendingWrite, timeout_s: float | None = None) -> None:
        """As the runtime's: the lock is released while the write waits, if this task holds it."""
        owner = self.lock.statistics().owner
        held = owner is not None and owner.id == anyio.get_current_task().id
        if held:
            self.lock.release()
        try:
            with anyio.move_on_after(timeout_s) as scope:
                await pending.wait()
        finally:
            if held:
                with anyio.CancelScope(shield=True):
                    await self.lock.acquire()
        if scope.cancelled_caught:
            raise CoordinatorError.of_write(ErrorCode.request_timed_out, f"writing to {self.tp} timed out")

    async def verify_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, *,
                                 add_partition: bool = False) -> object | None:
        """There is no transaction coordinator to ask: every partition is taken to be in the transaction."""
        return None

    async def write(self, records: Records, *, producer_id: int = -1, producer_epoch: int = -1,
                    transactional_id: str | None = None, add_partition: bool = False,
                    timeout_s: float | None = None) -> int:
        pending = self.append(records, producer_id=producer_id, producer_epoch=producer_epoch)
        await self.wait(pending, timeout_s)
        return pending.last_offset

    def delete_records_before(self, offset: int) -> int:
        """Prune below ``offset`` (capped at the committed offset): :attr:`log_start` rises, the entries stay in
        :attr:`log` for the suite to compare."""
        if not self.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} moved to another broker")
        self.log_start = max(self.log_start, min(offset, self.committed_offset))
        return self.log_start

    # Timers ----------------------------------------------------------------------------------------------------

    def schedule(self, key: Any, delay_s: float, callback: Callable[[], Awaitable[None]]) -> None:
        self.timers[key] = (delay_s, callback)

    def cancel(self, key: Any) -> None:
        self.timers.pop(key, None)

    async def fire(self, key: Any) -> None:
        """Let the timer ``key`` go off now."""
        _, callback = self.timers.pop(key)
        await callback()

    def close(self) -> None:
        """Unload the shard, as the runtime does when leadership moves: inactive, timers gone, pending writes failed
        with NOT_COORDINATOR, then ``unloaded()`` if any."""
        self.active = False
        self.timers.clear()
        pending, self._pending = self._pending, []
        for write in pending:
            write.complete(CoordinatorError(ErrorCode.not_coordinator, f"{self.tp} moved"))
        unloaded = getattr(self.shard, "unloaded", None)
        if unloaded is not None:
            unloaded()


def _replay(shard: CoordinatorShard, entry: Entry) -> None:
    """One committed entry into its shard, as the runtime replays it while loading and after a write."""
    if isinstance(entry, Marker):
        end = getattr(shard, "replay_end_transaction", None)
        if end is not None:
            end(entry.producer_id, entry.committed, entry.offset)
    elif entry.producer_id >= 0:
        shard.replay_transactional(entry.producer_id, entry.producer_epoch, entry.key,  # type: ignore[attr-defined]
                                   entry.value, entry.offset)
    else:
        shard.replay(entry.key, entry.value, entry.offset)


# Services without a broker --------------------------------------------------------------------------------------


class ContractRuntime:
    """The coordinator runtime of :class:`ContractServices`: one partition of the internal topic, loaded here.

    Every key maps to that partition (give the coordinator one partition in
    the harness's configuration). :meth:`load` builds a shard the way the
    runtime does: ``new_shard``, the entries replayed, ``loaded()``.
    """

    def __init__(self, services: ContractServices, tg: anyio.abc.TaskGroup | None) -> None:
        self._services = services
        self._tg = tg
        self.coordinator: Coordinator | None = None
        self.context: RecordingContext | None = None

    def load(self, entries: Iterable[Entry] = ()) -> RecordingContext:
        assert self.coordinator is not None
        entries = list(entries)
        tp = TopicPartition(self.coordinator.internal_topic, 0)
        epoch = self.context.leader_epoch + 1 if self.context is not None else 1
        context = RecordingContext(self._services, tp, epoch)
        context.shard = shard = self.coordinator.new_shard(context)  # type: ignore[arg-type]
        for entry in entries:
            _replay(shard, entry)
        context.loaded(entries)
        self.context = context
        shard.loaded()
        return context

    def by_key_type(self, key_type: int) -> Coordinator | None:
        return self.coordinator if self.coordinator is not None and self.coordinator.key_type == key_type else None

    def partition_of(self, coordinator: Coordinator, key: str) -> int:
        return 0

    async def shard_for(self, coordinator: Coordinator, key: str) -> RecordingContext:
        if self.context is None or not self.context.active:
            raise CoordinatorError(ErrorCode.not_coordinator, f"no shard is loaded for {key!r}")
        return self.context

    def shards(self, coordinator: Coordinator) -> list[RecordingContext]:
        return [self.context] if self.context is not None and self.context.active else []

    def leader_of(self, coordinator: Coordinator, key: str) -> int:
        return self._services.node_id

    def loading(self, coordinator: Coordinator) -> bool:
        return False

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        if self._tg is not None:
            self._tg.start_soon(function)


class ContractServices:
    """A :class:`josef.services.BrokerServices` without a broker: for a coordinator and its shards under test.

    The configuration and plugins are real; the image holds what
    :meth:`add_topic` and :meth:`set_feature` put there; producer ids count up; there are no other
    brokers to call. :meth:`call` sends a request to the coordinator's own
    handler, as the broker's dispatcher would. :attr:`clock` is what
    :func:`josef.coordinator.clock.now_ms` reads during the suite's tests: a
    scenario moves it forward instead of sleeping.
    """

    def __init__(self, config: Config, plugins: Any, tg: anyio.abc.TaskGroup | None = None, node_id: int = 1,
                 clock: ManualClock | None = None) -> None:
        self.clock = clock if clock is not None else ManualClock()
        self.node_id = node_id
        self.config = config
        self.plugins = plugins
        self.image = MetadataImage()
        self.authorizer = AllowAll(config)
        self.coordinators = ContractRuntime(self, tg)
        self.spawned: list[Callable[[], Awaitable[None]]] = []
        self._next_producer_id = 1000

    def add_topic(self, name: str, partitions: int = 1) -> None:
        """A topic of ``partitions`` partitions led by this broker, in the image."""
        topic_id = uuid_from_text(random_uuid())
        self.image, _ = self.image.apply(self.image.offset + 1, [
            TopicRecord(name=name, topic_id=topic_id),
            *(PartitionRecord(partition_id=p, topic_id=topic_id, replicas=(self.node_id,), isr=(self.node_id,),
                              leader=self.node_id) for p in range(partitions))])

    def set_feature(self, name: str, level: int) -> None:
        """Finalize feature ``name`` at ``level`` in the image (``transaction.version``...)."""
        self.image, _ = self.image.apply(self.image.offset + 1, [FeatureLevelRecord(name=name, feature_level=level)])

    async def new_producer_id(self) -> int:
        self._next_producer_id += 1
        return self._next_producer_id - 1

    def core_handler(self, api_key: int) -> Any:
        return TAKEOVER_APIS[api_key]

    def spawn(self, function: Callable[[], Awaitable[None]]) -> None:
        """Keep a coordinator's background work in :attr:`spawned` without running it: the suite drives the
        coordinator through its calls and the clock, and a loop of its own would outlive the scenario."""
        self.spawned.append(function)

    async def call_peer(self, node_id: int, api_key: int, body: Mapping[str, Any], *, version: int | None = None) -> Any:
        raise KafkaConnectionError(f"broker {node_id} cannot be reached: a contract test has no other brokers")

    async def call(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        """The coordinator's answer to a ``version`` request of ``body`` (built as clients' requests are), as a kio response."""
        coordinator = self.coordinators.coordinator
        assert coordinator is not None
        handlers = {key: handler for key, handler, _, _ in coordinator.apis()}
        assert api_key in handlers, f"the coordinator does not answer {api_key_map.get(api_key, api_key)}"
        handler = handlers[api_key]
        ctx = RequestContext(_Node(self), api_key, version, 0, "contract",  # type: ignore[arg-type]
                             Session("PLAINTEXT", "PLAINTEXT", "127.0.0.1"))
        answer = await handler(ctx, build(request_type(api_key, version), body))
        if isinstance(answer, Later):
            answer = await answer.body
        if isinstance(answer, Encoded):
            frame = b"".join(bytes(chunk) for chunk in answer.chunks)
            return decode_response(api_key, version, struct.pack(">i", 0) + frame)[1]
        return build(response_type(api_key, version), answer)


@attrs.frozen
class _Node:
    """What a RequestContext's node is to a plugin's handler: where its services are."""

    services: ContractServices


# Requests -------------------------------------------------------------------------------------------------------


def minimal_request(api_key: int, version: int) -> dict[str, Any]:
    """A request body with every field a version requires at its neutral value: no items, empty names, -1 ids."""
    return _minimal(request_type(api_key, version))


def _minimal(cls: type) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            continue
        kind = classify_field(field)
        if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
            body[field.name] = []
        elif isinstance(kind, EntityField):
            body[field.name] = None if is_optional(field) else _minimal(kind.type_)
        elif is_optional(field):
            body[field.name] = None
        else:
            body[field.name] = _neutral(field.name, field.metadata.get("kafka_type", ""))
    return body


def _neutral(name: str, kafka_type: str) -> Any:
    if kafka_type in ("int8", "int16", "int32", "int64"):
        return -1 if name.endswith(("offset", "epoch", "_id", "timestamp")) else 0
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    return {"uint16": 0, "float64": 0.0, "bool": False, "string": "", "bytes": b"", "records": b"",
            "timedelta_i32": 0, "timedelta_i64": 0, "uuid": None}.get(kafka_type, 0)


# The harness a plugin provides -------------------------------------------------------------------------------------


class CoordinatorHarness(Protocol):
    """What the suite needs from a coordinator plugin that it cannot learn through the contract."""

    #: The name the plugin registers its coordinator under (``register_coordinators``).
    name: str

    def config_keys(self) -> Mapping[str, str]:
        """Broker configuration for the tests: one partition of the internal topic at least, for the shard tests."""

    async def scenario(self, coordinator: Any, context: RecordingContext, services: ContractServices) -> None:
        """Drive writes into ``context.shard`` through the coordinator's handlers (:meth:`ContractServices.call`)
        or its shard's methods, leaving state that a load must rebuild; tombstones too, where the coordinator writes them."""

    def state(self, shard: Any) -> Any:
        """A comparable summary of ``shard``'s state: what the coordinator answers requests from."""

    def request(self, api_key: int, version: int) -> Mapping[str, Any] | None:
        """The body the end-to-end test sends for ``api_key`` at ``version``; None: :func:`minimal_request`'s."""

    # Optional: ``read(self, shard, at: int) -> Any``: a comparable summary of what the coordinator's reads
    # (OffsetFetch, Describe*, List*) answer from, read at snapshot ``at`` (the shard's committed offset).


# The suite ---------------------------------------------------------------------------------------------------------


class CoordinatorContract:
    """The contract of :class:`josef.coordinator.runtime.Coordinator`; subclass it and provide ``coordinator_harness``."""

    #: How long a shard test may take before the watchdog fails it.
    TIMEOUT_S = 30.0

    @pytest.fixture
    def coordinator_harness(self) -> CoordinatorHarness:
        raise NotImplementedError("a subclass of CoordinatorContract provides the coordinator_harness fixture")

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def factory(self, coordinator_harness: CoordinatorHarness) -> Callable[[Any], Coordinator]:
        """The coordinator's factory, as its plugin registers it."""
        registry = collect(get_plugin_manager(), "register_coordinators", "coordinator")
        assert coordinator_harness.name in registry.names(), (
            f"no coordinator {coordinator_harness.name!r} is registered (register_coordinators); "
            f"registered: {registry.names()}")
        return registry.get(coordinator_harness.name)

    @pytest.fixture
    def clock(self, monkeypatch: pytest.MonkeyPatch) -> ManualClock:
        clock = ManualClock()
        monkeypatch.setattr(josef.coordinator.clock, "now_ms", clock)
        return clock

    def config(self, harness: CoordinatorHarness) -> Config:
        return load_config(None, dict(harness.config_keys()))

    # Declarations ------------------------------------------------------------------------------------------------

    def test_apis_are_a_declaration_made_without_services(self, factory):
        apis = list(factory(None).apis())
        assert apis, "a coordinator answers some API"
        for entry in apis:
            assert len(entry) == 4, f"{entry!r} is not (api key, handler, lowest, highest version)"
            assert callable(entry[1]), f"the handler of API key {entry[0]} is not callable"
            assert all(isinstance(n, int) for n in (entry[0], entry[2], entry[3]))

    def test_each_api_key_is_a_kafka_api_within_the_versions_kafka_defines(self, factory):
        for key, _, low, high in factory(None).apis():
            assert key in api_key_map, f"API key {key} is not a Kafka API"
            known = schema_name_map[api_key_map[key]]
            assert min(known) <= low <= high <= max(known), (
                f"{api_key_map[key]} v{low}-v{high} is outside the versions Kafka defines, v{min(known)}-v{max(known)}")

    def test_no_api_key_is_declared_twice_or_taken_from_the_core(self, factory):
        keys = [key for key, _, _, _ in factory(None).apis()]
        assert len(keys) == len(set(keys)), f"API keys declared twice: {sorted(keys)}"
        taken = sorted(api_key_map[k] for k in set(keys) & CORE_API_KEYS if k not in TAKEOVER_APIS)
        assert taken == [], f"the core answers {taken}: a coordinator may take over only {sorted(TAKEOVER_APIS)}"

    def test_key_type_and_internal_topic_are_declared(self, factory):
        coordinator = factory(None)
        assert coordinator.key_type in FIND_COORDINATOR_KEY_TYPES, f"key_type {coordinator.key_type!r}"
        topic = coordinator.internal_topic
        assert isinstance(topic, str) and _LEGAL_TOPIC.match(topic) and topic not in (".", ".."), topic
        assert topic.startswith("__"), f"{topic!r}: internal topics start with __, so clients see them as internal"
        assert topic != "__cluster_metadata"

    def test_topic_settings_are_a_compacted_topic_with_partitions_and_replicas(self, coordinator_harness, factory):
        services = ContractServices(self.config(coordinator_harness), get_plugin_manager())
        partitions, replication, configs = factory(services).topic_settings()
        assert isinstance(partitions, int) and partitions > 0
        assert isinstance(replication, int) and replication > 0
        configs = dict(configs)
        assert configs.get("cleanup.policy") in ("compact", "delete"), configs.get("cleanup.policy")
        if configs["cleanup.policy"] == "delete":  # pruned by its shards (delete_records_before), never by time or size
            assert (configs.get("retention.ms"), configs.get("retention.bytes")) == ("-1", "-1"), (
                "a coordinator's topic that is not compacted keeps its records until the coordinator prunes them")
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items())

    # Shards --------------------------------------------------------------------------------------------------------

    async def _scenario(self, harness: CoordinatorHarness, factory: Callable[[Any], Coordinator],
                        tg: anyio.abc.TaskGroup, clock: ManualClock,
                        ) -> tuple[ContractServices, RecordingContext, Any, Any]:
        """Run the harness's scenario on a shard loaded from nothing: services, its context, state before and after."""
        services = ContractServices(self.config(harness), get_plugin_manager(), tg, clock=clock)
        services.coordinators.coordinator = factory(services)
        live = services.coordinators.load()
        empty = harness.state(live.shard)
        await harness.scenario(services.coordinators.coordinator, live, services)
        assert live.log, "the scenario wrote nothing: there is nothing to load"
        assert live.problems == []
        return services, live, empty, harness.state(live.shard)

    @pytest.mark.anyio
    async def test_a_shard_loaded_from_what_its_writes_wrote_has_their_state(self, coordinator_harness, factory,
                                                                             clock):
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                services, live, empty, state = await self._scenario(coordinator_harness, factory, tg, clock)
                assert state != empty, "the scenario left the state as it found it: the comparison would prove nothing"
                live.close()
                loaded = services.coordinators.load(live.log)
                assert coordinator_harness.state(loaded.shard) == state
                tg.cancel_scope.cancel()

    @pytest.mark.anyio
    @pytest.mark.parametrize("tombstones", [True, False], ids=["with-tombstones", "tombstones-cleaned"])
    async def test_a_shard_loaded_from_the_compacted_partition_has_the_same_state(self, coordinator_harness,
                                                                                  factory, clock, tombstones):
        _, _, configs = factory(ContractServices(self.config(coordinator_harness), get_plugin_manager())
                                ).topic_settings()
        if dict(configs).get("cleanup.policy") != "compact":
            pytest.skip("the coordinator's topic is not compacted: its shards prune it")
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                services, live, _, state = await self._scenario(coordinator_harness, factory, tg, clock)
                live.close()
                loaded = services.coordinators.load(compacted(live.log, tombstones=tombstones))
                assert coordinator_harness.state(loaded.shard) == state
                tg.cancel_scope.cancel()

    @pytest.mark.anyio
    async def test_a_shard_loaded_from_what_its_pruning_left_has_the_same_state(self, coordinator_harness, factory,
                                                                                clock):
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                services, live, _, state = await self._scenario(coordinator_harness, factory, tg, clock)
                pruned = live.log_start > 0
                if pruned:
                    live.close()
                    loaded = services.coordinators.load([e for e in live.log if e.offset >= live.log_start])
                    assert coordinator_harness.state(loaded.shard) == state, (
                        f"pruned below offset {live.log_start}, the partition no longer loads the same state")
                tg.cancel_scope.cancel()
        if not pruned:  # skipped outside the task group, which older anyio releases would wrap the skip in
            pytest.skip("the scenario pruned nothing (delete_records_before)")

    @pytest.mark.anyio
    async def test_a_shard_loaded_twice_from_one_partition_has_one_state(self, coordinator_harness, factory, clock):
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                services, live, _, _ = await self._scenario(coordinator_harness, factory, tg, clock)
                live.close()
                first = services.coordinators.load(live.log)
                first_state = coordinator_harness.state(first.shard)
                first.close()
                second = services.coordinators.load(live.log)
                assert coordinator_harness.state(second.shard) == first_state
                tg.cancel_scope.cancel()

    # The timeline model (plugin API 1.2) ---------------------------------------------------------------------------

    async def _prefixes(self, harness: CoordinatorHarness, factory: Callable[[Any], Coordinator],
                        tg: anyio.abc.TaskGroup, clock: ManualClock,
                        ) -> Iterator[tuple[ContractServices, RecordingContext, list[Entry]]]:
        """For each prefix of what the scenario wrote: a shard loaded from it, and the entries after it."""
        services, live, _, _ = await self._scenario(harness, factory, tg, clock)
        if not getattr(live.shard, "timeline", False):
            pytest.skip("a shard of plugin API 1.0-1.1 (no timeline) replays only committed records")
        live.close()
        entries = list(live.log)
        return ((services, services.coordinators.load(entries[:cut]), entries[cut:]) for cut in range(len(entries)))

    @staticmethod
    def _write_uncommitted(context: RecordingContext, entries: Sequence[Entry]) -> None:
        """``entries`` written as the runtime writes them, none committed."""
        context.hold = True
        for entry in entries:
            if isinstance(entry, Marker):
                context.end_transaction(entry.producer_id, entry.committed)
            else:
                context.append([(entry.key, entry.value)], producer_id=entry.producer_id,
                               producer_epoch=entry.producer_epoch)

    @pytest.mark.anyio
    async def test_writes_whose_append_fails_are_rolled_back_exactly(self, coordinator_harness, factory, clock):
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                for _, context, rest in await self._prefixes(coordinator_harness, factory, tg, clock):
                    before = coordinator_harness.state(context.shard)
                    self._write_uncommitted(context, rest)
                    context.fail(ErrorCode.not_enough_replicas)
                    assert coordinator_harness.state(context.shard) == before, (
                        f"after {len(rest)} writes rolled back to offset {context.committed_offset}, the state "
                        "differs from the state loaded from that offset: replayed state outside timeline types?")
                    context.close()
                tg.cancel_scope.cancel()

    @pytest.mark.anyio
    async def test_reads_at_the_committed_offset_do_not_see_uncommitted_writes(self, coordinator_harness, factory,
                                                                              clock):
        read = getattr(coordinator_harness, "read", None)
        if read is None:
            pytest.skip("the harness offers no read(shard, at) to compare")
        with anyio.fail_after(self.TIMEOUT_S):
            async with anyio.create_task_group() as tg:
                for _, context, rest in await self._prefixes(coordinator_harness, factory, tg, clock):
                    committed = read(context.shard, context.committed_offset)
                    self._write_uncommitted(context, rest)
                    assert read(context.shard, context.committed_offset) == committed, (
                        f"{len(rest)} writes not committed yet are visible to reads")
                    context.commit()
                    context.close()
                tg.cancel_scope.cancel()

    # On a broker ---------------------------------------------------------------------------------------------------

    @pytest.fixture
    def coordinator_broker(self, request: pytest.FixtureRequest, coordinator_harness: CoordinatorHarness) -> Any:
        """The ``josef_broker`` fixture's broker, with the harness's configuration."""
        request.applymarker(pytest.mark.josef_config(**coordinator_harness.config_keys()))
        return request.getfixturevalue("josef_broker")

    def test_a_broker_advertises_and_answers_each_api_at_each_version(self, coordinator_harness, factory,
                                                                      coordinator_broker):
        declared = {key: (low, high) for key, _, low, high in factory(None).apis()}
        client = RawClient(coordinator_broker.port)
        try:
            versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "contract",
                                                              "client_software_version": "1"})
            advertised = {a.api_key: (a.min_version, a.max_version) for a in versions.api_keys}
            assert {key: advertised.get(key) for key in declared} == declared, (
                "the broker does not advertise the coordinator's APIs as declared: is it registered by its plugin?")
            for key, (low, high) in sorted(declared.items()):
                for version in range(low, high + 1):
                    body = coordinator_harness.request(key, version)
                    body = minimal_request(key, version) if body is None else body
                    try:
                        response = client.call(key, version, dict(body))
                    except (OSError, struct.error) as exc:
                        raise AssertionError(f"{api_key_map[key]} v{version} got no answer: {exc!r}") from None
                    codes = set(error_codes(response))
                    assert ErrorCode.unsupported_version not in codes, (f"{api_key_map[key]} v{version}", response)
                    assert ErrorCode.unknown_server_error not in codes, (
                        f"{api_key_map[key]} v{version}: the handler failed on a well-formed request", response)
        finally:
            client.close()
