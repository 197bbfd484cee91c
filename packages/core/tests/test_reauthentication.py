"""KIP-368: sessions with a lifetime, re-authentication on the same connection, and connections that outlive theirs."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.sasl_client import SaslCredentials
from josef.testing import RawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'user_alice="alice-pw" user_bob="bob-pw";')
REAUTH = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
    "connections.max.reauth.ms": "1000",
})
METADATA = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def sasl_client(josef_broker) -> RawClient:
    return RawClient(next(b.port for b in josef_broker.broker.bound if b.name == "SASL_PLAINTEXT"))


def login(client: RawClient, user: str, version: int = 2):
    assert client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
    return client.call(ApiKey.SASL_AUTHENTICATE, version, {"auth_bytes": f"\x00{user}\x00{user}-pw".encode()})


@REAUTH
def test_the_session_lifetime_is_told_and_a_connection_that_outlives_it_is_closed(josef_broker, caplog):
    caplog.set_level(logging.INFO, logger="josef")
    client = sasl_client(josef_broker)
    answer = login(client, "alice")
    assert answer.error_code == ErrorCode.none and 0 < answer.session_lifetime.total_seconds() <= 1.0
    assert client.call(ApiKey.METADATA, 12, METADATA).brokers
    time.sleep(1.2)  # the point: the session's own lifetime passes (the broker has no event to await here)
    client.send(ApiKey.METADATA, 12, METADATA)
    assert client.closed_by_broker()  # closed rather than answered
    assert "SASL session expired without re-authentication" in caplog.text


@REAUTH
def test_re_authenticating_on_the_same_connection_keeps_it_and_another_principal_is_refused(josef_broker):
    client = sasl_client(josef_broker)
    assert login(client, "alice").error_code == ErrorCode.none
    again = login(client, "alice")  # before the session ends: same mechanism, same principal
    assert again.error_code == ErrorCode.none and again.session_lifetime.total_seconds() > 0
    assert client.call(ApiKey.METADATA, 12, METADATA).brokers
    refused = login(client, "bob")
    assert refused.error_code == ErrorCode.sasl_authentication_failed
    assert refused.error_message == "Cannot change principals during re-authentication from User:alice: User:bob"
    assert client.closed_by_broker()


@REAUTH
def test_josef_s_connection_re_authenticates_before_its_session_ends(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef.server.apis.authentication")
    port = next(b.port for b in josef_broker.broker.bound if b.name == "SASL_PLAINTEXT")

    async def run() -> int:
        conn = await Connection.open("127.0.0.1", port, sasl=SaslCredentials("PLAIN", "alice", "alice-pw"))
        answered = 0
        try:
            deadline = time.monotonic() + 3.5  # three and a half session lifetimes
            while time.monotonic() < deadline:
                await conn.request(ApiKey.METADATA, METADATA)
                answered += 1
                await asyncio.sleep(0.05)
        finally:
            await conn.close()
        return answered

    assert asyncio.run(run()) > 20
    assert caplog.text.count("re-authenticated User:alice") >= 3
