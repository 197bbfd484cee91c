"""Producer-id blocks: allocated by the controller through ProducerIdsRecord, handed out by the broker."""

import anyio
import anyio.lowlevel
import pytest

from josef.metadata.controller import Controller, ControllerError
from josef.metadata.image import MetadataImage
from josef.metadata.records import PRODUCER_ID_BLOCK_SIZE, ProducerIdsRecord, decode, encode
from josef.plugins import get_plugin_manager
from josef.producer.producer_ids import ProducerIdManager
from josef.node.server_properties import load_config


class MemoryQuorum:
    """Commits at once, through the records' encoding, as the metadata log would."""

    controller_id = 1  # this node leads

    def __init__(self, image=None):
        self.image = image or MetadataImage()
        self.commits = 0

    async def append(self, records):
        records = [decode(encode(r)) for r in records]
        self.commits += 1
        await anyio.lowlevel.checkpoint()  # a real commit waits for an fsync: let other tasks run meanwhile
        self.image, _ = self.image.apply(self.image.offset + len(records), records)
        return self.image.offset


def controller_on(quorum):
    config = load_config(None, {}, get_plugin_manager(autoload=False))
    return Controller(quorum, config, lambda: quorum.image)


def test_blocks_follow_each_other_and_are_recorded():
    quorum = MemoryQuorum()
    controller = controller_on(quorum)

    async def main():
        return [await controller.allocate_producer_ids(b) for b in (1, 2, 1)]

    blocks = anyio.run(main)
    assert [(b.broker_id, b.first_id, b.size) for b in blocks] == [
        (1, 0, PRODUCER_ID_BLOCK_SIZE), (2, PRODUCER_ID_BLOCK_SIZE, PRODUCER_ID_BLOCK_SIZE),
        (1, 2 * PRODUCER_ID_BLOCK_SIZE, PRODUCER_ID_BLOCK_SIZE)]
    assert quorum.image.next_producer_id == 3 * PRODUCER_ID_BLOCK_SIZE


def test_the_image_never_moves_backwards():
    image, _ = MetadataImage().apply(0, [ProducerIdsRecord(broker_id=1, broker_epoch=-1, next_producer_id=5000)])
    image, delta = image.apply(1, [ProducerIdsRecord(broker_id=1, broker_epoch=-1, next_producer_id=2000)])
    assert image.next_producer_id == 5000 and delta.empty


def test_an_exhausted_id_space_is_an_error():
    quorum = MemoryQuorum(MetadataImage().apply(0, [ProducerIdsRecord(broker_id=1, broker_epoch=-1, next_producer_id=2**63 - 10)])[0])
    with pytest.raises(ControllerError):
        anyio.run(controller_on(quorum).allocate_producer_ids, 1)


def test_manager_hands_out_unique_ids_and_takes_one_block_at_a_time():
    quorum = MemoryQuorum()
    controller = controller_on(quorum)
    manager = ProducerIdManager(lambda: controller.allocate_producer_ids(1))
    ids = []

    async def one():
        ids.append(await manager.generate())

    async def main():
        async with anyio.create_task_group() as tg:
            for _ in range(PRODUCER_ID_BLOCK_SIZE + 10):
                tg.start_soon(one)

    anyio.run(main)
    assert sorted(ids) == list(range(PRODUCER_ID_BLOCK_SIZE + 10))
    assert quorum.commits == 2


def test_a_restarted_broker_never_reuses_an_id():
    quorum = MemoryQuorum()
    controller = controller_on(quorum)

    async def take(count):
        manager = ProducerIdManager(lambda: controller.allocate_producer_ids(1))
        return [await manager.generate() for _ in range(count)]

    before = anyio.run(take, 3)
    after = anyio.run(take, 3)  # a new manager: what a broker has after a restart
    assert before == [0, 1, 2] and after == [PRODUCER_ID_BLOCK_SIZE + i for i in range(3)]
