"""``josef consumer-groups`` as a user runs it: ``python -m josef consumer-groups ...`` against a broker process.

Needs the broker's group coordinator (the josef-coordinator-group plugin).
"""

import time

import pytest
from test_cli import closed_port, josef, ok, one_line_error

from josef_client import Admin, Consumer, NewTopic, Producer, TopicPartition

DEADLINE_S = 60
PARTITIONS = [TopicPartition("orders", p) for p in range(3)]


@pytest.fixture
def broker(broker_factory):
    return broker_factory(**{"group.initial.rebalance.delay.ms": "0"})


@pytest.fixture
def orders(broker):
    """Topic orders: three partitions of ten records each."""
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic("orders", 3, 1)])
    with Producer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0) as producer:
        futures = [producer.send("orders", b"v", partition=p) for p in range(3) for _ in range(10)]
        for future in futures:
            future.result(30)
    return broker


def member(broker, group="billing"):
    return Consumer(bootstrap_servers=broker.bootstrap_servers, group_id=group, client_id="billing-client",
                    auto_offset_reset="earliest", enable_auto_commit=False, heartbeat_interval_ms=200,
                    fetch_max_wait_ms=100)


def consume_all(consumer, count):
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < count:
        assert time.monotonic() < deadline, f"only {got} of {count} records arrived"
        got += sum(len(r) for r in consumer.poll(timeout_ms=100).values())
    return got


def committed(broker, group="billing"):
    with Consumer(bootstrap_servers=broker.bootstrap_servers, group_id=group, enable_auto_commit=False) as c:
        found = c.committed(PARTITIONS)
    return {tp.partition: (om.offset if om else None) for tp, om in found.items()}


def rows(stdout):
    """The table lines after the header, split into columns."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[0].split(), [line.split() for line in lines[1:]]


def test_list_describe_reset_and_delete(orders):
    b = ("--bootstrap-server", orders.bootstrap_servers)
    consumer = member(orders)
    try:
        consumer.subscribe(["orders"])
        consume_all(consumer, 30)
        consumer.commit({PARTITIONS[0]: 10, PARTITIONS[1]: 7})  # partition 2: nothing committed

        assert ok("consumer-groups", "list", *b).stdout == "billing\n"
        assert ok("consumer-groups", "--list", *b).stdout == "billing\n"  # Kafka's spelling
        listed = ok("consumer-groups", "list", *b, "--state").stdout.splitlines()
        assert listed[0].split() == ["GROUP", "STATE"] and listed[1].split() == ["billing", "Stable"]
        assert ok("consumer-groups", "list", *b, "--state", "Empty,Dead").stdout.split() == ["GROUP", "STATE"]

        described = ok("consumer-groups", "describe", *b, "--group", "billing")
        header, table = rows(described.stdout)
        assert described.stdout.startswith("\n")
        assert header == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                          "HOST", "CLIENT-ID"]
        member_id = consumer.group_metadata().member_id
        assert [r[:7] + r[8:] for r in table] == [
            ["billing", "orders", "0", "10", "10", "0", member_id, "billing-client"],
            ["billing", "orders", "1", "7", "10", "3", member_id, "billing-client"],
            ["billing", "orders", "2", "-", "10", "-", member_id, "billing-client"],
        ]
        assert all("127.0.0.1" in r[7] for r in table)

        members = ok("consumer-groups", "describe", *b, "--group", "billing", "--members", "--verbose")
        header, table = rows(members.stdout)
        assert header == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
        assert table[0][0:2] == ["billing", member_id] and table[0][3:] == ["billing-client", "3", "orders(0,1,2)"]
        state = ok("consumer-groups", "describe", *b, "--group", "billing", "--state")
        assert rows(state.stdout) == (["GROUP", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                                      [["billing", "range", "Stable", "1"]])

        # An active group's offsets cannot be reset, nor can it be deleted.
        one_line_error(josef("consumer-groups", "reset-offsets", *b, "--group", "billing", "--topic", "orders",
                             "--to-earliest", "--execute"), r"can only be reset if the group 'billing' is inactive.*Stable")
        one_line_error(josef("consumer-groups", "delete", *b, "--group", "billing"), r"'billing'.*not empty")
    finally:
        consumer.close()

    described = ok("consumer-groups", "describe", *b, "--group", "billing")
    assert "Consumer group 'billing' has no active members." in described.stderr
    assert rows(described.stdout)[1] == [["billing", "orders", "0", "10", "10", "0", "-", "-", "-"],
                                         ["billing", "orders", "1", "7", "10", "3", "-", "-", "-"]]

    # Without --execute: the plan, and nothing changes.
    plan = ok("consumer-groups", "reset-offsets", *b, "--group", "billing", "--topic", "orders", "--to-earliest")
    assert rows(plan.stdout) == (["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                                 [["billing", "orders", str(p), "0"] for p in range(3)])
    assert "--execute" in plan.stderr
    assert committed(orders) == {0: 10, 1: 7, 2: None}
    ok("consumer-groups", "reset-offsets", *b, "--group", "billing", "--topic", "orders", "--to-earliest", "--dry-run")
    assert committed(orders) == {0: 10, 1: 7, 2: None}

    def reset(*how, topic=("--topic", "orders")):
        result = ok("consumer-groups", "--reset-offsets", *b, "--group", "billing", *topic, *how, "--execute")
        return {int(r[2]): int(r[3]) for r in rows(result.stdout)[1]}

    assert reset("--to-earliest") == {0: 0, 1: 0, 2: 0} and committed(orders) == {0: 0, 1: 0, 2: 0}
    assert reset("--shift-by", "4") == {0: 4, 1: 4, 2: 4}
    assert reset("--shift-by", "-6") == {0: 0, 1: 0, 2: 0}  # clamped to the log start
    assert reset("--to-offset", "25") == {0: 10, 1: 10, 2: 10}  # clamped to the log end
    assert reset("--to-offset", "3", topic=("--topic", "orders:1,2")) == {1: 3, 2: 3}
    assert committed(orders) == {0: 10, 1: 3, 2: 3}
    assert reset("--to-datetime", "2000-01-01T00:00:00.000") == {0: 0, 1: 0, 2: 0}  # before every record
    assert reset("--to-datetime", "2999-01-01T00:00:00.000Z") == {0: 10, 1: 10, 2: 10}  # after every record
    assert reset("--to-earliest", topic=("--all-topics",)) == {0: 0, 1: 0, 2: 0}
    assert reset("--to-latest") == {0: 10, 1: 10, 2: 10}
    assert reset("--by-duration", "P1D") == {0: 0, 1: 0, 2: 0}
    assert reset("--to-current") == {0: 0, 1: 0, 2: 0}
    assert committed(orders) == {0: 0, 1: 0, 2: 0}

    # A member of the group now starts where the reset put it.
    consumer = member(orders)
    try:
        consumer.subscribe(["orders"])
        assert consume_all(consumer, 30) == 30
    finally:
        consumer.close()

    assert ok("consumer-groups", "delete", *b, "--group", "billing").stdout == \
        "Deletion of requested consumer groups ('billing') was successful.\n"
    assert ok("consumer-groups", "list", *b).stdout == ""
    assert committed(orders) == {0: None, 1: None, 2: None}


def test_bad_input_is_one_error_line(orders):
    b = ("--bootstrap-server", orders.bootstrap_servers)
    one_line_error(josef("consumer-groups", "describe", *b), r"--group GROUP .* or --all-groups")
    one_line_error(josef("consumer-groups", "describe", *b, "--group", "nobody"), r"consumer group 'nobody' does not exist")
    one_line_error(josef("consumer-groups", "delete", *b, "--group", "nobody"), r"'nobody'.*does not exist")
    reset = ("consumer-groups", "reset-offsets", *b, "--group", "g")
    one_line_error(josef(*reset, "--topic", "orders"), r"exactly one of --to-earliest")
    one_line_error(josef(*reset, "--topic", "orders", "--to-earliest", "--to-latest"),
                   r"exactly one of .*\(got --to-earliest, --to-latest\)")
    one_line_error(josef(*reset, "--to-earliest"), r"--topic TOPIC .* or --all-topics")
    one_line_error(josef(*reset, "--topic", "orders", "--shift-by", "two"), r"--shift-by.*'two' is not a valid integer")
    one_line_error(josef(*reset, "--topic", "orders:x", "--to-earliest"), r"invalid --topic 'orders:x'")
    one_line_error(josef(*reset, "--topic", "orders", "--to-datetime", "yesterday"), r"invalid --to-datetime 'yesterday'")
    one_line_error(josef(*reset, "--topic", "orders", "--by-duration", "1 day"), r"invalid --by-duration")
    one_line_error(josef(*reset, "--topic", "orders", "--to-offset", "-1"), r"offsets cannot be negative")
    one_line_error(josef(*reset, "--topic", "nope", "--to-earliest"), r"topic 'nope' does not exist")
    one_line_error(josef(*reset, "--topic", "orders:7", "--to-earliest"), r"topic 'orders' has no partition 7")
    one_line_error(josef(*reset, "--topic", "orders", "--shift-by", "1"), r"cannot shift .* no committed offset")
    one_line_error(josef("consumer-groups", "list", "--bootstrap-server", f"127.0.0.1:{closed_port()}"),
                   r"127\.0\.0\.1")
    one_line_error(josef("consumer-groups", "--list", "--describe", *b), r"give only one of")
