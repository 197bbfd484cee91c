"""Drive a real TransactionShard and MarkerChannel without a broker: writes are recorded, peers are scripted.

The shard, the operations and the marker channel under test are the
production ones; only their surroundings are replaced (the partition link,
the broker's image, producer ids and peer channel), so state-machine tests
are deterministic and need no sleeping. Time is the harness's clock.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.testing import ManualClock
from josef.protocol.topic_partition import TopicPartition
from josef.testing.coordinator import Record, RecordingContext
from josef_coordinator_txn import transactions
from josef_coordinator_txn.configs import TxnSettings
from josef_coordinator_txn.markers import MarkerChannel
from josef_coordinator_txn.records import decode_key, decode_value
from josef_coordinator_txn.shard import TransactionShard

E = ErrorCode


class FakeContext(RecordingContext):
    """The contract suite's recording context (writes as the runtime makes them, timers fired by the test), with
    the records written so far as (key, value) pairs."""

    def __init__(self, leader_epoch: int = 7) -> None:
        super().__init__(None, TopicPartition("__transaction_state", 0), leader_epoch)

    @property
    def written(self) -> list[tuple[bytes, bytes | None]]:
        return [(entry.key, entry.value) for entry in self.log if isinstance(entry, Record)]


class FakePeers:
    """WriteTxnMarkers answered by a script: ``errors[(topic, partition)]`` is a list of codes, one per attempt."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, dict[str, Any]]] = []
        self.errors: dict[tuple[str, int], list[ErrorCode]] = {}
        self.unreachable: set[int] = set()
        #: When set, requests wait for it: markers stay in flight until the test lets them through.
        self.gate: anyio.Event | None = None
        self.sent = anyio.Event()

    async def call(self, node_id: int, api_key: int, body: dict[str, Any], *, version: int | None = None) -> Any:
        self.requests.append((node_id, body))
        self.sent.set()
        self.sent = anyio.Event()
        if self.gate is not None:
            await self.gate.wait()
        if node_id in self.unreachable:
            from josef.protocol.errors import KafkaConnectionError

            raise KafkaConnectionError(f"broker {node_id} is down")
        markers = []
        for marker in body["markers"]:
            topics = []
            for topic in marker["topics"]:
                partitions = []
                for index in topic["partition_indexes"]:
                    script = self.errors.get((topic["name"], index), [])
                    code = script.pop(0) if script else E.none
                    partitions.append(SimpleNamespace(partition_index=index, error_code=code))
                topics.append(SimpleNamespace(name=topic["name"], partitions=partitions))
            markers.append(SimpleNamespace(producer_id=marker["producer_id"], topics=topics))
        return SimpleNamespace(markers=markers)


class FakeRuntime:
    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self.tg = tg

    def spawn(self, function: Callable[[], Any]) -> None:
        self.tg.start_soon(function)


class FakeServices:
    """The broker services the coordinator uses: image (topics, leaders, features), producer ids, peers, spawn."""

    def __init__(self, tg: anyio.abc.TaskGroup, transaction_version: int = 2) -> None:
        self.image = SimpleNamespace(topics={}, brokers={1: object(), 2: object(), 3: object()},
                                     features={"transaction.version": transaction_version} if transaction_version else {})
        self.next_producer_id = 1000
        self.peers = FakePeers()
        self.coordinators = FakeRuntime(tg)

    async def new_producer_id(self) -> int:
        self.next_producer_id += 1
        return self.next_producer_id - 1

    async def call_peer(self, node_id: int, api_key: int, body: dict[str, Any], *, version: int | None = None) -> Any:
        return await self.peers.call(node_id, api_key, body, version=version)

    def add_topic(self, name: str, leaders: dict[int, int]) -> None:
        self.image.topics[name] = SimpleNamespace(partitions={p: SimpleNamespace(leader=leader)
                                                              for p, leader in leaders.items()})


class FakeCoordinator:
    def __init__(self, services: FakeServices, settings: TxnSettings) -> None:
        self.services = services
        self._settings = settings
        self.markers = MarkerChannel(services, self._completed)  # type: ignore[arg-type]
        self.producer_ids_allocated = 0
        #: Set (and replaced) each time a transaction's completion has been attempted.
        self.completed = anyio.Event()

    async def _completed(self, completion: Any) -> None:
        await transactions.write_completion(completion)
        self.completed.set()
        self.completed = anyio.Event()

    def settings(self) -> TxnSettings:
        return self._settings


class Harness:
    """One loaded shard with helpers that speak in requests; markers go through the real channel to FakePeers."""

    def __init__(self, tg: anyio.abc.TaskGroup, monkeypatch, *, transaction_version: int = 2, **settings: Any) -> None:
        self.clock = ManualClock()
        monkeypatch.setattr(clock, "now_ms", self.clock)
        self.services = FakeServices(tg, transaction_version)
        self.services.add_topic("orders", {0: 1, 1: 2, 2: 3})
        self.settings = TxnSettings(**settings)
        self.coordinator = FakeCoordinator(self.services, self.settings)
        self.context = FakeContext()
        self.shard = self.new_shard()

    def new_shard(self) -> TransactionShard:
        """A shard loaded from everything written so far (a coordinator failover onto this partition)."""
        if self.context.shard is not None:
            self.context.close()
        log = self.context.log
        self.context = FakeContext()
        shard = TransactionShard(self.context, self.coordinator)  # type: ignore[arg-type]
        self.context.shard = shard
        for entry in log:
            shard.replay(entry.key, entry.value, entry.offset)
        self.context.loaded(log)
        shard.loaded()
        self.shard = shard
        return shard

    def state(self, transactional_id: str = "tx") -> Any:
        return self.shard.transactions[transactional_id]

    def records(self) -> list[tuple[str | None, Any]]:
        """What was written, decoded: (transactional id, value or None)."""
        return [(decode_key(k), decode_value(v) if v is not None else None) for k, v in self.context.written]

    # Requests ------------------------------------------------------------------------------------------

    async def init(self, transactional_id: str = "tx", timeout_ms: int = 60_000,
                   expected: tuple[int, int] | None = None) -> tuple[int, int]:
        return await transactions.init_producer_id(self.shard, transactional_id, timeout_ms, expected)

    async def add(self, producer: tuple[int, int], *partitions: tuple[str, int], transactional_id: str = "tx",
                  version: int = 0) -> None:
        await transactions.add_partitions(self.shard, transactional_id, *producer, frozenset(partitions or
                                                                                              {("orders", 0)}), version)

    async def end(self, producer: tuple[int, int], commit: bool = True, transactional_id: str = "tx",
                  version: int = 0) -> tuple[int, int]:
        return await transactions.end_transaction(self.shard, transactional_id, *producer, commit=commit,
                                                  from_client=True, client_transaction_version=version)

    async def settle(self, transactional_id: str = "tx") -> None:
        """Wait until the transaction's markers and completion are written (the id is no longer pending)."""
        with anyio.fail_after(5):
            while self.shard.transactions[transactional_id].pending_transition:
                await self.coordinator.completed.wait()
