"""aiokafka's admin client against a josef broker: cluster, topics, configs, groups, offsets and records."""

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.admin.records_to_delete import RecordsToDelete
from aiokafka.structs import TopicPartition


def test_admin_calls(broker):
    asyncio.run(admin_calls(broker.bootstrap_servers))


async def admin_calls(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
        assert [b["node_id"] for b in cluster["brokers"]] == [1] and cluster["controller_id"] == 1

        await admin.create_topics([NewTopic("aio", num_partitions=2, replication_factor=1,
                                            topic_configs={"retention.ms": "3600000"})])
        await admin.create_partitions({"aio": NewPartitions(total_count=3)})
        [described] = await admin.describe_topics(["aio"])
        assert described["topic"] == "aio" and len(described["partitions"]) == 3

        [configs] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "aio")])
        values = {c[0]: c[1] for c in configs.resources[0][4]}
        assert values["retention.ms"] == "3600000"

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        for i in range(10):
            await producer.send_and_wait("aio", b"v%d" % i, partition=0)
        await producer.stop()

        consumer = AIOKafkaConsumer("aio", bootstrap_servers=bootstrap, group_id="aio-group",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        seen = 0
        while seen < 10:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, "no records within 5 s"
            seen += sum(len(records) for records in batches.values())
        await consumer.commit()
        await consumer.stop()

        assert ("aio-group", "consumer") in [(g[0], g[1]) for g in await admin.list_consumer_groups()]
        coordinator = await admin.find_coordinator("aio-group")
        assert coordinator == 1
        [groups] = await admin.describe_consumer_groups(["aio-group"])
        assert groups.groups[0][1] == "aio-group"
        offsets = await admin.list_consumer_group_offsets("aio-group")
        assert offsets[TopicPartition("aio", 0)].offset == 10

        deleted = await admin.delete_records({TopicPartition("aio", 0): RecordsToDelete(before_offset=4)})
        assert deleted[TopicPartition("aio", 0)] == 4
    finally:
        await admin.close()
