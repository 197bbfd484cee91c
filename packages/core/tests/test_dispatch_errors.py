"""Over a real socket: a handler that raises fails its request, not its connection; a waiting answer holds up no request."""

import logging
import threading

import anyio
import attrs
import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.server.dispatch import Later
from josef.testing import RawClient


async def broken(ctx, request):
    raise RuntimeError("handler bug")


@pytest.fixture
def broken_api(josef_broker, monkeypatch):
    """Make one core API's handler raise, on the running broker's dispatcher."""

    def breaking(key: int) -> None:
        apis = josef_broker.broker.dispatcher.apis
        monkeypatch.setitem(apis, key, attrs.evolve(apis[key], handler=broken))

    return breaking


def test_failed_request_is_answered_and_the_connection_goes_on(josef_broker, broken_api, caplog):
    broken_api(ApiKey.CREATE_TOPICS)
    client = RawClient(josef_broker.port)
    try:
        topics = [{"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
                  for name in ("a", "b")]
        with caplog.at_level(logging.ERROR, logger="josef.server.dispatch"):
            response = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": topics, "timeout": 1000, "validate_only": False})
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("a", ErrorCode.unknown_server_error), ("b", ErrorCode.unknown_server_error)]
        assert "handler bug" not in (response.topics[0].error_message or ""), "the exception stays in the log"

        versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions.error_code == ErrorCode.none
        metadata = client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                     "include_topic_authorized_operations": False})
        assert [b.port for b in metadata.brokers] == [josef_broker.port]
    finally:
        client.close()
    [record] = [r for r in caplog.records if r.name == "josef.server.dispatch"]
    assert record.getMessage() == "create_topics v7 request from client 'raw' failed; answering UNKNOWN_SERVER_ERROR"
    assert record.exc_info is not None and "handler bug" in str(record.exc_info[1])


def test_failed_acks_0_produce_closes_the_connection(josef_broker, broken_api, caplog):
    """acks=0 gets no response, so the connection is closed to tell the producer (as Kafka does)."""
    broken_api(ApiKey.PRODUCE)
    client = RawClient(josef_broker.port)
    try:
        with caplog.at_level(logging.WARNING, logger="josef.server"):
            client.call(ApiKey.PRODUCE, 9, {"acks": 0, "timeout": 1000, "topic_data": []})
            assert client.sock.recv(1) == b"", "the broker closed the connection"
    finally:
        client.close()
    messages = [r.getMessage() for r in caplog.records]
    assert "produce v9 request from client 'raw' failed; closing the connection: no error response can answer it" in messages
    assert any(m.startswith("closing connection from") and "cannot be answered" in m for m in messages)
    other = RawClient(josef_broker.port)
    try:
        assert other.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == ErrorCode.none
    finally:
        other.close()


def test_an_answer_that_waits_lets_the_next_requests_through_and_answers_stay_in_order(josef_broker, monkeypatch):
    apis = josef_broker.broker.dispatcher.apis
    release = josef_broker.call(anyio.Event)
    versions_handled = threading.Event()
    describe, versions = apis[ApiKey.DESCRIBE_CLUSTER], apis[ApiKey.API_VERSIONS]

    async def waiting(ctx, request):
        async def answer():
            await release.wait()
            return await describe.handler(ctx, request)
        return Later(answer())

    async def noting(ctx, request):
        versions_handled.set()
        return await versions.handler(ctx, request)

    monkeypatch.setitem(apis, ApiKey.DESCRIBE_CLUSTER, attrs.evolve(describe, handler=waiting))
    monkeypatch.setitem(apis, ApiKey.API_VERSIONS, attrs.evolve(versions, handler=noting))
    client = RawClient(josef_broker.port)
    try:
        client.send(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
        client.send(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert versions_handled.wait(10), "the second request waited for the first one's answer"
        josef_broker.call(release.set)
        cluster = client.receive()  # RawClient checks the correlation ids: first asked, first answered
        assert cluster.error_code == ErrorCode.none and cluster.cluster_id == josef_broker.broker.cluster_id
        assert client.receive().error_code == ErrorCode.none
    finally:
        client.close()
