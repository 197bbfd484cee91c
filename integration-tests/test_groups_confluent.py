"""confluent-kafka consumer groups against a josef broker: partitions shared, and taken over when a member goes.

Each consumer runs in its own process (``group_workers.py`` is the worker),
so a member can be killed with SIGKILL by its PID and the broker has to
notice through the session timeout, as with a crashed client. Each case runs
against one broker and against three with ``__consumer_offsets`` and the topic
replicated three ways (``brokers_factory``, conftest.py).
"""

from __future__ import annotations

import pytest
from group_workers import SESSION_TIMEOUT_MS, TOPIC_PARTITIONS, share_and_take_over


@pytest.mark.parametrize("departure", ["close", "kill"])
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_three_consumers_share_six_partitions_and_take_over_from_a_leaver(brokers_factory, strategy, departure):
    from confluent_kafka.admin import AdminClient, NewTopic

    broker = brokers_factory(**{"group.initial.rebalance.delay.ms": "0"})
    bootstrap = broker.bootstrap_servers
    topic, group = f"shared-{strategy}-{departure}", f"g-{strategy}-{departure}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS)])[topic].result(30)  # default.replication.factor

    settings = {"partition.assignment.strategy": strategy, "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 500}
    share_and_take_over(bootstrap, group, topic, settings, departure, sticky=strategy == "cooperative-sticky")
