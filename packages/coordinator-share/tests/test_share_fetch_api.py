"""ShareFetch and ShareAcknowledge on a broker, over a socket: share sessions, acquisition, acknowledgement,
redelivery, lock expiry and the state kept across a restart."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.records import build_batch, iter_batches
from josef.testing import RawClient, eventually

E = ErrorCode
LOCK_MS = 1000
pytestmark = pytest.mark.josef_config(**{"group.share.record.lock.duration.ms": str(LOCK_MS),
                                         "group.share.min.record.lock.duration.ms": "1000",
                                         "group.share.delivery.count.limit": "3"})


class Member:
    """A share consumer speaking ShareFetch v2 / ShareAcknowledge v2 for one partition."""

    def __init__(self, port: int, topic_id: Any, member_id: str, group: str = "queue") -> None:
        self.client = RawClient(port)
        self.topic_id, self.member_id, self.group = topic_id, member_id, group
        self.epoch = 0

    def fetch(self, acks: list[tuple[int, int, list[int]]] = (), max_wait_ms: int = 0, max_records: int = 500,
              epoch: int | None = None) -> Any:
        answer = self.client.call(ApiKey.SHARE_FETCH, 2, {
            "group_id": self.group, "member_id": self.member_id,
            "share_session_epoch": self.epoch if epoch is None else epoch, "max_wait": max_wait_ms, "min_bytes": 1,
            "max_bytes": 1 << 20, "max_records": max_records, "batch_size": max_records, "share_acquire_mode": 0,
            "is_renew_ack": False, "forgotten_topics_data": [],
            "topics": [{"topic_id": self.topic_id, "partitions": [{
                "partition_index": 0, "partition_max_bytes": 1 << 20, "acknowledgement_batches": [
                    {"first_offset": f, "last_offset": la, "acknowledge_types": t} for f, la, t in acks]}]}]})
        if answer.error_code == E.none and epoch is None:
            self.epoch += 1
        return answer

    def acknowledge(self, acks: list[tuple[int, int, list[int]]], epoch: int | None = None) -> Any:
        answer = self.client.call(ApiKey.SHARE_ACKNOWLEDGE, 2, {
            "group_id": self.group, "member_id": self.member_id,
            "share_session_epoch": self.epoch if epoch is None else epoch, "is_renew_ack": False,
            "topics": [{"topic_id": self.topic_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
                {"first_offset": f, "last_offset": la, "acknowledge_types": t} for f, la, t in acks]}]}]})
        if answer.error_code == E.none and epoch is None:
            self.epoch += 1
        return answer

    def close(self) -> None:
        self.client.close()


def acquired(answer: Any) -> list[tuple[int, int, int]]:
    assert answer.error_code == E.none, answer
    return [(a.first_offset, a.last_offset, a.delivery_count)
            for t in answer.responses for p in t.partitions for a in p.acquired_records]


def start_offset(client: RawClient, topic_id: Any) -> int:
    """The share partition's start offset as its share coordinator has it (ReadShareGroupStateSummary)."""
    answer = client.call(ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, {"group_id": "queue", "topics": [
        {"topic_id": topic_id, "partitions": [{"partition": 0, "leader_epoch": -1}]}]})
    return answer.results[0].partitions[0].start_offset


def partition(answer: Any) -> Any:
    [[part]] = [t.partitions for t in answer.responses]
    return part


@pytest.fixture
def topic(josef_broker):
    client = RawClient(josef_broker.port)
    created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
        {"name": "jobs", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 60000, "validate_only": False})
    assert created.topics[0].error_code == E.none
    topic_id = created.topics[0].topic_id
    yield client, topic_id
    client.close()


def produce(client: RawClient, values: list[bytes]) -> None:
    batch = build_batch([(None, v, int(time.time() * 1000)) for v in values])
    answer = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": "jobs", "partition_data": [{"index": 0, "records": batch}]}]})
    assert answer.responses[0].partition_responses[0].error_code == E.none


def test_members_share_records_release_redelivers_and_acknowledged_ones_never_return(josef_broker, topic):
    client, topic_id = topic
    a, b = Member(josef_broker.port, topic_id, "a"), Member(josef_broker.port, topic_id, "b")
    try:
        assert acquired(a.fetch()) == []  # the share partition starts at the end (share.auto.offset.reset latest)
        produce(client, [b"r%d" % i for i in range(10)])
        first = a.fetch(max_wait_ms=5000)
        assert acquired(first) == [(0, 9, 1)]
        assert [h.base_offset for _, h in iter_batches(partition(first).records)] == [0]
        assert first.acquisition_lock_timeout.total_seconds() * 1000 == LOCK_MS
        assert acquired(b.fetch()) == []  # everything is acquired by a
        released = a.acknowledge([(0, 9, [2] * 5 + [1] * 5)])  # RELEASE 0-4, ACCEPT 5-9
        assert partition(released).error_code == E.none
        assert acquired(b.fetch()) == [(0, 4, 2)]
        # b's records are not a's to acknowledge; what is accepted cannot be again.
        assert partition(a.acknowledge([(0, 4, [1])])).error_code == E.invalid_record_state
        assert partition(a.acknowledge([(5, 9, [1])])).error_code == E.invalid_record_state
        rejected = b.fetch(acks=[(0, 4, [3])])  # REJECT: archived, never delivered again
        assert partition(rejected).acknowledge_error_code == E.none
        produce(client, [b"late"])
        assert acquired(a.fetch(max_wait_ms=5000)) == [(10, 10, 1)]
    finally:
        a.close()
        b.close()


def test_share_session_epochs_are_checked(josef_broker, topic):
    _, topic_id = topic
    a = Member(josef_broker.port, topic_id, "a")
    try:
        assert a.acknowledge([], epoch=3).error_code == E.share_session_not_found
        a.fetch()
        assert a.fetch(epoch=5).error_code == E.invalid_share_session_epoch
        assert a.acknowledge([], epoch=0).error_code == E.invalid_share_session_epoch
        assert a.fetch().error_code == E.none
        assert a.fetch(epoch=-1).error_code == E.none  # closes the session
        assert a.fetch(epoch=2).error_code == E.share_session_not_found
    finally:
        a.close()


def test_an_expired_lock_redelivers_and_the_delivery_limit_archives(josef_broker, topic):
    client, topic_id = topic
    a, b = Member(josef_broker.port, topic_id, "a"), Member(josef_broker.port, topic_id, "b")
    try:
        a.fetch()
        produce(client, [b"poison"])
        assert acquired(a.fetch(max_wait_ms=5000)) == [(0, 0, 1)]
        # Nobody acknowledges: after the lock duration it is available again, with one more delivery each time.
        assert eventually(lambda: acquired(b.fetch()) == [(0, 0, 2)], 10, what="the lock to expire")
        assert eventually(lambda: acquired(a.fetch()) == [(0, 0, 3)], 10, what="the lock to expire again")
        # At the third expiry the limit (3) is reached: archived, the start offset passes it, nobody gets it.
        assert eventually(lambda: start_offset(client, topic_id) == 1, 10, what="the record to be archived")
        assert acquired(b.fetch()) == [] and acquired(a.fetch()) == []
    finally:
        a.close()
        b.close()


def test_acknowledged_state_survives_a_restart(josef_broker, topic):
    client, topic_id = topic
    a = Member(josef_broker.port, topic_id, "a")
    a.fetch()
    produce(client, [b"r%d" % i for i in range(6)])
    assert acquired(a.fetch(max_wait_ms=5000)) == [(0, 5, 1)]
    assert partition(a.acknowledge([(0, 5, [1, 1, 2, 1, 1, 3])])).error_code == E.none
    a.close()
    client.close()
    josef_broker.restart()
    b = Member(josef_broker.port, topic_id, "b")
    try:
        # The released record again, one delivery more; nothing accepted or rejected comes back.
        assert [acquired(b.fetch()) for _ in range(3)] == [[(2, 2, 2)], [], []]
    finally:
        b.close()
