"""The client side of SASL (josef.protocol.sasl_client): josef's Connection authenticating with PLAIN and SCRAM."""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode
from test_sasl_scram import PASSWORD, SCRAM_JAAS, alter, upsertion

from josef import scram
from josef.config import ConfigError
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.sasl_client import SaslAuthenticationFailed, SaslCredentials, _Scram
from josef.testing import RawClient

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_alice="alice-secret";')
BOTH = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
})


def sasl_port(josef_broker) -> int:
    return next(b.port for b in josef_broker.broker.bound if b.name == "SASL_PLAINTEXT")


async def metadata_as(port: int, credentials: SaslCredentials) -> list[int]:
    conn = await Connection.open("127.0.0.1", port, sasl=credentials)
    try:
        answer = await conn.request(ApiKey.METADATA, {"topics": None, "allow_auto_topic_creation": False,
                                                      "include_topic_authorized_operations": False})
        return [b.node_id for b in answer.brokers]
    finally:
        await conn.close()


@BOTH
def test_plain_and_scram_authenticate_and_wrong_passwords_are_refused_with_the_broker_s_message(josef_broker):
    admin = RawClient(josef_broker.port)
    assert alter(admin, [upsertion("bob", scram.SCRAM_SHA_512)]) == {"bob": (ErrorCode.none, None)}
    admin.close()
    port = sasl_port(josef_broker)
    assert asyncio.run(metadata_as(port, SaslCredentials("PLAIN", "alice", "alice-secret"))) == [1]
    assert asyncio.run(metadata_as(port, SaslCredentials("SCRAM-SHA-512", "bob", PASSWORD))) == [1]
    with pytest.raises(SaslAuthenticationFailed, match="Invalid username or password") as plain:
        asyncio.run(metadata_as(port, SaslCredentials("PLAIN", "alice", "hunter2")))
    assert plain.value.code == ErrorCode.sasl_authentication_failed and "hunter2" not in str(plain.value)
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials with SASL mechanism SCRAM-SHA-512"):
        asyncio.run(metadata_as(port, SaslCredentials("SCRAM-SHA-512", "bob", "hunter2")))
    with pytest.raises(SaslAuthenticationFailed, match=r"does not offer SCRAM-SHA-256 \(it offers PLAIN, SCRAM-SHA-512\)"):
        asyncio.run(metadata_as(port, SaslCredentials("SCRAM-SHA-256", "bob", PASSWORD)))


def test_a_server_that_does_not_know_the_credential_is_refused():
    """SCRAM is mutual: a server-final signature that is not the credential's fails the client."""
    exchange = _Scram(SaslCredentials("SCRAM-SHA-256", "user", "pencil"), scram.SCRAM_SHA_256)
    exchange.first()
    server_first = f"r={exchange.nonce}srv,s=QSXCR+Q6sek8bf92,i=4096".encode()
    assert exchange.respond(server_first).startswith(f"c=biws,r={exchange.nonce}srv,p=".encode())
    with pytest.raises(SaslAuthenticationFailed, match="does not know the credential"):
        exchange.respond(b"v=" + b"A" * 44)
    forged = _Scram(SaslCredentials("SCRAM-SHA-256", "user", "pencil"), scram.SCRAM_SHA_256)
    forged.first()
    with pytest.raises(SaslAuthenticationFailed, match="server-first message is invalid"):
        forged.respond(b"r=someone-elses-nonce,s=QSXCR+Q6sek8bf92,i=4096")


@pytest.mark.parametrize("settings, expected", [
    ({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config":
      'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3cr\\"et";'},
     ("SCRAM-SHA-512", "alice", 's3cr"et')),
    ({"sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": "pw"}, ("PLAIN", "bob", "pw")),
])
def test_credentials_read_from_kafka_s_and_librdkafka_s_client_keys(settings, expected):
    credentials = SaslCredentials.from_client_config(settings.get)
    assert (credentials.mechanism, credentials.username, credentials.password) == expected
    assert expected[2] not in repr(credentials)


@pytest.mark.parametrize("settings, error", [
    ({}, "sasl.mechanism GSSAPI is not supported"),
    ({"sasl.mechanism": "PLAIN"}, "SASL needs a user name and password"),
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": "username=a password=hunter2"}, "not a JAAS login module entry"),
])
def test_unusable_client_settings_are_refused_without_the_password(settings, error):
    with pytest.raises(ConfigError, match=error) as refused:
        SaslCredentials.from_client_config(settings.get)
    assert "hunter2" not in str(refused.value)
