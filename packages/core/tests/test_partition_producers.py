"""Producer state on a partition of a running broker: the append path, truncation, check order."""

import pytest
from kio.schema.errors import ErrorCode

from josef.replication.partition import PartitionError
from josef.protocol.records import CorruptRecordError, build_batch
from josef.protocol.topic_partition import TopicPartition

PID = 5


def partition_of(josef_broker, topic, **configs):
    josef_broker.call(josef_broker.broker.controller.create_topic, topic, 1, -1, None, configs)
    josef_broker.call(josef_broker.broker.replicas.storage_settled)  # its log opens in a worker thread
    return josef_broker.broker.replicas.get(TopicPartition(topic, 0))


def append(josef_broker, partition, batch):
    return josef_broker.call(partition.append_as_leader, batch, 1)


def batch(seq, count=1, epoch=0, pid=PID):
    return build_batch([(None, b"v", 100 + i) for i in range(count)], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq)


def test_duplicates_are_answered_with_the_original_offsets_and_not_appended(josef_broker):
    partition = partition_of(josef_broker, "dups", **{"message.timestamp.type": "LogAppendTime"})
    info, appended_at = append(josef_broker, partition, batch(0, count=3))
    assert (info.first_offset, info.last_offset) == (0, 2) and appended_at > 0
    again, again_at = append(josef_broker, partition, batch(0, count=3))
    assert (again.first_offset, again.last_offset, again_at) == (0, 2, appended_at)
    assert partition.log.log_end_offset == 3


def test_a_corrupt_batch_is_corrupt_even_when_its_sequence_is_a_duplicate(josef_broker):
    partition = partition_of(josef_broker, "corrupt")
    original = batch(0)
    append(josef_broker, partition, original)
    damaged = bytearray(original)
    damaged[-1] ^= 0xFF  # in the record: header, producer id and sequence are intact, only the CRC can tell
    with pytest.raises(CorruptRecordError):
        append(josef_broker, partition, bytes(damaged))


def test_errors_leave_log_and_state_unchanged(josef_broker):
    partition = partition_of(josef_broker, "errors")
    append(josef_broker, partition, batch(0, epoch=2))
    for bad, code in [(batch(2, epoch=2), ErrorCode.out_of_order_sequence_number),
                      (batch(1, epoch=1), ErrorCode.invalid_producer_epoch),
                      (batch(1, epoch=3), ErrorCode.out_of_order_sequence_number)]:
        with pytest.raises(PartitionError) as info:
            append(josef_broker, partition, bad)
        assert info.value.code == code
    assert partition.log.log_end_offset == 1 and partition.producers.get(PID).last_seq == 0


def test_truncation_rebuilds_the_producer_state(josef_broker):
    partition = partition_of(josef_broker, "truncated")
    for seq in range(4):
        append(josef_broker, partition, batch(seq))
    josef_broker.call(partition.truncate_to, 2)
    assert partition.producers.get(PID).last_seq == 1
    with pytest.raises(PartitionError):
        append(josef_broker, partition, batch(4))
    info, _ = append(josef_broker, partition, batch(2))
    assert info.first_offset == 2
