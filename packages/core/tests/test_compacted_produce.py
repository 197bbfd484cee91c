"""A compacted topic refuses records without a key, naming each one (KIP-467), as Kafka's LogValidator does.

Partitions are built by hand over logs of the running broker's storage, as
in test_partition_transactions.py; ``integration-tests/test_compaction.py``
checks what real clients get.
"""

import itertools
import time

import pytest
from kio.schema.errors import ErrorCode

from josef.log import LogConfig
from josef.metadata.image import PartitionImage
from josef.replication.partition import Partition
from josef.protocol.codecs import Compression
from josef.protocol.record_scan import records_without_key
from josef.protocol.records import RecordErrors, build_batch, build_marker
from josef.protocol.topic_partition import TopicPartition
from josef.server.apis.common import error_of

ME = 1
_names = itertools.count()


@pytest.fixture
def make(josef_broker):
    def partition(policy):
        tp = TopicPartition(f"compact-unit-{next(_names)}", 0)
        config = {"cleanup.policy": policy}
        p = Partition(tp, "topic-id", ME, josef_broker.broker.storage.open(tp, LogConfig.from_topic_config(config)),
                      config)
        p.update_state(PartitionImage((ME,), (ME,), ME, 0, 0), at_ms=1000)
        return p
    return partition


def batch(*keys, compression=Compression.NONE):
    now = int(time.time() * 1000)
    return build_batch([(key, b"v", now) for key in keys], compression=compression)


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_keyless_records_are_named_by_their_index_in_the_batch(compression):
    assert records_without_key(batch(b"a", None, b"c", None, compression=compression)) == [1, 3]
    assert records_without_key(batch(b"a", b"", compression=compression)) == []  # an empty key is a key


def test_a_control_batch_has_no_key_to_check():
    assert records_without_key(build_marker(7, 0, 3, commit=True, timestamp=0)) == []


def test_a_compacted_topic_refuses_the_batch_and_lists_every_keyless_record(make):
    p = make(["compact"])
    with pytest.raises(RecordErrors) as refused:
        p.append_as_leader(batch(b"k1", None, b"k3", None), -1)
    why = f"Compacted topic cannot accept message without key in topic partition {p.tp}."
    assert refused.value.errors == [(1, why), (3, why)]
    assert error_of(refused.value) == (ErrorCode.invalid_record, str(refused.value))
    assert str(refused.value) == (
        "One or more records have been rejected due to 2 record errors in total, and only showing the first three "
        f"errors at most: [RecordError(batchIndex=1, message='{why}'), RecordError(batchIndex=3, message='{why}')]")
    assert p.log.log_end_offset == 0  # nothing of the batch was written
    info, _ = p.append_as_leader(batch(b"k1", b"k2"), -1)
    assert (info.first_offset, info.last_offset) == (0, 1)


@pytest.mark.parametrize("policy", [["delete"], ["compact", "delete"]])
def test_only_compacted_topics_require_keys(make, policy):
    p = make(policy)
    if "compact" in policy:
        with pytest.raises(RecordErrors):
            p.append_as_leader(batch(None), -1)
    else:
        info, _ = p.append_as_leader(batch(None), -1)
        assert info.last_offset == 0
