"""josef's client over SASL: SCRAM-SHA-512 on SASL_SSL and PLAIN on SASL_PLAINTEXT, with ACLs deciding what it may do.

One broker with both listeners and the StandardAuthorizer; ``alice`` has a
SCRAM credential and the ACLs of a producer and a consumer of one topic.
"""

import pytest
from kio.schema.errors import ErrorCode

from josef import scram
from josef.config import ConfigError
from josef.node.runner import BrokerThread
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError
from josef.protocol.sasl_client import SaslAuthenticationFailed
from josef.testing import RawClient, broker_overrides
from josef.testing.tls import TlsFiles
from josef_client.admin import Admin
from josef_client.consumer import Consumer
from josef_client.producer import Producer

SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
PLAIN_JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_bob="bob-pw";'
TOPIC, GROUP = "client-sasl", "client-sasl-group"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tls = TlsFiles.create(tmp_path_factory.mktemp("tls"))
    thread = BrokerThread(broker_overrides(tmp_path_factory.mktemp("data"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT", **tls.broker_properties(),
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS"}))
    thread.start()
    try:
        admin = RawClient(thread.port)
        salt = scram.random_salt()
        answer = admin.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": [], "upsertions": [
            {"name": "alice", "mechanism": scram.SCRAM_SHA_512.type, "iterations": 4096, "salt": salt,
             "salted_password": scram.salted_password(scram.SCRAM_SHA_512, "alice-pw", salt, 4096)}]})
        assert answer.results[0].error_code == 0
        admin.call(ApiKey.CREATE_TOPICS, 7, {"topics": [{"name": TOPIC, "num_partitions": 2, "replication_factor": 1,
                                                         "assignments": [], "configs": []}],
                                             "timeout": 10000, "validate_only": False})
        acls = [(2, TOPIC, op) for op in (3, 4, 8)] + [(3, GROUP, 3)]  # READ, WRITE, DESCRIBE; READ on the group
        created = admin.call(ApiKey.CREATE_ACLS, 3, {"creations": [
            {"resource_type": kind, "resource_name": name, "resource_pattern_type": 3, "principal": "User:alice",
             "host": "*", "operation": op, "permission_type": 3} for kind, name, op in acls]})
        assert {r.error_code for r in created.results} == {0}
        admin.close()
        thread.tls = tls
        yield thread
    finally:
        thread.stop()


def bootstrap(broker, listener: str) -> str:
    return f"127.0.0.1:{next(b.port for b in broker.broker.bound if b.name == listener)}"


def test_scram_over_sasl_ssl_produces_and_consumes_in_a_group(broker):
    settings = {"bootstrap.servers": bootstrap(broker, "SASL_SSL"), "security.protocol": "SASL_SSL",
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(broker.tls.ca_pem),
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config":
                'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="alice-pw";'}
    producer = Producer(settings)
    try:
        for i in range(20):
            producer.send(TOPIC, f"s{i}".encode())
        producer.flush(30)
    finally:
        producer.close()
    consumer = Consumer({**settings, "group.id": GROUP, "auto.offset.reset": "earliest"})
    seen: list[bytes] = []
    try:
        consumer.subscribe([TOPIC])
        for _ in range(100):
            for records in consumer.poll(timeout_ms=200).values():
                seen += [r.value for r in records]
            if len(seen) >= 20:
                break
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(20))


def test_plain_over_sasl_plaintext_authenticates_and_acls_refuse_what_bob_was_not_granted(broker):
    settings = {"bootstrap.servers": bootstrap(broker, "SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": "bob-pw"}
    admin = Admin(settings)
    try:
        assert TOPIC not in admin.list_topics()  # bob may not describe it: Metadata leaves it out
    finally:
        admin.close()
    producer = Producer({**settings, "enable.idempotence": False})
    try:
        with pytest.raises(KafkaError) as refused:
            producer.send(TOPIC, b"nope")  # its metadata is refused before anything is sent
        assert refused.value.code == ErrorCode.topic_authorization_failed
    finally:
        producer.close()


def test_wrong_credentials_and_missing_ones_fail_clearly(broker):
    wrong = {"bootstrap.servers": bootstrap(broker, "SASL_PLAINTEXT"), "security.protocol": "SASL_PLAINTEXT",
             "sasl.mechanism": "PLAIN", "sasl.username": "bob", "sasl.password": "hunter2"}
    with pytest.raises(SaslAuthenticationFailed, match="Invalid username or password") as refused:
        Admin(wrong).list_topics()
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ConfigError, match="SASL needs a user name and password"):
        Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"})
