"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) over a real socket against the in-process broker."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode
from test_group_apis import COMMIT, JOIN, LIST, commit_body, create_topic, join_body

from josef.testing import RawClient

E = ErrorCode
CG_HEARTBEAT, CG_DESCRIBE = 68, 69

pytestmark = pytest.mark.josef_config(**{"group.initial.rebalance.delay.ms": "0", "num.partitions": "2"})


def hb_body(group: str, member: str, epoch: int, topics=("orders",), owned=None, assignor=None) -> dict:
    return {"group_id": group, "member_id": member, "member_epoch": epoch, "instance_id": None, "rack_id": None,
            "rebalance_timeout": 30_000 if epoch == 0 else -1,
            "subscribed_topic_names": list(topics) if epoch == 0 else None, "subscribed_topic_regex": None,
            "server_assignor": assignor, "topic_partitions": owned}


@pytest.mark.parametrize("version", [0, 1])
def test_heartbeat_join_describe_commit(josef_broker, version):
    client = RawClient(josef_broker.port)
    create_topic(client, "orders", 2)
    group = f"cg{version}"
    body = hb_body(group, "member-a" if version else "", 0)
    if version == 0:
        body.pop("subscribed_topic_regex")
    joined = client.call(CG_HEARTBEAT, version, body)
    assert joined.error_code == E.none, joined
    assert joined.member_epoch == 1 and joined.heartbeat_interval.total_seconds() == 5
    member = joined.member_id
    assert member
    (tp,) = joined.assignment.topic_partitions
    assert sorted(tp.partitions) == [0, 1]

    described = client.call(CG_DESCRIBE, 0, {"group_ids": [group, "nope"], "include_authorized_operations": False})
    found, missing = described.groups
    assert (found.error_code, found.group_state, found.group_epoch, found.assignment_epoch, found.assignor_name) == (
        E.none, "Stable", 1, 1, "uniform")
    (m,) = found.members
    assert m.member_id == member and m.subscribed_topic_names == ("orders",)
    assert m.assignment.topic_partitions[0].topic_name == "orders"
    assert missing.error_code == E.group_id_not_found
    with_ops = client.call(CG_DESCRIBE, 0, {"group_ids": [group], "include_authorized_operations": True})
    assert with_ops.groups[0].authorized_operations > 0

    # Members commit with their member epoch; a wrong member is refused.
    ok = client.call(COMMIT, 9, commit_body(group, 1, member, {("orders", 0): 5}))
    assert ok.topics[0].partitions[0].error_code == E.none
    bad = client.call(COMMIT, 9, commit_body(group, 1, "stranger", {("orders", 0): 5}))
    assert bad.topics[0].partitions[0].error_code == E.unknown_member_id

    # A classic member can't join a consumer group.
    classic = client.call(JOIN, 9, join_body(group, "x"))
    assert classic.error_code == E.inconsistent_group_protocol

    listed = client.call(LIST, 5, {"states_filter": [], "types_filter": ["consumer"]})
    assert [(g.group_id, g.group_type) for g in listed.groups] == [(group, "consumer")]

    errors = client.call(CG_HEARTBEAT, 1, hb_body(group, member, 7, owned=[]))
    assert errors.error_code == E.fenced_member_epoch
    assert client.call(CG_HEARTBEAT, 1, hb_body(group, "b", 0, assignor="sticky")).error_code == E.unsupported_assignor
    left = client.call(CG_HEARTBEAT, 1, hb_body(group, member, -1))
    assert (left.error_code, left.member_epoch) == (E.none, -1)
    deleted = client.call(42, 2, {"groups_names": [group]})
    assert deleted.results[0].error_code == E.none
    gone = client.call(CG_DESCRIBE, 0, {"group_ids": [group], "include_authorized_operations": False})
    assert gone.groups[0].error_code == E.group_id_not_found
    client.close()


class FirstMemberTakesAll:
    """A server-side assignor a deployment adds through its own plugin: every partition to one member."""

    name = "first-takes-all"
    server_side = True

    def assign(self, members, topics):
        first = min(members)
        return {m: ({t: set(range(n)) for t, n in topics.items()} if m == first else {}) for m in members}


def test_server_assignors_come_from_the_brokers_plugin_manager(tmp_path):
    """A plugin registered only with this broker's plugin manager (not an installed entry point) is found."""
    from josef import hookimpl
    from josef.plugins import get_plugin_manager
    from josef.node.runner import BrokerThread
    from josef.testing import broker_overrides

    class Plugin:
        @hookimpl
        def register_assignors(self, register):
            register("server:first-takes-all", FirstMemberTakesAll)

    overrides = broker_overrides(tmp_path, **{"group.initial.rebalance.delay.ms": "0", "num.partitions": "2",
                                              "group.consumer.assignors": "first-takes-all,uniform"})
    with BrokerThread(overrides, pm=get_plugin_manager(plugins=[Plugin()])) as broker:
        client = RawClient(broker.port)
        create_topic(client, "orders", 2)
        joined = client.call(CG_HEARTBEAT, 1, hb_body("custom", "member-a", 0))
        assert joined.error_code == E.none, joined
        (tp,) = joined.assignment.topic_partitions
        assert sorted(tp.partitions) == [0, 1]
        described = client.call(CG_DESCRIBE, 0, {"group_ids": ["custom"], "include_authorized_operations": False})
        assert described.groups[0].assignor_name == "first-takes-all"
