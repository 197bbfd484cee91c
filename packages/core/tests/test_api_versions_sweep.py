"""Every API at every advertised version answers a well-formed request with a parseable response.

Requests are built from one superset dict per API with the same builder the
handlers use, then sent over a real socket to the ``josef_broker`` fixture.
"""

import uuid

from kio.schema.errors import ErrorCode

from josef.metadata.features import LATEST_METADATA_VERSION
from josef.metadata.records import uuid_from_text
from josef.protocol.error_responses import error_codes
from josef.protocol.records import build_batch
from josef.server.apis import CORE_APIS
from josef.testing import RawClient


def bodies(topic_id: uuid.UUID, records: bytes) -> dict:
    topic = "sweep"
    return {
        0: {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
            {"name": topic, "topic_id": topic_id, "partition_data": [{"index": 0, "records": records}]}]},
        1: {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "", "topics": [
                {"topic": topic, "topic_id": topic_id, "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                     "log_start_offset": -1, "last_fetched_epoch": -1}]}]},
        2: {"replica_id": -1, "isolation_level": 0, "timeout": 1000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1,
                                            "max_num_offsets": 1}]}]},
        3: {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": True,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False},
        18: {"client_software_name": "sweep", "client_software_version": "1"},
        17: {"mechanism": "PLAIN"},
        36: {"auth_bytes": b"\x00user\x00password"},
        19: {"topics": [{"name": "created-{v}", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                         "configs": []}], "timeout": 5000, "validate_only": True},
        20: {"topic_names": ["absent"], "topics": [{"name": "absent", "topic_id": None}], "timeout": 5000},
        21: {"topics": [{"name": topic, "partitions": [{"partition_index": 0, "offset": 0}]}], "timeout": 5000},
        22: {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1},
        27: {"markers": [{"producer_id": 4242, "producer_epoch": 0, "transaction_result": True, "coordinator_epoch": 0,
                          "transaction_version": 0, "topics": [{"name": topic, "partition_indexes": [0]}]}]},
        23: {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]},
        32: {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}],
             "include_synonyms": True, "include_documentation": True},
        33: {"resources": [{"resource_type": 2, "resource_name": topic, "configs": [
            {"name": "retention.ms", "value": "100000"}]}], "validate_only": True},
        37: {"topics": [{"name": topic, "count": 1, "assignments": None}], "timeout": 5000, "validate_only": True},
        44: {"resources": [{"resource_type": 2, "resource_name": topic, "configs": [
            {"name": "retention.ms", "config_operation": 0, "value": "100000"}]}], "validate_only": True},
        60: {"include_cluster_authorized_operations": False, "endpoint_type": 1, "include_fenced_brokers": False},
        61: {"topics": [{"name": topic, "partition_indexes": [0]}]},
        74: {"resource_types": []},
        75: {"topics": [{"name": topic}], "response_partition_limit": 10, "cursor": None},
        48: {"components": [{"entity_type": "user", "match_type": 2, "match": None}], "strict": False},
        49: {"entries": [{"entity": [{"entity_type": "user", "entity_name": "sweep"}],
                          "ops": [{"key": "producer_byte_rate", "value": 1024.0, "remove": False}]}],
             "validate_only": True},
        35: {"topics": None},
        29: {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1, "principal_filter": None,
             "host_filter": None, "operation": 1, "permission_type": 1},
        30: {"creations": [{"resource_type": 2, "resource_name": topic, "resource_pattern_type": 3,
                            "principal": "User:sweep", "host": "*", "operation": 3, "permission_type": 3}]},
        31: {"filters": [{"resource_type_filter": 2, "resource_name_filter": topic, "pattern_type_filter": 3,
                          "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]},
        34: {"dirs": [{"path": "/nowhere", "topics": [{"name": topic, "partitions": [0]}]}]},
        43: {"election_type": 0, "topic_partitions": [{"topic": topic, "partitions": [0]}], "timeout": 5000},
        45: {"timeout": 5000, "allow_replication_factor_change": True,
             "topics": [{"name": topic, "partitions": [{"partition_index": 0, "replicas": None}]}]},
        46: {"timeout": 5000, "topics": None},
        50: {"users": None},
        51: {"deletions": [], "upsertions": [{"name": "sweep", "mechanism": 1, "iterations": 4096, "salt": b"salt",
                                              "salted_password": bytes(32)}]},
        57: {"timeout": 5000, "validate_only": True, "feature_updates": [
            {"feature": "metadata.version", "max_version_level": LATEST_METADATA_VERSION, "allow_downgrade": False,
             "upgrade_type": 1}]},
        38: {"owner_principal_type": None, "owner_principal_name": None, "renewers": [], "max_lifetime": -1},
        39: {"hmac": b"hmac", "renew_period": -1},
        40: {"hmac": b"hmac", "expiry_time_period": -1},
        41: {"owners": None},
    }


EXPECTED_ERRORS = {
    # ACLs without an ACL authorizer (the sweep's broker has the default allow-all), as Kafka answers.
    29: ErrorCode.security_disabled,
    30: ErrorCode.security_disabled,
    31: ErrorCode.security_disabled,
    20: ErrorCode.unknown_topic_or_partition,  # deleting a topic that does not exist
    37: ErrorCode.invalid_partitions,  # asking for fewer partitions than the topic has
    34: ErrorCode.log_dir_not_found,  # a directory that is not one of log.dirs
    43: ErrorCode.election_not_needed,  # the only replica already leads
    45: ErrorCode.no_reassignment_in_progress,  # cancelling what is not happening
    17: ErrorCode.illegal_sasl_state,  # SASL on a PLAINTEXT listener
    36: ErrorCode.illegal_sasl_state,
    # Delegation tokens over PLAINTEXT, refused before anything else, as Kafka does.
    **dict.fromkeys((38, 39, 40, 41), ErrorCode.delegation_token_request_not_allowed),
}


def test_every_api_and_version(josef_broker):
    client = RawClient(josef_broker.port)
    client.call(3, 12, bodies(uuid.UUID(int=0), b"")[3])  # auto-creates the topic
    topic_id = uuid_from_text(josef_broker.broker.image.topics["sweep"].topic_id)
    records = build_batch([(b"k", b"v", 1000)])
    answered = 0
    for key, _, low, high in CORE_APIS:
        api = josef_broker.broker.dispatcher.apis[key]
        for version in range(api.min_version, api.max_version + 1):
            body = bodies(topic_id, records)[key]
            if key == 19:
                body["topics"][0]["name"] = f"created-{version}"
            response = client.call(key, version, body)
            codes = set(error_codes(response)) - {ErrorCode.none}
            assert codes <= {EXPECTED_ERRORS.get(key)} - {None}, (key, version, codes, response)
            answered += 1
    assert answered > 60


def test_acks_zero_gets_no_response_but_is_appended(josef_broker):
    client = RawClient(josef_broker.port)
    client.call(3, 12, bodies(uuid.UUID(int=0), b"")[3])
    body = bodies(uuid.UUID(int=0), build_batch([(None, b"quiet", 1)]))[0]
    body["acks"] = 0
    assert client.call(0, 9, body) is None
    # The next response on the connection is the next request's: nothing was sent for acks=0.
    listed = client.call(2, 7, bodies(uuid.UUID(int=0), b"")[2])
    assert listed.topics[0].partitions[0].offset == 1


def test_offset_for_leader_epoch(josef_broker):
    client = RawClient(josef_broker.port)
    client.call(3, 12, bodies(uuid.UUID(int=0), b"")[3])
    for n in range(3):
        client.call(0, 9, bodies(uuid.UUID(int=0), build_batch([(None, b"x", n)]))[0])
    body = bodies(uuid.UUID(int=0), b"")[23]
    answer = client.call(23, 4, body).topics[0].partitions[0]
    assert (answer.error_code, answer.leader_epoch, answer.end_offset) == (ErrorCode.none, 0, 3)
    body["topics"][0]["partitions"][0]["current_leader_epoch"] = 7
    answer = client.call(23, 4, body).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.unknown_leader_epoch
