"""group.protocol=consumer (KIP-848): josef's ConsumerGroupMember against a fake group coordinator.

These are unit tests of josef_client.group_consumer: the coordinator is a
small in-process fake answering ConsumerGroupHeartbeat (its assignment logic
is a plain round robin that, as Kafka's does, gives a partition to its new
owner only once the previous owner has reported it no longer owns it).
Offsets (OffsetFetch, OffsetCommit) and topic ids (Metadata) are stubbed on
the consumer and the member; no broker runs.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import KafkaError
from josef.protocol.topic_partition import TopicPartition
from josef_client.consumer import (
    AsyncConsumer,
    CommitFailedError,
    OffsetAndMetadata,
    RebalanceListener,
)
from josef_client.group_consumer import ConsumerGroupMember

TOPIC = "orders"
TOPIC_ID = uuid.UUID(int=0x6f72)
IDS = {TOPIC: TOPIC_ID}


def tp(partition: int, topic: str = TOPIC) -> TopicPartition:
    return TopicPartition(topic, partition)


class Recorder(RebalanceListener):
    def __init__(self, log: list[tuple[str, Any]] | None = None) -> None:
        self.events: list[tuple[str, list[TopicPartition]]] = []
        self.log = log

    def _add(self, name: str, partitions: list[TopicPartition]) -> None:
        self.events.append((name, list(partitions)))
        if self.log is not None:
            self.log.append((name, list(partitions)))

    def on_partitions_revoked(self, partitions: list[TopicPartition]) -> None:
        self._add("revoked", partitions)

    def on_partitions_assigned(self, partitions: list[TopicPartition]) -> None:
        self._add("assigned", partitions)

    def on_partitions_lost(self, partitions: list[TopicPartition]) -> None:
        self._add("lost", partitions)


def response(error: ErrorCode = ErrorCode.none, *, member_id: str | None = None, epoch: int = 1,
             interval: int = 50, assignment: dict[uuid.UUID, list[int]] | None = None) -> SimpleNamespace:
    assigned = None
    if assignment is not None:
        assigned = SimpleNamespace(topic_partitions=[SimpleNamespace(topic_id=i, partitions=ps)
                                                     for i, ps in assignment.items()])
    return SimpleNamespace(error_code=error, error_message=None, member_id=member_id, member_epoch=epoch,
                           heartbeat_interval=interval, assignment=assigned)


class FakeCoordinator:
    """ConsumerGroupHeartbeat, KIP-848 style, for one topic: epochs, round-robin targets, revocation before reassignment."""

    def __init__(self, partitions: int, version: int = 1) -> None:
        self.partitions = partitions
        self.version = version
        self.epoch = 0  # the group epoch
        self.members: dict[str, dict[str, Any]] = {}  # member id -> epoch, owned, target
        self.requests: list[dict[str, Any]] = []
        self.fail_next: dict[str, ErrorCode] = {}
        self.committed: dict[TopicPartition, int] = {}

    def _rebalance(self) -> None:
        self.epoch += 1
        ids = sorted(self.members)
        for index, member in enumerate(ids):
            self.members[member]["target"] = {p for p in range(self.partitions) if p % len(ids) == index}

    def heartbeat(self, body: dict[str, Any]) -> SimpleNamespace:
        self.requests.append(body)
        member_id = body["member_id"] or f"server-{len(self.requests)}"
        if member_id in self.fail_next:
            return response(self.fail_next.pop(member_id), epoch=-1)
        epoch = body["member_epoch"]
        if epoch < 0:
            self.members.pop(member_id, None)
            if self.members:
                self._rebalance()
            return response(member_id=member_id, epoch=epoch)
        if epoch == 0:
            self.members[member_id] = {"epoch": 0, "owned": set(), "target": set()}
            self._rebalance()
        elif member_id not in self.members:
            return response(ErrorCode.unknown_member_id, epoch=-1)
        elif epoch != self.members[member_id]["epoch"]:
            return response(ErrorCode.fenced_member_epoch, epoch=-1)
        member = self.members[member_id]
        if body["topic_partitions"] is not None:
            member["owned"] = {p for t in body["topic_partitions"] for p in t["partitions"]}
        owned_elsewhere = {p for m, other in self.members.items() if m != member_id for p in other["owned"]}
        assignable = {p for p in member["target"] if p not in owned_elsewhere}
        # Kafka's member gets its new epoch once it has revoked what is no longer its own.
        if not (member["owned"] - member["target"]):
            member["epoch"] = self.epoch
        member["assigned"] = assignable | (member["owned"] & member["target"])
        return response(member_id=member_id, epoch=member["epoch"],
                        assignment={TOPIC_ID: sorted(member["assigned"])})


class FakeConnection:
    def __init__(self, coordinator: FakeCoordinator) -> None:
        self.coordinator = coordinator
        self.closed = False

    def version(self, api_key: int) -> int:
        assert api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT
        return self.coordinator.version

    def send(self, api_key: int, body: dict[str, Any], *, version: int) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        future.set_result(self.coordinator.heartbeat(body))
        return future

    async def close(self) -> None:
        self.closed = True


def make_member(coordinator: FakeCoordinator, listener: Any = None, *, auto_commit: bool = True,
                **config: Any) -> tuple[AsyncConsumer, ConsumerGroupMember, list[Any]]:
    consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="consumer",
                             enable_auto_commit=auto_commit, **config)
    consumer.subscribe([TOPIC], listener=listener)
    member = consumer._coordinator.member
    assert isinstance(member, ConsumerGroupMember)
    commits: list[Any] = []
    conn = FakeConnection(coordinator)

    async def ensure_coordinator() -> FakeConnection:
        return conn

    async def refresh_topic_ids() -> None:
        member._topic_ids.update(IDS)
        member._topic_names.update({v: k for k, v in IDS.items()})

    async def committed(partitions: list[TopicPartition], timeout_ms: int = 0) -> dict[TopicPartition, Any]:
        return {p: OffsetAndMetadata(coordinator.committed[p]) if p in coordinator.committed else None
                for p in partitions}

    async def commit(offsets: dict[TopicPartition, OffsetAndMetadata], timeout_ms: float) -> None:
        epoch, member_id, _ = member.commit_identity()
        commits.append((dict(offsets), epoch, member_id))
        coordinator.committed.update({p: o.offset for p, o in offsets.items()})

    member._ensure_coordinator = ensure_coordinator  # type: ignore[method-assign]
    member._refresh_topic_ids = refresh_topic_ids  # type: ignore[method-assign]
    member.coordinator_dead = lambda why: None  # type: ignore[method-assign]
    consumer.committed = committed  # type: ignore[method-assign]
    consumer._coordinator.commit = commit  # type: ignore[method-assign]
    return consumer, member, commits


def owned(consumer: AsyncConsumer) -> set[TopicPartition]:
    return set(consumer._subscriptions.states)


# Configuration ------------------------------------------------------------------------------------


def test_consumer_protocol_selects_the_kip848_member_and_rejects_classic_only_settings() -> None:
    consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="consumer",
                             group_remote_assignor="uniform")
    consumer.subscribe(["t"])
    assert isinstance(consumer._coordinator.member, ConsumerGroupMember)
    assert consumer._coordinator.member.server_assignor == "uniform"
    assert consumer._assignors == []
    for name, value in (("partition_assignment_strategy", ["range"]), ("session_timeout_ms", 10000),
                        ("heartbeat_interval_ms", 1000)):
        with pytest.raises(ConfigError, match=f"{name.replace('_', '.')} is not supported with group.protocol=consumer"):
            AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="consumer", **{name: value})
    with pytest.raises(ConfigError, match="partition.assignment.strategy is not supported"):
        AsyncConsumer({"bootstrap.servers": "localhost:1", "group.id": "g", "group.protocol": "consumer",
                       "partition.assignment.strategy": "range"})
    with pytest.raises(ConfigError, match="group.remote.assignor is only used with group.protocol=consumer"):
        AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_remote_assignor="uniform")


# The heartbeat request ----------------------------------------------------------------------------


def test_join_heartbeat_carries_a_client_member_id_epoch_0_the_subscription_and_the_assignor() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(3)
        consumer, member, _ = make_member(coordinator, group_remote_assignor="range", client_rack="r1")
        await member.heartbeat_once()
        [join] = coordinator.requests
        assert join["member_epoch"] == 0 and join["group_id"] == "g"
        assert str(uuid.UUID(join["member_id"])) == join["member_id"]  # v1: a client-generated UUID
        assert join["subscribed_topic_names"] == [TOPIC] and join["subscribed_topic_regex"] is None
        assert join["server_assignor"] == "range" and join["rack_id"] == "r1"
        assert join["topic_partitions"] == [] and join["rebalance_timeout"] == 300000
        assert member.member_id == join["member_id"] and member.member_epoch == 1
        await member.close()
        leave = coordinator.requests[-1]
        assert leave["member_epoch"] == -1 and leave["member_id"] == join["member_id"]

    asyncio.run(main())


def test_v0_uses_the_member_id_the_coordinator_assigns_and_static_members_leave_with_epoch_minus_2() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(2, version=0)
        consumer, member, _ = make_member(coordinator, group_instance_id="i-1")
        await member.heartbeat_once()
        join = coordinator.requests[0]
        assert join["member_id"] == "" and "subscribed_topic_regex" not in join and join["instance_id"] == "i-1"
        assert member.member_id == "server-1"
        await member.heartbeat_once()
        assert coordinator.requests[1]["member_id"] == "server-1"
        await member.close()
        assert coordinator.requests[-1]["member_epoch"] == -2

    asyncio.run(main())


def test_pattern_subscriptions_send_the_regex_from_v1() -> None:
    async def main() -> None:
        consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="consumer")
        consumer.subscribe(pattern="ord.*")
        member = consumer._coordinator.member
        assert isinstance(member, ConsumerGroupMember)
        body = await member._heartbeat_body(0, 1)
        assert body["subscribed_topic_regex"] == "ord.*" and body["subscribed_topic_names"] == []

    asyncio.run(main())


# Reconciliation -----------------------------------------------------------------------------------


def test_assignment_is_added_with_committed_offsets_or_reset_and_then_acknowledged() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(3)
        coordinator.committed[tp(1)] = 42
        listener = Recorder()
        consumer, member, _ = make_member(coordinator, listener)
        await member.heartbeat_once()
        assert member.target == {tp(0), tp(1), tp(2)}
        assert not member.stable
        await member.poll()
        assert owned(consumer) == {tp(0), tp(1), tp(2)}
        assert listener.events == [("assigned", [tp(0), tp(1), tp(2)])]
        assert consumer._subscriptions.states[tp(1)].position == 42
        assert consumer._subscriptions.states[tp(0)].reset == "latest" and consumer._subscriptions.states[tp(2)].reset == "latest"
        assert member.stable
        assert member._hb_wake.is_set()  # the next heartbeat goes at once, reporting what is owned
        body = await member._heartbeat_body(member.member_epoch, 1)
        assert body["topic_partitions"] == [{"topic_id": TOPIC_ID, "partitions": [0, 1, 2]}]
        assert member.commit_identity() == (1, member.member_id, None)
        await member._cancel_tasks()

    asyncio.run(main())


def test_revocation_commits_calls_the_listener_then_reports_the_smaller_assignment() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(4)
        log: list[Any] = []
        listener = Recorder(log)
        consumer, member, commits = make_member(coordinator, listener)
        await member.handle_response(response(member_id="m", epoch=1, assignment={TOPIC_ID: [0, 1, 2, 3]}))
        await member.reconcile()
        for p in range(4):
            consumer.seek(tp(p), 10 + p)
        await member.handle_response(response(member_id="m", epoch=2, assignment={TOPIC_ID: [0, 2]}))
        member._hb_wake.clear()
        await member.reconcile()
        assert owned(consumer) == {tp(0), tp(2)}
        # on_partitions_assigned follows every reconciliation, with what was added (here nothing), as classic does.
        assert listener.events[-2:] == [("revoked", [tp(1), tp(3)]), ("assigned", [])]
        [(offsets, epoch, member_id)] = commits
        assert offsets == {tp(1): OffsetAndMetadata(11), tp(3): OffsetAndMetadata(13)} and (epoch, member_id) == (2, "m")
        assert member._hb_wake.is_set()
        body = await member._heartbeat_body(member.member_epoch, 1)
        assert body["topic_partitions"] == [{"topic_id": TOPIC_ID, "partitions": [0, 2]}]
        # Kept partitions keep their positions: an incremental, not an eager, rebalance.
        assert consumer._subscriptions.states[tp(0)].position == 10 and consumer._subscriptions.states[tp(2)].position == 12
        # A mixed change revokes before it adds.
        await member.handle_response(response(member_id="m", epoch=3, assignment={TOPIC_ID: [2, 3]}))
        await member.reconcile()
        assert listener.events[-2:] == [("revoked", [tp(0)]), ("assigned", [tp(3)])]
        assert owned(consumer) == {tp(2), tp(3)}

    asyncio.run(main())


def test_no_auto_commit_means_no_commit_on_revocation() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(2)
        consumer, member, commits = make_member(coordinator, Recorder(), auto_commit=False)
        await member.handle_response(response(member_id="m", epoch=1, assignment={TOPIC_ID: [0, 1]}))
        await member.reconcile()
        consumer.seek(tp(0), 5)
        await member.handle_response(response(member_id="m", epoch=2, assignment={TOPIC_ID: [1]}))
        await member.reconcile()
        assert commits == [] and owned(consumer) == {tp(1)}

    asyncio.run(main())


@pytest.mark.parametrize("error", [ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id])
def test_fenced_members_lose_their_partitions_and_rejoin_with_epoch_0(error: ErrorCode) -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(2)
        listener = Recorder()
        consumer, member, commits = make_member(coordinator, listener)
        await member.heartbeat_once()
        await member.reconcile()
        assert owned(consumer) == {tp(0), tp(1)}
        coordinator.fail_next[member.member_id] = error
        await member.heartbeat_once()
        with pytest.raises(CommitFailedError):
            member.commit_identity()
        assert not member.stable
        await member.poll()
        assert listener.events[-1] == ("lost", [tp(0), tp(1)])
        assert ("revoked", [tp(0), tp(1)]) not in listener.events and commits == []
        assert member.member_epoch == 0
        for _ in range(500):  # the heartbeat task rejoins on its own: wait for its request, not for a time
            rejoin = [r for r in coordinator.requests if r["member_epoch"] == 0]
            if len(rejoin) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(rejoin) == 2 and rejoin[1]["member_id"] == rejoin[0]["member_id"]
        await member.poll()
        assert owned(consumer) == {tp(0), tp(1)} and listener.events[-1] == ("assigned", [tp(0), tp(1)])
        await member._cancel_tasks()

    asyncio.run(main())


def test_heartbeat_interval_comes_from_the_coordinator_and_errors_are_sorted() -> None:
    async def main() -> None:
        coordinator = FakeCoordinator(1)
        consumer, member, _ = make_member(coordinator)
        assert await member.handle_response(response(member_id="m", interval=1234)) == 1.234
        assert await member.handle_response(response(ErrorCode.coordinator_load_in_progress)) == member._backoff_s
        assert member._fatal is None
        await member.handle_response(response(ErrorCode.unsupported_assignor))
        with pytest.raises(KafkaError) as info:
            await member.poll()
        assert info.value.code == ErrorCode.unsupported_assignor

    asyncio.run(main())


def test_two_members_share_partitions_through_the_heartbeat_loop() -> None:
    """The whole protocol with the real heartbeat tasks: join, share, hand over only what was revoked, leave."""

    async def until(condition: Any, *members: ConsumerGroupMember) -> None:
        for _ in range(400):
            for member in members:
                await member.poll()
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("condition not reached")

    async def main() -> None:
        coordinator = FakeCoordinator(6)
        first_listener, second_listener = Recorder(), Recorder()
        first, a, _ = make_member(coordinator, first_listener)
        second, b, _ = make_member(coordinator, second_listener)
        everything = {tp(p) for p in range(6)}
        await until(lambda: owned(first) == everything and a.stable, a)
        await until(lambda: owned(first) | owned(second) == everything and owned(second)
                    and not owned(first) & owned(second) and a.stable and b.stable
                    and len(owned(first)) == 3, a, b)
        # The first member gave up only what moved; it never held nothing.
        assert first_listener.events[0] == ("assigned", sorted(everything))
        assert first_listener.events[1][0] == "revoked" and len(first_listener.events[1][1]) == 3
        assert first_listener.events[2] == ("assigned", [])
        assert second_listener.events == [("assigned", sorted(owned(second)))]
        await b.close()
        await until(lambda: owned(first) == everything, a)
        assert second_listener.events[-1] == ("revoked", second_listener.events[0][1])
        await a.close()
        assert coordinator.members == {}

    asyncio.run(main())


# End to end, against josef's broker (its coordinator-group plugin answers ConsumerGroupHeartbeat) ---------


def _e2e_consumer(bootstrap: str, name: str, listener: Recorder) -> Any:
    from josef_client.consumer import Consumer

    consumer = Consumer(bootstrap_servers=bootstrap, group_id="kip848", group_protocol="consumer",
                        auto_offset_reset="earliest", fetch_max_wait_ms=100, client_id=name)
    consumer.subscribe([TOPIC], listener=listener)
    return consumer


@pytest.mark.josef_config(**{"group.consumer.heartbeat.interval.ms": "200"})
def test_two_consumers_with_group_protocol_consumer_share_six_partitions_end_to_end(josef_broker: Any) -> None:
    import time

    from josef_client.admin import Admin, NewTopic
    from josef_client.producer import Producer

    with Admin(bootstrap_servers=josef_broker.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(TOPIC, 6, 1)])
    with Producer(bootstrap_servers=josef_broker.bootstrap_servers, linger_ms=0) as producer:
        futures = [producer.send(TOPIC, f"{p}-{i}".encode(), partition=p) for p in range(6) for i in range(10)]
        for future in futures:
            future.result(30)
    listeners = [Recorder(), Recorder()]
    consumers = [_e2e_consumer(josef_broker.bootstrap_servers, f"c{i}", listeners[i]) for i in range(2)]
    records: list[list[Any]] = [[], []]
    everything = {tp(p) for p in range(6)}
    try:
        deadline = time.monotonic() + 45

        def done() -> bool:
            owned = [set(c.assignment()) for c in consumers]
            return (len(owned[0]) == len(owned[1]) == 3 and owned[0] | owned[1] == everything
                    and sum(map(len, records)) >= 60)

        while not done():
            assert time.monotonic() < deadline, (
                f"timed out: assignments {[sorted(c.assignment()) for c in consumers]}, "
                f"records {[len(r) for r in records]}, events {[lis.events for lis in listeners]}")
            for consumer, got in zip(consumers, records):
                for batch in consumer.poll(timeout_ms=50).values():
                    got.extend(batch)
        end = time.monotonic() + 1
        while time.monotonic() < end:  # nothing more arrives: every record exactly once
            for consumer, got in zip(consumers, records):
                for batch in consumer.poll(timeout_ms=50).values():
                    got.extend(batch)
        keys = [(r.partition, r.offset) for got in records for r in got]
        assert len(keys) == len(set(keys)) == 60
        assert set(keys) == {(p, o) for p in range(6) for o in range(10)}
        assert not set(consumers[0].assignment()) & set(consumers[1].assignment())
        for listener in listeners:
            assert [e for e, _ in listener.events if e == "lost"] == []
        # One leaves (epoch -1): the other gets its partitions, at their committed offsets (nothing again).
        consumers[1].close()
        deadline = time.monotonic() + 30
        while set(consumers[0].assignment()) != everything:
            assert time.monotonic() < deadline, f"timed out: {sorted(consumers[0].assignment())}"
            for batch in consumers[0].poll(timeout_ms=50).values():
                records[0].extend(batch)
        end = time.monotonic() + 1
        while time.monotonic() < end:
            for batch in consumers[0].poll(timeout_ms=50).values():
                records[0].extend(batch)
        assert sum(map(len, records)) == 60
    finally:
        for consumer in consumers:
            consumer.close()
    # Closing committed every position (OffsetCommit with the member id and epoch), then left the group.
    from josef_client.consumer import Consumer

    with Consumer(bootstrap_servers=josef_broker.bootstrap_servers, group_id="kip848", enable_auto_commit=False) as check:
        committed = check.committed(sorted(everything))
    assert {p: om.offset for p, om in committed.items()} == {p: 10 for p in everything}
    for listener in listeners:
        assert listener.events[-1][0] == "revoked"
