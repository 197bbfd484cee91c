"""The controller's side of several log directories (KIP-858): directory assignment, and a failed directory's replicas."""

import anyio
from kio.schema.errors import ErrorCode

from josef.metadata.controller import Controller, IsrChange
from josef.metadata.image import UNASSIGNED_DIR, MetadataImage
from josef.metadata.partition_changes import Election
from josef.metadata.records import Endpoint, decode, encode, random_uuid
from josef.plugins import get_plugin_manager
from josef.node.server_properties import load_config

#: Broker 1's directories: a healthy one and one that will fail; 2 and 3 have one each.
HEALTHY, FAILING = random_uuid(), random_uuid()
DIRS = {1: (HEALTHY, FAILING), 2: (random_uuid(),), 3: (random_uuid(),)}
#: Replicas of "rf3": broker 1 leads 0 and 3, follows the others.
RF3 = {0: [1, 2, 3], 1: [2, 1, 3], 2: [3, 2, 1], 3: [1, 3, 2], 4: [2, 3, 1], 5: [3, 1, 2]}


class MemoryQuorum:
    controller_id = 1

    def __init__(self):
        self.image = MetadataImage()
        self.records = []

    async def append(self, records):
        records = [decode(encode(r)) for r in records]  # every record survives the metadata log's encoding
        self.records.extend(records)
        self.image, _ = self.image.apply(len(self.records) - 1, records)
        return len(self.records) - 1


def run(fn, *args, **kwargs):
    return anyio.run(lambda: fn(*args, **kwargs))


def cluster():
    config = load_config(None, {}, get_plugin_manager(autoload=False))
    quorum = MemoryQuorum()
    controller = Controller(quorum, config, lambda: quorum.image)
    epochs = {}

    async def start():
        for b in (1, 2, 3):
            epochs[b] = await controller.register_broker(b, random_uuid(), [Endpoint("PLAINTEXT", "h", 9000 + b)], None,
                                                         {}, log_dirs=DIRS[b])
            await controller.broker_heartbeat(b, epochs[b], quorum.image.offset, False, False)
        await controller.create_topic("rf3", assignments=RF3)
        await controller.create_topic("alone", assignments={0: [1]})

    anyio.run(start)
    return controller, quorum, epochs


def topic_id(quorum, name):
    return quorum.image.topics[name].topic_id


def assign(controller, quorum, epochs, placement, broker=1):
    """``placement``: ``{(topic, partition): directory}`` of broker 1's replicas."""
    return run(controller.assign_replicas_to_dirs, broker, epochs[broker],
               [(d, topic_id(quorum, t), p) for (t, p), d in placement.items()])


def heartbeat(controller, quorum, broker, epoch, offline=()):
    return run(controller.broker_heartbeat, broker, epoch, quorum.image.offset, False, False, offline)


def placed(controller, quorum, epochs):
    placement = {("rf3", p): (FAILING if p < 3 else HEALTHY) for p in RF3}
    placement[("alone", 0)] = FAILING
    assert assign(controller, quorum, epochs, placement) == [ErrorCode.none] * 7
    return placement


def test_brokers_register_their_directories_and_new_replicas_start_in_the_only_one_or_unassigned():
    _, quorum, _ = cluster()
    assert {b: quorum.image.brokers[b].log_dirs for b in (1, 2, 3)} == DIRS
    partition = quorum.image.topics["rf3"].partitions[0]
    assert partition.directories == (UNASSIGNED_DIR, DIRS[2][0], DIRS[3][0])
    assert quorum.records[-1].directories  # written to the metadata log, as Kafka writes PartitionRecord.directories


def test_a_broker_assigns_its_replicas_to_directories():
    controller, quorum, epochs = cluster()
    placed(controller, quorum, epochs)
    partitions = quorum.image.topics["rf3"].partitions
    assert [partitions[p].directory_of(1) for p in range(6)] == [FAILING] * 3 + [HEALTHY] * 3
    assert partitions[1].directory_of(2) == DIRS[2][0]
    offset = quorum.image.offset
    placed(controller, quorum, epochs)  # again: nothing to change
    assert quorum.image.offset == offset
    codes = run(controller.assign_replicas_to_dirs, 2, epochs[2], [
        (DIRS[2][0], topic_id(quorum, "alone"), 0), (DIRS[2][0], topic_id(quorum, "rf3"), 9),
        (DIRS[2][0], random_uuid(), 0)])
    assert codes == [ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition, ErrorCode.unknown_topic_id]


def test_a_failed_directory_takes_exactly_its_replicas_out_of_leadership_and_the_isr():
    controller, quorum, epochs = cluster()
    placed(controller, quorum, epochs)
    before = quorum.image.topics["rf3"].partitions
    assert heartbeat(controller, quorum, 1, epochs[1], offline=[FAILING]) == (True, False, False)
    after = quorum.image.topics["rf3"].partitions
    for p in (0, 1, 2):  # in the failed directory: out, leader or not
        assert after[p].leader in (2, 3) and 1 not in after[p].isr
    for p in (3, 4, 5):  # in the healthy one: untouched
        assert after[p] == before[p]
    # Nobody else can lead "alone": it has no leader now, as in Kafka.
    assert quorum.image.topics["alone"].partitions[0].leader == -1
    assert quorum.image.brokers[1].log_dirs == (HEALTHY,)
    assert not quorum.image.brokers[1].fenced

    offset = quorum.image.offset
    heartbeat(controller, quorum, 1, epochs[1], offline=[FAILING])  # reported again: nothing more
    assert quorum.image.offset == offset

    # Broker 1 may not lead or rejoin the ISR of a replica in the failed directory.
    results = run(controller.elect_leaders, Election.PREFERRED, [("rf3", 0), ("rf3", 3), ("alone", 0)])
    assert quorum.image.topics["rf3"].partitions[0].leader != 1
    assert quorum.image.topics["alone"].partitions[0].leader == -1
    assert results[0].error != ErrorCode.none
    p0 = quorum.image.topics["rf3"].partitions[0]
    change = IsrChange(topic_id(quorum, "rf3"), 0, p0.leader_epoch, p0.partition_epoch,
                       tuple((b, -1) for b in (*p0.isr, 1)))
    assert run(controller.alter_partition, p0.leader, epochs[p0.leader], [change])[0].error == \
        ErrorCode.ineligible_replica


def test_a_replica_assigned_to_a_directory_already_offline_leaves_at_once():
    controller, quorum, epochs = cluster()
    assign(controller, quorum, epochs, {("rf3", 3): HEALTHY})
    heartbeat(controller, quorum, 1, epochs[1], offline=[FAILING])
    assert quorum.image.topics["rf3"].partitions[0].leader == 1  # unassigned: not known to be in the failed one
    assign(controller, quorum, epochs, {("rf3", 0): FAILING})
    partition = quorum.image.topics["rf3"].partitions[0]
    assert partition.leader in (2, 3) and 1 not in partition.isr


def test_an_unknown_directory_changes_nothing():
    controller, quorum, epochs = cluster()
    offset = quorum.image.offset
    heartbeat(controller, quorum, 2, epochs[2], offline=[random_uuid()])
    assert quorum.image.offset == offset


def test_replicas_keep_their_directories_through_a_reassignment_and_new_ones_start_unassigned():
    controller, quorum, epochs = cluster()
    placed(controller, quorum, epochs)
    # Partition 4 of rf3 ([2, 3, 1]) moves to [2, 1]: a reordering that completes at once.
    run(controller.alter_partition_reassignments, [("rf3", 4, [1, 2])])
    partition = quorum.image.topics["rf3"].partitions[4]
    assert partition.replicas == (1, 2)
    assert partition.directories == (HEALTHY, DIRS[2][0])
    # "alone" ([1]) gains broker 2: its replica's directory is not known until broker 2 says.
    run(controller.alter_partition_reassignments, [("alone", 0, [1, 2])])
    partition = quorum.image.topics["alone"].partitions[0]
    assert partition.directory_of(1) == FAILING and partition.directory_of(2) == UNASSIGNED_DIR
