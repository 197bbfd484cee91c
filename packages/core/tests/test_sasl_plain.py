"""SASL/PLAIN on a SASL_PLAINTEXT listener: Kafka's handshake, its errors, and nothing secret in a log line."""

import logging

import pytest
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.node.broker_config import check_listeners
from josef.node.server_properties import load_config
from josef.protocol.api_keys import ApiKey
from josef.security import KafkaPrincipal
from josef.protocol.jaas import parse_jaas
from josef.server.sasl import INVALID_CREDENTIALS, PlainMechanism, SaslAuthenticationError
from josef.testing import RawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="s3cr\\"et";')
SASL = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
})


def test_jaas_entries_read_as_kafka_writes_them():
    module, options = parse_jaas(JAAS, "k")
    assert module == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert options == {"username": "admin", "password": "admin-secret", "user_admin": "admin-secret",
                       "user_alice": 's3cr"et'}
    with pytest.raises(ConfigError, match="^k: not a JAAS login module entry"):
        parse_jaas("PlainLoginModule username=admin", "k")


def test_plain_checks_the_users_of_its_login_module():
    plain = PlainMechanism.from_jaas(JAAS, "k")
    assert plain.authenticate(b"\x00alice\x00s3cr\"et") == KafkaPrincipal("User", "alice")
    assert plain.authenticate(b"alice\x00alice\x00s3cr\"et") == KafkaPrincipal("User", "alice")
    for token, message in [(b"\x00alice\x00wrong", INVALID_CREDENTIALS), (b"\x00mallory\x00s3cr\"et", INVALID_CREDENTIALS),
                           (b"alice\x00s3cr\"et", "Invalid SASL/PLAIN response: expected 3 tokens"),
                           (b"\x00\x00pw", "Authentication failed: username not specified"),
                           (b"admin\x00alice\x00s3cr\"et", "Authentication failed: Client requested an authorization "
                                                          "id that is different from username")]:
        with pytest.raises(SaslAuthenticationError) as refused:
            plain.authenticate(token)
        assert str(refused.value) == message


@pytest.mark.parametrize("overrides, error", [
    ({}, "listener SASL_PLAINTEXT: SASL mechanism GSSAPI is not supported yet; josef offers PLAIN"),
    ({"sasl.enabled.mechanisms": "PLAIN"},
     "listener SASL_PLAINTEXT: PLAIN needs listener.name.sasl_plaintext.plain.sasl.jaas.config"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="hunter2";'},
     "PlainLoginModule lists no user_<name>"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
      "inter.broker.listener.name": "SASL_PLAINTEXT"}, "brokers and controllers cannot authenticate to each other "
                                                        "with GSSAPI; set sasl.mechanism.inter.broker.protocol"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="hunter2";',
      "inter.broker.listener.name": "SASL_PLAINTEXT", "sasl.mechanism.inter.broker.protocol": "PLAIN"},
     "SASL needs a user name and password"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
      "listeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0"},  # the first is the inter-broker default
     "brokers and controllers cannot authenticate to each other with GSSAPI"),
])
def test_a_sasl_listener_that_cannot_work_stops_start_up_without_showing_secrets(overrides, error):
    config = load_config(None, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0", **overrides})
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)").replace("<", ".").replace(">", ".")) \
            as refused:
        check_listeners(config)
    assert "hunter2" not in str(refused.value) and "admin-secret" not in str(refused.value)


def sasl_client(josef_broker) -> RawClient:
    port = next(b.port for b in josef_broker.broker.bound if b.name == "SASL_PLAINTEXT")
    return RawClient(port)


def authenticate(client: RawClient, token: bytes, mechanism: str = "PLAIN"):
    handshake = client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    assert (handshake.error_code, handshake.mechanisms) == (ErrorCode.none, ("PLAIN",))
    return client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})



@SASL
def test_a_client_that_authenticates_is_served_as_its_user(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    client = sasl_client(josef_broker)
    try:
        versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE} <= {k.api_key for k in versions.api_keys}
        answer = authenticate(client, b"\x00alice\x00s3cr\"et")
        assert (answer.error_code, answer.error_message) == (ErrorCode.none, None)
        assert client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False}).brokers
        again = client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert again.error_code == ErrorCode.illegal_sasl_state
    finally:
        client.close()
    assert any(r.getMessage().startswith("authenticated User:alice from 127.0.0.1:") for r in caplog.records)
    assert 's3cr"et' not in caplog.text


@SASL
def test_a_wrong_password_is_refused_in_kafka_s_words_and_the_connection_closed(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    client = sasl_client(josef_broker)
    try:
        answer = authenticate(client, b"\x00alice\x00hunter2")
        assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, INVALID_CREDENTIALS)
        assert client.closed_by_broker()
    finally:
        client.close()
    assert "hunter2" not in caplog.text and "alice" not in caplog.text
    [line] = [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]
    assert line.endswith(f"on SASL_PLAINTEXT (PLAIN): {INVALID_CREDENTIALS}")
    # Everyone else is still served.
    other = sasl_client(josef_broker)
    try:
        assert authenticate(other, b"\x00admin\x00admin-secret").error_code == ErrorCode.none
    finally:
        other.close()


@SASL
def test_requests_before_authentication_close_the_connection(josef_broker):
    client = sasl_client(josef_broker)
    try:
        client.send(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
        assert client.closed_by_broker()
    finally:
        client.close()


@SASL
def test_an_unknown_mechanism_is_refused_with_the_enabled_ones_and_the_connection_closed(josef_broker):
    client = sasl_client(josef_broker)
    try:
        answer = client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
        assert (answer.error_code, answer.mechanisms) == (ErrorCode.unsupported_sasl_mechanism, ("PLAIN",))
        assert client.closed_by_broker()
    finally:
        client.close()


@SASL
def test_sasl_apis_out_of_order_or_off_a_sasl_listener_are_an_illegal_state(josef_broker):
    client = sasl_client(josef_broker)
    plain = RawClient(josef_broker.port)
    try:
        early = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\x00alice\x00s3cr\"et"})
        assert early.error_code == ErrorCode.illegal_sasl_state
        assert plain.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.illegal_sasl_state
        [listener] = [b for b in josef_broker.broker.bound if b.name == "PLAINTEXT"]
        assert josef_broker.port == listener.port
    finally:
        client.close()
        plain.close()


@pytest.mark.josef_config(**{**SASL.kwargs, "sasl.server.max.receive.size": "1024"})
def test_a_large_request_before_authentication_closes_the_connection_and_after_it_is_served(josef_broker, caplog):
    """Kafka's sasl.server.max.receive.size: an unauthenticated client cannot make the broker buffer a big frame."""
    caplog.set_level(logging.INFO, logger="josef")
    big = {"client_software_name": "x" * 2000, "client_software_version": "1"}
    client = sasl_client(josef_broker)
    try:
        client.send(ApiKey.API_VERSIONS, 3, big)
        assert client.closed_by_broker()
    finally:
        client.close()
    assert "exceeds sasl.server.max.receive.size (before SASL authentication) 1024" in caplog.text
    client = sasl_client(josef_broker)
    try:
        assert authenticate(client, b"\x00alice\x00s3cr\"et").error_code == ErrorCode.none
        answer = client.call(ApiKey.METADATA, 12, {"topics": [{"name": "t" * 1500, "topic_id": None}],
                                                   "allow_auto_topic_creation": False,
                                                   "include_topic_authorized_operations": False})
        assert answer.topics[0].name == "t" * 1500  # a 1.5 kB request, now within socket.request.max.bytes
    finally:
        client.close()


@pytest.mark.josef_config(**{**SASL.kwargs, "connections.max.idle.ms": "500"})
def test_a_client_that_never_authenticates_is_closed_when_idle(josef_broker):
    client = sasl_client(josef_broker)
    try:
        assert client.closed_by_broker()  # nothing sent: closed after connections.max.idle.ms, not kept forever
    finally:
        client.close()


def test_kafka_s_per_listener_sasl_keys_are_read_not_ignored(tmp_path, caplog):
    """listener.name.<l>.<mechanism>.sasl.jaas.config and its kind are open-ended names no ConfigKey declares:
    the broker reads them, so it must not log them as ignored (a typo still is)."""
    from josef.node.broker import Broker

    caplog.set_level(logging.WARNING, logger="josef.node.broker")
    config = load_config(None, {**SASL.kwargs, "log.dirs": str(tmp_path), "listener.name.sasl_plaintext.typo": "1",
                                "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": "60000"})
    Broker(config)
    assert "ignoring configuration keys no plugin declares: listener.name.sasl_plaintext.typo" in caplog.text
    assert "jaas" not in caplog.text and "max.reauth" not in caplog.text
