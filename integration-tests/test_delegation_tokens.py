"""Delegation tokens across a real cluster: a controller and two brokers in their own processes, every listener
SASL_SSL, the StandardAuthorizer on every node (see secured.py), ``delegation.token.secret.key`` on all of them.

alice creates a token through one broker (forwarded to the controller in an
Envelope), then a producer and a consumer group that hold only the token
(SCRAM-SHA-512 with ``tokenauth="true"``) write and read as alice, through
either broker (each derives the token's credential from the shared secret);
expired by alice, the token authenticates nowhere.

The clients are josef's own: no third-party Python client can authenticate
with a delegation token. librdkafka (confluent-kafka) knows the token APIs'
error codes but its SCRAM never sends the ``tokenauth`` extension, and neither
kafka-python's nor aiokafka's SCRAM has it.
"""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.protocol.errors import KafkaError
from josef.testing import eventually
from josef_client.admin import Admin, NewTopic, ScramCredentialUpsertion
from josef_client.consumer import Consumer
from josef_client.producer import Producer
from secured import ADMIN, ADMIN_PASSWORD, start_secured_cluster

pytestmark = pytest.mark.metadata

TOPIC, GROUP = "jobs", "job-runners"
ALICE, ALICE_PASSWORD = "alice", "alice-secret"


def settings(bootstrap: str, tls, username: str, password: str, token: bool = False) -> dict[str, str]:
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{username}" '
            f'password="{password}"' + (' tokenauth="true"' if token else "") + ";")
    return {"bootstrap.servers": bootstrap, **tls.client_properties(), "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas}


def allow(operation: AclOperation, resource_type: ResourceType = ResourceType.TOPIC, name: str = TOPIC) -> AclBinding:
    return AclBinding(resource_type, name, PatternType.LITERAL, f"User:{ALICE}", "*", operation,
                      AclPermissionType.ALLOW)


def test_a_token_made_through_one_broker_produces_and_consumes_as_its_owner_on_every_broker(josef_cluster, tmp_path):
    cluster, tls = start_secured_cluster(josef_cluster, tmp_path, controllers=1, brokers=2,
                                         **{"delegation.token.secret.key": "integration-token-secret",
                                            "offsets.topic.replication.factor": "2"})
    first, second = (node.bootstrap_server for node in cluster.brokers)
    with Admin(settings(first, tls, ADMIN, ADMIN_PASSWORD)) as admin:
        admin.alter_user_scram_credentials([ScramCredentialUpsertion(ALICE, "SCRAM-SHA-512", ALICE_PASSWORD)])
        admin.create_topics([NewTopic(TOPIC, num_partitions=2, replication_factor=2)])
        admin.create_acls([allow(AclOperation.WRITE), allow(AclOperation.READ), allow(AclOperation.DESCRIBE),
                           allow(AclOperation.READ, ResourceType.GROUP, GROUP)])

    with Admin(settings(first, tls, ALICE, ALICE_PASSWORD)) as alice:
        token = alice.create_delegation_token(renewers=[f"User:{ADMIN}"])
        assert (token.owner, token.requester, token.renewers) == ("User:alice", "User:alice", ("User:admin",))
        # The other broker learns it from the metadata log (as soon as it applies the commit, as in Kafka), and
        # shows it with the same HMAC, computed from the shared secret.
        with Admin(settings(second, tls, ADMIN, ADMIN_PASSWORD)) as renewer:
            [seen] = eventually(lambda: renewer.describe_delegation_tokens([f"User:{ALICE}"]),
                                what="the token on the other broker")
            assert (seen.token_id, seen.hmac) == (token.token_id, token.hmac)
            assert renewer.renew_delegation_token(token.hmac, renew_time_period_ms=3_600_000) <= \
                token.issue_timestamp + 3_600_000 + 60_000

    holder = settings(first, tls, token.token_id, token.hmac_base64, token=True)
    producer = Producer(holder)
    try:
        for i in range(20):
            producer.send(TOPIC, f"job-{i}".encode())
        producer.flush(30)
    finally:
        producer.close()
    consumer = Consumer({**settings(second, tls, token.token_id, token.hmac_base64, token=True),
                         "group.id": GROUP, "auto.offset.reset": "earliest"})
    seen_values: list[bytes] = []
    try:
        consumer.subscribe([TOPIC])
        for _ in range(150):
            for records in consumer.poll(timeout_ms=200).values():
                seen_values += [r.value for r in records]
            if len(seen_values) >= 20:
                break
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(seen_values) == sorted(f"job-{i}".encode() for i in range(20))
    # The token is alice and no more: a topic she may not write is refused.
    with Admin(settings(first, tls, ADMIN, ADMIN_PASSWORD)) as admin:
        admin.create_topics([NewTopic("payroll", num_partitions=1, replication_factor=2)])
    producer = Producer({**holder, "enable.idempotence": False})
    try:
        with pytest.raises(KafkaError) as refused:
            producer.send("payroll", b"nope")
        assert refused.value.code == ErrorCode.topic_authorization_failed
    finally:
        producer.close()

    with Admin(settings(second, tls, ALICE, ALICE_PASSWORD)) as alice:
        alice.expire_delegation_token(token.hmac, expiry_time_period_ms=-1)
        eventually(lambda: alice.describe_delegation_tokens() == [], what="the expired token gone")

    def refused(bootstrap: str) -> bool:
        try:
            Admin(settings(bootstrap, tls, token.token_id, token.hmac_base64, token=True)).close()
        except KafkaError as exc:
            assert exc.code == ErrorCode.sasl_authentication_failed
            return True
        return False
    for bootstrap in (first, second):  # each broker refuses it once it applied the removal
        eventually(lambda: refused(bootstrap), what=f"the expired token refused by {bootstrap}")
