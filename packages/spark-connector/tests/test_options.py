"""Option parsing and range arithmetic, without Spark or a broker: every rule of Spark's Kafka source options."""

import re

import pytest

from josef_spark.options import EARLIEST, LATEST, OptionError, read_options, write_options
from josef_spark.planning import OffsetRange, offset_ranges, rate_limit

SERVERS = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def read(streaming=False, **options):
    return read_options({**SERVERS, **options}, streaming=streaming)


def test_defaults_follow_spark():
    batch, stream = read(subscribe="a"), read(True, subscribe="a")
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert stream.starting.kind == "latest"
    assert batch.fail_on_data_loss and not batch.include_headers
    assert batch.max_offsets_per_trigger is None and batch.min_partitions is None
    assert stream.min_offsets_per_trigger is None and stream.max_trigger_delay_ms == 15 * 60_000
    assert batch.max_records_per_partition is None and batch.group_id is None
    assert (batch.group_id_prefix, stream.group_id_prefix) == ("spark-kafka-relation", "spark-kafka-source")


def test_strategies():
    assert read(subscribe=" a, b ,").subscribe == ("a", "b")
    assert read(subscribepattern="ev.*").subscribe_pattern == re.compile("ev.*")
    assert read(assign='{"b": [1, 0], "a": [2]}').assign == (("a", 2), ("b", 0), ("b", 1))


def test_offsets_and_timestamps():
    o = read(startingoffsets='{"a": {"0": 23, "1": -2}}', endingoffsets='{"a": {"0": -1, "1": 50}}', subscribe="a")
    assert o.starting.per_partition == {("a", 0): 23, ("a", 1): EARLIEST}
    assert o.ending.per_partition == {("a", 0): LATEST, ("a", 1): 50}
    # A global timestamp wins over per-partition timestamps, which win over offsets (Spark's precedence).
    both = read(subscribe="a", startingtimestamp="1000", startingoffsetsbytimestamp='{"a": {"0": 5}}',
                startingoffsets="earliest")
    assert (both.starting.kind, both.starting.timestamp) == ("timestamp", 1000)
    per = read(subscribe="a", startingoffsetsbytimestamp='{"a": {"0": 5}}', startingoffsets="earliest")
    assert per.starting.per_partition == {("a", 0): 5}


def test_kafka_options_pass_through_without_prefix():
    o = read(subscribe="a", **{"kafka.client.id": "etl", "kafka.isolation.level": "read_committed"})
    assert o.client_config == {"client.id": "etl", "isolation.level": "read_committed"}
    assert o.bootstrap_servers == "127.0.0.1:9092"


@pytest.mark.parametrize("options, streaming, names", [
    ({}, False, "subscribe, subscribePattern or assign"),
    ({"subscribe": "a", "assign": '{"a":[0]}'}, False, "got subscribe, assign"),
    ({"subscribe": " , "}, False, "subscribe must name"),
    ({"subscribepattern": "("}, False, "subscribePattern"),
    ({"assign": '{"a": ["x"]}'}, False, "assign"),
    ({"assign": "[1,2"}, False, "assign is not valid JSON"),
    ({"subscribe": "a", "startingoffsets": "latest"}, False, 'startingOffsets="latest"'),
    ({"subscribe": "a", "startingoffsets": '{"a": {"0": -1}}'}, False, "startingOffsets: -1"),
    ({"subscribe": "a", "endingoffsets": "earliest"}, False, 'endingOffsets="earliest"'),
    ({"subscribe": "a", "endingoffsets": '{"a": {"0": -2}}'}, False, "endingOffsets: -2"),
    ({"subscribe": "a", "endingoffsets": "latest"}, True, "endingOffsets"),
    ({"subscribe": "a", "startingoffsets": "first"}, False, "startingOffsets must be"),
    ({"subscribe": "a", "startingoffsets": '{"a": {"zero": 1}}'}, False, "'zero' of topic 'a'"),
    ({"subscribe": "a", "startingoffsets": '{"a": {"0": -7}}'}, False, "a-0 has offset -7"),
    ({"subscribe": "a", "startingtimestamp": "yesterday"}, False, "startingTimestamp"),
    ({"subscribe": "a", "startingoffsetsbytimestamp": '{"a": {"0": -5}}'}, False, "startingOffsetsByTimestamp"),
    ({"subscribe": "a", "startingoffsetsbytimestampstrategy": "closest"}, False, "startingOffsetsByTimestampStrategy"),
    ({"subscribe": "a", "maxoffsetspertrigger": "10"}, False, "maxOffsetsPerTrigger is for streaming"),
    ({"subscribe": "a", "maxoffsetspertrigger": "0"}, True, "maxOffsetsPerTrigger must be a positive"),
    ({"subscribe": "a", "minpartitions": "many"}, False, "minPartitions"),
    ({"subscribe": "a", "failondataloss": "maybe"}, False, "failOnDataLoss"),
    ({"subscribe": "a", "includeheaders": "yes"}, False, "includeHeaders"),
    ({"subscribe": "a", "startingofsets": "earliest"}, False, "unknown source option(s) startingofsets"),
    ({"subscribe": "a", "minoffsetspertrigger": "10"}, False, "minOffsetsPerTrigger is for streaming"),
    ({"subscribe": "a", "maxtriggerdelay": "10s"}, False, "maxTriggerDelay is for streaming"),
    ({"subscribe": "a", "minoffsetspertrigger": "-1"}, True, "minOffsetsPerTrigger must be a positive"),
    ({"subscribe": "a", "minoffsetspertrigger": "11", "maxoffsetspertrigger": "10"}, True,
     "minOffsetsPerTrigger (11) is higher than maxOffsetsPerTrigger (10)"),
    ({"subscribe": "a", "maxtriggerdelay": "soon"}, True, "maxTriggerDelay must be a duration"),
    ({"subscribe": "a", "maxtriggerdelay": "5 weeks"}, True, "maxTriggerDelay must be a duration"),
    ({"subscribe": "a", "maxrecordsperpartition": "0"}, False, "maxRecordsPerPartition must be a positive"),
    ({"subscribe": "a", "groupidprefix": " "}, False, "groupIdPrefix must not be empty"),
    ({"subscribe": "a", "kafka.group.id": ""}, False, "kafka.group.id must not be empty"),
    ({"subscribe": "a", "kafka.enable.auto.commit": "true"}, False, "kafka.enable.auto.commit is not supported"),
    ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, False, "kafka.auto.offset.reset"),
    ({"subscribe": "a", "kafka.fetch.max.wait": "5"}, False, "fetch.max.wait"),
    ({"subscribe": "a", "kafka.max.poll.records": "-3"}, False, "max.poll.records"),
    ({"assign": '{"a": [0]}', "startingoffsets": '{"a": {"0": 1}, "b": {"0": 1}}'}, False, "b-0, which assign"),
])
def test_bad_options_name_the_option(options, streaming, names):
    with pytest.raises(OptionError, match=re.escape(names)):
        read(streaming, **options)


def test_trigger_limits_group_ids_and_record_limits():
    o = read(True, subscribe="a", minoffsetspertrigger="100", maxoffsetspertrigger="100", maxtriggerdelay="30s")
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger, o.max_trigger_delay_ms) == (100, 100, 30_000)
    for text, ms in (("250", 250), ("250ms", 250), ("2s", 2000), ("3m", 180_000), ("3min", 180_000), ("1h", 3_600_000),
                     ("1d", 86_400_000), (" 5S ", 5000), ("1500us", 1)):
        assert read(True, subscribe="a", maxtriggerdelay=text).max_trigger_delay_ms == ms
    assert read(subscribe="a", maxrecordsperpartition="1000").max_records_per_partition == 1000
    # kafka.group.id is taken as it is (and reaches the consumer); groupIdPrefix only names generated ids.
    given = read(subscribe="a", groupidprefix="etl", **{"kafka.group.id": "billing"})
    assert (given.group_id, given.client_config["group.id"], given.group_id_prefix) == ("billing", "billing", "etl")
    assert read(True, subscribe="a", groupidprefix="etl").group_id_prefix == "etl"


def test_bootstrap_servers_are_required():
    with pytest.raises(OptionError, match="kafka.bootstrap.servers"):
        read_options({"subscribe": "a"}, streaming=False)
    with pytest.raises(OptionError, match="kafka.bootstrap.servers"):
        write_options({"topic": "a"})


def test_write_options():
    o = write_options({**SERVERS, "topic": " out ", "kafka.linger.ms": "20"})
    assert (o.topic, o.client_config) == ("out", {"linger.ms": "20"})
    assert write_options(SERVERS).topic is None
    for bad, message in (({"kafka.key.serializer": "x"}, "kafka.key.serializer"), ({"topics": "a"}, "topics"),
                         ({"topic": " "}, "topic must not be empty"), ({"kafka.acks": "most"}, "acks"),
                         ({"kafka.transactional.id": "t"}, "kafka.transactional.id is not supported"),
                         ({"exactlyonce": "maybe"}, "exactlyOnce must be true or false"),
                         ({"kafka.enable.idempotence": "false"}, "drop kafka.enable.idempotence=false"),
                         ({"transactionalidprefix": " "}, "transactionalIdPrefix must not be empty"),
                         ({"writeid": " "}, "writeId must be 1 to 200 characters"),
                         ({"writeid": "x" * 201}, "writeId must be 1 to 200 characters"),
                         ({"writeid": "daily", "exactlyonce": "false"}, "writeId needs exactlyOnce=true")):
        with pytest.raises(OptionError, match=re.escape(message)):
            write_options({**SERVERS, **bad})


def test_a_write_id_names_batch_writes_only():
    assert write_options(SERVERS).write_id is None
    assert write_options({**SERVERS, "writeid": " 2026-11-27 "}).write_id == "2026-11-27"
    with pytest.raises(OptionError, match="writeId is for batch writes: a streaming query's writes are named by its id"):
        write_options({**SERVERS, "writeid": "daily"}, streaming=True)


def test_exactly_once_is_the_default_and_can_be_turned_off():
    o = write_options(SERVERS)
    assert (o.exactly_once, o.transactional_id_prefix) == (True, "josef-spark")
    o = write_options({**SERVERS, "exactlyonce": "false", "kafka.enable.idempotence": "false",
                       "transactionalidprefix": "billing"})
    assert (o.exactly_once, o.transactional_id_prefix, o.client_config) == (False, "billing", {"enable.idempotence": "false"})


def test_ranges_skip_empty_partitions_and_split_for_min_partitions():
    start = {("a", 0): 0, ("a", 1): 10, ("b", 0): 5}
    end = {("a", 0): 100, ("a", 1): 10, ("b", 0): 35}
    assert offset_ranges(start, end, None) == [OffsetRange("a", 0, 0, 100), OffsetRange("b", 0, 5, 35)]
    pieces = offset_ranges(start, end, 8)
    assert len(pieces) >= 6
    for tp in (("a", 0), ("b", 0)):  # the pieces tile each range exactly
        mine = sorted((r.start, r.end) for r in pieces if (r.topic, r.partition) == tp)
        assert mine[0][0] == start[tp] and mine[-1][1] == end[tp]
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
    tiny = offset_ranges({("a", 0): 0}, {("a", 0): 2}, 10)
    assert [(r.start, r.end) for r in tiny] == [(0, 1), (1, 2)]  # never an empty piece


def test_max_records_per_partition_splits_first_then_min_partitions():
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 10}
    end = {("a", 0): 100, ("a", 1): 3, ("b", 0): 35}
    pieces = offset_ranges(start, end, None, 30)
    assert [(r.topic, r.partition, r.start, r.end) for r in pieces] == [
        ("a", 0, 0, 25), ("a", 0, 25, 50), ("a", 0, 50, 75), ("a", 0, 75, 100), ("a", 1, 0, 3), ("b", 0, 10, 35)]
    assert offset_ranges(start, end, None, 1000) == offset_ranges(start, end, None)
    both = offset_ranges(start, end, 12, 30)  # more pieces wanted than the record limit makes
    assert len(both) >= 12 and max(r.size for r in both) <= 30
    for tp in end:  # the pieces still tile each range exactly
        mine = sorted((r.start, r.end) for r in both if (r.topic, r.partition) == tp)
        assert mine[0][0] == start[tp] and mine[-1][1] == end[tp]
        assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
    ones = offset_ranges({("a", 0): 0}, {("a", 0): 5}, None, 1)
    assert [(r.start, r.end) for r in ones] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_rate_limit_never_exceeds_the_limit():
    start = {(t, p): 0 for t in "ab" for p in range(5)}
    end = {tp: 1 for tp in start}  # ten partitions with one record each, a limit of 3
    limited = rate_limit(start, end, 3)
    assert sum(limited[tp] - start[tp] for tp in start) == 3
    uneven = rate_limit({("a", 0): 0, ("a", 1): 0}, {("a", 0): 900, ("a", 1): 100}, 100)
    assert uneven == {("a", 0): 90, ("a", 1): 10}
    assert rate_limit({("a", 0): 0}, {("a", 0): 5}, 100) == {("a", 0): 5}
    # A partition new since start starts at its earliest offset (given in start), one that shrank stays put.
    assert rate_limit({("a", 0): 10}, {("a", 0): 4}, 1) == {("a", 0): 4}
