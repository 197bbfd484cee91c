"""josef's consumer as a member of consumer groups, end to end against a real broker (the josef_broker fixture).

These need the broker's group coordinator (the josef-coordinator-group
plugin, installed in the workspace): JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit and OffsetFetch. Every wait is for a condition,
with a deadline; the polls themselves are what moves the group along.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Iterable

import pytest

from josef import hookimpl
from josef.plugins import get_plugin_manager
from josef.protocol.topic_partition import TopicPartition
from josef.node.runner import BrokerThread
from josef_client.admin import Admin, NewTopic
from josef_client.consumer import (
    AsyncConsumer,
    CommitFailedError,
    Consumer,
    ConsumerRecord,
    OffsetAndMetadata,
    RebalanceListener,
)
from josef_client.producer import Producer

#: The coordinator's first rebalance waits this long for more members (Kafka's default is 3 s).
pytestmark = pytest.mark.josef_config(**{"group.initial.rebalance.delay.ms": "0"})

DEADLINE_S = 45


def create_topic(broker: BrokerThread, name: str, partitions: int) -> None:
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def produce(broker: BrokerThread, topic: str, partitions: int, per_partition: int, tag: str = "") -> None:
    with Producer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0) as producer:
        futures = [producer.send(topic, f"{tag}{p}-{i}".encode(), partition=p)
                   for p in range(partitions) for i in range(per_partition)]
        for future in futures:
            future.result(30)


def all_partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(count)}


class Recorder(RebalanceListener):
    """Every callback, in order; they run on worker threads of the consumers."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TopicPartition]]] = []
        self._lock = threading.Lock()

    def _add(self, kind: str, partitions: list[TopicPartition]) -> None:
        assert partitions == sorted(partitions)
        with self._lock:
            self.events.append((kind, frozenset(partitions)))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._add("revoked", partitions)

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._add("assigned", partitions)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self._add("lost", partitions)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


class Member:
    def __init__(self, broker: BrokerThread, name: str, topics: Iterable[str] | None = None, *,
                 pattern: str | None = None, **config: Any) -> None:
        config.setdefault("group_id", "g")
        config.setdefault("auto_offset_reset", "earliest")
        config.setdefault("heartbeat_interval_ms", 100)
        config.setdefault("session_timeout_ms", 30000)
        config.setdefault("fetch_max_wait_ms", 100)
        config.setdefault("client_id", name)
        self.name = name
        self.consumer = Consumer(bootstrap_servers=broker.bootstrap_servers, **config)
        self.listener = Recorder()
        self.records: list[ConsumerRecord] = []
        if topics is not None or pattern is not None:
            self.consumer.subscribe(None if topics is None else list(topics), pattern=pattern, listener=self.listener)

    def poll(self, timeout_ms: int = 50) -> None:
        for records in self.consumer.poll(timeout_ms=timeout_ms).values():
            self.records.extend(records)

    def assignment(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    def close(self) -> None:
        self.consumer.close()


def poll_until(members: list[Member], condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            state = {m.name: (sorted(f"{tp.topic}-{tp.partition}" for tp in m.assignment()), len(m.records))
                     for m in members}
            raise AssertionError(f"timed out waiting for {what}; assignments and record counts: {state}")
        for member in members:
            member.poll()


def keys(records: Iterable[ConsumerRecord]) -> list[tuple[str, int, int]]:
    return [(r.topic, r.partition, r.offset) for r in records]


def shares(members: list[Member], topic: str, partitions: int, each: int) -> Callable[[], bool]:
    """The members own every partition of the topic, ``each`` apiece, with no overlap."""
    def check() -> bool:
        owned = [m.assignment() for m in members]
        return (all(len(o) == each for o in owned) and set().union(*owned) == all_partitions(topic, partitions)
                and sum(len(o) for o in owned) == partitions)
    return check


def test_three_members_share_six_partitions_and_take_over_when_one_leaves(josef_broker):
    create_topic(josef_broker, "orders", 6)
    produce(josef_broker, "orders", 6, 10, "a")
    members = [Member(josef_broker, f"c{i}", ["orders"]) for i in range(3)]
    try:
        def consumed(group: list[Member]) -> int:
            return sum(len(m.records) for m in group)

        poll_until(members, lambda: shares(members, "orders", 6, 2)() and consumed(members) >= 60,
                   "three members with two partitions each, and all 60 records")
        for m in members:
            assert m.consumer.subscription() == {"orders"}
            _, partitions = [e for e in m.listener.events if e[0] == "assigned"][-1]
            assert partitions == m.assignment()  # eager (range is first in the default strategy): all at once

        leaving = members.pop()
        left_partitions = leaving.assignment()
        leaving.close()  # commits its positions, revokes, LeaveGroup: the others need not wait for a session timeout
        assert leaving.listener.events[-1] == ("revoked", frozenset(left_partitions))

        produce(josef_broker, "orders", 6, 10, "b")
        poll_until(members, lambda: shares(members, "orders", 6, 3)() and consumed(members) + len(leaving.records) >= 120,
                   "two members with three partitions each, and all 120 records", timeout_s=25)
        assert left_partitions <= members[0].assignment() | members[1].assignment()
        # Nothing more arrives: every record was consumed exactly once, across three rebalances or more.
        end = time.monotonic() + 1
        while time.monotonic() < end:
            for m in members:
                m.poll()
        everything = keys(r for m in members + [leaving] for r in m.records)
        assert len(everything) == len(set(everything)) == 120
        assert set(everything) == {("orders", p, o) for p in range(6) for o in range(20)}
        values = sorted(r.value for m in members + [leaving] for r in m.records)
        assert values == sorted(f"{tag}{p}-{i}".encode() for tag in "ab" for p in range(6) for i in range(10))
    finally:
        for m in members:
            m.close()
    # Closing committed every position.
    with Consumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="g", enable_auto_commit=False) as check:
        committed = check.committed(all_partitions("orders", 6))
    assert {tp: om.offset for tp, om in committed.items()} == {tp: 20 for tp in all_partitions("orders", 6)}


def test_unsubscribe_hands_the_partitions_over(josef_broker):
    create_topic(josef_broker, "t", 4)
    a, b = Member(josef_broker, "a", ["t"]), Member(josef_broker, "b", ["t"])
    try:
        poll_until([a, b], shares([a, b], "t", 4, 2), "two members with two partitions each")
        owned = a.assignment()
        a.consumer.unsubscribe()
        assert a.assignment() == set() and a.consumer.subscription() == frozenset()
        assert a.listener.events[-1] == ("revoked", frozenset(owned))
        # Within much less than the 30 s session timeout: LeaveGroup made the coordinator rebalance at once.
        poll_until([b], lambda: b.assignment() == all_partitions("t", 4), "b owning everything", timeout_s=20)
        with pytest.raises(RuntimeError, match="no partitions are assigned"):
            a.consumer.poll(timeout_ms=0)
        a.consumer.assign([TopicPartition("t", 0)])  # after unsubscribe(), assign() is allowed again
        assert a.assignment() == {TopicPartition("t", 0)}
    finally:
        a.close()
        b.close()


def test_static_membership_restart_keeps_the_assignment(josef_broker):
    create_topic(josef_broker, "t", 6)
    produce(josef_broker, "t", 6, 5)
    a = Member(josef_broker, "a", ["t"], group_instance_id="instance-a", session_timeout_ms=20000)
    b = Member(josef_broker, "b", ["t"], group_instance_id="instance-b", session_timeout_ms=20000)
    restarted = None
    try:
        poll_until([a, b], lambda: shares([a, b], "t", 6, 3)() and len(a.records) + len(b.records) >= 30,
                   "two static members with three partitions each, and all records")
        before_a, before_b = a.assignment(), b.assignment()
        member_id = a.consumer.group_metadata().member_id
        assert a.consumer.group_metadata().group_instance_id == "instance-a" and member_id
        b_events = len(b.listener.events)
        a.close()  # a static member sends no LeaveGroup: its place waits for it for session.timeout.ms
        produce(josef_broker, "t", 6, 5, "new")

        restarted = Member(josef_broker, "a2", ["t"], group_instance_id="instance-a", session_timeout_ms=20000)
        poll_until([restarted, b], lambda: restarted.assignment() != set()
                   and len(a.records) + len(b.records) + len(restarted.records) >= 60,
                   "the restarted member back, and all 60 records")
        assert restarted.assignment() == before_a
        assert restarted.consumer.group_metadata().member_id != member_id
        assert b.assignment() == before_b
        assert b.listener.events[b_events:] == [], "b saw a rebalance when a static member came back"
        # The restarted member continued from what the first one committed on close.
        everything = keys(a.records + b.records + restarted.records)
        assert len(everything) == len(set(everything)) == 60
    finally:
        for m in (a, b, restarted):
            if m is not None:
                m.close()


def test_commits_survive_a_broker_restart(josef_broker):
    create_topic(josef_broker, "t", 2)
    produce(josef_broker, "t", 2, 10)
    c = Member(josef_broker, "c", ["t"], enable_auto_commit=False)
    try:
        poll_until([c], lambda: len(c.records) >= 20, "all 20 records")
        c.consumer.commit()
        assert {tp: om.offset for tp, om in c.consumer.committed(all_partitions("t", 2)).items()} == \
            {TopicPartition("t", 0): 10, TopicPartition("t", 1): 10}

        josef_broker.restart()  # same port: the member finds its coordinator again and rejoins
        produce(josef_broker, "t", 2, 5, "after")
        poll_until([c], lambda: len(c.records) >= 30, "the records produced after the restart")
        assert sorted(keys(c.records)) == [("t", p, o) for p in range(2) for o in range(15)]
        deadline = time.monotonic() + DEADLINE_S
        while True:  # right after rejoining the group may still be settling
            try:
                c.consumer.commit({TopicPartition("t", 0): 15, TopicPartition("t", 1): OffsetAndMetadata(14, "m")})
                break
            except CommitFailedError:
                assert time.monotonic() < deadline
                c.poll()
    finally:
        c.close()
    josef_broker.restart()
    with Consumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="g", enable_auto_commit=False) as check:
        committed = check.committed(all_partitions("t", 2))
    assert committed[TopicPartition("t", 0)].offset == 15
    assert (committed[TopicPartition("t", 1)].offset, committed[TopicPartition("t", 1)].metadata) == (14, "m")
    # A new member of the group starts at the committed offsets.
    again = Member(josef_broker, "again", ["t"])
    try:
        poll_until([again], lambda: len(again.records) >= 1, "the one uncommitted record")
        assert keys(again.records) == [("t", 1, 14)]
    finally:
        again.close()


def test_cooperative_rebalance_revokes_only_what_moves(josef_broker):
    create_topic(josef_broker, "t", 6)
    strategy = {"partition_assignment_strategy": ["cooperative-sticky"]}
    first = Member(josef_broker, "first", ["t"], **strategy)
    second = None
    try:
        poll_until([first], lambda: first.assignment() == all_partitions("t", 6), "the first member owning everything")
        second = Member(josef_broker, "second", ["t"], **strategy)
        poll_until([first, second], shares([first, second], "t", 6, 3), "three partitions each")
        kept = first.assignment()
        revoked = [p for kind, p in first.listener.events if kind == "revoked"]
        assert revoked == [frozenset(all_partitions("t", 6) - kept)], first.listener.events
        assert "lost" not in first.listener.kinds()
        # The second member got its partitions only after the first had revoked them (two rebalances).
        assigned = [p for kind, p in second.listener.events if kind == "assigned"]
        assert frozenset().union(*assigned) == second.assignment() and second.assignment().isdisjoint(kept)
    finally:
        first.close()
        if second is not None:
            second.close()


def test_pattern_subscriptions_follow_new_topics(josef_broker):
    create_topic(josef_broker, "orders-eu", 2)
    create_topic(josef_broker, "payments", 1)
    c = Member(josef_broker, "c", pattern=r"orders-.*", metadata_max_age_ms=200)
    try:
        poll_until([c], lambda: c.assignment() == all_partitions("orders-eu", 2), "the matching topic")
        assert c.consumer.subscription() == {"orders-eu"}
        create_topic(josef_broker, "orders-us", 3)
        produce(josef_broker, "orders-us", 3, 1)
        poll_until([c], lambda: c.assignment() == all_partitions("orders-eu", 2) | all_partitions("orders-us", 3)
                   and len(c.records) == 3, "the new matching topic and its records")
        assert c.consumer.subscription() == {"orders-eu", "orders-us"}
    finally:
        c.close()


def test_a_member_that_stops_polling_leaves_and_rejoins(josef_broker):
    create_topic(josef_broker, "t", 4)
    slow = Member(josef_broker, "slow", ["t"], max_poll_interval_ms=1500)
    fast = Member(josef_broker, "fast", ["t"])
    try:
        poll_until([slow, fast], shares([slow, fast], "t", 4, 2), "two partitions each")
        owned = slow.assignment()
        # Only fast polls: slow's heartbeat task sees max.poll.interval.ms pass and leaves the group.
        poll_until([fast], lambda: fast.assignment() == all_partitions("t", 4), "fast owning everything")
        slow.poll(timeout_ms=0)  # its partitions were lost (it could not commit), and it rejoins
        assert ("lost", frozenset(owned)) in slow.listener.events
        poll_until([slow, fast], shares([slow, fast], "t", 4, 2), "two partitions each again")
    finally:
        slow.close()
        fast.close()


def test_commit_async_callbacks_interceptors_and_fenced_commits(josef_broker):
    commits: list[dict[TopicPartition, OffsetAndMetadata]] = []

    class Spy:
        def __init__(self, config):
            pass

        def on_commit(self, offsets):
            commits.append(dict(offsets))

    class Plugin:
        @hookimpl
        def register_interceptors(self, register):
            register("spy", Spy)

    pm = get_plugin_manager(plugins=[Plugin()])
    create_topic(josef_broker, "t", 1)
    produce(josef_broker, "t", 1, 3)
    tp = TopicPartition("t", 0)

    async def main() -> None:
        async with AsyncConsumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="g",
                                 auto_offset_reset="earliest", enable_auto_commit=False, heartbeat_interval_ms=100,
                                 interceptor_classes=["spy"], plugin_manager=pm) as c:
            seen: list[tuple[Any, Any]] = []
            assigned = asyncio.Event()

            class Listener:  # any object with some of the methods; async ones are awaited
                async def on_partitions_assigned(self, partitions):
                    assigned.set()

            c.subscribe(["t"], listener=Listener())
            got = []
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < 3:
                assert time.monotonic() < deadline
                for records in (await c.poll(timeout_ms=100)).values():
                    got += records
            assert assigned.is_set()
            await c.commit_async(callback=lambda offsets, error: seen.append((offsets, error)))
            assert seen == [({tp: OffsetAndMetadata(3)}, None)]
            assert commits == [{tp: OffsetAndMetadata(3)}]
            assert (await c.committed([tp]))[tp].offset == 3
            metadata = c.group_metadata()
            assert metadata.group_id == "g" and metadata.generation_id >= 1 and metadata.member_id

            # A member fenced out of its generation cannot commit.
            c._coordinator.member.generation = metadata.generation_id + 100
            with pytest.raises(CommitFailedError):
                await c.commit({tp: 1})
            assert (await c.committed([tp]))[tp].offset == 3
            assert c.group_metadata().generation_id == -1
            # ... and the next polls rejoin, after which commits work again.
            deadline = time.monotonic() + DEADLINE_S
            while c.group_metadata().generation_id < 0 or not c._coordinator.member.stable:
                assert time.monotonic() < deadline
                await c.poll(timeout_ms=100)
            await c.commit({tp: 2})
            assert (await c.committed([tp]))[tp].offset == 2

    asyncio.run(main())


def test_auto_commit_commits_positions_in_the_background(josef_broker):
    create_topic(josef_broker, "t", 2)
    produce(josef_broker, "t", 2, 4)
    c = Member(josef_broker, "c", ["t"], auto_commit_interval_ms=200)
    try:
        poll_until([c], lambda: len(c.records) >= 8, "all 8 records")
        # No commit() and no close: polling goes on, and every auto.commit.interval.ms the positions are committed.
        poll_until([c], lambda: {tp: om and om.offset for tp, om in c.consumer.committed(all_partitions("t", 2)).items()}
                   == {TopicPartition("t", 0): 4, TopicPartition("t", 1): 4}, "the positions committed")
    finally:
        c.close()


def test_a_failing_listener_is_raised_by_poll_after_the_rebalance(josef_broker):
    create_topic(josef_broker, "t", 2)
    produce(josef_broker, "t", 2, 3)

    class Failing(RebalanceListener):
        calls = 0

        def on_partitions_assigned(self, partitions):
            Failing.calls += 1
            raise ValueError(f"listener failed on {len(partitions)} partitions")

    with Consumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="g", auto_offset_reset="earliest",
                  heartbeat_interval_ms=100) as c:
        c.subscribe(["t"], listener=Failing())
        deadline = time.monotonic() + DEADLINE_S
        with pytest.raises(ValueError, match="listener failed on 2 partitions"):
            while True:
                assert time.monotonic() < deadline, "the listener's error never came out of poll()"
                c.poll(timeout_ms=100)
        # The rebalance itself completed: the member owns its partitions and consumes them.
        assert c.assignment() == all_partitions("t", 2) and Failing.calls == 1
        got = 0
        while got < 6:
            assert time.monotonic() < deadline
            got += sum(len(r) for r in c.poll(timeout_ms=100).values())


def test_closing_while_a_join_is_pending_leaves_at_once(josef_broker):
    create_topic(josef_broker, "t", 2)
    first = Member(josef_broker, "first", ["t"])
    try:
        poll_until([first], lambda: first.assignment() == all_partitions("t", 2), "the first member owning everything")
        second = Member(josef_broker, "second", ["t"])
        second.poll(timeout_ms=200)  # sends JoinGroup, which waits for the first member to rejoin: it does not poll
        assert second.assignment() == set()
        started = time.monotonic()
        second.close()  # LeaveGroup cannot queue behind the pending JoinGroup
        assert time.monotonic() - started < 10
        poll_until([first], lambda: first.listener.kinds()[-2:] == ["revoked", "assigned"]
                   and first.assignment() == all_partitions("t", 2), "the first member alone again")
    finally:
        first.close()
