"""Every API josef answers, against Kafka's ACL authorizer: refused without the ACL Kafka asks for, served with it.

One broker process with the StandardAuthorizer, a SASL_PLAINTEXT listener
for the users of the test and a PLAINTEXT one whose ``User:ANONYMOUS`` is a
super user (the setup: topic, group, ACLs). Each row of :data:`ROWS` is one
API at one version; its own user (``row<N>``) gets exactly the ACLs the row
names, and must not be refused; ``User:bob``, who has none, must be refused
with the row's error code. A test checks that every API the broker
advertises has a row, so a new API cannot arrive unauthorized.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, Callable

import attrs
import pytest
from kio.schema.errors import ErrorCode as E

from josef.acls import AclOperation as Op
from josef.acls import ResourceType as R
from josef.protocol.api_keys import ApiKey as K
from josef.protocol.error_responses import error_codes
from josef.protocol.records import build_batch
from josef.testing import RawClient

TOPIC, GROUP, TXN, CLUSTER = "mx", "mg", "mt", "kafka-cluster"
AUTHORIZATION_ERRORS = {E.topic_authorization_failed, E.group_authorization_failed, E.cluster_authorization_failed,
                        E.transactional_id_authorization_failed, E.delegation_token_authorization_failed}
NO_PERMISSION_NEEDED = {K.API_VERSIONS, K.SASL_HANDSHAKE, K.SASL_AUTHENTICATE, K.GET_TELEMETRY_SUBSCRIPTIONS,
                        K.PUSH_TELEMETRY}

Grant = tuple[R, str, Op]
Body = Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen
class Row:
    key: int
    version: int
    body: Body
    grants: tuple[Grant, ...]
    refused: E
    why: str = ""


def topic(op: Op) -> Grant:
    return (R.TOPIC, TOPIC, op)


def group(op: Op) -> Grant:
    return (R.GROUP, GROUP, op)


def txn(op: Op) -> Grant:
    return (R.TRANSACTIONAL_ID, TXN, op)


def cluster(op: Op) -> Grant:
    return (R.CLUSTER, CLUSTER, op)


def _partition_offsets(index_key: str = "partition_index") -> list[dict[str, Any]]:
    return [{index_key: 0}]


ROWS: list[Row] = [
    Row(K.PRODUCE, 9, lambda s: {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": s["records"]}]}]},
        (topic(Op.WRITE),), E.topic_authorization_failed),
    Row(K.FETCH, 12, lambda s: {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                "forgotten_topics_data": [], "rack_id": "", "topics": [
        {"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                         "current_leader_epoch": -1, "log_start_offset": -1,
                                         "last_fetched_epoch": -1}]}]},
        (topic(Op.READ),), E.topic_authorization_failed),
    Row(K.FETCH, 12, lambda s: {"replica_id": 7, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                "forgotten_topics_data": [], "rack_id": "", "topics": [
        {"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                         "current_leader_epoch": -1, "log_start_offset": -1,
                                         "last_fetched_epoch": -1}]}]},
        (cluster(Op.CLUSTER_ACTION),), E.topic_authorization_failed, "a follower's fetch"),
    Row(K.LIST_OFFSETS, 7, lambda s: {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}]}]},
        (topic(Op.DESCRIBE),), E.topic_authorization_failed),
    Row(K.METADATA, 12, lambda s: {"topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": True},
        (topic(Op.DESCRIBE),), E.topic_authorization_failed),
    Row(K.METADATA, 12, lambda s: {"topics": [{"name": "mx-auto", "topic_id": None}],
                                   "allow_auto_topic_creation": True, "include_topic_authorized_operations": False},
        ((R.TOPIC, "mx-auto", Op.DESCRIBE), (R.TOPIC, "mx-auto", Op.CREATE)), E.topic_authorization_failed,
        "auto-creation needs CREATE"),
    Row(K.OFFSET_COMMIT, 8, lambda s: {"group_id": GROUP, "generation_id_or_member_epoch": -1, "member_id": "",
                                       "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1,
             "committed_metadata": None}]}]},
        (group(Op.READ), topic(Op.READ)), E.group_authorization_failed),
    Row(K.OFFSET_FETCH, 7, lambda s: {"group_id": GROUP, "require_stable": False,
                                      "topics": [{"name": TOPIC, "partition_indexes": [0]}]},
        (group(Op.DESCRIBE), topic(Op.DESCRIBE)), E.group_authorization_failed),
    Row(K.OFFSET_FETCH, 8, lambda s: {"require_stable": False, "groups": [
        {"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]},
        (group(Op.DESCRIBE), topic(Op.DESCRIBE)), E.group_authorization_failed, "batched groups"),
    Row(K.FIND_COORDINATOR, 3, lambda s: {"key": GROUP, "key_type": 0},
        (group(Op.DESCRIBE),), E.group_authorization_failed),
    Row(K.FIND_COORDINATOR, 4, lambda s: {"key_type": 1, "coordinator_keys": [TXN]},
        (txn(Op.DESCRIBE),), E.transactional_id_authorization_failed),
    Row(K.JOIN_GROUP, 5, lambda s: {"group_id": GROUP, "session_timeout": 10000, "rebalance_timeout": 10000,
                                    "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                    "protocols": [{"name": "range", "metadata": b""}]},
        (group(Op.READ),), E.group_authorization_failed),
    Row(K.HEARTBEAT, 3, lambda s: {"group_id": GROUP, "generation_id": 1, "member_id": "m", "group_instance_id": None},
        (group(Op.READ),), E.group_authorization_failed),
    Row(K.LEAVE_GROUP, 3, lambda s: {"group_id": GROUP, "members": [{"member_id": "m", "group_instance_id": None}]},
        (group(Op.READ),), E.group_authorization_failed),
    Row(K.SYNC_GROUP, 3, lambda s: {"group_id": GROUP, "generation_id": 1, "member_id": "m",
                                    "group_instance_id": None, "assignments": []},
        (group(Op.READ),), E.group_authorization_failed),
    Row(K.DESCRIBE_GROUPS, 5, lambda s: {"groups": [GROUP], "include_authorized_operations": True},
        (group(Op.DESCRIBE),), E.group_authorization_failed),
    Row(K.CREATE_TOPICS, 5, lambda s: {"topics": [{"name": "mx-new", "num_partitions": 1, "replication_factor": 1,
                                                   "assignments": [], "configs": []}],
                                       "timeout": 5000, "validate_only": True},
        ((R.TOPIC, "mx-new", Op.CREATE),), E.topic_authorization_failed),
    Row(K.DELETE_TOPICS, 5, lambda s: {"topic_names": ["mx-absent"], "timeout": 5000},
        ((R.TOPIC, "mx-absent", Op.DELETE),), E.topic_authorization_failed),
    Row(K.DELETE_RECORDS, 2, lambda s: {"timeout": 5000, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 0}]}]},
        (topic(Op.DELETE),), E.topic_authorization_failed),
    Row(K.INIT_PRODUCER_ID, 4, lambda s: {"transactional_id": None, "transaction_timeout": 60000,
                                          "producer_id": -1, "producer_epoch": -1},
        (cluster(Op.IDEMPOTENT_WRITE),), E.cluster_authorization_failed),
    Row(K.INIT_PRODUCER_ID, 4, lambda s: {"transactional_id": None, "transaction_timeout": 60000,
                                          "producer_id": -1, "producer_epoch": -1},
        (topic(Op.WRITE),), E.cluster_authorization_failed, "WRITE on any topic is enough for idempotence"),
    Row(K.INIT_PRODUCER_ID, 4, lambda s: {"transactional_id": TXN, "transaction_timeout": 60000,
                                          "producer_id": -1, "producer_epoch": -1},
        (txn(Op.WRITE),), E.transactional_id_authorization_failed),
    Row(K.OFFSET_FOR_LEADER_EPOCH, 4, lambda s: {"replica_id": -1, "topics": [
        {"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]},
        (topic(Op.DESCRIBE),), E.topic_authorization_failed),
    Row(K.ADD_PARTITIONS_TO_TXN, 3, lambda s: {"v3_and_below_transactional_id": TXN, "v3_and_below_producer_id": 1,
                                               "v3_and_below_producer_epoch": 0,
                                               "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]},
        (txn(Op.WRITE), topic(Op.WRITE)), E.transactional_id_authorization_failed),
    Row(K.ADD_OFFSETS_TO_TXN, 3, lambda s: {"transactional_id": TXN, "producer_id": 1, "producer_epoch": 0,
                                            "group_id": GROUP},
        (txn(Op.WRITE), group(Op.READ)), E.transactional_id_authorization_failed),
    Row(K.END_TXN, 3, lambda s: {"transactional_id": TXN, "producer_id": 1, "producer_epoch": 0, "committed": False},
        (txn(Op.WRITE),), E.transactional_id_authorization_failed),
    Row(K.WRITE_TXN_MARKERS, 1, lambda s: {"markers": [
        {"producer_id": 4242, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": 0,
         "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]},
        (cluster(Op.CLUSTER_ACTION),), E.cluster_authorization_failed),
    Row(K.TXN_OFFSET_COMMIT, 3, lambda s: {"transactional_id": TXN, "group_id": GROUP, "producer_id": 1,
                                           "producer_epoch": 0, "generation_id": -1, "member_id": "",
                                           "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1,
             "committed_metadata": None}]}]},
        (txn(Op.WRITE), group(Op.READ), topic(Op.READ)), E.transactional_id_authorization_failed),
    Row(K.DESCRIBE_ACLS, 3, lambda s: {"resource_type_filter": 1, "resource_name_filter": None,
                                       "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                                       "operation": 1, "permission_type": 1},
        (cluster(Op.DESCRIBE),), E.cluster_authorization_failed),
    Row(K.CREATE_ACLS, 3, lambda s: {"creations": [
        {"resource_type": 2, "resource_name": "mx-acl", "resource_pattern_type": 3, "principal": "User:nobody",
         "host": "*", "operation": 3, "permission_type": 3}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.DELETE_ACLS, 3, lambda s: {"filters": [
        {"resource_type_filter": 2, "resource_name_filter": "mx-none", "pattern_type_filter": 3,
         "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.DESCRIBE_CONFIGS, 4, lambda s: {"resources": [{"resource_type": 2, "resource_name": TOPIC,
                                                         "configuration_keys": None}],
                                          "include_synonyms": False, "include_documentation": False},
        (topic(Op.DESCRIBE_CONFIGS),), E.topic_authorization_failed),
    Row(K.DESCRIBE_CONFIGS, 4, lambda s: {"resources": [{"resource_type": 4, "resource_name": "",
                                                         "configuration_keys": ["log.retention.ms"]}],
                                          "include_synonyms": False, "include_documentation": False},
        (cluster(Op.DESCRIBE_CONFIGS),), E.cluster_authorization_failed, "a broker's configs"),
    Row(K.ALTER_CONFIGS, 2, lambda s: {"validate_only": True, "resources": [
        {"resource_type": 2, "resource_name": TOPIC, "configs": [{"name": "retention.ms", "value": "100000"}]}]},
        (topic(Op.ALTER_CONFIGS),), E.topic_authorization_failed),
    Row(K.INCREMENTAL_ALTER_CONFIGS, 1, lambda s: {"validate_only": True, "resources": [
        {"resource_type": 2, "resource_name": TOPIC,
         "configs": [{"name": "retention.ms", "config_operation": 0, "value": "100000"}]}]},
        (topic(Op.ALTER_CONFIGS),), E.topic_authorization_failed),
    Row(K.ALTER_REPLICA_LOG_DIRS, 2, lambda s: {"dirs": [{"path": "/nowhere", "topics": [
        {"name": TOPIC, "partitions": [0]}]}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.DESCRIBE_LOG_DIRS, 4, lambda s: {"topics": None},
        (cluster(Op.DESCRIBE),), E.cluster_authorization_failed),
    Row(K.CREATE_PARTITIONS, 3, lambda s: {"topics": [{"name": TOPIC, "count": 1, "assignments": None}],
                                           "timeout": 5000, "validate_only": True},
        (topic(Op.ALTER),), E.topic_authorization_failed),
    Row(K.DELETE_GROUPS, 2, lambda s: {"groups_names": ["mg-absent"]},
        ((R.GROUP, "mg-absent", Op.DELETE),), E.group_authorization_failed),
    Row(K.ELECT_LEADERS, 2, lambda s: {"election_type": 0, "timeout": 5000,
                                       "topic_partitions": [{"topic": TOPIC, "partitions": [0]}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.ALTER_PARTITION_REASSIGNMENTS, 0, lambda s: {"timeout": 5000, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "replicas": None}]}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.LIST_PARTITION_REASSIGNMENTS, 0, lambda s: {"timeout": 5000, "topics": None},
        (cluster(Op.DESCRIBE),), E.cluster_authorization_failed),
    Row(K.OFFSET_DELETE, 0, lambda s: {"group_id": GROUP, "topics": [{"name": TOPIC, "partitions": [
        {"partition_index": 0}]}]},
        (group(Op.DELETE), topic(Op.READ)), E.group_authorization_failed),
    Row(K.DESCRIBE_CLIENT_QUOTAS, 1, lambda s: {"components": [], "strict": False},
        (cluster(Op.DESCRIBE_CONFIGS),), E.cluster_authorization_failed),
    Row(K.ALTER_CLIENT_QUOTAS, 1, lambda s: {"validate_only": True, "entries": [
        {"entity": [{"entity_type": "user", "entity_name": "x"}],
         "ops": [{"key": "producer_byte_rate", "value": 1024.0, "remove": False}]}]},
        (cluster(Op.ALTER_CONFIGS),), E.cluster_authorization_failed),
    # Client-metrics resources (KIP-714) are the cluster's, as in Kafka's ConfigHelper and KafkaApis.
    Row(K.INCREMENTAL_ALTER_CONFIGS, 1, lambda s: {"validate_only": True, "resources": [
        {"resource_type": 16, "resource_name": "mx-metrics",
         "configs": [{"name": "interval.ms", "config_operation": 0, "value": "1000"}]}]},
        (cluster(Op.ALTER_CONFIGS),), E.cluster_authorization_failed, "a client-metrics resource"),
    Row(K.DESCRIBE_CONFIGS, 4, lambda s: {"resources": [{"resource_type": 16, "resource_name": "mx-metrics",
                                                         "configuration_keys": None}],
                                          "include_synonyms": False, "include_documentation": False},
        (cluster(Op.DESCRIBE_CONFIGS),), E.cluster_authorization_failed, "a client-metrics resource"),
    Row(K.LIST_CONFIG_RESOURCES, 1, lambda s: {"resource_types": [16]},
        (cluster(Op.DESCRIBE_CONFIGS),), E.cluster_authorization_failed),
    Row(K.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, lambda s: {"users": None},
        (cluster(Op.DESCRIBE),), E.cluster_authorization_failed),
    Row(K.ALTER_USER_SCRAM_CREDENTIALS, 0, lambda s: {"deletions": [], "upsertions": [
        {"name": "mx-user", "mechanism": 1, "iterations": 4096, "salt": b"salt", "salted_password": bytes(32)}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    # KIP-373: a token for another owner needs CREATE_TOKENS on that user. Granted, this broker (no
    # delegation.token.secret.key) answers DELEGATION_TOKEN_AUTH_DISABLED: decided past authorization.
    Row(K.CREATE_DELEGATION_TOKEN, 3, lambda s: {"owner_principal_type": "User", "owner_principal_name": "mx-owner",
                                                 "renewers": [], "max_lifetime": -1},
        ((R.USER, "User:mx-owner", Op.CREATE_TOKENS),), E.delegation_token_authorization_failed),
    Row(K.DESCRIBE_PRODUCERS, 0, lambda s: {"topics": [{"name": TOPIC, "partition_indexes": [0]}]},
        (topic(Op.READ),), E.topic_authorization_failed),
    Row(K.DESCRIBE_TRANSACTIONS, 0, lambda s: {"transactional_ids": [TXN]},
        (txn(Op.DESCRIBE),), E.transactional_id_authorization_failed),
    Row(K.CONSUMER_GROUP_HEARTBEAT, 0, lambda s: {
        "group_id": "mg848", "member_id": str(uuid.uuid4()), "member_epoch": 0, "instance_id": None, "rack_id": None,
        "rebalance_timeout": 10000, "subscribed_topic_names": [TOPIC], "server_assignor": None,
        "topic_partitions": []},
        ((R.GROUP, "mg848", Op.READ),), E.group_authorization_failed),
    Row(K.CONSUMER_GROUP_DESCRIBE, 0, lambda s: {"group_ids": [GROUP], "include_authorized_operations": True},
        (group(Op.DESCRIBE),), E.group_authorization_failed),
    Row(K.SHARE_GROUP_HEARTBEAT, 1, lambda s: {
        "group_id": "mgshare", "member_id": str(uuid.uuid4()), "member_epoch": 0, "rack_id": None,
        "subscribed_topic_names": [TOPIC]},
        ((R.GROUP, "mgshare", Op.READ),), E.group_authorization_failed),
    Row(K.SHARE_GROUP_DESCRIBE, 1, lambda s: {"group_ids": [GROUP], "include_authorized_operations": True},
        (group(Op.DESCRIBE),), E.group_authorization_failed),
    Row(K.SHARE_FETCH, 1, lambda s: {
        "group_id": GROUP, "member_id": "m", "share_session_epoch": 0, "max_wait": 0, "min_bytes": 1,
        "max_bytes": 1024, "max_records": 500, "batch_size": 500, "forgotten_topics_data": [], "topics": [{"topic_id": s["topic_id"], "partitions": [
            {"partition_index": 0, "partition_max_bytes": 1024, "acknowledgement_batches": []}]}]},
        (group(Op.READ), topic(Op.READ)), E.group_authorization_failed),
    Row(K.SHARE_ACKNOWLEDGE, 1, lambda s: {
        "group_id": GROUP, "member_id": "m", "share_session_epoch": 3, "topics": [
            {"topic_id": s["topic_id"], "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]},
        (group(Op.READ), topic(Op.READ)), E.group_authorization_failed),
    *(Row(key, 0, body, (cluster(Op.CLUSTER_ACTION),), E.cluster_authorization_failed, "sent by brokers")
      for key, body in (
          (K.INITIALIZE_SHARE_GROUP_STATE, lambda s: {"group_id": "sg", "topics": [
              {"topic_id": s["topic_id"], "partitions": [{"partition": 0, "state_epoch": 0, "start_offset": 0}]}]}),
          (K.READ_SHARE_GROUP_STATE, lambda s: {"group_id": "sg", "topics": [
              {"topic_id": s["topic_id"], "partitions": [{"partition": 0, "leader_epoch": 0}]}]}),
          (K.WRITE_SHARE_GROUP_STATE, lambda s: {"group_id": "sg", "topics": [
              {"topic_id": s["topic_id"], "partitions": [{"partition": 0, "state_epoch": 0, "leader_epoch": 0,
                                                          "start_offset": 0, "state_batches": []}]}]}),
          (K.DELETE_SHARE_GROUP_STATE, lambda s: {"group_id": "sg", "topics": [
              {"topic_id": s["topic_id"], "partitions": [{"partition": 0}]}]}),
          (K.READ_SHARE_GROUP_STATE_SUMMARY, lambda s: {"group_id": "sg", "topics": [
              {"topic_id": s["topic_id"], "partitions": [{"partition": 0, "leader_epoch": 0}]}]}))),
    Row(K.DESCRIBE_SHARE_GROUP_OFFSETS, 1, lambda s: {"groups": [{"group_id": GROUP, "topics": None}]},
        (group(Op.DESCRIBE),), E.group_authorization_failed),
    Row(K.ALTER_SHARE_GROUP_OFFSETS, 0, lambda s: {"group_id": GROUP, "topics": [
        {"topic_name": TOPIC, "partitions": [{"partition_index": 0, "start_offset": 0}]}]},
        (group(Op.READ), topic(Op.READ)), E.group_authorization_failed),
    Row(K.DELETE_SHARE_GROUP_OFFSETS, 0, lambda s: {"group_id": GROUP, "topics": [{"topic_name": TOPIC}]},
        (group(Op.DELETE), topic(Op.READ)), E.group_authorization_failed),
    Row(K.DESCRIBE_TOPIC_PARTITIONS, 0, lambda s: {"topics": [{"name": TOPIC}], "response_partition_limit": 10,
                                                   "cursor": None},
        (topic(Op.DESCRIBE),), E.topic_authorization_failed),
    Row(K.UPDATE_FEATURES, 1, lambda s: {"timeout": 5000, "validate_only": True, "feature_updates": [
        {"feature": "metadata.version", "max_version_level": s["metadata_version"], "allow_downgrade": False,
         "upgrade_type": 1}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.DESCRIBE_QUORUM, 2, lambda s: {"topics": [{"topic_name": "__cluster_metadata", "partitions": [
        {"partition_index": 0}]}]},
        (cluster(Op.DESCRIBE),), E.cluster_authorization_failed),
    Row(K.ADD_RAFT_VOTER, 0, lambda s: {"cluster_id": None, "timeout": 5000, "voter_id": 99,
                                        "voter_directory_id": uuid.UUID(int=99),
                                        "listeners": [{"name": "CONTROLLER", "host": "127.0.0.1", "port": 1}]},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
    Row(K.REMOVE_RAFT_VOTER, 0, lambda s: {"cluster_id": None, "voter_id": 99, "voter_directory_id": uuid.UUID(int=99)},
        (cluster(Op.ALTER),), E.cluster_authorization_failed),
]
#: APIs answered without refusal, whose answer shows only what the principal may see (checked separately).
FILTERED = {K.LIST_GROUPS, K.LIST_TRANSACTIONS, K.DESCRIBE_CLUSTER,
            # Decided by the token's owner and renewers (DESCRIBE and DESCRIBE_TOKENS only widen what Describe
            # shows): test_delegation_token_apis_need_an_authenticated_connection_not_an_acl, and
            # packages/core/tests/test_delegation_tokens.py with tokens enabled.
            K.RENEW_DELEGATION_TOKEN, K.EXPIRE_DELEGATION_TOKEN, K.DESCRIBE_DELEGATION_TOKEN}

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="pw" '
        + " ".join(f'user_row{i}="pw"' for i in range(len(ROWS))) + ' user_bob="pw" user_carol="pw";')


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from conftest import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("acl-broker"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }).start()
    try:
        [port] = {int(m) for line in broker.log for m in re.findall(r"SASL_PLAINTEXT://127\.0\.0\.1:(\d+)", line)}
        broker.sasl_port = port
        admin = RawClient(broker.port)
        _setup(admin)
        broker.admin = admin
        broker.topic_id = admin.call(K.METADATA, 12, {"topics": [{"name": TOPIC, "topic_id": None}],
                                                      "allow_auto_topic_creation": False,
                                                      "include_topic_authorized_operations": False}).topics[0].topic_id
        yield broker
        admin.close()
    finally:
        broker.stop()


def _setup(admin: RawClient) -> None:
    created = admin.call(K.CREATE_TOPICS, 5, {"topics": [{"name": TOPIC, "num_partitions": 1, "replication_factor": 1,
                                                          "assignments": [], "configs": []}],
                                              "timeout": 10000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    produced = admin.call(K.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": build_batch([(b"k", b"v", 1000)])}]}]})
    assert produced.responses[0].partition_responses[0].error_code == E.none
    committed = admin.call(K.OFFSET_COMMIT, 8, ROWS_BY_KEY[K.OFFSET_COMMIT].body({}))
    assert committed.topics[0].partitions[0].error_code == E.none
    creations = [{"resource_type": kind, "resource_name": name, "resource_pattern_type": 3,
                  "principal": f"User:row{i}", "host": "*", "operation": op, "permission_type": 3}
                 for i, row in enumerate(ROWS) for kind, name, op in row.grants]
    creations.append({"resource_type": R.GROUP, "resource_name": GROUP, "resource_pattern_type": 3,
                      "principal": "User:carol", "host": "*", "operation": Op.DESCRIBE, "permission_type": 3})
    creations.append({"resource_type": R.TRANSACTIONAL_ID, "resource_name": TXN, "resource_pattern_type": 4,
                      "principal": "User:carol", "host": "*", "operation": Op.DESCRIBE, "permission_type": 3})
    acls = admin.call(K.CREATE_ACLS, 3, {"creations": creations})
    assert {r.error_code for r in acls.results} == {E.none}


ROWS_BY_KEY = {row.key: row for row in reversed(ROWS)}  # the first row of each API


def user_client(broker, user: str) -> RawClient:
    client = RawClient(broker.sasl_port)
    assert client.call(K.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == E.none
    answer = client.call(K.SASL_AUTHENTICATE, 2, {"auth_bytes": f"\x00{user}\x00pw".encode()})
    assert answer.error_code == E.none, answer
    return client


def test_every_advertised_api_has_a_row(secured):
    versions = secured.admin.call(K.API_VERSIONS, 3, {"client_software_name": "matrix",
                                                      "client_software_version": "1"})
    advertised = {k.api_key for k in versions.api_keys}
    covered = {row.key for row in ROWS} | FILTERED | NO_PERMISSION_NEEDED
    assert advertised - covered == set(), "APIs without an authorization row"


@pytest.mark.parametrize("index", range(len(ROWS)),
                         ids=[f"{K(r.key).name}-v{r.version}{'-' + r.why.replace(' ', '_') if r.why else ''}"
                              for r in ROWS])
def test_refused_without_the_acl_and_served_with_it(secured, index):
    row = ROWS[index]
    state = {"records": build_batch([(b"k", b"v", 1000)]), "metadata_version": 25, "topic_id": secured.topic_id}
    bob = user_client(secured, "bob")
    try:
        refused = set(error_codes(bob.call(row.key, row.version, row.body(state))))
    finally:
        bob.close()
    assert row.refused in refused and not refused & AUTHORIZATION_ERRORS - {row.refused}, refused
    granted = user_client(secured, f"row{index}")
    try:
        served = granted.call(row.key, row.version, row.body(state))
    finally:
        granted.close()
    assert not set(error_codes(served)) & AUTHORIZATION_ERRORS, served


def test_metadata_for_all_topics_hides_what_the_principal_may_not_describe(secured):
    everything = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": True,
                  "include_cluster_authorized_operations": True}
    bob, reader = user_client(secured, "bob"), user_client(secured, f"row{ROWS.index(ROWS_BY_KEY[K.METADATA])}")
    try:
        assert [t.name for t in bob.call(K.METADATA, 10, everything).topics] == []
        seen = reader.call(K.METADATA, 10, everything)
        assert [t.name for t in seen.topics] == [TOPIC]
        # DESCRIBE granted: the topic reports exactly that operation, the cluster none.
        assert seen.topics[0].topic_authorized_operations == 1 << Op.DESCRIBE
        assert seen.cluster_authorized_operations == 0
    finally:
        bob.close()
        reader.close()
    assert TOPIC in [t.name for t in secured.admin.call(K.METADATA, 10, everything).topics]


def test_lists_show_only_what_may_be_described(secured):
    bob, carol = user_client(secured, "bob"), user_client(secured, "carol")
    try:
        groups = {"states_filter": [], "types_filter": []}
        assert [g.group_id for g in bob.call(K.LIST_GROUPS, 5, groups).groups] == []
        assert [g.group_id for g in carol.call(K.LIST_GROUPS, 5, groups).groups] == [GROUP]
        cluster_ops = {"include_cluster_authorized_operations": True, "endpoint_type": 1}
        assert bob.call(K.DESCRIBE_CLUSTER, 1, cluster_ops).cluster_authorized_operations == 0
        assert secured.admin.call(K.DESCRIBE_CLUSTER, 1, cluster_ops).cluster_authorized_operations == sum(
            1 << op for op in (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
                               Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE))
        described = carol.call(K.DESCRIBE_GROUPS, 5, {"groups": [GROUP], "include_authorized_operations": True})
        assert described.groups[0].authorized_operations == 1 << Op.DESCRIBE
    finally:
        bob.close()
        carol.close()


def test_deny_by_default_and_acls_survive_a_restart(secured):
    """No ACL on a topic: denied (allow.everyone.if.no.acl.found is false); the ACLs are in the metadata log."""
    secured.admin.call(K.CREATE_TOPICS, 5, {"topics": [{"name": "mx-open", "num_partitions": 1,
                                                        "replication_factor": 1, "assignments": [], "configs": []}],
                                            "timeout": 10000, "validate_only": False})
    described = secured.admin.call(K.DESCRIBE_ACLS, 3, {
        "resource_type_filter": 2, "resource_name_filter": TOPIC, "pattern_type_filter": 2, "principal_filter": None,
        "host_filter": None, "operation": 1, "permission_type": 1})
    before = {(r.resource_name, a.principal, a.operation) for r in described.resources for a in r.acls}
    assert (TOPIC, "User:row0", Op.WRITE) in before
    secured.admin.close()
    secured.restart()
    secured.sasl_port = [int(m) for line in secured.log
                         for m in re.findall(r"SASL_PLAINTEXT://127\.0\.0\.1:(\d+)", line)][-1]
    secured.admin = RawClient(secured.port)
    again = secured.admin.call(K.DESCRIBE_ACLS, 3, {
        "resource_type_filter": 2, "resource_name_filter": TOPIC, "pattern_type_filter": 2, "principal_filter": None,
        "host_filter": None, "operation": 1, "permission_type": 1})
    assert {(r.resource_name, a.principal, a.operation) for r in again.resources for a in r.acls} == before
    writer = user_client(secured, "row0")
    try:
        answer = writer.call(K.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
            {"name": name, "partition_data": [{"index": 0, "records": build_batch([(b"k", b"v", 1000)])}]}
            for name in (TOPIC, "mx-open")]})
        codes = {t.name: t.partition_responses[0].error_code for t in answer.responses}
        assert codes == {TOPIC: E.none, "mx-open": E.topic_authorization_failed}
    finally:
        writer.close()


def test_delegation_token_apis_need_an_authenticated_connection_not_an_acl(secured):
    """Renew, Expire and Describe ask no ACL: bob, with none, reaches the token check (tokens are disabled on this
    broker); over PLAINTEXT even the super user is refused first (DELEGATION_TOKEN_REQUEST_NOT_ALLOWED), as Kafka."""
    bodies = {K.RENEW_DELEGATION_TOKEN: (2, {"hmac": b"x" * 64, "renew_period": -1}),
              K.EXPIRE_DELEGATION_TOKEN: (2, {"hmac": b"x" * 64, "expiry_time_period": -1}),
              K.DESCRIBE_DELEGATION_TOKEN: (3, {"owners": None}),
              K.CREATE_DELEGATION_TOKEN: (3, {"owner_principal_type": None, "owner_principal_name": None,
                                              "renewers": [], "max_lifetime": -1})}
    bob = user_client(secured, "bob")
    try:
        for key, (version, body) in bodies.items():
            assert bob.call(key, version, body).error_code == E.delegation_token_auth_disabled, K(key).name
            assert secured.admin.call(key, version, body).error_code == E.delegation_token_request_not_allowed
    finally:
        bob.close()


def test_a_share_consumer_needs_read_on_the_topic_as_well_as_the_group(secured):
    acl = {"resource_type": R.GROUP, "resource_name": "mg-carol", "resource_pattern_type": 3,
           "principal": "User:carol", "host": "*", "operation": Op.READ, "permission_type": 3}
    assert {r.error_code for r in secured.admin.call(K.CREATE_ACLS, 3, {"creations": [acl]}).results} == {E.none}
    carol = user_client(secured, "carol")
    try:
        answer = carol.call(K.SHARE_FETCH, 1, {
            "group_id": "mg-carol", "member_id": "m", "share_session_epoch": 0, "max_wait": 0, "min_bytes": 1,
            "max_bytes": 1024, "max_records": 10, "batch_size": 10, "forgotten_topics_data": [],
            "topics": [{"topic_id": secured.topic_id, "partitions": [
                {"partition_index": 0, "partition_max_bytes": 1024, "acknowledgement_batches": []}]}]})
    finally:
        carol.close()
    assert answer.error_code == E.none
    assert [p.error_code for t in answer.responses for p in t.partitions] == [E.topic_authorization_failed]
