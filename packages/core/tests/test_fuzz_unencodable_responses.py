"""Over a real socket: a response that cannot be encoded is answered with UNKNOWN_SERVER_ERROR, never a dropped connection.

Responses are encoded in the dispatcher, after the handler returned: a value
out of its field's wire range (a port of -1 in a uint16) once escaped as an
exception there and closed the client's connection with nothing said.
"""

import logging

import anyio
import attrs
import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError
from josef.protocol.api_keys import ApiKey
from josef.server.dispatch import Later
from josef.testing import RawClient

VERSIONS = {"client_software_name": "t", "client_software_version": "1"}


def bad_cluster(ctx, request):
    """A DescribeCluster answer naming broker id 2**31, which does not fit the int32 it is written as."""
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "cluster_id": "c",
            "controller_id": 1, "brokers": [{"broker_id": 2**31, "host": "h", "port": 1, "rack": None}],
            "cluster_authorized_operations": -(2**31), "endpoint_type": 1}


@pytest.fixture
def replaced(josef_broker, monkeypatch):
    def replace(key, handler):
        apis = josef_broker.broker.dispatcher.apis
        monkeypatch.setitem(apis, key, attrs.evolve(apis[key], handler=handler))
    return replace


@pytest.mark.parametrize("waits", [False, True], ids=["ready", "later"])
def test_an_unencodable_response_is_answered_with_unknown_server_error(josef_broker, replaced, caplog, waits):
    async def answer(ctx, request):
        if waits:
            async def body():
                await anyio.sleep(0)
                return bad_cluster(ctx, request)
            return Later(body())
        return bad_cluster(ctx, request)

    replaced(ApiKey.DESCRIBE_CLUSTER, answer)
    client = RawClient(josef_broker.port, client_id="encoder")
    try:
        with caplog.at_level(logging.ERROR, logger="josef.server.dispatch"):
            for version in (0, 1):
                client.send(ApiKey.DESCRIBE_CLUSTER, version, {"include_cluster_authorized_operations": False})
                client.send(ApiKey.API_VERSIONS, 3, VERSIONS)  # pipelined behind it: answered in order
                response = client.receive()  # RawClient checks the correlation id
                assert response.error_code == ErrorCode.unknown_server_error
                assert response.error_message == "The server experienced an unexpected error when processing the request."
                assert response.brokers == ()
                assert client.receive().error_code == ErrorCode.none
    finally:
        client.close()
    records = [r for r in caplog.records if r.name == "josef.server.dispatch"]
    assert len(records) == 2, "logged once per request"
    message = records[0].getMessage()
    assert message.startswith("describe_cluster v0 response to client 'encoder' (correlation id 1) cannot be encoded; "
                              "answering UNKNOWN_SERVER_ERROR; the request: DescribeClusterRequest(")
    assert records[0].exc_info is not None
    assert records[1].getMessage().startswith("describe_cluster v1 response to client 'encoder' (correlation id 3)")


def test_a_response_with_a_field_missing_is_answered_with_unknown_server_error(josef_broker, replaced, caplog):
    async def incomplete(ctx, request):
        return {"error_code": ErrorCode.none}  # no api_keys, throttle...: a handler bug
    replaced(ApiKey.DESCRIBE_CLUSTER, incomplete)
    client = RawClient(josef_broker.port)
    try:
        with caplog.at_level(logging.ERROR, logger="josef.server.dispatch"):
            response = client.call(ApiKey.DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": True})
        assert response.error_code == ErrorCode.unknown_server_error
        assert client.call(ApiKey.API_VERSIONS, 3, VERSIONS).error_code == ErrorCode.none
    finally:
        client.close()
    [record] = [r for r in caplog.records if r.name == "josef.server.dispatch"]
    assert "needs field" in str(record.exc_info[1])


def test_an_error_with_a_kafka_code_is_answered_with_that_code(josef_broker, replaced, caplog):
    """A controller that is not the active one raised NOT_CONTROLLER out of AlterClientQuotas, which became
    UNKNOWN_SERVER_ERROR and a traceback (found by fuzzing a cluster's controller listener). Kafka answers the
    error's own code, as it maps its ApiExceptions."""
    async def not_active(ctx, request):
        raise ControllerError(ErrorCode.not_controller, "this node is not the active controller")

    replaced(ApiKey.ALTER_CLIENT_QUOTAS, not_active)
    client = RawClient(josef_broker.port)
    try:
        with caplog.at_level(logging.INFO, logger="josef.server.dispatch"):
            response = client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [
                {"entity": [{"entity_type": "user", "entity_name": "u"}],
                 "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}]}]})
        assert [(e.error_code, e.error_message) for e in response.entries] == [
            (ErrorCode.not_controller, "this node is not the active controller")]
        assert client.call(ApiKey.API_VERSIONS, 3, VERSIONS).error_code == ErrorCode.none
    finally:
        client.close()
    [record] = [r for r in caplog.records if r.name == "josef.server.dispatch"]
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage() == ("alter_client_quotas v1 request from client 'raw' refused: NOT_CONTROLLER "
                                   "(this node is not the active controller)")
