"""Unit tests of the controller's decisions, over an in-memory stand-in for the quorum."""

import anyio
import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.controller import APPEND, DELETE, SET, SUBTRACT, Controller, ControllerError, IsrChange
from josef.metadata.image import MetadataImage
from josef.metadata.partition_changes import Election
from josef.metadata.placement import assign_replicas
from josef.metadata.records import BROKER_RESOURCE, TOPIC_RESOURCE, ConfigRecord, Endpoint, decode, encode, random_uuid
from josef.plugins import get_plugin_manager
from josef.node.server_properties import load_config


class MemoryQuorum:
    """Commits at once; the quorum contract without storage."""

    controller_id = 1  # this node leads

    def __init__(self):
        self.image = MetadataImage()
        self.records = []

    async def append(self, records):
        # Every record must survive its encoding, as it would in the metadata log.
        records = [decode(encode(r)) for r in records]
        self.records.extend(records)
        self.image, _ = self.image.apply(len(self.records) - 1, records)
        return len(self.records) - 1


INCARNATION = random_uuid()


def make(brokers=(1,), **overrides):
    config = load_config(None, overrides, get_plugin_manager(autoload=False))
    quorum = MemoryQuorum()
    controller = Controller(quorum, config, lambda: quorum.image)

    async def register():
        for b in brokers:
            epoch = await controller.register_broker(b, random_uuid(), [Endpoint("PLAINTEXT", "h", 9000 + b)], None, {})
            await controller.broker_heartbeat(b, epoch, quorum.image.offset, False, False)

    anyio.run(register)
    return controller, quorum


def run(coro_fn, *args, **kwargs):
    return anyio.run(lambda: coro_fn(*args, **kwargs))


def test_create_topic_defaults_and_configs():
    controller, quorum = make(**{"num.partitions": "3"})
    created = run(controller.create_topic, "orders", configs={"retention.ms": "1000"})
    topic = quorum.image.topics["orders"]
    assert len(topic.partitions) == 3 and created.replication_factor == 1
    assert all(p.leader == 1 and p.isr == (1,) for p in topic.partitions.values())
    assert quorum.image.config(TOPIC_RESOURCE, "orders") == {"retention.ms": "1000"}
    assert quorum.image.topic_by_id(topic.topic_id) is topic


@pytest.mark.parametrize(
    "kwargs,code",
    [
        ({"name": "bad name"}, ErrorCode.invalid_topic_exception),
        ({"name": "x" * 250}, ErrorCode.invalid_topic_exception),
        ({"name": ".."}, ErrorCode.invalid_topic_exception),
        ({"name": "t", "num_partitions": 0}, ErrorCode.invalid_partitions),
        ({"name": "t", "replication_factor": 3}, ErrorCode.invalid_replication_factor),
        ({"name": "t", "configs": {"retention.ms": "soon"}}, ErrorCode.invalid_config),
        ({"name": "t", "configs": {"no.such.key": "1"}}, ErrorCode.invalid_config),
        ({"name": "t", "assignments": {0: [1], 2: [1]}}, ErrorCode.invalid_replica_assignment),
        ({"name": "t", "assignments": {0: [7]}}, ErrorCode.invalid_replica_assignment),
    ],
)
def test_create_topic_errors(kwargs, code):
    controller, quorum = make()
    with pytest.raises(ControllerError) as info:
        run(controller.create_topic, **kwargs)
    assert info.value.code == code
    assert not quorum.image.topics


def test_duplicate_and_colliding_names():
    controller, _ = make()
    run(controller.create_topic, "a.b")
    for name, code in (("a.b", ErrorCode.topic_already_exists), ("a_b", ErrorCode.invalid_topic_exception)):
        with pytest.raises(ControllerError) as info:
            run(controller.create_topic, name)
        assert info.value.code == code


def test_validate_only_writes_nothing():
    controller, quorum = make()
    created = run(controller.create_topic, "t", 4, validate_only=True)
    assert len(created.topic.partitions) == 4 and "t" not in quorum.image.topics


def test_delete_topic_and_its_configs():
    controller, quorum = make()
    run(controller.create_topic, "t", configs={"retention.ms": "5"})
    run(controller.delete_topic, "t")
    assert "t" not in quorum.image.topics and not quorum.image.config(TOPIC_RESOURCE, "t")
    with pytest.raises(ControllerError) as info:
        run(controller.delete_topic, "t")
    assert info.value.code == ErrorCode.unknown_topic_or_partition


def test_create_partitions():
    controller, quorum = make(brokers=(1, 2, 3))
    run(controller.create_topic, "t", 2, 2)
    run(controller.create_partitions, "t", 5, None, False)
    topic = quorum.image.topics["t"]
    assert sorted(topic.partitions) == [0, 1, 2, 3, 4]
    assert all(len(set(p.replicas)) == 2 for p in topic.partitions.values())
    with pytest.raises(ControllerError) as info:
        run(controller.create_partitions, "t", 5, None, False)
    assert info.value.code == ErrorCode.invalid_partitions


def test_incremental_alter_configs():
    controller, quorum = make()
    run(controller.create_topic, "t")
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("retention.ms", SET, "10"), ("cleanup.policy", SET, "delete")], False)
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("cleanup.policy", APPEND, "compact")], False)
    assert quorum.image.config(TOPIC_RESOURCE, "t") == {"retention.ms": "10", "cleanup.policy": "delete,compact"}
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("cleanup.policy", SUBTRACT, "delete"), ("retention.ms", DELETE, None)], False)
    assert quorum.image.config(TOPIC_RESOURCE, "t") == {"cleanup.policy": "compact"}
    # The legacy AlterConfigs replaces the whole set.
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("segment.ms", SET, "100000")], False, False)
    assert quorum.image.config(TOPIC_RESOURCE, "t") == {"segment.ms": "100000"}


def test_alter_configs_errors():
    controller, _ = make()
    run(controller.create_topic, "t")
    cases = [
        (TOPIC_RESOURCE, "nope", [("retention.ms", SET, "1")], ErrorCode.unknown_topic_or_partition),
        (TOPIC_RESOURCE, "t", [("retention.ms", SET, "x")], ErrorCode.invalid_config),
        (TOPIC_RESOURCE, "t", [("retention.ms", APPEND, "1")], ErrorCode.invalid_config),
        (BROKER_RESOURCE, "1", [("node.id", SET, "2")], ErrorCode.invalid_config),
        (BROKER_RESOURCE, "9", [("log.retention.ms", SET, "2")], ErrorCode.invalid_request),
    ]
    for resource_type, name, ops, code in cases:
        with pytest.raises(ControllerError) as info:
            run(controller.alter_configs, resource_type, name, ops, False)
        assert info.value.code == code, (name, ops)


def test_broker_dynamic_config():
    controller, quorum = make()
    run(controller.alter_configs, BROKER_RESOURCE, "", [("log.retention.ms", SET, "99")], False)
    assert quorum.image.config(BROKER_RESOURCE, "") == {"log.retention.ms": "99"}


def test_a_registered_broker_is_fenced_until_it_catches_up():
    controller, quorum = make(brokers=())
    epoch = run(controller.register_broker, 1, INCARNATION, [Endpoint("PLAINTEXT", "h", 9001)], None, {})
    assert quorum.image.brokers[1].fenced and quorum.image.brokers[1].epoch == epoch
    registered_at = quorum.image.offset
    # Behind its own registration: stays fenced.
    assert run(controller.broker_heartbeat, 1, epoch, registered_at - 1, False, False) == (False, True, False)
    assert run(controller.broker_heartbeat, 1, epoch, registered_at, False, False) == (True, False, False)
    assert not quorum.image.brokers[1].fenced
    # Registering again (a restart) is a new, higher epoch; the old one is stale.
    again = run(controller.register_broker, 1, random_uuid(), [Endpoint("PLAINTEXT", "h", 9999)], None, {})
    assert again > epoch and quorum.image.brokers[1].endpoints[0].port == 9999
    with pytest.raises(ControllerError) as stale:
        run(controller.broker_heartbeat, 1, epoch, quorum.image.offset, False, False)
    assert stale.value.code == ErrorCode.stale_broker_epoch
    with pytest.raises(ControllerError) as unknown:
        run(controller.broker_heartbeat, 7, 1, 0, False, False)
    assert unknown.value.code == ErrorCode.broker_id_not_registered


def test_a_broker_without_the_finalized_features_is_refused():
    controller, quorum = make(brokers=())
    run(controller.bootstrap, {"metadata.version": 25})
    with pytest.raises(ControllerError) as refused:
        run(controller.register_broker, 1, INCARNATION, [], None, {"metadata.version": (22, 24)})
    assert refused.value.code == ErrorCode.unsupported_version and "finalized version 25" in refused.value.message


def test_silent_brokers_are_fenced_and_lose_leadership_then_take_it_back():
    now = [0.0]
    controller, quorum = make(brokers=(1, 2))
    controller.heartbeats._clock = lambda: now[0]
    controller.activate()
    run(controller.create_topic, "t", assignments={0: [2, 1]})
    run(controller.create_topic, "u", assignments={0: [2]})
    now[0] = 5.0
    run(controller.broker_heartbeat, 1, quorum.image.brokers[1].epoch, quorum.image.offset, False, False)
    assert run(controller.fence_expired_brokers) == []
    now[0] = 9.5  # broker 2's session (9 s) ran out; broker 1 heartbeat 4.5 s ago
    assert run(controller.fence_expired_brokers) == [2]
    t, u = (quorum.image.topics[name].partitions[0] for name in "tu")
    assert quorum.image.brokers[2].fenced
    assert (t.leader, t.isr, t.leader_epoch) == (1, (1,), 1)  # leadership moved to the other in-sync replica
    assert (u.leader, u.isr, u.leader_epoch) == (-1, (2,), 1)  # the last in-sync replica stays in the ISR
    epoch = quorum.image.brokers[2].epoch
    run(controller.broker_heartbeat, 2, epoch, quorum.image.offset, False, False)
    u = quorum.image.topics["u"].partitions[0]
    assert not quorum.image.brokers[2].fenced and (u.leader, u.leader_epoch) == (2, 2)


def test_a_broker_whose_session_with_the_quorum_ended_is_fenced_at_once_unless_it_registered_again():
    now = [0.0]
    controller, quorum = make(brokers=(1, 2))
    controller.heartbeats._clock = lambda: now[0]
    controller.activate()
    epochs = {b: quorum.image.brokers[b].epoch for b in (1, 2)}
    assert not controller.heartbeats.end(1, epochs[1] - 1), "an earlier registration's session: nothing to end"
    assert controller.heartbeats.end(2, epochs[2])
    now[0] = 0.5  # well within broker.session.timeout.ms
    assert run(controller.fence_expired_brokers) == [2]
    assert quorum.image.brokers[2].fenced and not quorum.image.brokers[1].fenced
    run(controller.broker_heartbeat, 2, epochs[2], quorum.image.offset, False, False)  # it is back: unfenced
    assert not quorum.image.brokers[2].fenced
    assert run(controller.fence_expired_brokers) == []


def test_a_stalled_controller_renews_sessions_instead_of_fencing_everyone():
    now = [0.0]
    controller, quorum = make(brokers=(1, 2))
    controller.heartbeats._clock = lambda: now[0]
    controller.activate()
    now[0] = 60.0  # no sweep for a minute: the controller's loop was blocked, not the brokers
    assert run(controller.fence_expired_brokers) == []
    assert not any(b.fenced for b in quorum.image.brokers.values())


def test_controlled_shutdown_moves_leadership_then_lets_the_broker_stop():
    controller, quorum = make(brokers=(1, 2))
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    epoch = quorum.image.brokers[1].epoch
    assert run(controller.broker_heartbeat, 1, epoch, quorum.image.offset, False, True) == (True, True, True)
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr) == (2, (2,)) and quorum.image.brokers[1].in_controlled_shutdown


def test_only_the_active_controller_decides():
    controller, quorum = make()
    quorum.controller_id = 2
    with pytest.raises(ControllerError) as refused:
        run(controller.create_topic, "t")
    assert refused.value.code == ErrorCode.not_controller


def test_placement_spreads_leaders_and_replicas():
    replicas = assign_replicas([1, 2, 3], 6, 3, start_index=0, shift=0)
    assert [r[0] for r in replicas] == [1, 2, 3, 1, 2, 3]
    assert all(len(set(r)) == 3 for r in replicas)
    with pytest.raises(ValueError):
        assign_replicas([1], 1, 2)


# AlterPartition --------------------------------------------------------------

def isr_change(quorum, topic="t", partition=0, isr=None, epochs=None, **overrides):
    """An AlterPartition change from the partition's current state, as its leader would send it."""
    p = quorum.image.topics[topic].partitions[partition]
    members = p.isr if isr is None else isr
    new_isr = tuple((b, (epochs or {}).get(b, quorum.image.brokers[b].epoch if b in quorum.image.brokers else -1))
                    for b in members)
    fields = {"topic_id": quorum.image.topics[topic].topic_id, "partition": partition,
              "leader_epoch": p.leader_epoch, "partition_epoch": p.partition_epoch, "new_isr": new_isr}
    return IsrChange(**{**fields, **overrides})


def alter(controller, quorum, *changes, broker=1):
    return run(controller.alter_partition, broker, quorum.image.brokers[broker].epoch, list(changes))


def test_alter_partition_shrinks_and_expands_the_isr_without_a_new_leader_epoch():
    controller, quorum = make(brokers=(1, 2, 3))
    run(controller.create_topic, "t", assignments={0: [1, 2, 3]})
    [shrunk] = alter(controller, quorum, isr_change(quorum, isr=(1, 2)))
    p = quorum.image.topics["t"].partitions[0]
    assert shrunk.error == ErrorCode.none and shrunk.partition == p
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, (1, 2), 0, 1)
    [grown] = alter(controller, quorum, isr_change(quorum, isr=(1, 2, 3)))
    assert grown.partition.isr == (1, 2, 3) and grown.partition.partition_epoch == 2
    # The same ISR again changes nothing and answers the current state.
    offset = quorum.image.offset
    [same] = alter(controller, quorum, isr_change(quorum))
    assert same.error == ErrorCode.none and quorum.image.offset == offset and same.partition.partition_epoch == 2


def test_alter_partition_refusals():
    controller, quorum = make(brokers=(1, 2, 3))
    run(controller.create_topic, "t", assignments={0: [1, 2], 1: [2, 1]})
    run(controller.create_topic, "u", assignments={0: [1, 2, 3]})
    cases = [
        (isr_change(quorum, topic_id=random_uuid()), ErrorCode.unknown_topic_id),
        (IsrChange(quorum.image.topics["t"].topic_id, 7, 0, 0, ((1, -1),)), ErrorCode.unknown_topic_or_partition),
        (isr_change(quorum, leader_epoch=-1), ErrorCode.fenced_leader_epoch),
        (isr_change(quorum, leader_epoch=5), ErrorCode.not_controller),
        (isr_change(quorum, partition=1), ErrorCode.invalid_request),  # broker 1 does not lead t-1
        (isr_change(quorum, partition_epoch=-1), ErrorCode.invalid_update_version),
        (isr_change(quorum, isr=(2,)), ErrorCode.invalid_request),  # the leader left out
        (isr_change(quorum, isr=(1, 1)), ErrorCode.invalid_request),
        (isr_change(quorum, isr=(1, 3)), ErrorCode.invalid_request),  # 3 is not a replica of t-0
        (isr_change(quorum, isr=(1,), leader_recovery_state=1), ErrorCode.invalid_request),  # RECOVERED -> RECOVERING
        (isr_change(quorum, isr=(1, 2), epochs={2: 12345}), ErrorCode.ineligible_replica),  # v3: 2 restarted since
    ]
    results = alter(controller, quorum, *(change for change, _ in cases))
    assert [r.error for r in results] == [code for _, code in cases]
    assert all(r.partition is None for r in results)
    assert quorum.image.topics["t"].partitions[0].partition_epoch == 0  # nothing was committed
    # A fenced broker, or one shutting down, cannot join the ISR.
    epoch3 = quorum.image.brokers[3].epoch
    [shrunk] = alter(controller, quorum, isr_change(quorum, topic="u", isr=(1, 2)))
    run(controller.broker_heartbeat, 3, epoch3, quorum.image.offset, True, False)
    [fenced] = alter(controller, quorum, isr_change(quorum, topic="u", isr=(1, 2, 3), epochs={3: epoch3}))
    assert (shrunk.error, fenced.error) == (ErrorCode.none, ErrorCode.ineligible_replica)
    # A sender at the wrong broker epoch is refused as a whole.
    with pytest.raises(ControllerError) as stale:
        run(controller.alter_partition, 1, quorum.image.brokers[1].epoch + 1, [isr_change(quorum)])
    assert stale.value.code == ErrorCode.stale_broker_epoch


def test_alter_partition_v2_isr_members_have_no_epoch_to_check():
    controller, quorum = make(brokers=(1, 2))
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    [result] = alter(controller, quorum, isr_change(quorum, isr=(1, 2), epochs={1: -1, 2: -1}))
    assert result.error == ErrorCode.none


# Elections -------------------------------------------------------------------

def fence(controller, quorum, broker):
    run(controller.broker_heartbeat, broker, quorum.image.brokers[broker].epoch, quorum.image.offset, True, False)


def unfence(controller, quorum, broker):
    run(controller.broker_heartbeat, broker, quorum.image.brokers[broker].epoch, quorum.image.offset, False, False)


def led_by_1_with_2_out_of_sync(**overrides):
    controller, quorum = make(brokers=(1, 2), **overrides)
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    alter(controller, quorum, isr_change(quorum, isr=(1,)))
    return controller, quorum


def test_unclean_election_when_the_topic_allows_it_then_the_leader_recovers(caplog):
    controller, quorum = led_by_1_with_2_out_of_sync()
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("unclean.leader.election.enable", SET, "true")], False)
    with caplog.at_level("WARNING", logger="josef.metadata.partition_changes"):
        fence(controller, quorum, 1)
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr, p.leader_recovery_state, p.leader_epoch) == (2, (2,), 1, 1)
    assert "t-0" in caplog.text and "broker 2" in caplog.text and "lost" in caplog.text
    # While recovering the ISR stays the leader alone; then the leader says it recovered (KIP-704).
    [grow] = alter(controller, quorum, isr_change(quorum, isr=(2, 1), leader_recovery_state=1), broker=2)
    assert grow.error == ErrorCode.invalid_request
    [recovered] = alter(controller, quorum, isr_change(quorum, leader_recovery_state=0), broker=2)
    assert recovered.error == ErrorCode.none and recovered.partition.leader_recovery_state == 0


def test_no_unclean_election_by_default_until_it_is_enabled_dynamically():
    controller, quorum = led_by_1_with_2_out_of_sync()
    fence(controller, quorum, 1)
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr) == (-1, (1,))
    # The cluster-wide dynamic default counts too, and enabling it elects at once.
    run(controller.alter_configs, BROKER_RESOURCE, "", [("unclean.leader.election.enable", SET, "true")], False)
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr, p.leader_recovery_state) == (2, (2,), 1)


def test_the_periodic_check_elects_uncleanly_where_the_config_allows():
    now = [0.0]
    controller, quorum = led_by_1_with_2_out_of_sync()
    controller._clock = lambda: now[0]
    fence(controller, quorum, 1)
    run(quorum.append, [ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="t",
                                     name="unclean.leader.election.enable", value="true")])
    run(controller.elect_leaders_when_due)  # the first check runs at once
    assert quorum.image.topics["t"].partitions[0].leader == 2


def test_elect_preferred_leaders():
    controller, quorum = make(brokers=(1, 2))
    run(controller.create_topic, "t", assignments={0: [1, 2], 1: [2, 1]})
    fence(controller, quorum, 1)
    unfence(controller, quorum, 1)  # back, but out of sync: broker 2 keeps leading t-0
    t = quorum.image.topics["t"]
    assert (t.partitions[0].leader, t.partitions[0].isr) == (2, (2,))

    def elect(partitions):
        return [(r.topic, r.partition, r.error) for r in run(controller.elect_leaders, Election.PREFERRED, partitions)]

    assert elect([("t", 0), ("t", 1), ("t", 9), ("nope", 0)]) == [
        ("t", 0, ErrorCode.preferred_leader_not_available), ("t", 1, ErrorCode.election_not_needed),
        ("t", 9, ErrorCode.unknown_topic_or_partition), ("nope", 0, ErrorCode.unknown_topic_or_partition)]
    alter(controller, quorum, isr_change(quorum, isr=(2, 1)), broker=2)
    assert elect(None) == [("t", 0, ErrorCode.none)]  # partitions already led by their preferred replica are left out
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr, p.leader_epoch) == (1, (2, 1), 2)
    assert elect(None) == []


def test_elect_unclean_leaders_on_request():
    controller, quorum = led_by_1_with_2_out_of_sync()
    run(controller.create_topic, "gone", assignments={0: [1]})

    def elect(partitions):
        return [r.error for r in run(controller.elect_leaders, Election.UNCLEAN, partitions)]

    assert elect([("t", 0)]) == [ErrorCode.election_not_needed]
    fence(controller, quorum, 1)
    assert elect([("gone", 0), ("t", 0)]) == [ErrorCode.eligible_leaders_not_available, ErrorCode.none]
    p = quorum.image.topics["t"].partitions[0]
    assert (p.leader, p.isr, p.leader_recovery_state) == (2, (2,), 1)


def test_leadership_returns_to_preferred_replicas_when_a_broker_is_imbalanced():
    now = [0.0]
    controller, quorum = make(brokers=(1, 2), **{"leader.imbalance.per.broker.percentage": "40"})
    controller._clock = lambda: now[0]
    controller.activate()
    run(controller.create_topic, "t", assignments={p: [1, 2] for p in range(3)})

    def move_all_to_2():
        fence(controller, quorum, 1)
        unfence(controller, quorum, 1)
        for p in range(3):
            alter(controller, quorum, isr_change(quorum, partition=p, isr=(2, 1)), broker=2)

    def leaders():
        return [quorum.image.topics["t"].partitions[p].leader for p in range(3)]

    move_all_to_2()
    run(controller.elect_leaders, Election.PREFERRED, [("t", 0), ("t", 1)])
    assert leaders() == [1, 1, 2]
    now[0] = 301.0  # leader.imbalance.check.interval.seconds has passed: 1 of 3 (33%) is not above 40%
    run(controller.elect_leaders_when_due)
    assert leaders() == [1, 1, 2]
    move_all_to_2()
    now[0] = 400.0  # imbalanced, but not yet time to check again
    run(controller.elect_leaders_when_due)
    assert leaders() == [2, 2, 2]
    now[0] = 602.0
    run(controller.elect_leaders_when_due)
    assert leaders() == [1, 1, 1]


def test_no_automatic_rebalance_when_disabled():
    now = [0.0]
    controller, quorum = make(brokers=(1, 2), **{"auto.leader.rebalance.enable": "false"})
    controller._clock = lambda: now[0]
    controller.activate()
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    fence(controller, quorum, 1)
    unfence(controller, quorum, 1)
    alter(controller, quorum, isr_change(quorum, isr=(2, 1)), broker=2)
    now[0] = 1000.0
    run(controller.elect_leaders_when_due)
    assert quorum.image.topics["t"].partitions[0].leader == 2


# Reassignments ---------------------------------------------------------------

def reassign(controller, *targets, **kwargs):
    return [(r.error, r.message) for r in run(controller.alter_partition_reassignments, list(targets), **kwargs)]


def partition(quorum, topic="t", index=0):
    return quorum.image.topics[topic].partitions[index]


def test_a_reassignment_moves_the_partition_once_the_new_replicas_are_in_sync():
    controller, quorum = make(brokers=(1, 2, 3, 4))
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    assert reassign(controller, ("t", 0, [3, 4])) == [(ErrorCode.none, None)]
    p = partition(quorum)
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.isr, p.leader) == ((3, 4, 1, 2), (3, 4), (1, 2),
                                                                                     (1, 2), 1)
    assert [(t, i, q.replicas) for t, i, q in controller.list_partition_reassignments(None)] == [("t", 0, (3, 4, 1, 2))]
    assert controller.list_partition_reassignments([("t", [1]), ("nope", [0])]) == []
    [half] = alter(controller, quorum, isr_change(quorum, isr=(1, 2, 3)))
    assert half.error == ErrorCode.none and half.partition.reassigning
    # The last new replica joins: the move completes, the old replicas leave and the leader moves to the target.
    [done] = alter(controller, quorum, isr_change(quorum, isr=(1, 2, 3, 4)))
    p = partition(quorum)
    assert done.error == ErrorCode.new_leader_elected
    assert (p.replicas, p.isr, p.leader, p.adding_replicas, p.removing_replicas) == ((3, 4), (3, 4), 3, (), ())
    assert p.leader_epoch == 1 and controller.list_partition_reassignments(None) == []


def test_a_reassignment_already_in_sync_completes_at_once_and_keeps_its_leader():
    controller, quorum = make(brokers=(1, 2, 3))
    run(controller.create_topic, "t", assignments={0: [1, 2, 3]})
    assert reassign(controller, ("t", 0, [2, 1])) == [(ErrorCode.none, None)]
    p = partition(quorum)
    assert (p.replicas, p.isr, p.leader, p.reassigning) == ((2, 1), (1, 2), 1, False)
    assert p.leader_epoch == 1  # a replica left: its fetches are fenced by a new leader epoch
    assert reassign(controller, ("t", 0, [2, 1])) == [(ErrorCode.none, None)]  # nothing to do
    assert partition(quorum).partition_epoch == p.partition_epoch


def test_cancelling_a_reassignment_reverts_it():
    controller, quorum = make(brokers=(1, 2, 3))
    run(controller.create_topic, "t", assignments={0: [1, 2]})
    assert reassign(controller, ("t", 0, None))[0][0] == ErrorCode.no_reassignment_in_progress
    reassign(controller, ("t", 0, [3, 2]))
    alter(controller, quorum, isr_change(quorum, isr=(1, 2)))
    assert reassign(controller, ("t", 0, None)) == [(ErrorCode.none, None)]
    p = partition(quorum)
    assert (p.replicas, p.isr, p.leader, p.reassigning) == ((2, 1), (1, 2), 1, False)


def test_reassignment_refusals():
    controller, quorum = make(brokers=(1, 2))
    run(controller.create_topic, "t", assignments={0: [1]})
    results = reassign(controller, ("nope", 0, [1]), ("t", 3, [1]), ("t", 0, []), ("t", 0, [1, 7]), ("t", 0, [2, 2]))
    assert results == [
        (ErrorCode.unknown_topic_or_partition, "Unable to find a topic named nope."),
        (ErrorCode.unknown_topic_or_partition, "Unable to find partition t:3."),
        (ErrorCode.invalid_replica_assignment, "The manual partition assignment includes an empty replica list."),
        (ErrorCode.invalid_replica_assignment,
         "The manual partition assignment includes broker 7, but no such broker is registered."),
        (ErrorCode.invalid_replica_assignment,
         "The manual partition assignment includes the broker 2 more than once."),
    ]
    [(code, _)] = reassign(controller, ("t", 0, [1, 2]), allow_replication_factor_change=False)
    assert code == ErrorCode.invalid_replication_factor and not partition(quorum).reassigning


# Eligible leader replicas (KIP-966) ------------------------------------------

def with_elr(enabled=True, brokers=(1, 2, 3), assignment=(1, 2, 3), **overrides):
    """A topic ``t`` of one partition on ``assignment``, min.insync.replicas 2, ELR tracked when ``enabled``."""
    controller, quorum = make(brokers=brokers, **{"min.insync.replicas": "2", **overrides})
    if enabled:
        run(controller.bootstrap, {"eligible.leader.replicas.version": 1})
    run(controller.create_topic, "t", assignments={0: list(assignment)})
    return controller, quorum


def part(quorum):
    p = quorum.image.topics["t"].partitions[0]
    return p.leader, p.isr, p.elr, p.last_known_elr


def register_again(controller, quorum, broker, clean):
    """A restart: the broker registers with its previous epoch after a clean shutdown, -1 after an unclean one."""
    previous = quorum.image.brokers[broker].epoch if clean else -1
    run(controller.register_broker, broker, random_uuid(), [Endpoint("PLAINTEXT", "h", 9000 + broker)], None,
        {"eligible.leader.replicas.version": (0, 1)}, previous)


def test_the_eligible_leader_replicas_feature_is_on_for_clusters_new_at_4_1():
    from josef.node.builtins import register_features
    declared = {}
    register_features(lambda name, feature: declared.setdefault(name, feature))
    feature = declared["eligible.leader.replicas.version"]
    assert (feature.min_level, feature.max_level, feature.default_level) == (0, 1, 1)
    assert [feature.default_for(level) for level in (25, 26)] == [0, 1]  # Kafka 4.0 left it off, 4.1 turns it on


def test_a_cluster_new_with_elr_gets_a_cluster_level_min_isr_at_the_static_value():
    controller, quorum = make(**{"min.insync.replicas": "2"})
    run(controller.bootstrap, {"metadata.version": 26, "eligible.leader.replicas.version": 1})
    assert quorum.image.features == {"metadata.version": 26, "eligible.leader.replicas.version": 1}
    assert quorum.image.config(BROKER_RESOURCE, "") == {"min.insync.replicas": "2"}
    run(controller.bootstrap, {"metadata.version": 26, "eligible.leader.replicas.version": 1})
    assert quorum.records.count(quorum.records[-1]) == 1  # bootstrapped once

    controller, quorum = make()
    run(controller.bootstrap, {"metadata.version": 25, "eligible.leader.replicas.version": 0})
    assert quorum.image.features == {"metadata.version": 25} and not quorum.image.config(BROKER_RESOURCE, "")


def test_turning_elr_on_sets_min_isr_cluster_wide_and_drops_broker_level_ones():
    from josef.metadata.features import ELIGIBLE_LEADER_REPLICAS, SupportedFeature, UpgradeType
    supported = {"metadata.version": SupportedFeature(22, 26, 26),
                 "eligible.leader.replicas.version": ELIGIBLE_LEADER_REPLICAS}
    controller, quorum = make(brokers=(), **{"min.insync.replicas": "2"})
    run(controller.bootstrap, {"metadata.version": 23})
    for broker in (1, 2):
        run(controller.register_broker, broker, random_uuid(), [], None,
            {"metadata.version": (22, 26), "eligible.leader.replicas.version": (0, 1)})
    run(controller.alter_configs, BROKER_RESOURCE, "2", [("min.insync.replicas", SET, "3")], False)
    with pytest.raises(ControllerError, match="eligible.leader.replicas.version could not be set to 1 because it "
                                              "depends on metadata.version level 24") as refused:
        run(controller.update_features, [("eligible.leader.replicas.version", 1, UpgradeType.UPGRADE)], supported,
            False)
    assert refused.value.code == ErrorCode.invalid_update_version
    run(controller.update_features, [("eligible.leader.replicas.version", 1, UpgradeType.UPGRADE),
                                     ("metadata.version", 24, UpgradeType.UPGRADE)], supported, True)
    assert quorum.image.features == {"metadata.version": 23}  # validate only
    run(controller.update_features, [("eligible.leader.replicas.version", 1, UpgradeType.UPGRADE),
                                     ("metadata.version", 24, UpgradeType.UPGRADE)], supported, False)
    assert quorum.image.features == {"metadata.version": 24, "eligible.leader.replicas.version": 1}
    assert quorum.image.config(BROKER_RESOURCE, "") == {"min.insync.replicas": "2"}
    assert quorum.image.config(BROKER_RESOURCE, "2") == {}
    # A safe downgrade turns it off again, and the cluster-level value stays (Kafka keeps it).
    run(controller.update_features, [("eligible.leader.replicas.version", 0, UpgradeType.SAFE_DOWNGRADE)], supported,
        False)
    assert quorum.image.features == {"metadata.version": 24}
    assert quorum.image.config(BROKER_RESOURCE, "") == {"min.insync.replicas": "2"}


def test_with_elr_min_isr_is_cluster_wide_and_changing_it_clears_the_elr():
    controller, quorum = with_elr()
    assert quorum.image.config(BROKER_RESOURCE, "") == {"min.insync.replicas": "2"}
    for name, ops, message in [
        ("1", [("min.insync.replicas", SET, "1")], "Broker-level min.insync.replicas cannot be altered"),
        ("", [("min.insync.replicas", DELETE, None)], "Cluster-level min.insync.replicas cannot be removed"),
    ]:
        with pytest.raises(ControllerError, match=message) as refused:
            run(controller.alter_configs, BROKER_RESOURCE, name, ops, False)
        assert refused.value.code == ErrorCode.invalid_config
    with pytest.raises(ControllerError, match="Cluster-level min.insync.replicas cannot be removed"):
        run(controller.alter_configs, BROKER_RESOURCE, "", [("log.retention.ms", SET, "9")], False, False)  # legacy
    run(controller.alter_configs, BROKER_RESOURCE, "1", [("log.retention.ms", SET, "9")], False)  # others may

    run(controller.create_topic, "u", assignments={0: [1, 2, 3]})
    for topic in ("t", "u"):
        [r] = alter(controller, quorum, isr_change(quorum, isr=(1,), topic=topic))
    assert [quorum.image.topics[t].partitions[0].elr for t in "tu"] == [(2, 3), (2, 3)]
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("min.insync.replicas", SET, "3")], False)
    assert [quorum.image.topics[t].partitions[0].elr for t in "tu"] == [(), (2, 3)]  # only t's was chosen under it
    epoch = quorum.image.topics["u"].partitions[0].partition_epoch
    run(controller.alter_configs, BROKER_RESOURCE, "", [("min.insync.replicas", SET, "2")], False)  # even unchanged
    u = quorum.image.topics["u"].partitions[0]
    assert (u.elr, u.last_known_elr, u.partition_epoch) == ((), (), epoch + 1)


def test_without_elr_fenced_replicas_only_leave_the_isr_and_the_last_one_stays():
    controller, quorum = with_elr(enabled=False)
    for broker in (3, 2, 1):
        fence(controller, quorum, broker)
    assert part(quorum) == (-1, (1,), (), ())
    unfence(controller, quorum, 2)
    assert part(quorum) == (-1, (1,), (), ())  # 2 is not in sync: no leader without unclean election
    register_again(controller, quorum, 1, clean=False)
    assert part(quorum) == (-1, (1,), (), ())


def test_replicas_leaving_an_isr_below_min_isr_join_the_elr_until_it_is_back():
    controller, quorum = with_elr()
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1, 2)))
    assert part(quorum) == (1, (1, 2), (), ())  # still at min.insync.replicas: 3 may lack committed records
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1,)))
    assert r.error == ErrorCode.none and part(quorum) == (1, (1,), (2,), ())
    assert quorum.image.topics["t"].partitions[0].leader_epoch == 0  # an ISR shrink bumps no leader epoch
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1, 3)))
    assert part(quorum) == (1, (1, 3), (), ())  # back at min ISR: the ELR is cleared


def test_the_effective_min_isr_is_at_most_the_replication_factor():
    controller, quorum = with_elr(brokers=(1, 2), assignment=(1, 2), **{"min.insync.replicas": "3"})
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1,)))
    assert part(quorum) == (1, (1,), (2,), ())
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("min.insync.replicas", SET, "1")], False)
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1, 2)))
    [r] = alter(controller, quorum, isr_change(quorum, isr=(1,)))
    assert part(quorum) == (1, (1,), (), ())  # the topic's own min.insync.replicas counts


def test_fenced_elr_members_stay_and_one_is_elected_when_the_isr_is_empty():
    controller, quorum = with_elr()
    fence(controller, quorum, 3)
    assert part(quorum) == (1, (1, 2), (), ())
    fence(controller, quorum, 2)
    assert part(quorum) == (1, (1,), (2,), ())
    fence(controller, quorum, 1)  # the last ISR member: the ISR empties, the ELR keeps it and the fenced 2
    assert part(quorum) == (-1, (), (1, 2), (1,))
    epoch = quorum.image.topics["t"].partitions[0].leader_epoch
    unfence(controller, quorum, 3)  # not eligible: nothing changes
    assert part(quorum) == (-1, (), (1, 2), (1,))
    unfence(controller, quorum, 2)  # an ELR member: a clean election, it is the ISR alone
    p = quorum.image.topics["t"].partitions[0]
    assert part(quorum) == (2, (2,), (1,), ()) and p.leader_epoch == epoch + 1 and p.leader_recovery_state == 0


def test_a_clean_restart_keeps_the_elr_and_an_unclean_one_leaves_it():
    controller, quorum = with_elr()
    for broker in (3, 2, 1):
        fence(controller, quorum, broker)
    assert part(quorum) == (-1, (), (1, 2), (1,))
    register_again(controller, quorum, 2, clean=True)
    assert part(quorum) == (-1, (), (1, 2), (1,))
    register_again(controller, quorum, 1, clean=False)  # it may have lost acknowledged records
    assert part(quorum) == (-1, (), (2,), (1,))
    unfence(controller, quorum, 2)
    assert part(quorum) == (2, (2,), (), ())


def test_an_unclean_restart_leaves_the_isr_too():
    controller, quorum = with_elr()
    fence(controller, quorum, 3)
    register_again(controller, quorum, 2, clean=False)
    assert part(quorum) == (1, (1,), (), ())  # 2 left the ISR but may not be in the ELR


def test_the_last_known_leader_leads_again_when_isr_and_elr_are_empty():
    controller, quorum = with_elr()
    for broker in (3, 2, 1):
        fence(controller, quorum, broker)
    register_again(controller, quorum, 1, clean=False)
    register_again(controller, quorum, 2, clean=False)
    assert part(quorum) == (-1, (), (), (1,))
    unfence(controller, quorum, 2)  # neither eligible nor the last leader
    assert part(quorum) == (-1, (), (), (1,))
    unfence(controller, quorum, 1)  # an unclean choice, even without unclean.leader.election.enable
    p = quorum.image.topics["t"].partitions[0]
    assert part(quorum) == (1, (1,), (), ()) and p.leader_recovery_state == 1


def test_unclean_election_only_when_no_isr_or_elr_member_can_lead():
    controller, quorum = with_elr(assignment=(3, 2, 1))
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("unclean.leader.election.enable", SET, "true")], False)
    for broker in (1, 2, 3):
        fence(controller, quorum, broker)
    assert part(quorum) == (-1, (), (2, 3), (3,))
    unfence(controller, quorum, 2)  # an ELR member, though 3 comes first in the replicas: clean
    p = quorum.image.topics["t"].partitions[0]
    assert part(quorum) == (2, (2,), (3,), ()) and p.leader_recovery_state == 0

    controller, quorum = with_elr(assignment=(3, 2, 1))
    run(controller.alter_configs, TOPIC_RESOURCE, "t", [("unclean.leader.election.enable", SET, "true")], False)
    for broker in (1, 2, 3):
        fence(controller, quorum, broker)
    unfence(controller, quorum, 1)  # the ELR members are all fenced: 1 leads uncleanly, the ELR is dropped
    p = quorum.image.topics["t"].partitions[0]
    assert part(quorum) == (1, (1,), (), ()) and p.leader_recovery_state == 1


def test_after_elr_is_turned_off_a_member_of_an_elr_left_behind_still_leads():
    from josef.metadata.features import ELIGIBLE_LEADER_REPLICAS, UpgradeType
    controller, quorum = with_elr()
    for broker in (3, 2, 1):
        fence(controller, quorum, broker)
    run(controller.update_features, [("eligible.leader.replicas.version", 0, UpgradeType.SAFE_DOWNGRADE)],
        {"eligible.leader.replicas.version": ELIGIBLE_LEADER_REPLICAS}, False)
    assert part(quorum) == (-1, (), (1, 2), (1,))
    unfence(controller, quorum, 2)  # eligible when it left: a clean election, as Kafka's; the ELR is not kept
    assert part(quorum) == (2, (2,), (), ())


def test_elect_leaders_uses_the_elr():
    controller, quorum = with_elr()
    for broker in (3, 2, 1):
        fence(controller, quorum, broker)
    [result] = run(controller.elect_leaders, Election.UNCLEAN, [("t", 0)])
    assert result.error == ErrorCode.eligible_leaders_not_available  # every replica is fenced
    # Unfenced in a commit of its own (as if its partitions were decided elsewhere), then elected on request.
    broker = quorum.image.brokers[2]
    from josef.metadata.records import UnfenceBrokerRecord
    run(quorum.append, [UnfenceBrokerRecord(id=2, epoch=broker.epoch)])
    [result] = run(controller.elect_leaders, Election.UNCLEAN, [("t", 0)])
    assert result.error == ErrorCode.none and part(quorum) == (2, (2,), (1,), ())
