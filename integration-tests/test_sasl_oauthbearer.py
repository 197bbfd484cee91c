"""SASL/OAUTHBEARER as real clients use it, against a broker process: librdkafka's unsecured tokens
(``sasl.oauthbearer.config=principal=alice`` with ``enable.sasl.oauthbearer.unsecure.jwt``) on one listener, and signed JWTs on another whose broker verifies them
against the JWKS of a real HTTP server on a free port of 127.0.0.1 (confluent-kafka's ``oauth_cb``, kafka-python's
and aiokafka's ``sasl_oauth_token_provider``)."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest
from aiokafka.abc import AbstractTokenProvider as AioTokenProvider
from confluent_kafka.admin import AdminClient
from kafka.net.sasl.oauth import AbstractTokenProvider
from josef.testing.oauth import IdentityProvider
from round_trips import (
    aiokafka_transactional_round_trip,
    confluent_round_trip,
    confluent_transactional_round_trip,
    expected,
    kafka_python_transactional_round_trip,
)

LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def signed(idp: IdentityProvider, sub: str) -> tuple[str, float]:
    """A token of ``sub`` and its expiry, as confluent-kafka's oauth_cb returns them."""
    return idp.token("idp-1", sub=sub), time.time() + idp.lifetime_s


@pytest.fixture(scope="module")
def jwks() -> Iterator[IdentityProvider]:
    with IdentityProvider() as provider:
        provider.add_key("idp-1")
        yield provider


@pytest.fixture
def oauth_broker(broker_factory, jwks):
    broker = broker_factory(**{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SECURED://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SECURED:SASL_PLAINTEXT,"
                                          "CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": f"{LOGIN_MODULE} required;",
        "listener.name.secured.oauthbearer.sasl.jaas.config": f"{LOGIN_MODULE} required;",
        "listener.name.secured.oauthbearer.sasl.server.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        "sasl.oauthbearer.jwks.endpoint.url": jwks.url,
        "sasl.oauthbearer.expected.audience": "josef",
        "sasl.oauthbearer.expected.issuer": "https://idp.test",
    })
    for name in ("SASL_PLAINTEXT", "SECURED"):
        setattr(broker, name.lower(), broker.listener_bootstrap(name))
    return broker


def test_confluent_kafka_with_librdkafka_s_unsecured_tokens(oauth_broker):
    settings = {"bootstrap.servers": oauth_broker.sasl_plaintext, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.config": "principal=alice",
                "enable.sasl.oauthbearer.unsecure.jwt": True}
    assert confluent_round_trip(settings, "oauth-rd") == expected("oauth-rd")


def test_confluent_kafka_with_signed_tokens_from_oauth_cb_and_an_unsigned_one_refused(oauth_broker, jwks):
    calls: list[str] = []

    def oauth_cb(config: str) -> tuple[str, float]:
        calls.append(config)
        return signed(jwks, "alice")
    settings = {"bootstrap.servers": oauth_broker.secured, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb}
    assert confluent_round_trip(settings, "oauth-jwks") == expected("oauth-jwks")
    assert sorted(confluent_transactional_round_trip(settings, "oauth-jwks-txn")) == sorted(
        f"t{i}".encode() for i in range(20))
    assert calls
    unsecured = {"bootstrap.servers": oauth_broker.secured, "security.protocol": "SASL_PLAINTEXT",
                 "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.config": "principal=mallory",
                 "enable.sasl.oauthbearer.unsecure.jwt": True}
    with pytest.raises(Exception):
        AdminClient(unsecured).list_topics(timeout=5)
    assert oauth_broker.wait_for_log('(OAUTHBEARER): {"status":"invalid_token"}')


class Tokens(AbstractTokenProvider):
    def __init__(self, jwks: IdentityProvider) -> None:
        self.jwks = jwks

    def token(self) -> str:
        return self.jwks.token("idp-1", sub="bob")


def test_kafka_python_with_a_token_provider(oauth_broker, jwks):
    settings = {"bootstrap_servers": oauth_broker.secured, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": Tokens(jwks)}
    assert sorted(kafka_python_transactional_round_trip(settings, "kp-oauth")) == sorted(
        f"k{i}".encode() for i in range(20))


class AioTokens(AioTokenProvider):
    def __init__(self, jwks: IdentityProvider) -> None:
        self.jwks = jwks

    async def token(self) -> str:
        return self.jwks.token("idp-1", sub="carol")


def test_aiokafka_with_a_token_provider(oauth_broker, jwks):
    settings = {"bootstrap_servers": oauth_broker.secured, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": AioTokens(jwks)}
    assert sorted(asyncio.run(aiokafka_transactional_round_trip(settings, "aio-oauth"))) == sorted(
        f"a{i}".encode() for i in range(20))
