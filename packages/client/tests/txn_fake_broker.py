"""A one-node Kafka server in a thread that plays partition leader, transaction coordinator and group coordinator.

Enough of Kafka's transaction protocol to test the client's side of it
without a broker: InitProducerId bumps the epoch of a transactional id
(fencing older producers), AddPartitionsToTxn and AddOffsetsToTxn record
what a transaction holds, Produce refuses transactional batches to
partitions not added (as Kafka's verification does) and batches of stale
epochs, EndTxn commits or aborts (and with v5 bumps the epoch, Transactions
V2), TxnOffsetCommit checks the consumer generation. Tests script errors
with :meth:`FakeBroker.fail` and read what was asked from ``requests``.
It speaks the real framing through josef's own encoders.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import attrs
from kio.schema.errors import ErrorCode as E
from kio.schema.index import api_key_map, schema_name_map

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import iter_batches, iter_records
from josef.protocol.topic_partition import TopicPartition

from fake_server import FakeKafkaServer

NODE = 0


@attrs.define
class Txn:
    producer_id: int
    epoch: int
    timeout_ms: int
    state: str = "Empty"
    partitions: set[TopicPartition] = attrs.field(factory=set)
    groups: set[str] = attrs.field(factory=set)
    start_ms: int = -1


@attrs.define
class Stored:
    """A record as the partition holds it, with its transaction's outcome once known."""

    offset: int
    producer_id: int
    epoch: int
    transactional: bool
    key: bytes | None
    value: bytes | None
    outcome: str | None = None  # "commit" / "abort" for transactional records whose marker was written


class FakeBroker(FakeKafkaServer):
    def __init__(self, topics: dict[str, int], *, transaction_version: int = 0,
                 max_versions: dict[int, int] | None = None) -> None:
        self.topics = dict(topics)
        self.transaction_version = transaction_version
        self.max_versions = max_versions or {}
        self.errors: dict[int, collections.deque[E]] = collections.defaultdict(collections.deque)
        self.txns: dict[str, Txn] = {}
        self.logs: dict[TopicPartition, list[Stored]] = collections.defaultdict(list)
        self.sequences: dict[tuple[TopicPartition, int], tuple[int, int]] = {}  # next sequence, epoch
        self.pending_offsets: dict[tuple[str, int], dict[TopicPartition, tuple[int, str | None]]] = {}
        self.committed_offsets: dict[str, dict[TopicPartition, tuple[int, str | None]]] = collections.defaultdict(dict)
        self.txn_offset_members: list[tuple[int, str, str | None]] = []
        self.generations: dict[str, int] = {}
        self.markers: list[Any] = []
        self._next_pid = 1000
        super().__init__()

    # Harness ------------------------------------------------------------------------------

    def fail(self, api_key: int, *codes: E) -> None:
        """The next answers to ``api_key`` carry these errors, one answer each (per partition where the API has partitions)."""
        self.errors[api_key].extend(codes)

    def values(self, topic: str, partition: int = 0, outcome: str | None = "commit") -> list[bytes | None]:
        """Values of transactional records with that outcome (None: still open) and of plain records (outcome 'commit')."""
        return [r.value for r in self.logs[TopicPartition(topic, partition)]
                if (r.outcome if r.transactional else "commit") == outcome]

    def _error(self, api_key: int) -> E:
        queue = self.errors.get(api_key)
        return queue.popleft() if queue else E.none

    def answer(self, key: int, version: int, body: Any) -> dict[str, Any] | None:
        answer = self.handlers[key](self, version, body)
        return None if key == ApiKey.PRODUCE and body.acks == 0 else answer

    # Cluster ------------------------------------------------------------------------------------

    def api_versions(self, version: int, body: Any) -> dict[str, Any]:
        keys = []
        for key in self.handlers:
            versions = schema_name_map[api_key_map[key]]
            keys.append({"api_key": key, "min_version": min(versions),
                         "max_version": min(max(versions), self.max_versions.get(key, max(versions)))})
        features = ([{"name": "transaction.version", "max_version_level": self.transaction_version,
                      "min_version_level": self.transaction_version}] if self.transaction_version else [])
        return {"error_code": E.none, "throttle_time": 0, "api_keys": keys, "supported_features": [],
                "finalized_features_epoch": 1 if features else -1, "finalized_features": features,
                "zk_migration_ready": False}

    def metadata(self, version: int, body: Any) -> dict[str, Any]:
        names = list(self.topics) if body.topics is None else [t.name for t in body.topics]
        return {"throttle_time": 0, "brokers": [{"node_id": NODE, "host": "127.0.0.1", "port": self.port, "rack": None}],
                "cluster_id": "fake", "controller_id": NODE,
                "topics": [{"error_code": E.none if n in self.topics else E.unknown_topic_or_partition, "name": n,
                            "topic_id": None, "is_internal": False, "topic_authorized_operations": -2147483648,
                            "partitions": [{"error_code": E.none, "partition_index": p, "leader_id": NODE,
                                            "leader_epoch": 0, "replica_nodes": [NODE], "isr_nodes": [NODE],
                                            "offline_replicas": []} for p in range(self.topics.get(n, 0))]}
                           for n in names],
                "cluster_authorized_operations": -2147483648}

    def find_coordinator(self, version: int, body: Any) -> dict[str, Any]:
        code = self._error(ApiKey.FIND_COORDINATOR)
        found = {"error_code": code, "error_message": None, "node_id": NODE, "host": "127.0.0.1", "port": self.port}
        if version >= 4:
            return {"throttle_time": 0, "coordinators": [{"key": k, **found} for k in body.coordinator_keys]}
        return {"throttle_time": 0, **found}

    # Transactions ---------------------------------------------------------------------------------

    def _check_producer(self, txn: Txn | None, producer_id: int, epoch: int) -> E:
        if txn is None or txn.producer_id != producer_id:
            return E.invalid_producer_id_mapping
        if epoch != txn.epoch:
            return E.producer_fenced
        return E.none

    def init_producer_id(self, version: int, body: Any) -> dict[str, Any]:
        code = self._error(ApiKey.INIT_PRODUCER_ID)
        if code != E.none:
            return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}
        txn = self.txns.get(body.transactional_id)
        if txn is None:
            self._next_pid += 1
            txn = self.txns[body.transactional_id] = Txn(self._next_pid, 0, int(body.transaction_timeout.total_seconds() * 1000))
        else:
            if body.producer_id >= 0 and (body.producer_id, body.producer_epoch) != (txn.producer_id, txn.epoch):
                return {"throttle_time": 0, "error_code": E.producer_fenced, "producer_id": -1, "producer_epoch": -1}
            if txn.state == "Ongoing":
                self._complete(body.transactional_id, txn, commit=False)  # a zombie's transaction is aborted
            txn.epoch += 1
        return {"throttle_time": 0, "error_code": E.none, "producer_id": txn.producer_id, "producer_epoch": txn.epoch}

    def add_partitions_to_txn(self, version: int, body: Any) -> dict[str, Any]:
        txn = self.txns.get(body.v3_and_below_transactional_id)
        code = self._check_producer(txn, body.v3_and_below_producer_id, body.v3_and_below_producer_epoch)
        results = []
        for topic in body.v3_and_below_topics:
            parts = []
            for p in topic.partitions:
                error = self._error(ApiKey.ADD_PARTITIONS_TO_TXN) if code == E.none else code
                if error == E.none and topic.name not in self.topics:
                    error = E.unknown_topic_or_partition
                if error == E.none:
                    txn.partitions.add(TopicPartition(topic.name, p))
                    self._start(txn)
                parts.append({"partition_index": p, "partition_error_code": error})
            results.append({"name": topic.name, "results_by_partition": parts})
        return {"throttle_time": 0, "error_code": E.none, "results_by_topic_v3_and_below": results, "results_by_transaction": []}

    def _start(self, txn: Txn) -> None:
        if txn.state != "Ongoing":
            txn.state, txn.start_ms = "Ongoing", 1_700_000_000_000

    def add_offsets_to_txn(self, version: int, body: Any) -> dict[str, Any]:
        txn = self.txns.get(body.transactional_id)
        code = self._error(ApiKey.ADD_OFFSETS_TO_TXN)
        if code == E.none:
            code = self._check_producer(txn, body.producer_id, body.producer_epoch)
        if code == E.none:
            txn.groups.add(body.group_id)
            self._start(txn)
        return {"throttle_time": 0, "error_code": code}

    def txn_offset_commit(self, version: int, body: Any) -> dict[str, Any]:
        txn = self.txns.get(body.transactional_id)
        code = self._check_producer(txn, body.producer_id, body.producer_epoch)
        if code == E.none and version < 5 and body.group_id not in txn.groups:
            code = E.invalid_txn_state
        if code == E.none and version >= 3:
            self.txn_offset_members.append((body.generation_id, body.member_id, body.group_instance_id))
            expected = self.generations.get(body.group_id)
            if expected is not None and body.generation_id != expected:
                code = E.illegal_generation
        if code == E.none and version >= 5:
            txn.groups.add(body.group_id)
            self._start(txn)
        topics = []
        for topic in body.topics:
            parts = []
            for p in topic.partitions:
                error = code if code != E.none else self._error(ApiKey.TXN_OFFSET_COMMIT)
                if error == E.none:
                    self.pending_offsets.setdefault((body.group_id, txn.producer_id), {})[
                        TopicPartition(topic.name, p.partition_index)] = (p.committed_offset, p.committed_metadata)
                parts.append({"partition_index": p.partition_index, "error_code": error})
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    def end_txn(self, version: int, body: Any) -> dict[str, Any]:
        txn = self.txns.get(body.transactional_id)
        code = self._error(ApiKey.END_TXN)
        if code == E.none:
            code = self._check_producer(txn, body.producer_id, body.producer_epoch)
        if code == E.none and txn.state != "Ongoing" and version < 5:
            code = E.invalid_txn_state
        if code != E.none:
            return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}
        self._complete(body.transactional_id, txn, commit=body.committed)
        if version >= 5:
            txn.epoch += 1
        return {"throttle_time": 0, "error_code": E.none, "producer_id": txn.producer_id, "producer_epoch": txn.epoch}

    def _complete(self, transactional_id: str, txn: Txn, commit: bool) -> None:
        outcome = "commit" if commit else "abort"
        for tp in txn.partitions:
            for record in self.logs[tp]:
                if record.producer_id == txn.producer_id and record.transactional and record.outcome is None:
                    record.outcome = outcome
        for group in txn.groups:
            pending = self.pending_offsets.pop((group, txn.producer_id), {})
            if commit:
                self.committed_offsets[group].update(pending)
        txn.partitions.clear()
        txn.groups.clear()
        txn.state = "CompleteCommit" if commit else "CompleteAbort"

    # Produce ----------------------------------------------------------------------------------------

    def produce(self, version: int, body: Any) -> dict[str, Any]:
        responses = []
        for topic in body.topic_data:
            parts = []
            for p in topic.partition_data:
                tp = TopicPartition(topic.name, p.index)
                code, base = self._append(version, body.transactional_id, tp, bytes(p.records))
                parts.append({"index": p.index, "error_code": code, "base_offset": base, "log_append_time": -1,
                              "log_start_offset": 0, "record_errors": [], "error_message": None})
            responses.append({"name": topic.name, "partition_responses": parts})
        return {"responses": responses, "throttle_time": 0}

    def _append(self, version: int, transactional_id: str | None, tp: TopicPartition, data: bytes) -> tuple[E, int]:
        code = self._error(ApiKey.PRODUCE)
        if code != E.none:
            return code, -1
        (pos, header), = list(iter_batches(data))
        txn = self.txns.get(transactional_id) if transactional_id else None
        if header.is_transactional:
            if txn is None or txn.producer_id != header.producer_id:
                return E.invalid_producer_id_mapping, -1
            if header.producer_epoch < txn.epoch:
                return E.invalid_producer_epoch, -1
            if tp not in txn.partitions:
                if version < 12 or self.transaction_version < 2:
                    return E.invalid_txn_state, -1
                txn.partitions.add(tp)
                self._start(txn)
        if header.producer_id >= 0:
            expected, epoch = self.sequences.get((tp, header.producer_id), (0, header.producer_epoch))
            if header.producer_epoch != epoch:
                expected = 0
            if header.base_sequence != expected:
                return E.out_of_order_sequence_number, -1
            self.sequences[(tp, header.producer_id)] = (expected + header.records_count, header.producer_epoch)
        log = self.logs[tp]
        base = len(log)
        for i, record in enumerate(iter_records(data[pos:pos + header.size])):
            log.append(Stored(base + i, header.producer_id, header.producer_epoch, header.is_transactional,
                              record.key, record.value))
        return E.none, base

    # Admin ------------------------------------------------------------------------------------------

    def list_transactions(self, version: int, body: Any) -> dict[str, Any]:
        states = [{"transactional_id": t, "producer_id": txn.producer_id, "transaction_state": txn.state}
                  for t, txn in sorted(self.txns.items())
                  if (not body.state_filters or txn.state in body.state_filters)
                  and (not body.producer_id_filters or txn.producer_id in body.producer_id_filters)]
        error = self._error(ApiKey.LIST_TRANSACTIONS)
        return {"throttle_time": 0, "error_code": error, "unknown_state_filters": [],
                "transaction_states": [] if error else states}

    def describe_transactions(self, version: int, body: Any) -> dict[str, Any]:
        answers = []
        for t in body.transactional_ids:
            txn = self.txns.get(t)
            if txn is None:
                answers.append({"error_code": E.transactional_id_not_found, "transactional_id": t, "transaction_state": "",
                                "transaction_timeout": 0, "transaction_start_time": -1, "producer_id": -1,
                                "producer_epoch": -1, "topics": []})
                continue
            topics: dict[str, list[int]] = {}
            for tp in sorted(txn.partitions):
                topics.setdefault(tp.topic, []).append(tp.partition)
            answers.append({"error_code": E.none, "transactional_id": t, "transaction_state": txn.state,
                            "transaction_timeout": txn.timeout_ms,
                            "transaction_start_time": txn.start_ms if txn.state == "Ongoing" else -1,
                            "producer_id": txn.producer_id, "producer_epoch": txn.epoch,
                            "topics": [{"topic": n, "partitions": p} for n, p in topics.items()]})
        return {"throttle_time": 0, "transaction_states": answers}

    def describe_producers(self, version: int, body: Any) -> dict[str, Any]:
        topics = []
        for topic in body.topics:
            parts = []
            for p in topic.partition_indexes:
                log = self.logs[TopicPartition(topic.name, p)]
                producers: dict[int, Stored] = {}
                starts: dict[int, int] = {}
                for record in log:
                    if record.producer_id >= 0:
                        producers[record.producer_id] = record
                        if record.transactional and record.outcome is None:
                            starts.setdefault(record.producer_id, record.offset)
                parts.append({"partition_index": p, "error_code": E.none, "error_message": None, "active_producers": [
                    {"producer_id": pid, "producer_epoch": r.epoch, "last_sequence": r.offset,
                     "last_timestamp": 1_700_000_000_000, "coordinator_epoch": 3, "current_txn_start_offset": starts.get(pid, -1)}
                    for pid, r in sorted(producers.items())]})
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    def write_txn_markers(self, version: int, body: Any) -> dict[str, Any]:
        self.markers.extend(body.markers)
        answers = []
        for marker in body.markers:
            topics = []
            for topic in marker.topics:
                for p in topic.partition_indexes:
                    for record in self.logs[TopicPartition(topic.name, p)]:
                        if record.producer_id == marker.producer_id and record.transactional and record.outcome is None:
                            record.outcome = "commit" if marker.transaction_result else "abort"
                topics.append({"name": topic.name, "partitions": [
                    {"partition_index": p, "error_code": self._error(ApiKey.WRITE_TXN_MARKERS)} for p in topic.partition_indexes]})
            answers.append({"producer_id": marker.producer_id, "topics": topics})
        return {"markers": answers}

    handlers: dict[int, Callable[[FakeBroker, int, Any], dict[str, Any]]] = {
        ApiKey.API_VERSIONS: api_versions, ApiKey.METADATA: metadata, ApiKey.FIND_COORDINATOR: find_coordinator,
        ApiKey.INIT_PRODUCER_ID: init_producer_id, ApiKey.ADD_PARTITIONS_TO_TXN: add_partitions_to_txn,
        ApiKey.ADD_OFFSETS_TO_TXN: add_offsets_to_txn, ApiKey.TXN_OFFSET_COMMIT: txn_offset_commit,
        ApiKey.END_TXN: end_txn, ApiKey.PRODUCE: produce, ApiKey.LIST_TRANSACTIONS: list_transactions,
        ApiKey.DESCRIBE_TRANSACTIONS: describe_transactions, ApiKey.DESCRIBE_PRODUCERS: describe_producers,
        ApiKey.WRITE_TXN_MARKERS: write_txn_markers,
    }
