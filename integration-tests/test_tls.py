"""TLS as real clients use it: confluent-kafka, kafka-python, aiokafka and josef's own tools over SSL with client
certificates, SASL_SSL with PLAIN, and a 3-node cluster whose brokers and controllers talk TLS to each other.

One broker process serves the single-broker tests: an SSL listener that
requires client certificates (per listener) and a SASL_SSL one; each test
uses its own topics and groups.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import uuid

import pytest
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

from conftest import BrokerProcess
from round_trips import (
    aiokafka_transactional_round_trip,
    confluent_transactional_round_trip,
    kafka_python_transactional_round_trip,
    poll_values,
)
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient
from josef.testing.tls import TlsFiles

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" '
        'user_admin="admin-secret" user_alice="alice-secret";')


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return TlsFiles.create(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_broker(tls, tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("broker"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        **tls.broker_properties(),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
    })
    broker.start()
    for name in ("SSL", "SASL_SSL"):
        setattr(broker, name.lower(), broker.listener_bootstrap(name))
    try:
        yield broker
    finally:
        broker.kill()
        print("--- broker log ---\n" + "".join(broker.log[-200:]))


def confluent_ssl(tls: TlsFiles, bootstrap: str, **extra) -> dict:
    client = tls.client("confluent")
    return {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(tls.ca_pem),
            "ssl.certificate.location": str(client.certificate), "ssl.key.location": str(client.key), **extra}


def test_confluent_kafka_over_ssl_with_a_client_certificate(tls, tls_broker):
    seen = confluent_transactional_round_trip(confluent_ssl(tls, tls_broker.ssl), "cf-tls", 50)
    assert sorted(seen) == sorted(f"t{i}".encode() for i in range(50))


def test_the_ssl_listener_refuses_a_client_without_a_certificate(tls, tls_broker):
    admin = AdminClient({"bootstrap.servers": tls_broker.ssl, "security.protocol": "SSL",
                         "ssl.ca.location": str(tls.ca_pem)})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    assert tls_broker.wait_for_log("TLS handshake failed")


def test_kafka_python_over_ssl_with_a_client_certificate(tls, tls_broker):
    client = tls.client("kafka-python")
    settings = {"bootstrap_servers": tls_broker.ssl, "security_protocol": "SSL", "ssl_cafile": str(tls.ca_pem),
                "ssl_certfile": str(client.certificate), "ssl_keyfile": str(client.key)}
    seen = kafka_python_transactional_round_trip(settings, "kp-tls")
    assert sorted(seen) == sorted(f"k{i}".encode() for i in range(20))


def test_aiokafka_over_ssl_with_a_client_certificate(tls, tls_broker):
    client = tls.client("aiokafka")
    context = create_ssl_context(cafile=str(tls.ca_pem), certfile=str(client.certificate), keyfile=str(client.key))
    settings = {"bootstrap_servers": tls_broker.ssl, "security_protocol": "SSL", "ssl_context": context}
    seen = asyncio.run(aiokafka_transactional_round_trip(settings, "aio-tls"))
    assert sorted(seen) == sorted(f"a{i}".encode() for i in range(20))


def test_sasl_ssl_with_plain_for_confluent_kafka_and_kafka_python(tls, tls_broker):
    settings = {"bootstrap.servers": tls_broker.sasl_ssl, "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(tls.ca_pem), "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                "sasl.password": "alice-secret"}
    admin = AdminClient(settings)
    admin.create_topics([NewTopic("sasl-tls", 1, 1)])["sasl-tls"].result(30)
    producer = Producer({**settings, "transactional.id": "sasl-tls-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(30):
        producer.produce("sasl-tls", f"s{i}".encode())
    producer.commit_transaction(30)
    consumer = Consumer({**settings, "group.id": "sasl-tls-group", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.subscribe(["sasl-tls"])
    try:
        seen = poll_values(consumer, 30)
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(30))
    kp = KafkaConsumer("sasl-tls", group_id="kp-sasl-tls", auto_offset_reset="earliest", consumer_timeout_ms=15000,
                       bootstrap_servers=tls_broker.sasl_ssl, security_protocol="SASL_SSL",
                       ssl_cafile=str(tls.ca_pem), sasl_mechanism="PLAIN", sasl_plain_username="admin",
                       sasl_plain_password="admin-secret")
    got = []
    for message in kp:
        got.append(message.value)
        if len(got) == 30:
            break
    kp.close()
    assert sorted(got) == sorted(seen)


def test_josef_topics_over_ssl_with_command_config(tls, tls_broker, tmp_path):
    client = tls.client("josef-tool")
    properties = tmp_path / "client.properties"
    properties.write_text("".join(f"{k}={v}\n" for k, v in tls.client_properties(client).items()))

    def josef(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "josef", "topics", "--bootstrap-server", tls_broker.ssl,
                               "--command-config", str(properties), *args], capture_output=True, text=True,
                              timeout=60)

    created = josef("--create", "--topic", "tool-tls", "--partitions", "3")
    assert created.returncode == 0, created.stderr
    listed = josef("--list")
    assert listed.returncode == 0 and "tool-tls" in listed.stdout.split(), listed.stderr
    # Without its certificate the tool cannot connect, and says so in one line.
    properties.write_text("".join(f"{k}={v}\n" for k, v in tls.client_properties().items()))
    refused = josef("--list")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr


def test_a_cluster_replicates_over_ssl_between_brokers_and_controllers(tls, josef_cluster):
    # Every listener is TLS, with client certificates required: the client listener (named PLAINTEXT by the cluster
    # harness, which finds brokers by that name) is the inter-broker one, and the controllers' is CONTROLLER.
    cluster = josef_cluster(combined=3, **{
        "listener.security.protocol.map": "PLAINTEXT:SSL,CONTROLLER:SSL",
        **tls.broker_properties(), "ssl.client.auth": "required",
        "default.replication.factor": "3", "min.insync.replicas": "2", "offsets.topic.replication.factor": "3"})
    # The quorum formed over TLS: its listener takes nothing else (a plaintext request gets the connection closed).
    host, port = cluster.controllers[0].controller_address.rsplit(":", 1)
    with pytest.raises((ConnectionError, struct.error)):
        RawClient(int(port), host).call(ApiKey.API_VERSIONS, 0, {})
    settings = confluent_ssl(tls, cluster.bootstrap_servers)
    topic = f"replicated-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(settings)
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(60)
    producer = Producer({**settings, "acks": "all", "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, f"r{i}".encode())
    assert producer.flush(60) == 0
    metadata = admin.list_topics(topic, timeout=30)
    leader = metadata.topics[topic].partitions[0].leader
    assert sorted(metadata.topics[topic].partitions[0].isrs) == [1, 2, 3]
    cluster.node(leader).kill()  # SIGKILL
    survivors = ",".join(n.bootstrap_server for n in cluster.brokers if n.node_id != leader)
    consumer = Consumer({**confluent_ssl(tls, survivors), "group.id": f"after-{leader}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        seen = poll_values(consumer, 200)
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(200))
    assert not any("Traceback" in node.log for node in cluster.nodes if node.node_id != leader)


