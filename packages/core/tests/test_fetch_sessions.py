"""Incremental fetch sessions (KIP-227) over a real socket: what a session answers, its errors, and the cache's eviction."""

import time
import uuid

import pytest
from kio.schema.errors import ErrorCode as E

from josef.metadata.records import uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch
from josef.protocol.fetch_codec import FetchPartition, FetchRequest, FetchTopic
from josef.server.fetch_session import CachedPartition, FetchSessionCache, new_context
from josef.testing import RawClient

PARTITIONS = 1000


def create(client: RawClient, name: str, partitions: int) -> None:
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none


def produce(client: RawClient, topic: str, partition: int, value: bytes) -> int:
    batch = build_batch([(None, value, int(time.time() * 1000))])
    answer = client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
    [result] = answer.responses[0].partition_responses
    assert result.error_code == E.none
    return result.base_offset


def fetch(client: RawClient, *, session_id=0, epoch=-1, partitions=(), topic="t", forgotten=(), max_wait=0, version=11):
    return client.call(ApiKey.FETCH, version, {
        "replica_id": -1, "max_wait": max_wait, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 0,
        "session_id": session_id, "session_epoch": epoch, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [
            {"partition": p, "fetch_offset": offset, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
             "log_start_offset": -1} for p, offset in partitions]}] if partitions else [],
        "forgotten_topics_data": [{"topic": topic, "partitions": list(forgotten)}] if forgotten else []})


def answered(response) -> dict[int, object]:
    return {p.partition_index: p for t in response.responses for p in t.partitions}


@pytest.fixture
def client(josef_broker):
    client = RawClient(josef_broker.port)
    yield client
    client.close()


def test_an_incremental_fetch_over_1000_partitions_names_only_the_one_that_changed(client, josef_broker):
    create(client, "t", PARTITIONS)
    full = fetch(client, epoch=0, partitions=[(p, 0) for p in range(PARTITIONS)])
    assert full.error_code == E.none and full.session_id != 0
    assert len(answered(full)) == PARTITIONS
    session = josef_broker.broker.fetch_sessions.get(full.session_id)
    assert session is not None and len(session.partitions) == PARTITIONS

    assert answered(fetch(client, session_id=full.session_id, epoch=1)) == {}  # nothing changed, nothing named
    produce(client, "t", 537, b"news")
    changed = answered(fetch(client, session_id=full.session_id, epoch=2))
    assert list(changed) == [537]
    assert changed[537].high_watermark == 1 and b"news" in bytes(changed[537].records)
    # The consumer moves its offset for 537 only; the session keeps the other 999 as they were.
    assert answered(fetch(client, session_id=full.session_id, epoch=3, partitions=[(537, 1)])) == {}
    assert session.partitions[("t", 537)].request.fetch_offset == 1


def test_a_waiting_fetch_over_1000_partitions_is_answered_with_the_one_that_gained_data(client, josef_broker):
    create(client, "w", PARTITIONS)
    producer = RawClient(josef_broker.port)
    try:
        client.send(ApiKey.FETCH, 11, {
            "replica_id": -1, "max_wait": 20_000, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": "w", "partitions": [
                {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                 "log_start_offset": -1} for p in range(PARTITIONS)]}]})
        started = time.monotonic()
        produce(producer, "w", 911, b"only-here")
        response = client.receive()
    finally:
        producer.close()
    assert time.monotonic() - started < 15  # woken by the append, not by max_wait
    parts = answered(response)
    assert len(parts) == PARTITIONS  # a sessionless fetch names every partition
    assert [p for p, data in parts.items() if data.records] == [911]
    assert b"only-here" in bytes(parts[911].records)
    assert {data.high_watermark for p, data in parts.items() if p != 911} == {0}


def test_session_errors(client):
    create(client, "t", 3)
    full = fetch(client, epoch=0, partitions=[(p, 0) for p in range(3)])
    sid = full.session_id
    assert fetch(client, session_id=sid, epoch=5).error_code == E.invalid_fetch_session_epoch
    assert fetch(client, session_id=sid + 1 if sid < 2**31 - 1 else 1, epoch=1).error_code == E.fetch_session_id_not_found
    assert fetch(client, session_id=sid, epoch=1).error_code == E.none  # the session survives a wrong epoch
    # A full fetch naming the session closes it; epoch -1 opens none.
    closed = fetch(client, session_id=sid, epoch=-1, partitions=[(0, 0)])
    assert closed.error_code == E.none and closed.session_id == 0
    assert fetch(client, session_id=sid, epoch=2).error_code == E.fetch_session_id_not_found


def test_forgotten_partitions_leave_the_session_and_an_emptied_session_closes(client, josef_broker):
    create(client, "t", 2)
    sid = fetch(client, epoch=0, partitions=[(0, 0), (1, 0)]).session_id
    assert answered(fetch(client, session_id=sid, epoch=1, forgotten=[1])) == {}
    produce(client, "t", 1, b"forgotten")
    produce(client, "t", 0, b"kept")
    assert list(answered(fetch(client, session_id=sid, epoch=2))) == [0]
    emptied = fetch(client, session_id=sid, epoch=3, forgotten=[0])
    assert emptied.error_code == E.none and emptied.session_id == 0
    assert josef_broker.broker.fetch_sessions.get(sid) is None


def test_a_session_made_with_topic_ids_is_refused_without_them(client, josef_broker):
    create(client, "t", 1)
    topic_id = uuid_from_text(josef_broker.broker.image.topics["t"].topic_id)
    body = {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": 0, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic_id": topic_id, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                              "partition_max_bytes": 1 << 20}]}]}
    full = client.call(ApiKey.FETCH, 13, body)
    assert full.error_code == E.none and full.session_id != 0
    assert full.responses[0].topic_id == topic_id
    assert fetch(client, session_id=full.session_id, epoch=1, version=12).error_code == E.fetch_session_topic_id_error


@pytest.mark.josef_config(**{"max.incremental.fetch.session.cache.slots": 0})
def test_no_session_is_made_when_the_cache_has_no_slots(client):
    create(client, "t", 1)
    full = fetch(client, epoch=0, partitions=[(0, 0)])
    assert full.error_code == E.none and full.session_id == 0 and list(answered(full)) == [0]


def sized(n: int) -> dict:
    return {("t", p): CachedPartition("t", None, None) for p in range(n)}


def test_eviction_follows_kafkas_rules():
    cache = FetchSessionCache(2, eviction_ms=1000)
    young = cache.create(0, False, False, sized(5))
    other = cache.create(0, False, False, sized(1))
    # Full, both young: a consumer's session may not evict them, whatever its size.
    assert cache.create(10, False, False, sized(50)) == 0
    # A follower's (privileged) may evict the smallest consumer session, young or not.
    follower = cache.create(20, True, False, sized(1))
    assert follower != 0 and cache.get(other) is None and cache.get(young) is not None
    # Unused for longer than the eviction time: the stalest session goes first, for anyone.
    cache.get(follower).last_used_ms = 1500
    stale_evictor = cache.create(1100, False, False, sized(1))
    assert stale_evictor != 0 and cache.get(young) is None
    # Settled (older than the eviction time) and in use: a bigger consumer session outranks a smaller one...
    for session in cache.sessions.values():
        session.last_used_ms = 2400
    bigger = cache.create(2500, False, False, sized(10))
    assert bigger != 0 and cache.get(stale_evictor) is None
    # ...but never a follower's, and not a bigger one.
    assert cache.create(2600, False, False, sized(5)) == 0
    assert cache.get(follower) is not None and cache.evictions == 3


def test_a_session_partition_of_a_topic_id_unknown_at_first_is_named_once_the_broker_knows_it():
    """A follower's metadata may be ahead of its leader's: the session keeps the id and names it later."""
    topic_id = uuid.uuid4()
    cache = FetchSessionCache(10)
    part = FetchPartition(0, 0, 0, -1, 0, 1 << 20)
    full = FetchRequest(2, 1, 500, 1, 1 << 20, 0, 0, 0, [FetchTopic(None, topic_id, [part])], [], "")
    context = new_context(cache, full, [None], True, 0, True)
    assert context.create and context.wanted == [(None, topic_id, part)]
    session_id = cache.create(0, True, True, {(topic_id, 0): CachedPartition(None, topic_id, part)})
    known = {}
    incremental = FetchRequest(2, 1, 500, 1, 1 << 20, 0, session_id, 1, [], [], "")
    assert new_context(cache, incremental, [], True, 1, True, known.get).wanted == [(None, topic_id, part)]
    known[topic_id] = "late"
    incremental.session_epoch = 2
    assert new_context(cache, incremental, [], True, 2, True, known.get).wanted == [("late", topic_id, part)]
