"""josef's Kafka client: asyncio-native producer, consumer and admin, with thin synchronous wrappers.

    from josef.client import Producer
    with Producer({"bootstrap.servers": "localhost:9092"}) as producer:
        producer.send("orders", b"order-1").result(10)

Configuration uses Kafka's property names, as a dict or as keyword arguments
with underscores (``linger_ms=5``). It works against josef and any Kafka broker.
"""

from josef.client.admin import Admin, AsyncAdmin, ConfigResource, NewPartitions, NewTopic, OffsetSpec
from josef.client.cluster import TopicPartition
from josef.client.consumer import AsyncConsumer, Consumer, OffsetAndMetadata
from josef.client.group import CommitFailedError, RebalanceListener
from josef.client.errors import ConfigError, KafkaConnectionError, KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.client.producer import AsyncProducer, Producer, RecordMetadata
from josef.client.records import ConsumerRecord

__all__ = [
    "Admin", "AsyncAdmin", "ConfigResource", "NewPartitions", "NewTopic", "OffsetSpec",
    "AsyncConsumer", "AsyncProducer", "ConfigError", "Consumer", "ConsumerRecord", "KafkaConnectionError",
    "KafkaError", "KafkaTimeoutError", "OffsetAndMetadata", "Producer", "RecordMetadata", "TopicPartition",
    "CommitFailedError", "RebalanceListener",
    "UnsupportedVersionError",
]
