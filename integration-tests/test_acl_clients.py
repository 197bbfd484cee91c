"""Kafka's ACLs as real clients meet them: confluent-kafka, kafka-python and aiokafka over SASL_PLAINTEXT.

The broker runs the StandardAuthorizer. ``alice`` gets what
``kafka-acls.sh --producer`` and ``--consumer`` grant (and a transactional
id); ``bob`` gets nothing and is refused with the errors these clients
report for Kafka's.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka.errors import GroupAuthorizationFailedError
from round_trips import first_error, poll_values
from kio.schema.errors import ErrorCode as E

from josef.acls import AclOperation as Op
from josef.acls import ResourceType as R
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="pw" '
        'user_alice="alice-pw" user_bob="bob-pw";')
TOPIC, GROUP, TXN = "acl-orders", "acl-billing", "acl-tx"
# What kafka-acls --producer --topic T --transactional-id X and --consumer --topic T --group G grant (Kafka's AclCommand).
ALICE = [(R.TOPIC, TOPIC, Op.WRITE), (R.TOPIC, TOPIC, Op.DESCRIBE), (R.TOPIC, TOPIC, Op.CREATE),
         (R.TRANSACTIONAL_ID, TXN, Op.WRITE), (R.TRANSACTIONAL_ID, TXN, Op.DESCRIBE),
         (R.TOPIC, TOPIC, Op.READ), (R.GROUP, GROUP, Op.READ)]


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    from conftest import BrokerProcess

    broker = BrokerProcess(tmp_path_factory.mktemp("acl-clients"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "auto.create.topics.enable": "false",
    }).start()
    try:
        broker.sasl_bootstrap = broker.listener_bootstrap("SASL_PLAINTEXT")
        admin = RawClient(broker.port)
        created = admin.call(ApiKey.CREATE_TOPICS, 5, {"topics": [
            {"name": TOPIC, "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 10000, "validate_only": False})
        assert created.topics[0].error_code == E.none
        acls = admin.call(ApiKey.CREATE_ACLS, 3, {"creations": [
            {"resource_type": kind, "resource_name": name, "resource_pattern_type": 3, "principal": "User:alice",
             "host": "*", "operation": op, "permission_type": 3} for kind, name, op in ALICE]})
        assert {r.error_code for r in acls.results} == {E.none}
        admin.close()
        yield broker
    finally:
        broker.stop()


def confluent(broker, user: str, **extra) -> dict:
    return {"bootstrap.servers": broker.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-pw", **extra}


def test_confluent_kafka_alice_produces_transactionally_and_consumes_in_her_group(acl_broker):
    producer = Producer(confluent(acl_broker, "alice", **{"transactional.id": TXN}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(TOPIC, f"t{i}".encode(), key=str(i).encode())
    producer.commit_transaction(30)
    consumer = Consumer(confluent(acl_broker, "alice", **{"group.id": GROUP, "auto.offset.reset": "earliest",
                                                          "isolation.level": "read_committed"}))
    consumer.subscribe([TOPIC])
    try:
        seen = set(poll_values(consumer, 50))
        committed = consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert seen == {f"t{i}".encode() for i in range(50)}
    assert {tp.error for tp in committed} == {None}


def test_confluent_kafka_bob_is_refused_what_he_was_not_granted(acl_broker):
    producer = Producer(confluent(acl_broker, "bob"))
    failures: list[KafkaError] = []
    producer.produce(TOPIC, b"nope", on_delivery=lambda err, msg: failures.append(err))
    producer.flush(30)
    assert [e.code() for e in failures] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    with pytest.raises(KafkaException) as refused:
        Producer(confluent(acl_broker, "bob", **{"transactional.id": TXN})).init_transactions(30)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    consumer = Consumer(confluent(acl_broker, "bob", **{"group.id": GROUP}))
    consumer.subscribe([TOPIC])
    try:
        assert first_error(consumer) == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    admin = AdminClient(confluent(acl_broker, "bob"))
    assert TOPIC not in admin.list_topics(timeout=30).topics  # Metadata hides it
    with pytest.raises(KafkaException) as create:
        admin.create_topics([NewTopic("bobs-topic", 1, 1)])["bobs-topic"].result(30)
    assert create.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_kafka_python_consumer_without_group_read_is_refused(acl_broker):
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=acl_broker.sasl_bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password="bob-pw",
                             group_id=GROUP, consumer_timeout_ms=10000)
    try:
        with pytest.raises(GroupAuthorizationFailedError, match=GROUP):
            consumer.poll(timeout_ms=10000)
    finally:
        consumer.close()


def test_aiokafka_producer_without_write_is_refused(acl_broker):
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=acl_broker.sasl_bootstrap, security_protocol="SASL_PLAINTEXT",
                                    sasl_mechanism="PLAIN", sasl_plain_username="bob", sasl_plain_password="bob-pw")
        await producer.start()
        try:
            with pytest.raises(AioTopicAuthorizationFailed):
                await producer.send_and_wait(TOPIC, b"nope")
        finally:
            await producer.stop()

    asyncio.run(run())
