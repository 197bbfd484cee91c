"""KIP-848 consumer groups (``group.protocol=consumer``) with confluent-kafka against a josef broker.

The broker computes the assignment (server-side ``uniform`` assignor) and
hands it out through ConsumerGroupHeartbeat; partitions move between members
only after their previous owner has revoked them.

Each consumer runs in its own process (``group_workers.py`` is the worker),
so a member can be killed with SIGKILL by its PID and the broker has to
notice through the session timeout, as with a crashed client.
"""

from __future__ import annotations

import pytest
from group_workers import (
    SESSION_TIMEOUT_MS,
    TOPIC_PARTITIONS,
    committed,
    consume_committing,
    produce,
    share_and_take_over,
)


@pytest.mark.parametrize("departure", ["close", "kill"])
def test_consumers_share_six_partitions_and_take_over_from_a_leaver(broker_factory, departure):
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = broker_factory(**{"group.consumer.heartbeat.interval.ms": "500",
                               "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS)})
    bootstrap = broker.bootstrap_servers
    topic, group = f"kip848-{departure}", f"g848-{departure}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])[topic].result(30)

    # The uniform assignor is sticky: nobody loses a partition it had.
    share_and_take_over(bootstrap, group, topic, {"group.protocol": "consumer"}, departure, sticky=True)


def test_consumer_group_survives_a_broker_restart(broker_factory):
    """The member keeps its member id and partitions: the group is rebuilt from its records on load."""
    import socket

    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    broker = broker_factory(**{"listeners": f"PLAINTEXT://127.0.0.1:{port}",
                               "group.consumer.heartbeat.interval.ms": "500"})
    bootstrap = broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("durable848", TOPIC_PARTITIONS, 1)])["durable848"].result(30)
    produce(bootstrap, "durable848", 0, 60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "live848", "group.protocol": "consumer",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["durable848"])


    try:
        assert sorted(consume_committing(consumer, 60), key=lambda v: int(v[1:])) == [f"v{i}" for i in range(60)]
        member_id = consumer.memberid()
        broker.restart()
        assert broker.port == port
        produce(bootstrap, "durable848", 60, 30)
        assert sorted(consume_committing(consumer, 30), key=lambda v: int(v[1:])) == [f"v{i}" for i in range(60, 90)]
        assert consumer.memberid() == member_id
    finally:
        consumer.close()
    assert committed(bootstrap, "live848", "durable848") == {p: 15 for p in range(TOPIC_PARTITIONS)}
