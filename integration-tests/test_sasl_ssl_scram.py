"""SASL_SSL with SCRAM-SHA-512, as each third-party client uses it: admin, a transaction, a group reading it back.

One broker process: a PLAINTEXT listener (the test's own setup, brokers
between themselves) and a SASL_SSL one offering SCRAM-SHA-512, whose user
``alice`` is created through AlterUserScramCredentials.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.helpers import create_ssl_context
from conftest import BrokerProcess
from kio.schema.errors import ErrorCode
from round_trips import (
    aiokafka_transactional_round_trip,
    confluent_transactional_round_trip,
    kafka_python_transactional_round_trip,
)

from josef import scram
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient
from josef.testing.tls import TlsFiles

PASSWORD = "alice-secret"


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return TlsFiles.create(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secured(tls, tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("broker"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        **tls.broker_properties(),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    }).start()
    try:
        admin = RawClient(broker.port)
        salt = scram.random_salt()
        created = admin.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": [], "upsertions": [
            {"name": "alice", "mechanism": scram.SCRAM_SHA_512.type, "iterations": 8192, "salt": salt,
             "salted_password": scram.salted_password(scram.SCRAM_SHA_512, PASSWORD, salt, 8192)}]})
        assert created.results[0].error_code == ErrorCode.none
        admin.close()
        broker.sasl_ssl = broker.listener_bootstrap("SASL_SSL")
        yield broker
    finally:
        broker.stop()
    assert not any(PASSWORD in line for line in broker.log)


def test_confluent_kafka(tls, secured):
    settings = {"bootstrap.servers": secured.sasl_ssl, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(tls.ca_pem), "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                "sasl.password": PASSWORD}
    assert sorted(confluent_transactional_round_trip(settings, "ck-scram-ssl")) == sorted(
        f"t{i}".encode() for i in range(20))


def test_kafka_python(tls, secured):
    settings = {"bootstrap_servers": secured.sasl_ssl, "security_protocol": "SASL_SSL", "ssl_cafile": str(tls.ca_pem),
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
    assert sorted(kafka_python_transactional_round_trip(settings, "kp-scram-ssl")) == sorted(
        f"k{i}".encode() for i in range(20))


def test_aiokafka(tls, secured):
    settings = {"bootstrap_servers": secured.sasl_ssl, "security_protocol": "SASL_SSL",
                "ssl_context": create_ssl_context(cafile=str(tls.ca_pem)), "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
    assert sorted(asyncio.run(aiokafka_transactional_round_trip(settings, "aio-scram-ssl"))) == sorted(
        f"a{i}".encode() for i in range(20))
