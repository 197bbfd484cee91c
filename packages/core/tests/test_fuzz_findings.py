"""Regression tests for what the protocol fuzzer (josef.testing.fuzz) found, each over a real socket where it can be.

- Tagged fields a request's schema does not know closed the connection (kio
  refuses them; Kafka's readers keep them aside and go on): a newer client's
  optional field must not cost it its connection.
- A millisecond duration kio cannot hold as a ``timedelta`` (a delegation
  token's max lifetime of 2**63-1 ms) closed the connection: it is clamped.
- A null array where the schema allows none reached the handler as None
  and failed it (UNKNOWN_SERVER_ERROR, a traceback): it is refused as
  Kafka's readers refuse it.
- Deleting a topic of the longest legal name (249 characters) renamed its
  log directory to a name over 255 bytes; the failed rename took the log
  directory offline, and with it every partition of a single-disk broker.
- Fetch's own codec read a partition's tag 1 as the follower's high
  watermark at every version, where it is an unknown tag before v18: a
  valid request was refused.
- WriteTxnMarkers for producer id -1 failed an assertion in the partition's
  marker append (UNKNOWN_SERVER_ERROR and a traceback): Kafka appends it.
- Controller APIs on a cluster's controller listener: an Envelope whose
  principal bytes are short raised struct.error (UNKNOWN_SERVER_ERROR and a
  traceback; Kafka answers PRINCIPAL_DESERIALIZATION_FAILURE), and
  AssignReplicasToDirs and AlterPartition crashed on the zero topic id
  (kio's None) instead of answering UNKNOWN_TOPIC_ID.
- CreatePartitions (or CreateTopics) of 2**31-2 partitions: the controller
  built that many records, the broker grew to 22 GB and was killed; Kafka
  refuses an operation of more than 10,000 records (POLICY_VIOLATION).
- Metadata answered a topic once per time the request named it: a request
  naming a 3,339-partition topic thousands of times (a few kilobytes) made
  the broker build tens of millions of partition entries; it grew to 7 GB
  and failed with MemoryError.
- DescribeClientQuotas and AlterClientQuotas errors quoted every entity type
  of the request: with thousands, a message longer than v0 strings hold,
  and a response that could not be encoded; an entity naming a type twice,
  once as the default, failed sorting None against a name.
- A topic could be named __cluster_metadata, sharing the metadata log's
  directory: deleting it closed the metadata log's files, and the broker
  stopped with every log directory failed. Kafka refuses the name.
- A connection muted for its throttle time (KIP-219), hours under a tiny
  byte-rate quota, was held half-closed all that time after its client
  disconnected.
- Metadata v10-11 naming a topic by id (or by a null name) was answered with
  a null name, which those versions cannot encode, and the connection was
  closed: Kafka answers INVALID_REQUEST.
"""

import io
import logging
import os
import socket
import struct
import uuid
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from josef.protocol.api_keys import ApiKey
from josef.protocol.bounds import apply_edits, check_bounds
from josef.protocol.error_responses import error_response
from josef.protocol.messages import (
    MalformedRequestError,
    build,
    decode_response,
    encode_response,
    parse_body,
    request_type,
)
from josef.protocol.records import build_batch
from josef.testing import RawClient, eventually
from josef.testing.fuzz.requests import frame, header, uvarint
from josef.testing.fuzz.target import RunningBroker, sockets


def body(api_key: int, version: int, data: dict) -> bytes:
    buf = io.BytesIO()
    entity = build(request_type(api_key, version), data)
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def exchange(port: int, data: bytes, timeout: float = 10) -> bytes | None:
    """One request frame sent; its answer (without size), or None when the broker closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        return sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


def unknown_tags(*tags: tuple[int, bytes]) -> bytes:
    return uvarint(len(tags)) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in tags)


VERSIONS_V3 = {"client_software_name": "fuzz", "client_software_version": "1"}


def test_unknown_tagged_fields_are_skipped(josef_broker):
    data = body(ApiKey.API_VERSIONS, 3, VERSIONS_V3)
    assert data.endswith(b"\x00")  # no tagged fields: the section is one count byte
    tagged = data[:-1] + unknown_tags((7, b"hi"), (300, b"x" * 200))
    answer = exchange(josef_broker.port, frame(header(ApiKey.API_VERSIONS, 3, 5, b"c", True) + tagged))
    assert answer is not None, "the broker closed the connection"
    correlation, response = decode_response(ApiKey.API_VERSIONS, 3, answer)
    assert (correlation, response.error_code) == (5, ErrorCode.none)


def test_unknown_tagged_fields_in_nested_entries_are_skipped(josef_broker):
    topics = [{"name": "no-such-topic", "topic_id": None}]
    data = body(ApiKey.METADATA, 12, {"topics": topics, "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    # The one topic entry (topic id, then name) ends with its (empty) tagged section.
    entry_end = data.index(b"no-such-topic") + len("no-such-topic")
    assert data[entry_end] == 0
    tagged = data[:entry_end] + unknown_tags((0, b"\x01\x02")) + data[entry_end + 1:]
    answer = exchange(josef_broker.port, frame(header(ApiKey.METADATA, 12, 6, b"c", True) + tagged))
    assert answer is not None, "the broker closed the connection"
    _, response = decode_response(ApiKey.METADATA, 12, answer)
    assert [(t.name, t.error_code) for t in response.topics] == [("no-such-topic", ErrorCode.unknown_topic_or_partition)]


def test_an_unknown_tag_inside_a_known_tagged_struct_is_dropped_and_its_size_follows():
    """Fetch's ReplicaState (tag 1) holding an unknown tag: the struct's size prefix shrinks with it."""
    cls = request_type(ApiKey.FETCH, 15)
    plain = body(ApiKey.FETCH, 15, {"replica_state": {"replica_id": 3, "replica_epoch": 9}, "max_wait": 0,
                                    "min_bytes": 1, "max_bytes": 100, "isolation_level": 0, "session_id": 0,
                                    "session_epoch": -1, "topics": [], "forgotten_topics_data": [], "rack_id": ""})
    state = struct.pack(">iq", 3, 9)
    inner = state + b"\x00"
    assert plain.find(uvarint(1) + uvarint(len(inner)) + inner) > 0
    with_unknown = state + unknown_tags((5, b"abc"))
    data = plain.replace(uvarint(1) + uvarint(len(inner)) + inner,
                         uvarint(1) + uvarint(len(with_unknown)) + with_unknown)
    edits: list = []
    assert check_bounds(cls, data, 0, edits) == len(data)
    assert apply_edits(data, edits) == plain
    request = parse_body(ApiKey.FETCH, 15, data, 0)
    assert (request.replica_state.replica_id, request.replica_state.replica_epoch) == (3, 9)


@pytest.mark.parametrize("version", [1, 3])
def test_a_duration_longer_than_a_timedelta_is_clamped(josef_broker, version):
    """CreateDelegationToken with max_lifetime 2**63-1 ms: answered (on PLAINTEXT, refused as Kafka refuses it)."""
    data = body(ApiKey.CREATE_DELEGATION_TOKEN, version, {"owner_principal_type": None, "owner_principal_name": None,
                                                          "renewers": [], "max_lifetime": 1})
    data = data[:-(9 if version >= 2 else 8)] + struct.pack(">q", 2**63 - 1) + (b"\x00" if version >= 2 else b"")
    answer = exchange(josef_broker.port, frame(header(ApiKey.CREATE_DELEGATION_TOKEN, version, 7, b"c", version >= 2)
                                               + data))
    assert answer is not None, "the broker closed the connection"
    _, response = decode_response(ApiKey.CREATE_DELEGATION_TOKEN, version, answer)
    assert response.error_code == ErrorCode.delegation_token_request_not_allowed


def test_a_null_array_where_the_schema_has_none_is_refused_before_the_handler(josef_broker, caplog):
    """SyncGroup v2 with a null ``assignments``: Kafka's reader refuses it; it once failed the handler."""
    data = body(ApiKey.SYNC_GROUP, 2, {"group_id": "g", "generation_id": 1, "member_id": "m", "assignments": []})
    assert data.endswith(struct.pack(">i", 0))
    data = data[:-4] + struct.pack(">i", -1)
    with pytest.raises(MalformedRequestError, match="null, where the schema allows no null"):
        parse_body(ApiKey.SYNC_GROUP, 2, data, 0)
    with caplog.at_level(logging.WARNING):
        assert exchange(josef_broker.port, frame(header(ApiKey.SYNC_GROUP, 2, 8, b"c", False) + data)) is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("null, where the schema allows no null" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name,topic_id", [(None, None), (None, uuid.UUID(int=5)), ("fuzz-a", uuid.UUID(int=5))])
def test_metadata_v11_naming_a_topic_by_id_is_an_invalid_request(josef_broker, name, topic_id):
    """Metadata before v12 takes names only: Kafka answers INVALID_REQUEST for every topic (a null name as "").
    A null name once made a response that could not be encoded, and the connection was closed."""
    client = RawClient(josef_broker.port)
    try:
        response = client.call(ApiKey.METADATA, 11, {"topics": [{"name": name, "topic_id": topic_id}],
                                                    "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False})
        assert [(t.name, t.error_code) for t in response.topics] == [(name or "", ErrorCode.invalid_request)]
        assert client.call(ApiKey.API_VERSIONS, 3, VERSIONS_V3).error_code == ErrorCode.none
    finally:
        client.close()


def test_an_error_response_has_no_null_where_the_response_allows_none():
    """The error response to a request naming a topic by id only, at a version whose response names are not
    nullable: "" as Kafka's getErrorResponse writes, so that it can be encoded."""
    request = build(request_type(ApiKey.METADATA, 10), {"topics": [{"name": None, "topic_id": uuid.UUID(int=1)}],
                                                         "allow_auto_topic_creation": False,
                                                         "include_cluster_authorized_operations": False,
                                                         "include_topic_authorized_operations": False})
    response = error_response(ApiKey.METADATA, 10, request, ErrorCode.unknown_server_error, "boom")
    assert [t.name for t in response.topics] == [""]
    decode_response(ApiKey.METADATA, 10, encode_response(ApiKey.METADATA, 10, 1, response)[4:], whole=True)


def test_deleting_a_topic_with_the_longest_legal_name_keeps_the_log_directory_online(josef_broker):
    """A topic of 249 characters (Kafka's limit): its log directory renamed for deletion got a name over 255
    bytes, the rename failed, and the failure took the only log directory, and every partition, offline."""
    name = "a" * 249
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []},
            {"name": "kept", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 30_000, "validate_only": False})
        assert [t.error_code for t in created.topics] == [ErrorCode.none, ErrorCode.none]
        data_dir = Path(josef_broker.broker.config["log.dirs"][0])
        eventually(lambda: (data_dir / f"{name}-0").is_dir(), what="the long topic's log")
        deleted = client.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": name, "topic_id": None}],
                                                        "timeout": 30_000})
        assert [t.error_code for t in deleted.responses] == [ErrorCode.none]
        eventually(lambda: not (data_dir / f"{name}-0").exists(), what="the long topic's log renamed for deletion")
        dirs = client.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
        assert [(r.log_dir, r.error_code) for r in dirs.results] == [(str(data_dir), ErrorCode.none)]
        produced = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 30_000, "transactional_id": None,
                                                   "topic_data": [{"name": "kept", "partition_data": [
                                                       {"index": 0, "records": build_batch([(None, b"v", 1)])}]}]})
        assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none
    finally:
        client.close()
    assert not [p for p in data_dir.iterdir() if len(p.name.encode()) > 255]


def test_fetch_before_v18_skips_a_partition_s_unknown_tag_1(josef_broker):
    """Tag 1 of a fetch partition is the follower's high watermark from v18 (KIP-1166) only; josef's Fetch
    codec read it at every version and refused a v13 request whose partition carried another tag 1."""
    entry = struct.pack(">iiqiqi", 0, -1, 0, -1, -1, 1000)
    data = body(ApiKey.FETCH, 13, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1000,
                                   "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
                                   "forgotten_topics_data": [], "topics": [{"topic_id": uuid.UUID(int=9), "partitions": [
                                       {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                        "last_fetched_epoch": -1, "log_start_offset": -1,
                                        "partition_max_bytes": 1000}]}]})
    assert data.count(entry + b"\x00") == 1
    data = data.replace(entry + b"\x00", entry + unknown_tags((1, b"abc")))
    answer = exchange(josef_broker.port, frame(header(ApiKey.FETCH, 13, 9, b"c", True) + data))
    assert answer is not None, "the broker closed the connection"
    _, response = decode_response(ApiKey.FETCH, 13, answer)
    assert [(t.topic_id, t.partitions[0].error_code) for t in response.responses] == [
        (uuid.UUID(int=9), ErrorCode.unknown_topic_id)]


def test_a_transaction_marker_for_no_producer_is_appended_and_ends_nothing(josef_broker, caplog):
    """WriteTxnMarkers naming producer id -1: the partition's marker append asserted a producer, and the
    request failed with UNKNOWN_SERVER_ERROR. Kafka appends the marker, which ends no transaction."""
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "marked", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 30_000, "validate_only": False})
        assert created.topics[0].error_code == ErrorCode.none
        with caplog.at_level(logging.ERROR):
            response = client.call(ApiKey.WRITE_TXN_MARKERS, 1, {"markers": [
                {"producer_id": -1, "producer_epoch": -1, "transaction_result": True, "coordinator_epoch": 0,
                 "topics": [{"name": "marked", "partition_indexes": [0]}]}]})
        assert [p.error_code for m in response.markers for t in m.topics for p in t.partitions] == [ErrorCode.none]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        offsets = client.call(ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 1, "topics": [
            {"name": "marked", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
        assert offsets.topics[0].partitions[0].offset == 1  # the marker, and no transaction left open
    finally:
        client.close()


CONTROLLER_LISTENER = pytest.mark.josef_config(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")


def controller_client(josef_broker) -> RawClient:
    return RawClient(next(b.port for b in josef_broker.broker.bound if b.name == "CONTROLLER"))


@CONTROLLER_LISTENER
@pytest.mark.parametrize("principal", [b"\x00", b"\x00\x00\x05ab", b"\x00\x07"])
def test_an_envelope_whose_principal_cannot_be_read_is_refused_as_kafka_refuses_it(josef_broker, caplog, principal):
    """A principal too short to hold its version (or a bad string) raised struct.error out of the Envelope
    handler: UNKNOWN_SERVER_ERROR and a traceback. Kafka answers PRINCIPAL_DESERIALIZATION_FAILURE."""
    client = controller_client(josef_broker)
    try:
        with caplog.at_level(logging.ERROR):
            response = client.call(ApiKey.ENVELOPE, 0, {"request_data": b"\x00" * 12, "request_principal": principal,
                                                        "client_host_address": b"\x7f\x00\x00\x01"})
        assert response.error_code == ErrorCode.principal_deserialization_failure
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        client.close()


@CONTROLLER_LISTENER
def test_the_zero_topic_id_names_no_topic_in_controller_requests(josef_broker, caplog):
    """kio reads the zero UUID as None, which AssignReplicasToDirs and AlterPartition turned into text and
    crashed on (UNKNOWN_SERVER_ERROR, a traceback): it names no topic, UNKNOWN_TOPIC_ID."""
    broker = josef_broker.broker
    epoch = broker.image.brokers[broker.node_id].epoch
    client = controller_client(josef_broker)
    try:
        with caplog.at_level(logging.ERROR):
            assigned = client.call(ApiKey.ASSIGN_REPLICAS_TO_DIRS, 0, {
                "broker_id": broker.node_id, "broker_epoch": epoch, "directories": [
                    {"id_": uuid.UUID(int=3), "topics": [{"topic_id": None, "partitions": [{"partition_index": 0}]}]}]})
            altered = client.call(ApiKey.ALTER_PARTITION, 3, {
                "broker_id": broker.node_id, "broker_epoch": epoch, "topics": [{"topic_id": None, "partitions": [
                    {"partition_index": 0, "leader_epoch": 0, "new_isr_with_epochs": [], "leader_recovery_state": 0,
                     "partition_epoch": 0}]}]})
        assert assigned.error_code == ErrorCode.none
        assert [p.error_code for d in assigned.directories for t in d.topics for p in t.partitions] == [
            ErrorCode.unknown_topic_id]
        assert altered.error_code == ErrorCode.none
        assert [p.error_code for t in altered.topics for p in t.partitions] == [ErrorCode.unknown_topic_id]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        client.close()


def test_an_operation_of_more_records_than_kafka_writes_at_once_is_refused(josef_broker):
    """CreatePartitions to 2**31-2 partitions made the controller build that many records: the broker took
    22 GB and was killed. Kafka refuses more than 10,000 records per operation (POLICY_VIOLATION)."""
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "huge", "num_partitions": 2**31 - 1, "replication_factor": 1, "assignments": [], "configs": []},
            {"name": "small", "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 30_000, "validate_only": False})
        assert [(t.name, t.error_code, t.error_message) for t in created.topics] == [
            ("huge", ErrorCode.policy_violation, "Unable to perform excessively large batch operation."),
            ("small", ErrorCode.none, None)]
        grown = client.call(ApiKey.CREATE_PARTITIONS, 3, {"topics": [
            {"name": "small", "count": 2**31 - 2, "assignments": None}, {"name": "small", "count": 3, "assignments": None}],
            "timeout": 30_000, "validate_only": False})
        assert [r.error_code for r in grown.results] == [ErrorCode.policy_violation, ErrorCode.none]
        assert len(josef_broker.broker.image.topics["small"].partitions) == 3
    finally:
        client.close()


def test_quota_errors_name_a_client_s_strings_briefly(josef_broker, caplog):
    """A quota entity or filter repeating one type thousands of times was answered with an error message
    listing them all, longer than v0's strings hold: the response could not be encoded."""
    client = RawClient(josef_broker.port)
    try:
        with caplog.at_level(logging.ERROR):
            described = client.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, {"strict": False, "components": [
                {"entity_type": "user", "match_type": 1, "match": None}] * 5000})
            altered = client.call(ApiKey.ALTER_CLIENT_QUOTAS, 0, {"validate_only": False, "entries": [
                {"entity": [{"entity_type": "user", "entity_name": "u"}] * 5000,
                 "ops": [{"key": "producer_byte_rate", "value": 1.0, "remove": False}]},
                {"entity": [{"entity_type": "x" * 30_000, "entity_name": "u"}], "ops": []}]})
        assert (described.error_code, described.error_message) == (
            ErrorCode.invalid_request, "duplicate entity type in the filter: 'user'")
        assert [(e.error_code, len(e.error_message) < 200) for e in altered.entries] == [
            (ErrorCode.invalid_request, True), (ErrorCode.invalid_request, True)]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        client.close()


def test_a_quota_entity_naming_a_type_twice_with_a_default_is_refused(josef_broker, caplog):
    """user (default) and user "u" in one entity: sorting its pairs compared None with a name and raised
    TypeError (UNKNOWN_SERVER_ERROR); the duplicate type is refused first."""
    client = RawClient(josef_broker.port)
    try:
        with caplog.at_level(logging.ERROR):
            altered = client.call(ApiKey.ALTER_CLIENT_QUOTAS, 0, {"validate_only": False, "entries": [
                {"entity": [{"entity_type": "user", "entity_name": None}, {"entity_type": "user", "entity_name": "u"}],
                 "ops": [{"key": "producer_byte_rate", "value": 1.0, "remove": False}]}]})
        assert [(e.error_code, e.error_message) for e in altered.entries] == [
            (ErrorCode.invalid_request, "duplicate entity type 'user'")]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        client.close()


def test_no_topic_may_be_named_after_the_metadata_log(josef_broker):
    """A topic named __cluster_metadata shared the metadata log's directory; deleting it closed the metadata
    log's files under the quorum (EBADF, then ESPIPE once a socket took the descriptor) and the broker stopped.
    Kafka refuses the name."""
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "__cluster_metadata", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": []}], "timeout": 30_000, "validate_only": False})
        assert [(t.error_code, t.error_message) for t in created.topics] == [
            (ErrorCode.invalid_request, "Creation of internal topic __cluster_metadata is prohibited.")]
        metadata = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "__cluster_metadata", "topic_id": None}],
                                                    "allow_auto_topic_creation": True,
                                                    "include_topic_authorized_operations": False})
        assert metadata.topics[0].error_code != ErrorCode.none
        deleted = client.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": "__cluster_metadata", "topic_id": None}],
                                                        "timeout": 30_000})
        assert deleted.responses[0].error_code == ErrorCode.unknown_topic_or_partition
        after = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "after", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 30_000, "validate_only": False})
        assert after.topics[0].error_code == ErrorCode.none, "the metadata log still takes records"
    finally:
        client.close()


def test_a_throttled_client_that_disconnects_frees_its_connection(josef_broker):
    """Over a byte-rate quota, a connection reads nothing for the throttle time (KIP-219), which can be hours:
    a client that closed meanwhile left the broker holding its connection, half-closed, all that time."""
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "throttled", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 30_000, "validate_only": False})
        assert created.topics[0].error_code == ErrorCode.none
        quota = client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [
            {"entity": [{"entity_type": "user", "entity_name": None}],
             "ops": [{"key": "producer_byte_rate", "value": 1.0, "remove": False}]}]})
        assert quota.entries[0].error_code == ErrorCode.none
        eventually(lambda: josef_broker.broker.image.client_quotas, what="the quota in the broker's image")
        produced = client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 30_000, "transactional_id": None,
                                                   "topic_data": [{"name": "throttled", "partition_data": [
                                                       {"index": 0, "records": build_batch([(None, b"x" * 100_000, 1)])}]}]})
        assert produced.throttle_time.total_seconds() > 3600
    finally:
        client.close()
    me = RunningBroker("127.0.0.1", josef_broker.port, os.getpid(), Path("/dev/null"))
    eventually(lambda: not sockets(me).listener, timeout=10, what="the broker closing the throttled connection")


def test_metadata_answers_a_topic_named_many_times_once(josef_broker):
    """As Kafka (a set of the names or ids)."""
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "wide", "num_partitions": 8, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 30_000, "validate_only": False})
    assert created.topics[0].error_code == ErrorCode.none
    topic_id = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "wide", "topic_id": None}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False}).topics[0].topic_id
    by_name = client.call(ApiKey.METADATA, 1, {"topics": [{"name": "wide"}] * 10_000}).topics
    by_id = client.call(ApiKey.METADATA, 12, {"topics": [{"name": None, "topic_id": topic_id}] * 3 + [
        {"name": "wide", "topic_id": None}], "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False}).topics
    client.close()
    assert [(t.name, len(t.partitions)) for t in by_name] == [("wide", 8)]
    assert [(t.topic_id, len(t.partitions)) for t in by_id] == [(topic_id, 8)] * 2  # once by id, once by name
