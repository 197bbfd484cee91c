"""A cluster secured end to end: every listener SASL_SSL, the StandardAuthorizer on every node (issue 22).

One controller and three brokers (``secured.py``): clients log in with
SCRAM-SHA-512 over TLS, brokers authenticate to each other and to the
controller with PLAIN as ``User:broker``, a super user, as Kafka's nodes do.
Replication and leader elections run over it exactly as over PLAINTEXT
(``test_replication.py``'s chaos test runs over it too); a node without valid
credentials, or whose principal may not CLUSTER_ACTION, never joins.
"""

from __future__ import annotations

import re

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType,
                                   NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

from josef.testing import eventually
from secured import OUTSIDER, OUTSIDER_PASSWORD, client_settings, plain_jaas, start_secured_cluster
from test_replication import (FAST, Load, admin, check_every_acknowledged_record, create_topic, full_isr, partitions_of,
                              read_all, settings)

pytestmark = pytest.mark.metadata

ALICE, ALICE_PASSWORD = "alice", "alice-secret"


def test_replication_and_elections_over_sasl_ssl_with_scram_clients_and_acls(josef_cluster, tmp_path):
    cluster, tls = start_secured_cluster(josef_cluster, tmp_path / "tls", controllers=1, brokers=3, **FAST)
    as_admin = client_settings(tls)
    as_alice = client_settings(tls, ALICE, ALICE_PASSWORD)
    topic = "secured"
    client = admin(cluster, as_admin)
    # alice: a SCRAM-SHA-512 credential and ACLs for her topic and the checker's group, made by the admin.
    upsert = UserScramCredentialUpsertion(ALICE, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          ALICE_PASSWORD.encode())
    client.alter_user_scram_credentials([upsert])[ALICE].result(30)
    allow = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{ALICE}", "*", operation,
                        AclPermissionType.ALLOW) for operation in (AclOperation.CREATE, AclOperation.WRITE,
                                                                   AclOperation.READ, AclOperation.DESCRIBE)]
    allow.append(AclBinding(ResourceType.GROUP, "alice-", ResourcePatternType.PREFIXED, f"User:{ALICE}", "*",
                            AclOperation.READ, AclPermissionType.ALLOW))
    for future in client.create_acls(allow).values():
        future.result(30)
    create_topic(cluster, topic, client=as_alice)
    full_isr(cluster, topic, as_alice)
    with Load(cluster, topic, client=as_alice) as load:
        victim = cluster.node(partitions_of(cluster, topic, as_alice)[0][0])
        victim.kill()
        eventually(lambda: partitions_of(cluster, topic, as_alice)[0][0] not in (-1, victim.node_id),
                   what="a new leader")
        load.progress(on=[0])  # the partition the killed broker led takes writes again
        victim.restart()
        full_isr(cluster, topic, as_alice)  # it caught up over SASL_SSL and rejoined every ISR
        load.progress()
    records = read_all(cluster, topic, client=as_alice, group="alice-checker")
    acknowledged = check_every_acknowledged_record(load, records)
    assert acknowledged >= 3 * 300
    assert not [e for e in load.failed if e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # The restarted broker registered again through the controller's SASL_SSL listener.
    assert victim.wait_for_log("registered with broker epoch")
    assert not any("Traceback" in node.log for node in cluster.nodes)
    # The authorizer is on: alice may not create a topic her ACLs do not name.
    alices_admin = admin(cluster, as_alice)  # kept alive until the answer
    with pytest.raises(KafkaException) as caught:
        alices_admin.create_topics([NewTopic("not-alices", 1, 3)])["not-alices"].result(30)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def credentials(username: str, password: str) -> dict[str, str]:
    """A broker's own credentials towards the controller and the other brokers (PLAIN on both listeners)."""
    return {"listener.name.controller.plain.sasl.jaas.config": plain_jaas(username, password),
            "listener.name.plaintext.plain.sasl.jaas.config": plain_jaas(username, password)}


def test_a_broker_without_valid_credentials_or_cluster_action_never_joins(josef_cluster, tmp_path):
    cluster, tls = start_secured_cluster(josef_cluster, tmp_path / "tls", controllers=1, brokers=3, **FAST)
    as_admin = client_settings(tls)
    [controller] = cluster.controllers
    members = {b.node_id for b in cluster.brokers}

    # A wrong password: the controller refuses the SASL exchange, and the broker stops saying why.
    impostor = cluster.add_broker(credentials("broker", "not-the-secret"), wait=False)
    assert impostor.wait_for_log("cannot authenticate to controller 1 on CONTROLLER with PLAIN as 'broker': "
                                 "SASL_AUTHENTICATION_FAILED (58): Authentication failed: Invalid username or password",
                                 timeout=60), impostor.tail()
    assert impostor.wait() == 1
    assert controller.wait_for_log(re.compile(r"failed authentication with 127\.0\.0\.1:\d+ on CONTROLLER \(PLAIN\)"))

    # Valid credentials of a user who is no super user: authenticated, but refused CLUSTER_ACTION.
    outsider = cluster.add_broker(credentials(OUTSIDER, OUTSIDER_PASSWORD), wait=False)
    assert outsider.wait_for_log("controller 1 answered CLUSTER_AUTHORIZATION_FAILED: User:outsider may not "
                                 "CLUSTER_ACTION on the cluster", timeout=60), outsider.tail()
    assert outsider.wait() == 1

    for refused in (impostor, outsider):
        assert "registered with broker epoch" not in refused.log and "Traceback" not in refused.log
    assert "not-the-secret" not in impostor.log + controller.log
    # The cluster never listed them, and serves on: a replicated topic takes acks=all writes, read back in full.
    assert set(admin(cluster, as_admin).list_topics(timeout=10).brokers) == members
    topic = "after-refusals"
    create_topic(cluster, topic, partitions=1, client=as_admin)
    full_isr(cluster, topic, as_admin)
    producer = Producer(settings(cluster, as_admin, acks="all"))
    for i in range(100):
        producer.produce(topic, f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    records = read_all(cluster, topic, partitions=1, client=as_admin)[0]
    assert [value for _, value in records] == [f"v{i}".encode() for i in range(100)]
    assert set(admin(cluster, as_admin).list_topics(timeout=10).brokers) == members
