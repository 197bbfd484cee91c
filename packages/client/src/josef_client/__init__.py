"""josef's Kafka client: asyncio-native producer, consumer and admin, with thin synchronous wrappers.

    from josef_client import Producer
    with Producer({"bootstrap.servers": "localhost:9092"}) as producer:
        producer.send("orders", b"order-1").result(10)

Configuration uses Kafka's property names, as a dict or as keyword arguments
with underscores (``linger_ms=5``). It works against josef and any Kafka broker.
Everything an application needs is importable from here; the submodules are
the client's own structure.
"""

from josef.protocol.errors import (
    ConfigError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    UnsupportedVersionError,
)
from josef.protocol.records import ConsumerRecord, CorruptRecordError, RecordDeserializationError
from josef.protocol.topic_partition import TopicPartition
from josef_client.admin import (
    Admin,
    AsyncAdmin,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)
from josef_client.consumer import (
    AsyncConsumer,
    Consumer,
    NoOffsetForPartitionError,
    OffsetAndMetadata,
    OffsetOutOfRangeError,
)
from josef_client.group import CommitFailedError, ConsumerGroupMetadata, RebalanceListener
from josef_client.producer import AsyncProducer, Producer, RecordMetadata
from josef_client.share_consumer import AcknowledgeType, AsyncShareConsumer, ShareConsumer, ShareConsumerRecord
from josef_client.transaction_errors import (
    FatalProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)

__all__ = [
    "AcknowledgeType", "Admin", "AsyncAdmin", "AsyncConsumer", "AsyncProducer", "AsyncShareConsumer", "CommitFailedError", "ConfigError", "ConfigResource",
    "Consumer", "ConsumerGroupMetadata", "ConsumerRecord", "CorruptRecordError", "FatalProducerError",
    "KafkaConnectionError", "KafkaError", "KafkaTimeoutError", "NewPartitions", "NewTopic", "NoOffsetForPartitionError",
    "OffsetAndMetadata", "OffsetOutOfRangeError", "OffsetSpec", "Producer", "ProducerFencedError",
    "RecordDeserializationError", "RecordMetadata", "RebalanceListener", "ShareConsumer", "ShareConsumerRecord",
    "TopicPartition", "TransactionAbortableError",
    "TransactionAbortedError", "TransactionStateError", "UnsupportedVersionError",
]
