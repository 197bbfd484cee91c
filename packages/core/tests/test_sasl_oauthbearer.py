"""SASL/OAUTHBEARER on a SASL_PLAINTEXT listener: unsecured tokens, and signed ones checked against a JWKS served by
a real HTTP server on a free port of 127.0.0.1; Kafka's error challenge, and nothing secret in a log line."""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any, Iterator

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.node.broker_config import check_listeners
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.protocol.api_keys import ApiKey
from josef.security import KafkaPrincipal
from josef.server.oauthbearer import OAuthBearerServer, UnsecuredValidator, parse_client_first
from josef.server.sasl import SaslAuthenticationError
from josef.server.scram import invalid_credentials
from josef.testing.oauth import IdentityProvider
from josef.testing import RawClient, broker_overrides, eventually

LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
JWKS_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
UNSECURED = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "OAUTHBEARER",
    "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
        f'{LOGIN_MODULE} required unsecuredValidatorRequiredScope="kafka";',
})
METADATA = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def unsecured(**claims: Any) -> str:
    now = int(time.time())
    return f"{b64({'alg': 'none'})}.{b64({'iat': now, 'exp': now + 600, 'scope': 'kafka', **claims})}."


def first_message(token: str, extensions: str = "") -> bytes:
    return f"n,,\x01auth=Bearer {token}\x01{extensions}\x01".encode()


def sasl_client(broker) -> RawClient:
    return RawClient(next(b.port for b in broker.broker.bound if b.name == "SASL_PLAINTEXT"))


def handshake(client: RawClient) -> None:
    answer = client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "OAUTHBEARER"})
    assert (answer.error_code, answer.mechanisms) == (ErrorCode.none, ("OAUTHBEARER",))



def authenticates(broker, token: str) -> Any:
    """The SaslAuthenticate answer to ``token``; the connection serves Metadata after it."""
    client = sasl_client(broker)
    try:
        handshake(client)
        answer = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": first_message(token)})
        assert (answer.error_code, answer.error_message, answer.auth_bytes) == (ErrorCode.none, None, b"")
        assert client.call(ApiKey.METADATA, 12, METADATA).brokers
        return answer
    finally:
        client.close()


def refused(broker, token: str, status: bytes = b'{"status":"invalid_token"}') -> None:
    """Kafka's refusal of a token: the error challenge, acknowledged with ^A, then SASL_AUTHENTICATION_FAILED with the
    challenge as the message, and the connection closed."""
    client = sasl_client(broker)
    try:
        handshake(client)
        challenge = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": first_message(token)})
        assert (challenge.error_code, challenge.auth_bytes) == (ErrorCode.none, status)
        failed = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\x01"})
        assert (failed.error_code, failed.error_message) == (ErrorCode.sasl_authentication_failed, status.decode())
        assert client.closed_by_broker()
    finally:
        client.close()


def failure_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]


# Unsecured tokens ---------------------------------------------------------------------------------------------


@UNSECURED
def test_an_unsecured_token_authenticates_as_its_sub_for_no_longer_than_it_lives(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    token = unsecured(sub="alice", exp=int(time.time()) + 120)
    answer = authenticates(josef_broker, token)
    # KIP-368: the session is capped to the token's life (120 s, less the time the exchange took).
    assert 100_000 < answer.session_lifetime.total_seconds() * 1000 <= 120_000
    assert any(r.getMessage().startswith("authenticated User:alice from 127.0.0.1:") for r in caplog.records)
    assert token not in caplog.text


@UNSECURED
@pytest.mark.parametrize("claims, status, reason", [
    ({"sub": "alice", "iat": int(time.time()) - 7200, "exp": int(time.time()) - 3600}, b'{"status":"invalid_token"}',
     "the token has expired"),
    ({"sub": ""}, b'{"status":"invalid_token"}', "no principal name in the JWT claim sub"),
    ({"name": "alice"}, b'{"status":"invalid_token"}', "no principal name in the JWT claim sub"),
    ({"sub": "alice", "scope": "read"}, b'{"status":"insufficient_scope", "scope":"[kafka]"}',
     "the token's scope lacks a required element"),
])
def test_a_bad_unsecured_token_gets_kafka_s_challenge_then_fails_and_closes(josef_broker, caplog, claims, status, reason):
    caplog.set_level(logging.DEBUG, logger="josef")
    token = unsecured(**claims)
    refused(josef_broker, token, status)
    [line] = failure_lines(caplog)
    assert f"on SASL_PLAINTEXT (OAUTHBEARER): {status.decode()} ({reason}" in line
    assert token not in caplog.text and "alice" not in caplog.text


@UNSECURED
@pytest.mark.parametrize("message", [
    b"n,,\x01auth=Bearer abc.def.\x01",  # no closing ^A
    b"n,,\x01auth=Basic abc.def.\x01\x01",  # not a bearer token
    b"y,,\x01auth=Bearer abc.def.\x01\x01",  # channel binding
    b"n,,\x01user=alice\x01\x01",  # no auth
    b"\x00alice\x00s3cret",  # PLAIN's token
])
def test_a_malformed_first_message_fails_at_once_in_kafka_s_words(josef_broker, caplog, message):
    caplog.set_level(logging.DEBUG, logger="josef")
    client = sasl_client(josef_broker)
    try:
        handshake(client)
        answer = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": message})
        assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed,
                                                             invalid_credentials("OAUTHBEARER"))
        assert client.closed_by_broker()
    finally:
        client.close()
    [line] = failure_lines(caplog)
    assert "invalid OAUTHBEARER client first message" in line
    assert "s3cret" not in caplog.text and "abc.def" not in caplog.text


@UNSECURED
def test_a_signed_token_is_not_an_unsecured_one_and_a_second_try_on_the_connection_may_succeed(josef_broker):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused(josef_broker, jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, key, algorithm="RS256"))
    # As OAuthBearerSaslServer: a new first message instead of ^A after the challenge starts over.
    client = sasl_client(josef_broker)
    try:
        handshake(client)
        challenge = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": first_message(unsecured(sub="x", exp=1))})
        assert challenge.auth_bytes == b'{"status":"invalid_token"}'
        again = client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": first_message(unsecured(sub="bob"),
                                                                                        "traceId=42\x01")})
        assert (again.error_code, again.auth_bytes) == (ErrorCode.none, b"")
    finally:
        client.close()


def test_the_client_first_message_is_read_as_kafka_reads_it():
    token = unsecured(sub="alice")
    assert parse_client_first(f"n,a=alice,\x01auth=Bearer {token}\x01k=v w\x01\x01".encode()) == \
        ("alice", token, {"k": "v w"})
    server = OAuthBearerServer(UnsecuredValidator(required_scope=("kafka",)))
    with pytest.raises(SaslAuthenticationError, match="different from the token's principal name"):
        server.evaluate(f"n,a=bob,\x01auth=Bearer {token}\x01\x01".encode())
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        parse_client_first(f"n,,\x01auth=Bearer {token}\x011x=v\x01\x01".encode())  # an extension key of letters only
    ok = OAuthBearerServer(UnsecuredValidator(clock_skew_ms=5000))
    assert ok.evaluate(first_message(unsecured(sub="alice", iat=int(time.time()) - 60,
                                                  exp=int(time.time()) - 2))) == b""  # within the skew
    assert (ok.principal, ok.complete) == (KafkaPrincipal("User", "alice"), True)
    assert ok.expires_at_ms is not None and ok.expires_at_ms < time.time() * 1000


JAAS = f"{LOGIN_MODULE} required;"


@pytest.mark.parametrize("overrides, error", [
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="hunter2";'},
     "OAUTHBEARER needs org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": JAAS,
      "sasl.oauthbearer.jwks.endpoint.url": "http://127.0.0.1:9/jwks"},
     "sasl.oauthbearer.jwks.endpoint.url is set but tokens would not be verified with it"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": JAAS,
      "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": JWKS_HANDLER},
     "validates tokens against a JWKS: set sasl.oauthbearer.jwks.endpoint.url"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": JAAS,
      "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": "com.example.Mine",
      "sasl.oauthbearer.jwks.endpoint.url": "http://127.0.0.1:9/jwks"}, "not com.example.Mine"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
      f'{LOGIN_MODULE} required unsecuredValidatorAllowableClockSkewMs="-1";'}, "must not be negative"),
])
def test_an_oauthbearer_listener_that_cannot_work_stops_start_up(overrides, error):
    config = load_config(None, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                                "inter.broker.listener.name": "PLAINTEXT", "sasl.enabled.mechanisms": "OAUTHBEARER",
                                **overrides})
    with pytest.raises(ConfigError, match=error) as refusal:
        check_listeners(config)
    assert "hunter2" not in str(refusal.value)


# JWKS ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    with IdentityProvider() as provider:
        provider.add_key("rsa-1")
        provider.add_key("ec-1", "ES256")
        yield provider


@pytest.fixture(scope="module")
def jwks_broker(idp, tmp_path_factory) -> Iterator[BrokerThread]:
    broker = BrokerThread(broker_overrides(tmp_path_factory.mktemp("jwks"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": JAAS,
        "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": JWKS_HANDLER,
        "sasl.oauthbearer.jwks.endpoint.url": idp.url,
        "sasl.oauthbearer.expected.audience": "josef,other",
        "sasl.oauthbearer.expected.issuer": "https://idp.test"}))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def test_signed_tokens_authenticate_as_their_sub_with_the_jwks_fetched_once(jwks_broker, idp, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    assert idp.fetches == 1  # at start-up, before the listener accepted anyone
    for kid, sub in [("rsa-1", "alice"), ("ec-1", "bob"), ("rsa-1", "carol")]:
        answer = authenticates(jwks_broker, idp.token(kid, sub=sub))
        assert 0 < answer.session_lifetime.total_seconds() <= 300
    assert idp.fetches == 1
    authenticated = [r.getMessage() for r in caplog.records if r.getMessage().startswith("authenticated ")]
    assert [line.split()[1] for line in authenticated] == ["User:alice", "User:bob", "User:carol"]


@pytest.mark.parametrize("case", ["audience", "issuer", "signature", "expired", "unsigned", "no sub", "no exp"])
def test_a_token_the_jwks_validator_refuses_fails_without_a_trace_of_it_in_the_log(jwks_broker, idp, caplog, case):
    caplog.set_level(logging.DEBUG, logger="josef")
    now = int(time.time())
    if case == "signature":  # the right kid, another key
        forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        token = jwt.encode({"sub": "alice", "iat": now, "exp": now + 300, "aud": "josef", "iss": "https://idp.test"},
                           forger, algorithm="RS256", headers={"kid": "rsa-1"})
    elif case == "unsigned":
        token = unsecured(sub="alice", aud="josef", iss="https://idp.test")
    else:
        claims = {"audience": {"aud": "someone-else"}, "issuer": {"iss": "https://evil.test"},
                  "expired": {"iat": now - 7200, "exp": now - 3600}, "no sub": {"sub": None}}.get(case, {})
        token = idp.token("rsa-1", **claims)
        if case == "no exp":
            key, _ = idp.keys["rsa-1"]
            token = jwt.encode({"sub": "alice", "iat": now, "aud": "josef", "iss": "https://idp.test"}, key,
                               algorithm="RS256", headers={"kid": "rsa-1"})
    fetches = idp.fetches
    refused(jwks_broker, token)
    [line] = failure_lines(caplog)
    assert '{"status":"invalid_token"}' in line
    assert token not in caplog.text and token.split(".")[1] not in caplog.text and "alice" not in caplog.text
    assert idp.fetches == fetches


def test_an_unknown_key_id_is_refused_and_fetches_the_jwks_once_in_the_background(jwks_broker, idp, caplog):
    """Key rotation: a token signed with a key the cache lacks is refused, and schedules one refresh, after which
    the new key verifies tokens; a forged key id does not make the broker fetch the JWKS per token."""
    caplog.set_level(logging.DEBUG, logger="josef")
    idp.add_key("rsa-2")
    fetches = idp.fetches
    refused(jwks_broker, idp.token("rsa-2"))
    jwks = jwks_broker.broker.sasl["SASL_PLAINTEXT"].mechanisms["OAUTHBEARER"].jwks
    idp.wait_for_fetches(fetches + 1)
    eventually(lambda: jwks.fetches == fetches + 1, what="the broker's refreshed JWKS")  # parsed, in place
    authenticates(jwks_broker, idp.token("rsa-2", sub="dave"))
    assert idp.fetches == fetches + 1
    assert any("no key in the JWKS has the JWT's key id; a refresh of the JWKS is scheduled" in line
               for line in failure_lines(caplog))
    idp.add_key("ghost")
    token = idp.token("ghost")
    del idp.keys["ghost"]  # never served
    refused(jwks_broker, token)
    idp.wait_for_fetches(fetches + 2)
    eventually(lambda: jwks.fetches == fetches + 2, what="the broker's refreshed JWKS")
    refused(jwks_broker, token)  # the same unknown id within a minute: refused without scheduling another fetch
    refused(jwks_broker, token)
    assert jwks._wake is not None and not jwks._wake.is_set()
    assert idp.fetches == fetches + 2
