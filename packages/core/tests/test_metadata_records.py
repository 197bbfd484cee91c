"""Kafka's binary metadata records: framing, every record type, older versions, and what is refused."""

import uuid

import pytest

from josef.metadata import records as R
from josef.metadata.image import BrokerImage, MetadataImage
from josef.metadata.records import UnknownRecordError, decode, encode

TOPIC_ID = uuid.UUID("0123456789abcdef0123456789abcdef")

EVERY_RECORD = [
    R.RegisterBrokerRecord(broker_id=3, incarnation_id=TOPIC_ID, broker_epoch=17, rack="r1", fenced=False,
                           end_points=(R.BrokerEndpoint(name="PLAINTEXT", host="h", port=9092, security_protocol=0),),
                           features=(R.BrokerFeature(name="metadata.version", min_supported_version=22,
                                                     max_supported_version=25),),
                           log_dirs=(TOPIC_ID,)),
    R.UnregisterBrokerRecord(broker_id=3, broker_epoch=17),
    R.TopicRecord(name="orders", topic_id=TOPIC_ID),
    R.PartitionRecord(partition_id=2, topic_id=TOPIC_ID, replicas=(1, 2, 3), isr=(1, 2), leader=1, leader_epoch=4,
                      partition_epoch=9, directories=(TOPIC_ID,) * 3, eligible_leader_replicas=(3,)),
    R.ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value=None),
    R.PartitionChangeRecord(partition_id=2, topic_id=TOPIC_ID, isr=(1,), leader=-1),
    R.FenceBrokerRecord(id=3, epoch=17),
    R.UnfenceBrokerRecord(id=3, epoch=17),
    R.RemoveTopicRecord(topic_id=TOPIC_ID),
    R.FeatureLevelRecord(name="metadata.version", feature_level=25),
    R.ClientQuotaRecord(entity=(R.EntityData(entity_type="user", entity_name=None),), key="producer_byte_rate",
                        value=1024.0, remove=False),
    R.ProducerIdsRecord(broker_id=1, broker_epoch=-1, next_producer_id=2000),
    R.BrokerRegistrationChangeRecord(broker_id=3, broker_epoch=17, fenced=-1, in_controlled_shutdown=1),
    R.NoOpRecord(),
    R.ClearElrRecord(topic_name="orders"),
]


@pytest.mark.parametrize("record", EVERY_RECORD, ids=lambda r: type(r).__name__)
def test_every_record_survives_its_encoding_framed_as_api_message_and_version(record):
    data = encode(record)
    # Frame version 1, the record's api key and version: one varint byte each.
    assert data[:3] == bytes([1, type(record).api_key, type(record).__version__])
    assert decode(data) == record


def test_clear_elr_empties_the_elr_of_one_topic_or_of_all_and_bumps_partition_epochs():
    """Kafka's ClearElrRecord replay: a topic created in the same commit is cleared too; a gone one is skipped."""
    other = uuid.UUID(int=7)
    holding = dict(replicas=(1, 2, 3), isr=(1,), leader=1, leader_epoch=0, partition_epoch=0,
                   eligible_leader_replicas=(2, 3), last_known_elr=(2,))
    records = [R.TopicRecord(name="a", topic_id=TOPIC_ID), R.TopicRecord(name="b", topic_id=other)]
    records += [R.PartitionRecord(partition_id=i, topic_id=t, **holding) for t in (TOPIC_ID, other) for i in (0, 1)]
    image, _ = MetadataImage().apply(0, records + [R.ClearElrRecord(topic_name="a"), R.ClearElrRecord(topic_name="x")])
    assert [(p.elr, p.last_known_elr, p.partition_epoch) for p in image.topics["a"].partitions.values()] == [
        ((), (), 1), ((), (), 1)]
    assert all(p.elr == (2, 3) for p in image.topics["b"].partitions.values())
    image, delta = image.apply(1, [R.ClearElrRecord(topic_name="")])
    assert all(not p.elr and not p.last_known_elr for t in image.topics.values() for p in t.partitions.values())
    assert sorted(delta.changed_partitions) == [("b", 0), ("b", 1)]  # a had nothing left to clear


def test_topic_record_bytes_are_kafkas():
    """Byte for byte what Kafka's TopicRecord v0 serialiser writes: compact string, uuid, no tagged fields."""
    assert encode(R.TopicRecord(name="ab", topic_id=TOPIC_ID)) == (
        bytes([1, 2, 0]) + bytes([3]) + b"ab" + TOPIC_ID.bytes + bytes([0]))


def test_a_partition_change_writes_only_what_changed():
    """Every field but the ids is tagged: an ISR change is the ids, one tag and its value."""
    data = encode(R.PartitionChangeRecord(partition_id=0, topic_id=TOPIC_ID, isr=(1,)))
    assert data == bytes([1, 5, 2]) + bytes(4) + TOPIC_ID.bytes + bytes([1, 0, 5, 2, 0, 0, 0, 1])


def test_an_older_version_with_the_same_layout_is_read():
    """PartitionRecord v1 is v2 without its tagged ELR fields: Kafka writes it below ELR, josef reads it."""
    v2 = encode(R.PartitionRecord(partition_id=0, topic_id=TOPIC_ID, replicas=(1,), isr=(1,), leader=1))
    assert decode(v2[:2] + bytes([1]) + v2[3:]) == decode(v2)


@pytest.mark.parametrize("data,message", [
    (b'{"type":"TopicRecord"}', "frame version 123"),
    (bytes([1, 99, 0]), "type 99"),
    (bytes([1, 3, 0]) + bytes(40), "PartitionRecord version 0"),
    (bytes([1, 2, 1]), "TopicRecord version 1"),
    (bytes([1, 2, 0, 5]), "malformed TopicRecord"),
    (encode(R.NoOpRecord()) + b"x", "1 bytes after a NoOpRecord"),
    (bytes([1]), "truncated"),
])
def test_what_josef_cannot_read_is_refused_by_name(data, message):
    with pytest.raises(UnknownRecordError, match=message):
        decode(data)


def test_a_partition_change_bumps_epochs_as_kafka_merges_it():
    topic = R.TopicRecord(name="t", topic_id=TOPIC_ID)
    image, _ = MetadataImage().apply(0, [topic, R.PartitionRecord(
        partition_id=0, topic_id=TOPIC_ID, replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=0,
        partition_epoch=0)])
    image, delta = image.apply(1, [R.PartitionChangeRecord(partition_id=0, topic_id=TOPIC_ID, isr=(1, 2))])
    p = image.topics["t"].partitions[0]
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 2), 1, 0, 1)
    assert delta.changed_partitions == (("t", 0),) and not delta.created_topics
    image, _ = image.apply(2, [R.PartitionChangeRecord(partition_id=0, topic_id=TOPIC_ID, leader=2)])
    p = image.topics["t"].partitions[0]
    assert (p.isr, p.leader, p.leader_epoch, p.partition_epoch) == ((1, 2), 2, 1, 2)


def test_a_partition_keeps_its_reassignment_recovery_state_and_elr_as_kafka_does():
    """PartitionRecord loads every field; a change merges what it names; a snapshot writes them back."""
    topic = R.TopicRecord(name="t", topic_id=TOPIC_ID)
    image, _ = MetadataImage().apply(0, [topic, R.PartitionRecord(
        partition_id=0, topic_id=TOPIC_ID, replicas=(4, 1, 2), isr=(1, 2), adding_replicas=(4,),
        removing_replicas=(2,), leader=1, leader_epoch=3, partition_epoch=5, leader_recovery_state=1,
        eligible_leader_replicas=(2,), last_known_elr=(1,))])
    p = image.topics["t"].partitions[0]
    assert (p.adding_replicas, p.removing_replicas, p.leader_recovery_state, p.elr, p.last_known_elr) == (
        (4,), (2,), 1, (2,), (1,))
    assert p.reassigning and p.preferred_leader == 4
    rebuilt, _ = MetadataImage().apply(0, list(image.records()))
    assert rebuilt.topics["t"].partitions[0] == p
    image, _ = image.apply(1, [R.PartitionChangeRecord(partition_id=0, topic_id=TOPIC_ID, adding_replicas=(),
                                                       removing_replicas=(), replicas=(4, 1), leader_recovery_state=0,
                                                       eligible_leader_replicas=())])
    p = image.topics["t"].partitions[0]
    assert (p.replicas, p.adding_replicas, p.removing_replicas, p.leader_recovery_state, p.elr, p.last_known_elr) == (
        (4, 1), (), (), 0, (), (1,))
    assert not p.reassigning and (p.leader_epoch, p.partition_epoch) == (3, 6)


def test_fencing_names_the_registration_it_fences():
    broker = BrokerImage(3, (R.Endpoint("PLAINTEXT", "h", 1),), None, True, 10, "AAAAAAAAAAAAAAAAAAAAAA")
    image, _ = MetadataImage().apply(0, [broker.to_record()])
    image, delta = image.apply(1, [R.UnfenceBrokerRecord(id=3, epoch=10)])
    assert not image.brokers[3].fenced and delta.changed_brokers == (3,)
    image, delta = image.apply(2, [R.FenceBrokerRecord(id=3, epoch=9)])  # an older registration: ignored
    assert not image.brokers[3].fenced and delta.empty
    image, _ = image.apply(3, [R.BrokerRegistrationChangeRecord(broker_id=3, broker_epoch=10, fenced=1,
                                                                in_controlled_shutdown=1)])
    assert image.brokers[3].fenced and image.brokers[3].in_controlled_shutdown
    image, _ = image.apply(4, [R.UnregisterBrokerRecord(broker_id=3, broker_epoch=10)])
    assert 3 not in image.brokers


def test_an_image_rebuilds_from_its_own_records():
    """What a snapshot holds: replaying ``image.records()`` from nothing gives the same image."""
    image, _ = MetadataImage().apply(41, [EVERY_RECORD[0]] + EVERY_RECORD[2:4] + EVERY_RECORD[9:12] + [
        R.ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value="5"),
        R.ConfigRecord(resource_type=4, resource_name="", name="log.retention.ms", value="7")])
    rebuilt, _ = MetadataImage().apply(41, list(image.records()))
    assert rebuilt == image
    assert image.topics["orders"].partitions[2].isr == (1, 2) and image.features == {"metadata.version": 25}
    assert image.brokers[3].features == {"metadata.version": (22, 25)} and image.client_quotas


def test_a_commit_copies_only_what_it_changes_and_never_touches_the_old_image():
    image, _ = MetadataImage().apply(41, [EVERY_RECORD[0]] + EVERY_RECORD[2:4] + EVERY_RECORD[9:12])
    before = image.topics["orders"].partitions[2]
    changed, _ = image.apply(42, [R.PartitionChangeRecord(partition_id=2, topic_id=TOPIC_ID, isr=(1,))])
    assert changed.brokers is image.brokers and changed.configs is image.configs
    assert changed.features is image.features and changed.client_quotas is image.client_quotas
    assert image.topics["orders"].partitions[2] is before and changed.topics["orders"].partitions[2].isr == (1,)
    fenced, _ = changed.apply(43, [R.FenceBrokerRecord(id=3, epoch=17)])
    assert fenced.topics is changed.topics and fenced.brokers[3].fenced and not changed.brokers[3].fenced
