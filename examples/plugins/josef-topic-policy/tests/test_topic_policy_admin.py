"""The policy on a real broker (josef.testing's josef_broker, which loads this installed plugin), through confluent-kafka."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

POLICY = {
    "create.topic.policy.class.name": "topic-policy",
    "alter.config.policy.class.name": "topic-policy",
    "topic.policy.name.pattern": "[a-z]+[.][a-z0-9-]+",
    "topic.policy.max.partitions": "6",
    "topic.policy.min.retention.ms": "60000",
}

pytestmark = pytest.mark.josef_config(**POLICY)


def admin_for(broker) -> AdminClient:
    # librdkafka's own log lines go to Python logging (pytest shows them with a failure), not to stderr.
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers, "logger": logging.getLogger("librdkafka")})


def refusal(future) -> KafkaError:
    """The error a refused admin future carries."""
    with pytest.raises(KafkaException) as refused:
        future.result(30)
    return refused.value.args[0]


def topics(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def test_topics_the_policy_refuses_fail_with_policy_violation_and_its_reason(josef_broker):
    admin = admin_for(josef_broker)
    futures = admin.create_topics([
        NewTopic("billing.invoices", 3, 1, config={"retention.ms": "86400000"}),
        NewTopic("Invoices", 1, 1),
        NewTopic("billing.everything", 12, 1),
        NewTopic("billing.scratch", 1, 1, config={"retention.ms": "1000"}),
    ], operation_timeout=30)
    futures["billing.invoices"].result(30)
    bad_name, too_many, too_short = (refusal(futures[t]) for t in ("Invoices", "billing.everything", "billing.scratch"))
    assert {e.code() for e in (bad_name, too_many, too_short)} == {KafkaError.POLICY_VIOLATION}
    assert "'Invoices' does not match" in bad_name.str()
    assert "would have 12 partitions; at most 6 are allowed" in too_many.str()
    assert "retention.ms=1000 is below the minimum of 60000" in too_short.str()
    created = topics(admin)
    assert "billing.invoices" in created and not {"Invoices", "billing.everything", "billing.scratch"} & created


def test_validate_only_is_checked_and_creates_nothing(josef_broker):
    admin = admin_for(josef_broker)
    futures = admin.create_topics([NewTopic("billing.dry-run", 2, 1), NewTopic("dry_run", 2, 1)],
                                  validate_only=True, operation_timeout=30)
    futures["billing.dry-run"].result(30)
    assert refusal(futures["dry_run"]).code() == KafkaError.POLICY_VIOLATION
    assert not {"billing.dry-run", "dry_run"} & topics(admin)


def test_retention_below_the_floor_is_refused_when_altered(josef_broker):
    admin = admin_for(josef_broker)
    admin.create_topics([NewTopic("billing.payments", 1, 1)], operation_timeout=30)["billing.payments"].result(30)

    def set_retention(value: str):
        resource = ConfigResource("topic", "billing.payments", incremental_configs=[
            ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)])
        return admin.incremental_alter_configs([resource])[resource]

    refused = refusal(set_retention("5000"))
    assert refused.code() == KafkaError.POLICY_VIOLATION
    assert "retention.ms=5000 is below the minimum of 60000" in refused.str()
    set_retention("7200000").result(30)
    set_retention("-1").result(30)  # keep forever: above any floor
    resource = ConfigResource("topic", "billing.payments")
    described = admin.describe_configs([resource])[resource].result(30)
    assert described["retention.ms"].value == "-1"
