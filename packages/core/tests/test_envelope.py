"""Envelope: a broker's forwarded admin request, answered by the controller listener as if the client asked."""

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request
from josef.security import ANONYMOUS, KafkaPrincipal
from josef.server.apis.envelope import address_bytes, principal_bytes, read_principal
from josef.testing import RawClient

CONTROLLER_LISTENER = pytest.mark.josef_config(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")


def controller_port(josef_broker) -> int:
    return next(b.port for b in josef_broker.broker.bound if b.name == "CONTROLLER")


def enveloped(api_key, version, body, host="10.1.2.3"):
    frame = encode_request(api_key, version, 77, b"forwarded-client", body)
    return {"request_data": frame[4:], "request_principal": principal_bytes(ANONYMOUS),
            "client_host_address": address_bytes(host)}


def test_principals_are_serialised_as_kafka_does():
    data = principal_bytes(ANONYMOUS)
    assert data[:2] == b"\x00\x00" and read_principal(data) == ANONYMOUS
    assert read_principal(principal_bytes(KafkaPrincipal("User", "alice"))) == KafkaPrincipal("User", "alice")
    assert address_bytes("10.1.2.3") == bytes([10, 1, 2, 3]) and len(address_bytes("::1")) == 16


@CONTROLLER_LISTENER
def test_the_controller_answers_the_embedded_request(josef_broker):
    create = {"timeout": 5000, "validate_only": False, "topics": [
        {"name": "via-envelope", "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}]}
    answer = RawClient(controller_port(josef_broker)).call(ApiKey.ENVELOPE, 0, enveloped(ApiKey.CREATE_TOPICS, 7, create))
    assert answer.error_code == ErrorCode.none
    correlation, inner = decode_response(ApiKey.CREATE_TOPICS, 7, answer.response_data)
    assert correlation == 77 and [(t.name, t.error_code, t.num_partitions) for t in inner.topics] == [
        ("via-envelope", ErrorCode.none, 2)]
    assert len(josef_broker.broker.image.topics["via-envelope"].partitions) == 2


@CONTROLLER_LISTENER
@pytest.mark.parametrize("api_key,version,body", [
    (ApiKey.API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"}),  # not forwardable
    (ApiKey.BROKER_HEARTBEAT, 1, {"broker_id": 1, "broker_epoch": 1, "current_metadata_offset": 0,
                                  "want_fence": False, "want_shut_down": False, "offline_log_dirs": []}),
])
def test_only_forwardable_requests_travel_in_an_envelope(josef_broker, api_key, version, body):
    answer = RawClient(controller_port(josef_broker)).call(ApiKey.ENVELOPE, 0, enveloped(api_key, version, body))
    assert (answer.error_code, answer.response_data) == (ErrorCode.invalid_request, None)


@CONTROLLER_LISTENER
def test_an_envelope_is_a_controller_api_only(josef_broker):
    broker_port = next(b.port for b in josef_broker.broker.bound if b.name == "PLAINTEXT")
    versions = RawClient(broker_port).call(ApiKey.API_VERSIONS, 3, {"client_software_name": "x",
                                                                     "client_software_version": "1"})
    assert ApiKey.ENVELOPE not in {k.api_key for k in versions.api_keys}
    controller = RawClient(controller_port(josef_broker)).call(ApiKey.API_VERSIONS, 3, {
        "client_software_name": "x", "client_software_version": "1"})
    keys = {k.api_key for k in controller.api_keys}
    assert {ApiKey.ENVELOPE, ApiKey.BROKER_REGISTRATION, ApiKey.VOTE, ApiKey.FETCH} <= keys
    assert ApiKey.PRODUCE not in keys


def test_brokers_forward_voter_changes_to_the_quorum(josef_broker):
    """AddRaftVoter and RemoveRaftVoter list the broker listener too: the broker passes them to the controller.

    The default node's quorum is static (kraft.version 0), so the controller refuses as Kafka's does.
    """
    client = RawClient(josef_broker.port)
    versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"})
    assert {ApiKey.ADD_RAFT_VOTER, ApiKey.REMOVE_RAFT_VOTER, ApiKey.DESCRIBE_QUORUM} <= {
        k.api_key for k in versions.api_keys}
    removed = client.call(ApiKey.REMOVE_RAFT_VOTER, 0, {"cluster_id": josef_broker.broker.cluster_id, "voter_id": 9,
                                                         "voter_directory_id": "AAAAAAAAAAAAAAAAAAAAAA"})
    assert removed.error_code == ErrorCode.unsupported_version
