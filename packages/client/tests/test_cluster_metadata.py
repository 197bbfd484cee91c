"""Metadata from a broker that is behind (a node just resumed after a freeze names itself leader in an old epoch)
never replaces a newer leader epoch the client already knows; a re-created topic (a new topic id) starts afresh."""

import asyncio
import uuid
from types import SimpleNamespace

from josef_client.cluster import Cluster, PartitionInfo

TOPIC = "t"
FIRST_ID, SECOND_ID = uuid.uuid4(), uuid.uuid4()


def answer(leader: int, epoch: int, topic_id: uuid.UUID = FIRST_ID) -> SimpleNamespace:
    partition = SimpleNamespace(partition_index=0, leader_id=leader, leader_epoch=epoch, replica_nodes=[1, 2, 3],
                                isr_nodes=[leader])
    return SimpleNamespace(brokers=[], cluster_id="c", controller_id=1, topics=[
        SimpleNamespace(name=TOPIC, topic_id=topic_id, error_code=0, partitions=[partition])])


class Answering:
    closed = False

    def __init__(self, *answers: SimpleNamespace) -> None:
        self.answers = list(answers)

    async def request(self, api_key, body):
        return self.answers.pop(0)


def leader_after(*answers: SimpleNamespace) -> PartitionInfo:
    cluster = Cluster.__new__(Cluster)
    cluster.brokers, cluster.partitions, cluster.topic_errors, cluster._topic_ids, cluster._connections = {}, {}, {}, {}, {}
    conn = Answering(*answers)

    async def any_connection():
        return conn
    cluster.any_connection = any_connection

    async def main():
        for _ in answers:
            await cluster._fetch([TOPIC], False)
    asyncio.run(main())
    return cluster.partitions[TOPIC][0]


def test_a_broker_naming_an_older_leader_epoch_does_not_move_the_leader_back():
    info = leader_after(answer(leader=3, epoch=4), answer(leader=2, epoch=2))
    assert (info.leader, info.leader_epoch) == (3, 4)


def test_a_newer_epoch_replaces_the_known_one():
    info = leader_after(answer(leader=2, epoch=2), answer(leader=3, epoch=4))
    assert (info.leader, info.leader_epoch) == (3, 4)


def test_a_recreated_topic_starts_from_its_own_epochs():
    info = leader_after(answer(leader=3, epoch=4), answer(leader=1, epoch=0, topic_id=SECOND_ID))
    assert (info.leader, info.leader_epoch) == (1, 0)
