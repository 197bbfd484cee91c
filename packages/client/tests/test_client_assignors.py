"""The client-side assignors and the consumer protocol's embedded messages, without a broker."""

from __future__ import annotations

import random
import struct

import pytest

from josef import hookimpl
from josef.plugins import PluginError, get_plugin_manager
from josef.protocol.consumer_protocol import Subscription
from josef.protocol.topic_partition import TopicPartition
from josef_client.assignors import (
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    decode_sticky_user_data,
    encode_sticky_user_data,
    load_assignors,
    member_order,
)
from josef_client.config import ConfigError
from josef_client.consumer import AsyncConsumer


def tps(spec: str) -> list[TopicPartition]:
    """``"a0 a1 b2"`` -> [a-0, a-1, b-2] (topic is the letters, partition the digits); ``"t0:1"`` is t0-1."""
    out = []
    for item in spec.split():
        if ":" in item:
            topic, _, partition = item.partition(":")
            out.append(TopicPartition(topic, int(partition)))
            continue
        topic = item.rstrip("0123456789")
        out.append(TopicPartition(topic, int(item[len(topic):])))
    return out


def subs(members: dict[str, tuple[str, ...]] | list[str], topics: tuple[str, ...] = ("t",)) -> dict[str, Subscription]:
    if isinstance(members, list):
        members = {m: topics for m in members}
    return {m: Subscription(ts) for m, ts in members.items()}


def counts(assignment: dict[str, list[TopicPartition]]) -> list[int]:
    return [len(parts) for parts in assignment.values()]


def assert_complete(assignment: dict[str, list[TopicPartition]], cluster: dict[str, int],
                    subscriptions: dict[str, Subscription]) -> None:
    """Every partition of a subscribed topic once, to a member subscribed to its topic."""
    seen = [tp for parts in assignment.values() for tp in parts]
    assert len(seen) == len(set(seen)), f"a partition assigned twice: {assignment}"
    wanted = {t for s in subscriptions.values() for t in s.topics}
    assert set(seen) == {TopicPartition(t, p) for t in wanted for p in range(cluster.get(t, 0))}
    for member, parts in assignment.items():
        assert all(tp.topic in subscriptions[member].topics for tp in parts), (member, parts)


# Registration --------------------------------------------------------------------------------------


def test_the_builtins_are_registered_through_the_hook():
    assignors = load_assignors(["range", "roundrobin", "sticky", "cooperative-sticky"])
    assert [a.name for a in assignors] == ["range", "roundrobin", "sticky", "cooperative-sticky"]
    assert [a.supports_cooperative for a in assignors] == [False, False, False, True]
    assert [type(a) for a in assignors] == [RangeAssignor, RoundRobinAssignor, StickyAssignor,
                                           CooperativeStickyAssignor]
    with pytest.raises(PluginError, match="no assignor named 'uniform'.*cooperative-sticky, range"):
        load_assignors(["uniform"])


def test_a_plugin_assignor_is_chosen_by_name():
    class Everything:
        name = "everything-to-first"
        supports_cooperative = False

        def assign(self, cluster_partitions, subscriptions):
            members = member_order(subscriptions)
            return {m: (tps("t0 t1") if i == 0 else []) for i, m in enumerate(members)}

    class Plugin:
        @hookimpl
        def register_assignors(self, register):
            register(Everything.name, Everything)

    pm = get_plugin_manager(plugins=[Plugin()])
    [assignor] = load_assignors(["everything-to-first"], pm)
    assert assignor.assign({"t": 2}, subs(["b", "a"])) == {"a": tps("t0 t1"), "b": []}
    consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", plugin_manager=pm,
                             partition_assignment_strategy="everything-to-first,range")
    assert [a.name for a in consumer._assignors] == ["everything-to-first", "range"]


def test_consumer_group_settings_are_checked_when_the_consumer_is_built():
    with pytest.raises(PluginError, match="no assignor named 'rnage'"):
        AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", partition_assignment_strategy=["rnage"])
    with pytest.raises(ConfigError, match="partition.assignment.strategy is not supported with group.protocol=consumer"):
        AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="consumer",
                      partition_assignment_strategy=["range"])
    with pytest.raises(ConfigError, match="group.protocol"):
        AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", group_protocol="modern")
    with pytest.raises(ConfigError, match="heartbeat.interval.ms must be lower than session.timeout.ms"):
        AsyncConsumer(bootstrap_servers="localhost:1", group_id="g", heartbeat_interval_ms=10000,
                      session_timeout_ms=6000)
    consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g")
    assert consumer.config["partition.assignment.strategy"] == ["range", "cooperative-sticky"]
    assert (consumer.config["session.timeout.ms"], consumer.config["heartbeat.interval.ms"],
            consumer.config["max.poll.interval.ms"], consumer.config["auto.commit.interval.ms"]) == (45000, 3000, 300000, 5000)
    assert consumer.config["group.protocol"] == "classic" and consumer._coordinator.auto_commit
    assert not AsyncConsumer(bootstrap_servers="localhost:1")._coordinator.auto_commit  # no group, nothing to commit to


def test_subscribe_checks_its_arguments():
    consumer = AsyncConsumer(bootstrap_servers="localhost:1", group_id="g")
    with pytest.raises(ValueError, match="topics or pattern"):
        consumer.subscribe(["a"], pattern="a.*")
    with pytest.raises(ValueError, match="topics or pattern"):
        consumer.subscribe()
    with pytest.raises(ValueError, match="at least one topic"):
        consumer.subscribe([])
    with pytest.raises(ValueError, match="not a valid regular expression"):
        consumer.subscribe(pattern="(")
    consumer.subscribe("orders")
    assert consumer.subscription() == {"orders"}
    consumer.subscribe(["b", "a"])
    assert consumer.subscription() == {"a", "b"}
    with pytest.raises(RuntimeError, match="mutually exclusive"):
        consumer.assign([TopicPartition("a", 0)])
    no_group = AsyncConsumer(bootstrap_servers="localhost:1")
    with pytest.raises(Exception, match="needs group.id"):
        no_group.subscribe(["a"])


# Range and round robin: Kafka's documented examples --------------------------------------------------


def test_range_assigns_consecutive_ranges_per_topic():
    # The RangeAssignor javadoc: two consumers, two topics of three partitions.
    cluster = {"t0": 3, "t1": 3}
    result = RangeAssignor().assign(cluster, subs(["C1", "C0"], ("t0", "t1")))
    assert result == {"C0": tps("t0:0 t0:1 t1:0 t1:1"), "C1": tps("t0:2 t1:2")}


def test_range_only_uses_the_members_subscribed_to_each_topic():
    cluster = {"a": 4, "b": 2, "missing": 0}
    result = RangeAssignor().assign(cluster, subs({"m1": ("a",), "m2": ("a", "b"), "m3": ("b", "missing")}))
    assert result == {"m1": tps("a0 a1"), "m2": tps("a2 a3 b0"), "m3": tps("b1")}


def test_roundrobin_deals_sorted_partitions_in_turn():
    # The RoundRobinAssignor javadoc: two consumers, two topics of three partitions.
    cluster = {"t0": 3, "t1": 3}
    result = RoundRobinAssignor().assign(cluster, subs(["C0", "C1"], ("t0", "t1")))
    assert result == {"C0": tps("t0:0 t0:2 t1:1"), "C1": tps("t0:1 t1:0 t1:2")}
    # The javadoc's second example: C0 subscribes to t0; C1 to t0, t1; C2 to t0, t1, t2 (1, 2, 3 partitions).
    result = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3},
                                         subs({"C0": ("t0",), "C1": ("t0", "t1"), "C2": ("t0", "t1", "t2")}))
    assert result == {"C0": tps("t0:0"), "C1": tps("t1:0"), "C2": tps("t1:1 t2:0 t2:1 t2:2")}


def test_static_members_sort_by_instance_id():
    """A restarted static member gets a new member id but keeps its place, so range gives it the same partitions."""
    def static(ids: dict[str, str]) -> dict[str, Subscription]:
        return {m: Subscription(("t",), group_instance_id=i) for m, i in ids.items()}

    before = RangeAssignor().assign({"t": 4}, static({"zzz-1": "a", "aaa-2": "b"}))
    after = RangeAssignor().assign({"t": 4}, static({"yyy-3": "a", "aaa-2": "b"}))
    assert before["zzz-1"] == after["yyy-3"] == tps("t0 t1")
    assert before["aaa-2"] == after["aaa-2"] == tps("t2 t3")


# Balance ---------------------------------------------------------------------------------------------

ALL = (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor)


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
def test_identical_subscriptions_are_balanced(assignor):
    rng = random.Random(7)
    for _ in range(200):
        topics = [f"t{i}" for i in range(rng.randint(1, 4))]
        cluster = {t: rng.randint(0, 9) for t in topics}
        members = [f"m{i}" for i in rng.sample(range(100), rng.randint(1, 7))]
        subscriptions = subs(members, tuple(topics))
        result = assignor().assign(cluster, subscriptions)
        assert sorted(result) == sorted(members)
        assert_complete(result, cluster, subscriptions)
        if assignor is RangeAssignor:  # balanced per topic (Kafka promises no more)
            for topic in topics:
                per_topic = [sum(tp.topic == topic for tp in parts) for parts in result.values()]
                assert max(per_topic) - min(per_topic) <= 1, (cluster, result)
        else:
            assert max(counts(result)) - min(counts(result)) <= 1, (cluster, result)


@pytest.mark.parametrize("assignor", ALL, ids=lambda a: a.name)
def test_assignments_are_deterministic(assignor):
    rng = random.Random(11)
    cluster = {"a": 7, "b": 3, "c": 5}
    members = {f"m{i}": tuple(sorted(rng.sample(sorted(cluster), rng.randint(1, 3)))) for i in range(6)}
    first = assignor().assign(cluster, subs(members))
    for _ in range(5):
        shuffled = list(members.items())
        rng.shuffle(shuffled)
        again = assignor().assign(dict(reversed(list(cluster.items()))), subs(dict(shuffled)))
        assert {m: again[m] for m in first} == first


def test_sticky_with_different_subscriptions_assigns_everything_to_eligible_members():
    rng = random.Random(3)
    for _ in range(100):
        cluster = {t: rng.randint(1, 6) for t in "abcde"}
        members = {f"m{i}": tuple(rng.sample(sorted(cluster), rng.randint(1, 5))) for i in range(rng.randint(1, 6))}
        subscriptions = subs(members)
        assert_complete(StickyAssignor().assign(cluster, subscriptions), cluster, subscriptions)


def test_sticky_balances_members_with_different_subscriptions_where_it_can():
    # m1 can only take "a"; the others take "b" as well: m1 must get a's partitions before b's are spread.
    cluster = {"a": 4, "b": 4}
    result = StickyAssignor().assign(cluster, subs({"m1": ("a",), "m2": ("a", "b"), "m3": ("a", "b")}))
    assert sorted(counts(result)) == [2, 3, 3]
    assert all(tp.topic == "a" for tp in result["m1"])


# Stickiness ------------------------------------------------------------------------------------------


class Member:
    """One member's side of rebalances: its own assignor instance (state kept across rebalances) and what it owns."""

    def __init__(self, member_id: str, assignor_type: type, topics: tuple[str, ...] = ("t",)) -> None:
        self.member_id = member_id
        self.assignor = assignor_type()
        self.topics = topics
        self.owned: list[TopicPartition] = []
        self.generation = -1

    def subscription(self, eager: bool) -> Subscription:
        user_data = self.assignor.subscription_user_data(self.topics)
        # Eager members revoke everything before joining; cooperative ones send what they own.
        return Subscription(self.topics, user_data, () if eager else tuple(self.owned), self.generation)

    def receive(self, partitions: list[TopicPartition], generation: int) -> None:
        self.assignor.on_assignment(partitions, generation)
        self.owned = list(partitions)
        self.generation = generation


def rebalance(members: list[Member], cluster: dict[str, int], generation: int, *, eager: bool) -> dict[str, list[TopicPartition]]:
    leader = members[0].assignor
    result = leader.assign(cluster, {m.member_id: m.subscription(eager) for m in members})
    for m in members:
        m.receive(result[m.member_id], generation)
    return result


def moved(before: dict[str, list[TopicPartition]], after: dict[str, list[TopicPartition]]) -> int:
    return sum(len(set(parts) - set(before.get(m, ()))) for m, parts in after.items() if m in before)


def test_sticky_keeps_partitions_when_a_member_joins_and_leaves():
    cluster = {"t": 12}
    members = [Member(f"m{i}", StickyAssignor) for i in range(3)]
    first = rebalance(members, cluster, 1, eager=True)
    assert sorted(counts(first)) == [4, 4, 4]

    members.append(Member("m3", StickyAssignor))  # 12 partitions over 4: each old member gives up exactly one
    second = rebalance(members, cluster, 2, eager=True)
    assert sorted(counts(second)) == [3, 3, 3, 3]
    for m in ("m0", "m1", "m2"):
        assert set(second[m]) <= set(first[m]), (m, first[m], second[m])
    assert moved(first, second) == 0 and len(second["m3"]) == 3

    leaving = members.pop(1)  # its three partitions go to the others; nobody else moves
    third = rebalance(members, cluster, 3, eager=True)
    assert sorted(counts(third)) == [4, 4, 4]
    for m in ("m0", "m2", "m3"):
        assert set(second[m]) <= set(third[m])
    assert set(third["m0"]) | set(third["m2"]) | set(third["m3"]) == set(tps(" ".join(f"t{p}" for p in range(12))))
    assert set(second[leaving.member_id]) <= set(third["m0"]) | set(third["m2"]) | set(third["m3"])


def test_range_is_not_sticky_where_sticky_is():
    """The reason sticky exists: range moves partitions between members that stay."""
    cluster = {"t": 12}
    range_before = RangeAssignor().assign(cluster, subs(["m0", "m1", "m2"]))
    range_after = RangeAssignor().assign(cluster, subs(["m0", "m1", "m2", "m3"]))
    assert moved(range_before, range_after) > 0
    sticky = [Member(f"m{i}", StickyAssignor) for i in range(3)]
    before = rebalance(sticky, cluster, 1, eager=True)
    after = rebalance(sticky + [Member("m3", StickyAssignor)], cluster, 2, eager=True)
    assert moved(before, after) == 0


def test_sticky_prefers_the_claim_of_the_newest_generation():
    cluster = {"t": 4}
    subscriptions = {
        "old": Subscription(("t",), owned_partitions=tuple(tps("t0 t1")), generation=3),
        "new": Subscription(("t",), owned_partitions=tuple(tps("t1 t2")), generation=5),
    }
    result = StickyAssignor().assign(cluster, subscriptions)
    assert TopicPartition("t", 1) in result["new"] and TopicPartition("t", 2) in result["new"]
    assert TopicPartition("t", 0) in result["old"]
    assert_complete(result, cluster, subscriptions)
    # Same generation: neither claim counts, the partition is simply assigned once.
    tie = {"a": Subscription(("t",), owned_partitions=tuple(tps("t0")), generation=5),
           "b": Subscription(("t",), owned_partitions=tuple(tps("t0")), generation=5)}
    assert_complete(StickyAssignor().assign({"t": 2}, tie), {"t": 2}, tie)


def test_sticky_drops_claims_on_gone_partitions_and_unsubscribed_topics():
    cluster = {"t": 2, "u": 2}
    subscriptions = {"a": Subscription(("t",), owned_partitions=tuple(tps("t0 t5 u0 gone0")), generation=1),
                     "b": Subscription(("t", "u"), generation=1)}
    result = StickyAssignor().assign(cluster, subscriptions)
    assert_complete(result, cluster, subscriptions)
    assert TopicPartition("t", 0) in result["a"]


def test_sticky_user_data_is_kafkas_format():
    data = encode_sticky_user_data(tps("b1 a0 a2"), 7)
    # StickyAssignorUserData v1: [topic, [partitions]], generation; topics in order.
    assert data == (struct.pack(">i", 2) + struct.pack(">h", 1) + b"a" + struct.pack(">iii", 2, 0, 2)
                    + struct.pack(">h", 1) + b"b" + struct.pack(">ii", 1, 1) + struct.pack(">i", 7))
    assert decode_sticky_user_data(data) == (tps("a0 a2 b1"), 7)
    assert decode_sticky_user_data(data[:-4]) == (tps("a0 a2 b1"), -1)  # v0 has no generation
    assert decode_sticky_user_data(None) == ([], -1)
    assert decode_sticky_user_data(b"\x00\x00\x00\x05junk") == ([], -1)


# Cooperative -----------------------------------------------------------------------------------------


def test_cooperative_sticky_revokes_first_and_assigns_in_a_second_rebalance():
    cluster = {"t": 6}
    members = [Member("m0", CooperativeStickyAssignor), Member("m1", CooperativeStickyAssignor)]
    first = rebalance(members, cluster, 1, eager=False)
    assert sorted(counts(first)) == [3, 3]

    members.append(Member("m2", CooperativeStickyAssignor))
    owned_before = {m.member_id: set(m.owned) for m in members}
    second = rebalance(members, cluster, 2, eager=False)
    # Nothing moves straight from one member to another: the new member gets nothing yet,
    # the old owners give up one partition each (revoked), and those are unassigned for now.
    assert second["m2"] == []
    for m in ("m0", "m1"):
        assert set(second[m]) <= owned_before[m] and len(second[m]) == 2
    revoked = (owned_before["m0"] - set(second["m0"])) | (owned_before["m1"] - set(second["m1"]))
    assert len(revoked) == 2

    third = rebalance(members, cluster, 3, eager=False)  # the owners rejoin after revoking
    assert sorted(counts(third)) == [2, 2, 2]
    assert set(third["m2"]) == revoked
    assert third["m0"] == second["m0"] and third["m1"] == second["m1"]
    assert_complete(third, cluster, {m.member_id: Subscription(m.topics) for m in members})


def test_cooperative_sticky_hands_a_leaving_members_partitions_over_at_once():
    cluster = {"t": 6}
    members = [Member(f"m{i}", CooperativeStickyAssignor) for i in range(3)]
    rebalance(members, cluster, 1, eager=False)
    rebalance(members, cluster, 2, eager=False)
    before = {m.member_id: set(m.owned) for m in members}
    gone = members.pop(0)
    after = rebalance(members, cluster, 3, eager=False)  # unowned partitions need no revocation
    assert sorted(counts(after)) == [3, 3]
    for m in members:
        assert before[m.member_id] <= set(after[m.member_id])
    assert before[gone.member_id] <= set(after["m1"]) | set(after["m2"])


def test_cooperative_sticky_never_gives_an_owned_partition_to_another_member():
    rng = random.Random(5)
    for _ in range(100):
        cluster = {"a": rng.randint(1, 8), "b": rng.randint(1, 8)}
        members = [Member(f"m{i}", CooperativeStickyAssignor, ("a", "b")) for i in range(rng.randint(1, 5))]
        for generation in range(1, 8):
            if rng.random() < 0.3 and len(members) > 1:
                members.pop(rng.randrange(len(members)))
            if rng.random() < 0.4:
                members.append(Member(f"n{generation}", CooperativeStickyAssignor, ("a", "b")))
            owned = {tp: m.member_id for m in members for tp in m.owned}
            result = rebalance(members, cluster, generation, eager=False)
            for member, parts in result.items():
                assert all(owned.get(tp, member) == member for tp in parts)
        # Settled (two rebalances with no membership change): everything assigned, balanced.
        rebalance(members, cluster, 100, eager=False)
        final = rebalance(members, cluster, 101, eager=False)
        assert_complete(final, cluster, {m.member_id: Subscription(m.topics) for m in members})
        assert max(counts(final)) - min(counts(final)) <= 1


def test_cooperative_sticky_reads_the_generation_from_user_data_of_old_subscriptions():
    assignor = CooperativeStickyAssignor()
    assignor.on_assignment(tps("t0"), 9)
    assert assignor.subscription_user_data(("t",)) == struct.pack(">i", 9)
    subscriptions = {  # v1 subscriptions: owned partitions, but the generation only in the user data
        "a": Subscription(("t",), struct.pack(">i", 9), tuple(tps("t0")), -1),
        "b": Subscription(("t",), struct.pack(">i", 4), tuple(tps("t0")), -1),
    }
    result = CooperativeStickyAssignor().assign({"t": 2}, subscriptions)
    assert TopicPartition("t", 0) in result["a"] and TopicPartition("t", 0) not in result["b"]
