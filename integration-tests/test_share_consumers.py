"""confluent-kafka's ShareConsumer (librdkafka) against josef: share groups end to end (KIP-932).

Five consumers share one partition and together accept every record once;
explicit acknowledgement releases records to the others, rejects them for
good, and a record never accepted is archived at the delivery-count limit;
an acquisition lock that runs out gives the records to another member.
"""

from __future__ import annotations

import time
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

#: Records locked for 2 s, for the tests of lock expiry and renewal; the others keep Kafka's 30 s, which no slow
#: machine outlasts between a poll and its acknowledgement.
SHORT_LOCKS = {"group.share.record.lock.duration.ms": "2000", "group.share.min.record.lock.duration.ms": "1000",
               "group.share.delivery.count.limit": "3", "group.share.heartbeat.interval.ms": "500"}
LIMIT_3 = {"group.share.delivery.count.limit": "3", "group.share.heartbeat.interval.ms": "500"}


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(bootstrap: str, topic: str, count: int, per_batch: int = 1) -> list[bytes]:
    values = [b"job-%04d" % i for i in range(count)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i, value in enumerate(values):
        producer.produce(topic, value)
        if (i + 1) % per_batch == 0:
            producer.flush(10)  # small batches, so that the consumers take turns
    assert producer.flush(30) == 0
    return values


def share_consumer(bootstrap: str, group: str, **extra: str) -> ShareConsumer:
    return ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})


def joined(broker, consumers: list[ShareConsumer], topic: str, group: str) -> None:
    """Each consumer subscribed and polling until the group has them all, each with its assignment (ShareGroupDescribe).

    The group starts at the log start (share.auto.offset.reset=earliest): librdkafka sends its first ShareFetch
    when it likes, and a share partition starting at the end would skip what was produced before it."""
    set_group_config(broker, group, {"share.auto.offset.reset": "earliest"})
    for consumer in consumers:
        consumer.subscribe([topic])

    def settled() -> bool:
        for consumer in consumers:
            assert len(consumer.poll(0.1)) == 0
        client = RawClient(broker.port)
        try:
            [described] = client.call(ApiKey.SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group],
                                                                      "include_authorized_operations": False}).groups
        finally:
            client.close()
        return (described.error_code == ErrorCode.none and len(described.members) == len(consumers)
                and all(m.member_epoch == described.assignment_epoch and m.assignment.topic_partitions
                        for m in described.members))

    eventually(settled, 60, what=f"{len(consumers)} members in share group {group}")
    for consumer in consumers:  # a fetch by each, so each share session is open before records arrive
        assert len(consumer.poll(0.2)) == 0


def drain(consumers: list[ShareConsumer], want: int, timeout: float = 60) -> dict[int, list]:
    """Poll the consumers in turn until ``want`` records arrived in all (or the timeout); the messages by consumer."""
    got: dict[int, list] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout
    while sum(map(len, got.values())) < want and time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            for message in consumer.poll(0.1):
                assert message.error() is None, message.error()
                got[i].append(message)
    return got


def test_five_consumers_share_a_partition_and_accept_every_record_once(broker):
    create(broker.bootstrap_servers, "jobs")
    consumers = [share_consumer(broker.bootstrap_servers, "workers") for _ in range(5)]
    try:
        joined(broker, consumers, "jobs", "workers")
        values = produce(broker.bootstrap_servers, "jobs", 300, per_batch=3)
        got = drain(consumers, len(values))
        received = [m.value() for ms in got.values() for m in ms]
        assert sorted(received) == values, "every record once, across the five"
        assert all(got.values()), f"a consumer got nothing: {[len(ms) for ms in got.values()]}"
        assert {m.delivery_count() for ms in got.values() for m in ms} == {1}
        for consumer in consumers:  # implicit mode: the next poll accepted the last batch; nothing comes back
            assert len(consumer.poll(0.5)) == 0
    finally:
        for consumer in consumers:
            consumer.close()
    # A consumer joining later gets nothing: everything was accepted.
    late = share_consumer(broker.bootstrap_servers, "workers")
    try:
        late.subscribe(["jobs"])
        assert sum(len(late.poll(0.5)) for _ in range(8)) == 0
    finally:
        late.close()


def test_release_redelivers_to_another_member_and_reject_archives(broker_factory):
    broker = broker_factory(**LIMIT_3)
    create(broker.bootstrap_servers, "tasks")
    explicit = {"share.acknowledgement.mode": "explicit"}
    a = share_consumer(broker.bootstrap_servers, "crew", **explicit)
    b = share_consumer(broker.bootstrap_servers, "crew", **explicit)
    try:
        # b joins only once a holds the records: librdkafka fetches ahead of poll(), so a member in the group
        # would acquire records into its buffer before a asked for them.
        joined(broker, [a], "tasks", "crew")
        values = produce(broker.bootstrap_servers, "tasks", 10, per_batch=10)
        first = drain([a], 10)[0]
        assert sorted(m.value() for m in first) == values
        for m in first:  # a gives the even ones back and rejects the odd ones
            a.acknowledge(m, AcknowledgeType.RELEASE if m.offset() % 2 == 0 else AcknowledgeType.REJECT)
        a.commit_sync()
        b.subscribe(["tasks"])
        again = drain([b], 5)[0]
        assert sorted(m.offset() for m in again) == [0, 2, 4, 6, 8]
        assert {m.delivery_count() for m in again} == {2}
        for m in again:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        b.commit_sync()
        assert sum(len(c.poll(0.3)) for _ in range(6) for c in (a, b)) == 0, "a rejected record came back"
    finally:
        a.close()
        b.close()


def test_a_record_never_accepted_is_archived_at_the_delivery_count_limit(broker_factory):
    broker = broker_factory(**LIMIT_3)
    create(broker.bootstrap_servers, "poison")
    consumer = share_consumer(broker.bootstrap_servers, "careful", **{"share.acknowledgement.mode": "explicit"})
    try:
        joined(broker, [consumer], "poison", "careful")
        produce(broker.bootstrap_servers, "poison", 1)
        counts = []
        for _ in range(3):
            [message] = drain([consumer], 1)[0]
            counts.append(message.delivery_count())
            consumer.acknowledge(message, AcknowledgeType.RELEASE)
            consumer.commit_sync()
        assert counts == [1, 2, 3]
        assert sum(len(consumer.poll(0.3)) for _ in range(8)) == 0, "delivered beyond the limit"
    finally:
        consumer.close()


def test_an_expired_lock_gives_the_records_to_another_member(broker_factory):
    broker = broker_factory(**SHORT_LOCKS)  # 2 s locks
    create(broker.bootstrap_servers, "slow")
    explicit = {"share.acknowledgement.mode": "explicit"}
    stuck = share_consumer(broker.bootstrap_servers, "pool", **explicit)
    other = share_consumer(broker.bootstrap_servers, "pool", **explicit)
    try:
        joined(broker, [stuck], "slow", "pool")  # other joins later: librdkafka fetches ahead of poll()
        values = produce(broker.bootstrap_servers, "slow", 4, per_batch=4)
        before = time.monotonic()  # the records are acquired after this, and locked for 2 s from then
        held = drain([stuck], 4)[0]  # and never acknowledged
        assert sorted(m.value() for m in held) == values and {m.delivery_count() for m in held} == {1}
        other.subscribe(["slow"])
        redelivered = drain([other], 4, timeout=30)[0]
        assert sorted(m.value() for m in redelivered) == values
        assert {m.delivery_count() for m in redelivered} == {2}
        assert time.monotonic() - before >= 2.0, "redelivered before the lock could have expired"
    finally:
        stuck.close()
        other.close()


def set_group_config(broker, group: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET on the GROUP resource (type 32), as kafka-configs.sh --entity-type groups."""
    client = RawClient(broker.port)
    try:
        answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
            {"resource_type": 32, "resource_name": group, "configs": [
                {"name": k, "config_operation": 0, "value": v} for k, v in configs.items()]}]})
    finally:
        client.close()
    assert answer.responses[0].error_code == ErrorCode.none, answer


def read_values(consumer: ShareConsumer, want: int, timeout: float = 30) -> list[bytes]:
    return sorted(m.value() for m in drain([consumer], want, timeout)[0])


def test_share_auto_offset_reset_earliest_latest_and_by_duration(broker):
    create(broker.bootstrap_servers, "history")
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i, age_ms in enumerate((3 * 3_600_000, 2 * 3_600_000, 60_000, 1_000)):  # 3 h, 2 h, 1 min, 1 s ago
        producer.produce("history", b"old-%d" % i, timestamp=now - age_ms)
    assert producer.flush(10) == 0
    expected = {"earliest": 4, "by_duration:PT2H30M": 3, "by_duration:PT5M": 2, "latest": 0}
    for reset, count in expected.items():
        group = "reset-" + reset.replace(":", "-")
        set_group_config(broker, group, {"share.auto.offset.reset": reset})
        consumer = share_consumer(broker.bootstrap_servers, group)
        try:
            consumer.subscribe(["history"])
            got = drain([consumer], count, timeout=15 if count else 3)[0]
            assert len(got) == count, (reset, [m.value() for m in got])
        finally:
            consumer.close()


def test_read_committed_share_groups_never_get_aborted_records(broker):
    create(broker.bootstrap_servers, "payments")
    set_group_config(broker, "auditors", {"share.isolation.level": "read_committed",
                                          "share.auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "payer"})
    producer.init_transactions(30)
    for outcome in ("commit", "abort", "commit"):
        producer.begin_transaction()
        for i in range(3):
            producer.produce("payments", b"%s-%d" % (outcome.encode(), i))
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    consumer = share_consumer(broker.bootstrap_servers, "auditors")
    try:
        consumer.subscribe(["payments"])
        got = read_values(consumer, 6)
        assert got == sorted([b"commit-0", b"commit-1", b"commit-2"] * 2)
        assert sum(len(consumer.poll(0.3)) for _ in range(6)) == 0, "an aborted record was delivered"
    finally:
        consumer.close()


def test_josefs_share_consumer_acknowledges_renews_and_shares(broker_factory):
    """josef-client's ShareConsumer: explicit RELEASE and ACCEPT, implicit mode, and RENEW (ShareFetch v2) keeping a
    record past its lock duration while another member polls for it."""
    from josef_client.share_consumer import AcknowledgeType as Ack
    from josef_client.share_consumer import ShareConsumer as JosefShareConsumer

    lock_s = 4  # long enough for a renewal to arrive in time on a loaded machine, short enough to outlast twice
    broker = broker_factory(**{**SHORT_LOCKS, "group.share.record.lock.duration.ms": str(lock_s * 1000)})
    create(broker.bootstrap_servers, "renewals")
    holder = JosefShareConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "renewers",
                                 "share.acknowledgement.mode": "explicit"})
    other = JosefShareConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "renewers"})
    outcomes: list = []
    holder.set_acknowledgement_commit_callback(lambda offsets, error: outcomes.append((offsets, error)))
    try:
        holder.subscribe(["renewals"])
        other.subscribe(["renewals"])
        eventually(lambda: holder.assignment() and other.assignment() and not holder.poll(100)
                   and not other.poll(100), 30, what="both consumers in the group")
        produce(broker.bootstrap_servers, "renewals", 4, per_batch=4)
        held = []
        deadline = time.monotonic() + 30
        while len(held) < 4 and time.monotonic() < deadline:
            held += holder.poll(500)
        assert [r.offset for r in held] == [0, 1, 2, 3] and {r.delivery_count for r in held} == {1}
        # Release two (the other member gets them, delivered a second time), keep two past their lock.
        for record in held:
            holder.acknowledge(record, Ack.RELEASE if record.offset < 2 else Ack.RENEW)
        assert set(holder.commit_sync().values()) == {None}
        released, started = [], time.monotonic()
        while time.monotonic() - started < 2 * lock_s:
            released += other.poll(500)
            for record in held[2:]:
                holder.acknowledge(record, Ack.RENEW)
            holder.commit_sync()
        assert sorted((r.offset, r.delivery_count) for r in released) == [(0, 2), (1, 2)], "renewed records leaked"
        for record in held[2:]:
            holder.acknowledge(record, Ack.ACCEPT)
        holder.commit_sync()
        assert other.poll(1000) == [] and holder.poll(500) == []
        assert all(error is None for _, error in outcomes)
    finally:
        holder.close()
        other.close()


def josef_cli(*args: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stdout, done.stderr)
    return done.stdout


def test_the_share_group_tools(broker):
    """josef share-groups (kafka-share-groups.sh) and josef console-share-consumer against a broker process."""
    bootstrap = broker.bootstrap_servers
    create(bootstrap, "orders")
    produce(bootstrap, "orders", 5, per_batch=5)
    # The group does not exist yet: reset-offsets creates its state at the log start (dry run first).
    plan = josef_cli("share-groups", "--reset-offsets", "--bootstrap-server", bootstrap, "--group", "tools",
                     "--topic", "orders", "--to-earliest")
    assert plan.split("\n")[1].split() == ["tools", "orders", "0", "0"]
    josef_cli("share-groups", "--reset-offsets", "--bootstrap-server", bootstrap, "--group", "tools",
              "--topic", "orders", "--to-earliest", "--execute")
    printed = josef_cli("console-share-consumer", "--bootstrap-server", bootstrap, "--topic", "orders",
                        "--group", "tools", "--max-messages", "5", "--timeout-ms", "20000",
                        "--property", "print.offset=true")
    assert [line.split("\t") for line in printed.strip().split("\n")] == [[f"Offset:{i}", f"job-{i:04d}"]
                                                                          for i in range(5)]
    assert josef_cli("share-groups", "--list", "--bootstrap-server", bootstrap).split() == ["tools"]
    offsets = josef_cli("share-groups", "--describe", "--bootstrap-server", bootstrap, "--group", "tools")
    header, row = offsets.strip().split("\n")
    assert header.split() == ["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"]
    cells = row.split()
    assert cells[:3] + cells[4:] == ["tools", "orders", "0", "5", "0"]  # everything accepted: start 5, no lag
    state = josef_cli("share-groups", "--describe", "--state", "--bootstrap-server", bootstrap, "--group", "tools")
    header, row = state.strip().split("\n")
    assert header.split()[:4] == ["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY"]
    assert {"tools", "simple", "Empty"} <= set(row.split())
    deleted = josef_cli("share-groups", "--delete-offsets", "--bootstrap-server", bootstrap, "--group", "tools",
                        "--topic", "orders")
    assert deleted.strip().split("\n")[1].split() == ["orders", "Successful"]
    assert "was successful" in josef_cli("share-groups", "--delete", "--bootstrap-server", bootstrap,
                                         "--group", "tools")
    assert josef_cli("share-groups", "--list", "--bootstrap-server", bootstrap).split() == []


def test_five_josef_share_consumers_share_a_partition_and_accept_every_record_once(broker):
    from josef_client.share_consumer import ShareConsumer as JosefShareConsumer

    create(broker.bootstrap_servers, "tasks-josef")
    consumers = [JosefShareConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "josef-workers",
                                     "max.poll.records": 50}) for _ in range(5)]
    try:
        for consumer in consumers:
            consumer.subscribe(["tasks-josef"])
        joined_all = lambda: all(c.assignment() for c in consumers) and not any(c.poll(50) for c in consumers)  # noqa: E731
        eventually(joined_all, 60, what="five members with assignments")
        values = produce(broker.bootstrap_servers, "tasks-josef", 300, per_batch=3)
        got: dict[int, list] = {i: [] for i in range(5)}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < len(values) and time.monotonic() < deadline:
            for i, consumer in enumerate(consumers):
                got[i] += consumer.poll(100)
        assert sorted(r.value for rs in got.values() for r in rs) == values, "every record once, across the five"
        assert all(got.values()), f"a consumer got nothing: {[len(rs) for rs in got.values()]}"
        assert all(c.poll(300) == [] for c in consumers)  # implicit: accepted, nothing comes back
    finally:
        for consumer in consumers:
            consumer.close()
