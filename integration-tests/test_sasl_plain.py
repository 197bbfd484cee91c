"""SASL_PLAINTEXT with PLAIN, as real clients use it: confluent-kafka, kafka-python and aiokafka against a broker process."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from round_trips import (
    aiokafka_transactional_round_trip,
    confluent_round_trip,
    confluent_transactional_round_trip,
    expected,
    kafka_python_transactional_round_trip,
)

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" '
        'user_admin="admin-secret" user_alice="alice-secret";')
SASL_OVERRIDES = {
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
}


@pytest.fixture
def sasl_broker(broker_factory):
    broker = broker_factory(**SASL_OVERRIDES)
    broker.sasl_bootstrap = broker.listener_bootstrap("SASL_PLAINTEXT")
    return broker


def confluent(broker, password: str = "alice-secret", **extra) -> dict:
    return {"bootstrap.servers": broker.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": password, **extra}


def test_confluent_kafka_produces_consumes_in_a_group_and_administers_as_alice(sasl_broker):
    assert confluent_round_trip(confluent(sasl_broker), "secured", 100) == expected("secured", 100)


def test_a_wrong_password_fails_authentication_for_confluent_kafka_and_is_not_logged(sasl_broker):
    errors: list[KafkaError] = []
    admin = AdminClient(confluent(sasl_broker, password="hunter2", error_cb=errors.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # error_cb is served by poll
    assert any(e.code() == KafkaError._AUTHENTICATION and "Authentication failed: Invalid username or password"
               in e.str() for e in errors), errors
    assert sasl_broker.wait_for_log("failed authentication with 127.0.0.1")
    assert not any("hunter2" in line or "alice-secret" in line for line in sasl_broker.log)


def test_kafka_python_administers_and_writes_a_transaction_read_in_a_group_over_sasl_plain(sasl_broker):
    settings = {"bootstrap_servers": sasl_broker.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN", "sasl_plain_username": "admin", "sasl_plain_password": "admin-secret"}
    assert sorted(kafka_python_transactional_round_trip(settings, "kp-secured")) == sorted(
        f"k{i}".encode() for i in range(20))


def test_aiokafka_administers_and_writes_a_transaction_read_in_a_group_over_sasl_plain(sasl_broker):
    settings = {"bootstrap_servers": sasl_broker.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN", "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}
    assert sorted(asyncio.run(aiokafka_transactional_round_trip(settings, "aio-secured"))) == sorted(
        f"a{i}".encode() for i in range(20))


def test_confluent_kafka_writes_a_transaction_read_in_a_group_over_sasl_plain(sasl_broker):
    assert sorted(confluent_transactional_round_trip(confluent(sasl_broker), "ck-txn-secured")) == sorted(
        f"t{i}".encode() for i in range(20))


def test_librdkafka_re_authenticates_before_its_session_ends_and_keeps_its_connection(broker_factory):
    """KIP-368 with confluent-kafka: sessions of 2 s, 6 s of producing, no connection closed for an expired session."""
    broker = broker_factory(**SASL_OVERRIDES, **{"connections.max.reauth.ms": "2000"})
    broker.sasl_bootstrap = broker.listener_bootstrap("SASL_PLAINTEXT")
    producer = Producer(confluent(broker, **{"linger.ms": 10}))
    failures: list[KafkaError] = []
    sent = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        producer.produce("reauth", f"r{sent}".encode(), on_delivery=lambda err, msg: err and failures.append(err))
        sent += 1
        producer.poll(0.02)
    assert producer.flush(30) == 0
    assert failures == [] and sent > 100
    assert not any("session expired" in line for line in broker.log), "a connection outlived its session"
