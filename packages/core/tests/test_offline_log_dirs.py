"""The controller's side of a failed log directory (KIP-858): brokers name their directories, and leadership moves away."""

import anyio

from josef.metadata.controller import Controller
from josef.metadata.image import MetadataImage
from josef.metadata.records import Endpoint, decode, encode, random_uuid
from josef.plugins import get_plugin_manager
from josef.server_properties import load_config

DIRS = {b: (random_uuid(), random_uuid()) for b in (1, 2, 3)}


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
        await controller.create_topic("rf3", 6, 3)
        await controller.create_topic("alone", assignments={0: [1]})

    anyio.run(start)
    return controller, quorum, epochs


def heartbeat(controller, quorum, broker, epoch, offline=()):
    return anyio.run(lambda: controller.broker_heartbeat(broker, epoch, quorum.image.offset, False, False, offline))


def test_brokers_register_their_log_directories():
    _, quorum, _ = cluster()
    assert {b: quorum.image.brokers[b].log_dirs for b in (1, 2, 3)} == DIRS


def test_a_failed_directory_moves_leadership_away_where_another_in_sync_replica_can_lead():
    controller, quorum, epochs = cluster()
    topic = quorum.image.topics["rf3"]
    led = [i for i, p in topic.partitions.items() if p.leader == 1]
    assert led
    before = quorum.image.offset
    assert heartbeat(controller, quorum, 1, epochs[1], offline=[DIRS[1][1]]) == (True, False, False)
    topic = quorum.image.topics["rf3"]
    for i, p in topic.partitions.items():
        if i in led:
            assert p.leader in (2, 3) and 1 not in p.isr
        else:
            assert p.leader != 1 and 1 in p.isr  # followers stay until their leaders see them lag
    # A partition nobody else can lead keeps its leader; the broker stays registered and unfenced.
    assert quorum.image.topics["alone"].partitions[0].leader == 1
    assert quorum.image.brokers[1].log_dirs == (DIRS[1][0],)
    assert not quorum.image.brokers[1].fenced

    # Reported again in the next heartbeats: nothing more happens.
    offset = quorum.image.offset
    assert offset > before
    heartbeat(controller, quorum, 1, epochs[1], offline=[DIRS[1][1]])
    assert quorum.image.offset == offset


def test_an_unknown_directory_changes_nothing():
    controller, quorum, epochs = cluster()
    offset = quorum.image.offset
    heartbeat(controller, quorum, 2, epochs[2], offline=[random_uuid()])
    assert quorum.image.offset == offset
