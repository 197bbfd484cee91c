"""The transaction coordinator's metrics (josef_coordinator_txn.metrics), read from a real shard and marker channel."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from josef.node.server_properties import load_config
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.testing import ManualClock
from josef.testing.coordinator import ContractServices
import josef.coordinator.clock
from josef_coordinator_txn.coordinator import TransactionCoordinator
from josef_coordinator_txn.metrics import transaction_metrics
from txn_harness import Harness

pytestmark = pytest.mark.anyio
E = ErrorCode
STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
          "PrepareEpochFence")


@pytest.fixture
def anyio_backend():
    return "asyncio"


def samples(families) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def states_of(values: dict) -> dict[str, float]:
    return {dict(labels)["state"]: v for (name, labels), v in values.items()
            if name == "kafka_server_transaction_coordinator_metrics_transaction_count"}


def value(values: dict, name: str, **labels: str) -> float:
    return values[name, tuple(sorted(labels.items()))]


CHANNEL = "kafka_coordinator_transaction_transactionmarkerchannelmanager"


async def test_states_marker_queues_and_retries(monkeypatch):
    async with anyio.create_task_group() as tg:
        h = Harness(tg, monkeypatch)

        def read() -> dict:
            return samples(transaction_metrics([h.shard], h.coordinator.markers,
                                               h.coordinator.producer_ids_allocated))

        await h.add(await h.init("open"), transactional_id="open")
        await h.init("empty")
        h.services.peers.gate = anyio.Event()  # the first WriteTxnMarkers to broker 1 waits: the next ones queue
        sent = h.services.peers.sent
        for transactional_id in ("one", "two", "three"):
            producer = await h.init(transactional_id)
            await h.add(producer, transactional_id=transactional_id)
            await h.end(producer, transactional_id=transactional_id)
        await sent.wait()
        h.services.add_topic("orders", {0: 1, 1: -1, 2: 3})  # orders-1 has no leader
        lost = await h.init("lost")
        await h.add(lost, ("orders", 1), transactional_id="lost")
        await h.end(lost, commit=False, transactional_id="lost")
        await anyio.wait_all_tasks_blocked()

        values = read()
        assert states_of(values) == {**dict.fromkeys(STATES, 0), "Empty": 1, "Ongoing": 1, "PrepareCommit": 3,
                                     "PrepareAbort": 1}
        assert value(values, "kafka_server_transaction_coordinator_metrics_transactional_id_count") == 6
        assert value(values, "kafka_server_transaction_coordinator_metrics_producer_ids_allocated_total") == 6
        assert value(values, f"{CHANNEL}_markerqueuesize", broker="1") == 2  # "two" and "three" behind "one"
        assert value(values, f"{CHANNEL}_unknowndestinationqueuesize") == 1  # "lost", until orders-1 has a leader
        assert value(values, f"{CHANNEL}_logappendretryqueuesize") == 0

        h.context.fail_appends = E.not_enough_replicas  # the CompleteCommits are refused: they wait to be retried
        h.services.peers.gate.set()
        with anyio.fail_after(5):
            while h.coordinator.markers.log_append_retries < 3:
                await anyio.sleep(0.01)
        values = read()
        assert value(values, f"{CHANNEL}_logappendretryqueuesize") == 3
        assert value(values, f"{CHANNEL}_markerqueuesize", broker="1") == 0

        h.context.fail_appends = None
        h.services.add_topic("orders", {0: 1, 1: 2, 2: 3})
        for transactional_id in ("one", "two", "three", "lost"):
            await h.settle(transactional_id)
        values = read()
        assert states_of(values) == {**dict.fromkeys(STATES, 0), "Empty": 1, "Ongoing": 1, "CompleteCommit": 3,
                                     "CompleteAbort": 1}
        assert value(values, f"{CHANNEL}_unknowndestinationqueuesize") == 0
        assert value(values, f"{CHANNEL}_logappendretryqueuesize") == 0
        tg.cancel_scope.cancel()


async def call(services: ContractServices, api_key: int, version: int, body: dict[str, Any]) -> Any:
    return await services.call(api_key, version, body)


async def test_the_coordinator_collects_its_loaded_shards(monkeypatch):
    """``TransactionCoordinator.collect()``, what the node exports: the coordinator's shards and channel."""
    clock = ManualClock()
    monkeypatch.setattr(josef.coordinator.clock, "now_ms", clock)
    async with anyio.create_task_group() as tg:
        services = ContractServices(load_config(None, {"transaction.state.log.num.partitions": "1"}),
                                    get_plugin_manager(), tg, clock=clock)
        coordinator = services.coordinators.coordinator = TransactionCoordinator(services)
        before = samples(coordinator.collect())
        assert math.isnan(value(before, "kafka_server_transaction_coordinator_metrics_partition_load_time_max"))
        services.coordinators.load()
        services.add_topic("orders", 2)
        producers = {}
        for transactional_id in ("a", "b"):
            answer = await call(services, ApiKey.INIT_PRODUCER_ID, 4, {
                "transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": -1,
                "producer_epoch": -1})
            assert answer.error_code == E.none
            producers[transactional_id] = (answer.producer_id, answer.producer_epoch)
        producer_id, epoch = producers["a"]
        added = await call(services, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": "a", "v3_and_below_producer_id": producer_id,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": "orders", "partitions": [0, 1]}]})
        assert {p.partition_error_code for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition} == {E.none}
        # The image has no brokers: the markers of a's commit have no known destination.
        ended = await call(services, ApiKey.END_TXN, 3, {"transactional_id": "a", "producer_id": producer_id,
                                                         "producer_epoch": epoch, "committed": True})
        assert ended.error_code == E.none
        await anyio.wait_all_tasks_blocked()

        values = samples(coordinator.collect())
        assert states_of(values) == {**dict.fromkeys(STATES, 0), "PrepareCommit": 1, "Empty": 1}
        assert value(values, "kafka_server_transaction_coordinator_metrics_transactional_id_count") == 2
        assert value(values, "kafka_server_transaction_coordinator_metrics_producer_ids_allocated_total") == 2
        assert value(values, f"{CHANNEL}_unknowndestinationqueuesize") == 1
        load_avg = value(values, "kafka_server_transaction_coordinator_metrics_partition_load_time_avg")
        load_max = value(values, "kafka_server_transaction_coordinator_metrics_partition_load_time_max")
        assert 0 <= load_avg == load_max < 5000
        tg.cancel_scope.cancel()
