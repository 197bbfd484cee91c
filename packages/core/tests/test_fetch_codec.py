"""The hand-written Fetch codec agrees with kio byte for byte, at every version josef answers."""

import datetime
import random
import uuid

import pytest

from josef.protocol import fetch_codec
from josef.protocol.messages import MalformedRequestError, build, encode_body, request_type, response_type

VERSIONS = range(4, 19)


def kio_bytes(entity) -> bytes:
    return encode_body(entity)


def random_request(rng: random.Random, version: int) -> dict:
    def topic_key() -> dict:
        return {"topic_id": uuid.UUID(int=rng.getrandbits(128))} if version >= 13 else {"topic": f"topic-{rng.randrange(1000)}"}

    body = {
        "max_wait": rng.randrange(0, 30_000), "min_bytes": rng.randrange(1, 10**6), "max_bytes": rng.randrange(1, 2**31),
        "isolation_level": rng.randrange(2), "session_id": rng.randrange(2**31), "session_epoch": rng.randrange(-1, 100),
        "rack_id": rng.choice(["", "rack-a"]),
        "topics": [{**topic_key(), "partitions": [
            {"partition": rng.randrange(1000), "current_leader_epoch": rng.randrange(-1, 50),
             "fetch_offset": rng.randrange(2**40), "last_fetched_epoch": rng.randrange(-1, 50),
             "log_start_offset": rng.randrange(-1, 2**40), "partition_max_bytes": rng.randrange(2**31),
             **({"high_watermark": rng.randrange(2**40)} if version >= 18 and rng.random() < 0.5 else {}),
             **({"replica_directory_id": uuid.uuid4()} if version >= 17 and rng.random() < 0.3 else {})}
            for _ in range(rng.randrange(0, 5))]} for _ in range(rng.randrange(0, 4))],
        "forgotten_topics_data": [{**topic_key(), "partitions": [rng.randrange(100) for _ in range(rng.randrange(3))]}
                                  for _ in range(rng.randrange(0, 3))],
    }
    if version >= 15:
        if rng.random() < 0.5:
            body["replica_state"] = {"replica_id": rng.randrange(5), "replica_epoch": rng.randrange(-1, 100)}
    else:
        body["replica_id"] = rng.choice([-1, 1, 2])
    if version >= 12 and rng.random() < 0.5:
        body["cluster_id"] = "abc"
    return body


@pytest.mark.parametrize("version", VERSIONS)
def test_requests_read_as_kio_reads_them(version):
    rng = random.Random(version)
    for _ in range(50):
        kio_request = build(request_type(1, version), random_request(rng, version))
        frame = b"\x07" * 3 + kio_bytes(kio_request)
        ours = fetch_codec.decode_request(version, frame, 3)
        assert ours.max_wait_ms == kio_request.max_wait // datetime.timedelta(milliseconds=1)
        for name in ("min_bytes", "max_bytes", "isolation_level", "session_id", "session_epoch", "rack_id"):
            assert getattr(ours, name) == getattr(kio_request, name, getattr(ours, name)), name
        replica = kio_request.replica_state.replica_id if version >= 15 else kio_request.replica_id
        assert ours.replica_id == replica
        assert len(ours.topics) == len(kio_request.topics)
        for mine, theirs in zip(ours.topics, kio_request.topics):
            assert (mine.topic, mine.topic_id) == (getattr(theirs, "topic", None), getattr(theirs, "topic_id", None))
            assert len(mine.partitions) == len(theirs.partitions)
            for p, q in zip(mine.partitions, theirs.partitions):
                for name in ("partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch",
                             "log_start_offset", "partition_max_bytes", "high_watermark"):
                    assert getattr(p, name) == getattr(q, name, getattr(p, name)), name
        assert [(f.topic, f.topic_id, f.partitions) for f in ours.forgotten_topics_data] == [
            (getattr(f, "topic", None), getattr(f, "topic_id", None), list(f.partitions))
            for f in getattr(kio_request, "forgotten_topics_data", ())]


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_requests_are_malformed_not_crashes(version):
    rng = random.Random(100 + version)
    frame = kio_bytes(build(request_type(1, version), random_request(rng, version)))
    for cut in range(0, len(frame) - 1, max(1, len(frame) // 40)):
        with pytest.raises(MalformedRequestError):
            fetch_codec.decode_request(version, frame[:cut], 0)


def test_an_array_claiming_more_than_the_frame_holds_is_refused_before_reading():
    frame = (-1).to_bytes(4, "big", signed=True) + bytes(13) + (2**30).to_bytes(4, "big")
    with pytest.raises(MalformedRequestError, match="does not fit"):
        fetch_codec.decode_request(4, frame, 0)


def random_response(rng: random.Random, version: int) -> dict:
    def pair():
        return rng.choice([None, (-1, -1), (rng.randrange(100), rng.randrange(2**31))])

    topics = []
    for _ in range(rng.randrange(0, 4)):
        partitions = []
        for _ in range(rng.randrange(0, 5)):
            records = rng.choice([b"", bytes(rng.randrange(1, 300))])
            partitions.append({
                "partition_index": rng.randrange(1000), "error_code": rng.choice([0, 1, 6, 74]),
                "high_watermark": rng.randrange(-1, 2**40), "last_stable_offset": rng.randrange(-1, 2**40),
                "log_start_offset": rng.randrange(-1, 2**40), "preferred_read_replica": rng.randrange(-1, 3),
                "aborted_transactions": rng.choice([None, [], [(rng.randrange(2**40), rng.randrange(2**40))
                                                               for _ in range(rng.randrange(1, 3))]]),
                "records": records, "diverging_epoch": pair(), "current_leader": pair(), "snapshot_id": pair()})
            if rng.random() < 0.3:  # the shape most partitions of a consumer's fetch have: caught up, nothing to say
                partitions[-1].update(error_code=0, preferred_read_replica=-1, records=b"", diverging_epoch=None,
                                      current_leader=None, snapshot_id=None, aborted_transactions=rng.choice([None, []]))
        topics.append({"topic": f"t{rng.randrange(100)}", "topic_id": uuid.UUID(int=rng.getrandbits(128)),
                       "partitions": partitions})
    endpoints = [(rng.randrange(5), "localhost", rng.randrange(65536), rng.choice([None, "r1"]))
                 for _ in range(rng.randrange(0, 3))]
    return {"throttle_time": rng.randrange(100), "error_code": rng.choice([0, 70]), "session_id": rng.randrange(2**31),
            "responses": topics, "node_endpoints": endpoints}


def as_kio_dict(body: dict) -> dict:
    def tag(value, names):
        return {} if value is None else dict(zip(names, value))

    return {**body, "node_endpoints": [dict(zip(("node_id", "host", "port", "rack"), e)) for e in body["node_endpoints"]],
            "responses": [{**t, "partitions": [{
                **p, "aborted_transactions": None if p["aborted_transactions"] is None else [
                    {"producer_id": a, "first_offset": b} for a, b in p["aborted_transactions"]],
                "diverging_epoch": tag(p["diverging_epoch"], ("epoch", "end_offset")),
                "current_leader": tag(p["current_leader"], ("leader_id", "leader_epoch")),
                "snapshot_id": tag(p["snapshot_id"], ("end_offset", "epoch"))} for p in t["partitions"]]}
                for t in body["responses"]]}


@pytest.mark.parametrize("version", VERSIONS)
def test_responses_write_what_kio_writes(version):
    rng = random.Random(1000 + version)
    for _ in range(50):
        body = random_response(rng, version)
        expected = kio_bytes(build(response_type(1, version), as_kio_dict(body)))
        encoder = fetch_codec.ResponseEncoder(version)
        topics: list = []
        for topic in body["responses"]:
            encoder.topic(topics, topic["topic"], topic["topic_id"], len(topic["partitions"]))
            for p in topic["partitions"]:
                encoder.partition(topics, p["partition_index"], p["error_code"], p["high_watermark"],
                                  p["last_stable_offset"], p["log_start_offset"], p["records"],
                                  p["aborted_transactions"], p["preferred_read_replica"], p["diverging_epoch"],
                                  p["current_leader"], p["snapshot_id"])
            encoder.topic_end(topics)
        chunks = encoder.response(topics, len(body["responses"]), throttle_time_ms=body["throttle_time"],
                                  error_code=body["error_code"], session_id=body["session_id"],
                                  node_endpoints=body["node_endpoints"])
        assert b"".join(bytes(c) for c in chunks) == expected
