"""A log storage layer (``register_log_storage_layers``) over the selected storage, and the broker's reads below a
log's local start (tiered storage's seam), over a real socket.

The layer here stands in for tiered storage: its logs call everything below
``local_start`` remote and serve it from the local log underneath, through
``read_remote``, in a worker thread. What is tested is the broker's side:
the layer is assembled over the storage, a consumer's fetch below the local
start is answered by an awaited remote read (cut short by
``remote.fetch.max.wait.ms``, failing alone), and ListOffsets tells the two
log starts apart. The real layer, over real object storage, is
``josef-storage-tiered``'s.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode as E

from josef import hookimpl
from josef.log import LogDirError, OffsetMovedToTieredStorageError, OffsetOutOfRangeError, RemoteRecords
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef.testing import RawClient, broker_overrides

TP = TopicPartition("t", 0)


class ArchiveLog:
    """A log whose offsets below ``local_start`` count as remote."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.local_start = 0
        #: Set: remote reads wait for it (a slow object store). ``failure``: remote reads raise it.
        self.gate: anyio.Event | None = None
        self.failure: Exception | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def local_log_start_offset(self) -> int:
        return max(self._inner.log_start_offset, self.local_start)

    def _check_local(self, offset: int) -> None:
        if self._inner.log_start_offset <= offset < self.local_log_start_offset:
            raise OffsetMovedToTieredStorageError(f"offset {offset} is remote")

    def read(self, offset: int, *args: Any) -> Any:
        self._check_local(offset)
        return self._inner.read(offset, *args)

    def read_region(self, offset: int, *args: Any) -> Any:
        self._check_local(offset)
        return self._inner.read_region(offset, *args)

    async def read_remote(self, offset: int, max_bytes: int, max_offset: int, min_one_batch: bool = True,
                          read_committed: bool = False) -> RemoteRecords:
        if not self._inner.log_start_offset <= offset < self.local_log_start_offset:
            raise OffsetOutOfRangeError(f"offset {offset} is not remote")
        if self.gate is not None:
            await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        upper = min(max_offset, self.local_log_start_offset)
        records = await anyio.to_thread.run_sync(self._inner.read, offset, max_bytes, upper, min_one_batch)
        return RemoteRecords(records, self._inner.aborted_txns(offset, upper) if read_committed else [])


class ArchiveStorage:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.logs: dict[TopicPartition, ArchiveLog] = {}
        self.background_ran = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open(self, tp: TopicPartition, config: Any) -> ArchiveLog:
        log = self.logs[tp] = ArchiveLog(self._inner.open(tp, config))
        return log


def archive(storage, config, services):
    layer = ArchiveStorage(storage)

    async def background():  # what tiered storage's remote log manager runs
        layer.background_ran = True
        await anyio.sleep_forever()

    services.spawn(background)
    return layer


class ArchivePlugin:
    @staticmethod
    @hookimpl
    def register_log_storage_layers(register):
        register("archive", archive)
        register("off", lambda storage, config, services: None)  # a layer its config leaves off


@pytest.fixture
def broker(tmp_path):
    pm = get_plugin_manager(plugins=[ArchivePlugin()], block=["coordinator-group", "coordinator-txn", "coordinator-share"])
    thread = BrokerThread({**broker_overrides(tmp_path), "remote.fetch.max.wait.ms": "300"}, pm=pm)
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture
def client(broker):
    client = RawClient(broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    for i in range(4):
        batch = build_batch([(None, b"v%d" % i, int(time.time() * 1000))])
        produced = client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
        assert produced.responses[0].partition_responses[0].error_code == E.none
    yield client
    client.close()


def fetch(client, offset, isolation=0):
    answer = client.call(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
    return answer.responses[0].partitions[0]


def offsets(records):
    return [header.base_offset for _, header in iter_batches(bytes(records or b""))]


def list_offset(client, timestamp):
    answer = client.call(ApiKey.LIST_OFFSETS, 8, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    return answer.topics[0].partitions[0]


def test_the_layer_wraps_the_selected_storage_and_the_metadata_log_stays_below_it(broker, client):
    storage = broker.broker.storage
    assert isinstance(storage, ArchiveStorage)
    assert TP in storage.logs and not any(tp.topic == "__cluster_metadata" for tp in storage.logs)
    assert storage.logs[TP].log_end_offset == 4
    assert storage.background_ran  # what it spawned runs once the broker serves, until the broker stops


def test_a_fetch_below_the_local_start_is_answered_from_remote_storage(broker, client):
    broker.broker.storage.logs[TP].local_start = 2
    remote = fetch(client, 0)
    assert (remote.error_code, offsets(remote.records)) == (E.none, [0, 1])  # one read ends where the local log starts
    assert remote.log_start_offset == 0 and remote.high_watermark == 4
    assert offsets(fetch(client, 2).records) == [2, 3]
    committed = fetch(client, 1, isolation=1)
    assert (committed.error_code, offsets(committed.records), list(committed.aborted_transactions)) == (E.none, [1], [])


def test_list_offsets_tells_the_log_start_from_the_local_log_start(broker, client):
    broker.broker.storage.logs[TP].local_start = 3
    assert list_offset(client, -2).offset == 0
    assert list_offset(client, -4).offset == 3
    assert list_offset(client, -1).offset == 4
    assert list_offset(client, -5).offset == -1  # LATEST_TIERED: nothing in remote storage (the local log's answer)


def test_a_slow_remote_read_is_answered_empty_after_remote_fetch_max_wait_ms(broker, client):
    log = broker.broker.storage.logs[TP]
    log.local_start = 2
    log.gate = broker.call(anyio.Event)
    started = time.monotonic()
    slow = fetch(client, 0)
    assert (slow.error_code, offsets(slow.records)) == (E.none, [])
    assert time.monotonic() - started >= 0.3
    broker.call(log.gate.set)
    assert offsets(fetch(client, 0).records) == [0, 1]


def test_a_failed_remote_read_fails_that_read_alone(broker, client):
    log = broker.broker.storage.logs[TP]
    log.local_start = 2
    log.failure = LogDirError("the object store answered 500")
    assert fetch(client, 0).error_code == E.kafka_storage_error
    assert offsets(fetch(client, 2).records) == [2, 3]
    log.failure = None
    assert offsets(fetch(client, 0).records) == [0, 1]
