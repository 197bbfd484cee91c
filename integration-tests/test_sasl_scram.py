"""SASL_PLAINTEXT with SCRAM, as real clients use it: users made with ``josef configs`` or ``josef storage format --add-scram``.

One broker process for the module, with SCRAM-SHA-256 and SCRAM-SHA-512 on
its SASL_PLAINTEXT listener and a PLAINTEXT one for the tools (josef's own
client has no SASL yet). ``josef configs --alter`` creates alice's
credentials before any client connects: confluent-kafka, kafka-python and
aiokafka then produce, consume in a group and make an admin call as alice.
A second broker starts from log directories formatted with ``--add-scram``:
its admin can log in at once.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from round_trips import confluent_round_trip, expected

pytestmark = pytest.mark.metadata

SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
SCRAM_OVERRIDES = {
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
}
PASSWORD = "alice-secret"
TIMEOUT_S = 60


def josef(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory):
    from conftest import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("scram-broker"), **SCRAM_OVERRIDES).start()
    try:
        broker.sasl_bootstrap = broker.listener_bootstrap("SASL_PLAINTEXT")
        b = ("--bootstrap-server", broker.bootstrap_servers)
        for credential in ("SCRAM-SHA-512=[iterations=8192,password=alice-secret]", "SCRAM-SHA-256=[password=alice-secret]"):
            created = josef("configs", *b, "--alter", "--add-config", credential, "--entity-type", "users",
                            "--entity-name", "alice")
            assert (created.returncode, created.stdout, created.stderr) == (
                0, "Completed updating config for user alice.\n", "")
        yield broker
    finally:
        broker.stop()
        print("--- broker log ---\n" + "".join(broker.log[-200:]))


def test_josef_configs_describes_alters_and_deletes_credentials_as_kafka_configs_does(scram_broker):
    b = ("--bootstrap-server", scram_broker.bootstrap_servers)
    described = josef("configs", *b, "--describe", "--entity-type", "users", "--entity-name", "alice")
    assert described.stdout == ("SCRAM credential configs for user-principal 'alice' are "
                                "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=8192\n")
    # Kafka's controller takes one change per user and request: two mechanisms at once are refused.
    both = josef("configs", *b, "--alter", "--entity-type", "users", "--entity-name", "carol", "--add-config",
                 "SCRAM-SHA-512=[iterations=8192,password=carol-secret],SCRAM-SHA-256=[password=carol-secret]")
    assert both.returncode == 1 and "A user credential cannot be altered twice in the same request" in both.stderr
    assert josef("configs", *b, "--alter", "--entity-type", "users", "--entity-name", "carol",
                 "--add-config", "SCRAM-SHA-256=[password=carol-secret]").returncode == 0
    assert josef("configs", *b, "--alter", "--entity-type", "users", "--entity-name", "carol",
                 "--delete-config", "SCRAM-SHA-256").stdout == "Completed updating config for user carol.\n"
    gone = josef("configs", *b, "--alter", "--entity-type", "users", "--entity-name", "carol",
                 "--delete-config", "SCRAM-SHA-256")
    assert gone.returncode == 1 and "Attempt to delete a user credential that does not exist" in gone.stderr
    low = josef("configs", *b, "--alter", "--entity-type", "users", "--entity-name", "carol",
                "--add-config", "SCRAM-SHA-256=[iterations=100,password=carol-secret]")
    assert low.stderr == "Error: Iterations 100 is less than the minimum 4096 required for SCRAM-SHA-256\n"
    everyone = josef("configs", *b, "--describe", "--entity-type", "users").stdout
    assert everyone.splitlines() == ["SCRAM credential configs for user-principal 'alice' are "
                                     "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=8192"]
    assert not any("alice-secret" in line or "carol-secret" in line for line in scram_broker.log)


def confluent(broker, mechanism: str = "SCRAM-SHA-512", user: str = "alice", password: str = PASSWORD,
              **extra) -> dict:
    return {"bootstrap.servers": broker.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **extra}


def test_confluent_kafka_administers_produces_and_consumes_in_a_group_with_scram_sha_512(scram_broker):
    assert confluent_round_trip(confluent(scram_broker), "scram-secured") == expected("scram-secured")


def test_a_wrong_password_fails_in_kafka_s_words_for_confluent_kafka(scram_broker):
    errors: list[KafkaError] = []
    admin = AdminClient(confluent(scram_broker, password="hunter2", error_cb=errors.append))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # error_cb is served by poll
    assert any(e.code() == KafkaError._AUTHENTICATION and "Authentication failed during authentication due to "
               "invalid credentials with SASL mechanism SCRAM-SHA-512" in e.str() for e in errors), errors
    assert scram_broker.wait_for_log("failed authentication with 127.0.0.1")
    assert not any("hunter2" in line for line in scram_broker.log)


def test_kafka_python_produces_and_consumes_in_a_group_with_scram_sha_512(scram_broker):
    settings = {"bootstrap_servers": scram_broker.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}
    producer = KafkaProducer(**settings)
    for i in range(20):
        producer.send("kp-scram", f"k{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("kp-scram", group_id="kp-scram-group", auto_offset_reset="earliest",
                             consumer_timeout_ms=15000, **settings)
    values = {m.value for _, m in zip(range(20), consumer)}
    consumer.close()
    assert values == {f"k{i}".encode() for i in range(20)}


def test_aiokafka_administers_produces_and_consumes_in_a_group_with_scram_sha_256(scram_broker):
    settings = {"bootstrap_servers": scram_broker.sasl_bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD}

    async def run() -> tuple[set[bytes], list[str]]:
        admin = AIOKafkaAdminClient(**settings)
        await admin.start()
        try:
            topics = await admin.list_topics()
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**settings)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait("aio-scram", f"a{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("aio-scram", group_id="aio-scram-group", auto_offset_reset="earliest", **settings)
        await consumer.start()
        values: set[bytes] = set()
        try:
            async with asyncio.timeout(30):
                async for message in consumer:
                    values.add(message.value)
                    if len(values) == 20:
                        break
        finally:
            await consumer.stop()
        return values, topics

    values, topics = asyncio.run(run())
    assert values == {f"a{i}".encode() for i in range(20)}
    assert isinstance(topics, list)


def test_an_admin_added_at_format_time_logs_in_at_once(broker_factory, tmp_path: Path):
    data_dir = tmp_path / "formatted"
    properties = tmp_path / "server.properties"
    properties.write_text(f"log.dirs={data_dir}\n" + "".join(f"{k}={v}\n" for k, v in SCRAM_OVERRIDES.items()))
    cluster_id = josef("storage", "random-uuid").stdout.strip()
    formatted = josef("storage", "format", "-t", cluster_id, "-c", str(properties),
                      "--add-scram", "SCRAM-SHA-256=[name=admin,password=admin-secret]")
    assert formatted.returncode == 0, formatted.stderr
    broker = broker_factory(data_dir, **SCRAM_OVERRIDES)
    broker.sasl_bootstrap = broker.listener_bootstrap("SASL_PLAINTEXT")
    admin = AdminClient(confluent(broker, "SCRAM-SHA-256", "admin", "admin-secret"))
    admin.create_topics([NewTopic("from-the-start", 1, 1)])["from-the-start"].result(30)
    assert "from-the-start" in admin.list_topics(timeout=10).topics
    assert not any("admin-secret" in line for line in broker.log)
