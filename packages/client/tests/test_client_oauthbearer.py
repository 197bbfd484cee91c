"""josef's client over SASL/OAUTHBEARER: unsecured tokens from Kafka's login options, tokens from a callable, and the
client-credentials flow against a real token endpoint, on a broker whose second listener verifies tokens against the
JWKS of that identity provider (a real HTTP server on a free port of 127.0.0.1)."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest

from josef.config import ConfigError
from josef.node.runner import BrokerThread
from josef.protocol.sasl_client import SaslAuthenticationFailed
from josef.testing.oauth import IdentityProvider
from josef.testing import broker_overrides
from josef_client.admin import Admin
from josef_client.consumer import Consumer
from josef_client.producer import Producer

LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
CLIENT_SECRET = "s3cret-of-the-app"


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    with IdentityProvider(client_secrets={"app": CLIENT_SECRET}) as provider:
        provider.add_key("k1")
        yield provider


@pytest.fixture(scope="module")
def broker(idp, tmp_path_factory) -> Iterator[BrokerThread]:
    thread = BrokerThread(broker_overrides(tmp_path_factory.mktemp("data"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SECURED://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SECURED:SASL_PLAINTEXT,"
                                          "CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "OAUTHBEARER",
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": f"{LOGIN_MODULE} required;",
        "listener.name.secured.oauthbearer.sasl.jaas.config": f"{LOGIN_MODULE} required;",
        "listener.name.secured.oauthbearer.sasl.server.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        "listener.name.secured.sasl.oauthbearer.jwks.endpoint.url": idp.url,
        "listener.name.secured.sasl.oauthbearer.expected.audience": "josef"}))
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def settings(broker, listener: str, **extra: Any) -> dict[str, Any]:
    port = next(b.port for b in broker.broker.bound if b.name == listener)
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", **extra}


def produce_and_consume(config: dict[str, Any], topic: str) -> list[bytes]:
    producer = Producer(config)
    try:
        for i in range(10):
            producer.send(topic, f"{topic}-{i}".encode())
        producer.flush(30)
    finally:
        producer.close()
    consumer = Consumer({**config, "group.id": f"{topic}-group", "auto.offset.reset": "earliest"})
    seen: list[bytes] = []
    try:
        consumer.subscribe([topic])
        for _ in range(150):
            for records in consumer.poll(timeout_ms=200).values():
                seen += [r.value for r in records]
            if len(seen) >= 10:
                break
        consumer.commit()
    finally:
        consumer.close()
    return sorted(seen)


def test_unsecured_tokens_from_kafka_s_login_options_produce_and_consume_in_a_group(broker):
    config = settings(broker, "SASL_PLAINTEXT", **{"sasl.jaas.config": f'{LOGIN_MODULE} required '
                      'unsecuredLoginStringClaim_sub="alice" unsecuredLoginExtension_traceId="42";'})
    assert produce_and_consume(config, "oauth-unsecured") == sorted(f"oauth-unsecured-{i}".encode() for i in range(10))


def test_a_token_provider_s_signed_tokens_produce_and_consume_and_an_unsigned_one_is_refused(broker, idp):
    calls: list[int] = []

    def provider() -> str:
        calls.append(threading.get_ident())
        return idp.token("k1", sub="bob")
    config = settings(broker, "SECURED", **{"sasl.oauthbearer.token.provider": provider})
    assert produce_and_consume(config, "oauth-signed") == sorted(f"oauth-signed-{i}".encode() for i in range(10))
    assert calls and threading.get_ident() not in calls  # called for each connection, never on the caller's thread
    unsecured = settings(broker, "SECURED", **{"sasl.jaas.config":
                                               f'{LOGIN_MODULE} required unsecuredLoginStringClaim_sub="bob";'})
    with pytest.raises(SaslAuthenticationFailed, match='"status":"invalid_token"'):
        Admin(unsecured).list_topics()


def test_the_client_credentials_flow_gets_a_token_once_for_all_connections(broker, idp):
    config = settings(broker, "SECURED", **{
        "sasl.oauthbearer.token.endpoint.url": idp.token_url, "sasl.login.callback.handler.class": LOGIN_HANDLER,
        "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="app" clientSecret="{CLIENT_SECRET}";'})
    issued = idp.tokens_issued
    assert produce_and_consume(config, "oauth-credentials") == \
        sorted(f"oauth-credentials-{i}".encode() for i in range(10))
    assert idp.tokens_issued in (issued + 1, issued + 2)  # one per client (producer, consumer), reused by connections
    wrong = {**config, "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="app" clientSecret="hunter2";'}
    with pytest.raises(SaslAuthenticationFailed, match="cannot get an access token") as refused:
        Admin(wrong).list_topics()
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("extra, error", [
    ({}, "OAUTHBEARER needs a token"),
    ({"sasl.jaas.config": f'{LOGIN_MODULE} required unsecuredLoginStringClaim_exp="1" '
                          'unsecuredLoginStringClaim_sub="a";'}, "the exp claim is set by the login module"),
    ({"sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:9/token",
      "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="app" clientSecret="hunter2";'},
     "needs sasl.login.callback.handler.class"),
    ({"sasl.oauthbearer.token.provider": "not callable"}, "must be a callable"),
])
def test_oauthbearer_settings_that_make_no_token_fail_when_the_client_is_made(extra, error):
    with pytest.raises(ConfigError, match=error) as refused:
        Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_PLAINTEXT",
                  "sasl.mechanism": "OAUTHBEARER", **extra})
    assert "hunter2" not in str(refused.value)
