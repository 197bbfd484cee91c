"""The hand-written Produce codec agrees with kio byte for byte, at every version josef answers."""

import datetime
import random
import uuid

import pytest

from josef.protocol import produce_codec
from josef.protocol.messages import MalformedRequestError, build, request_type, response_type
from test_fetch_codec import kio_bytes

VERSIONS = range(3, 14)


def random_request(rng: random.Random, version: int) -> dict:
    return {"transactional_id": rng.choice([None, "", "txn-1"]), "acks": rng.choice([-1, 0, 1]),
            "timeout": rng.randrange(30_000),
            "topic_data": [{**({"topic_id": uuid.UUID(int=rng.getrandbits(128))} if version >= 13 else
                               {"name": f"t{rng.randrange(100)}"}),
                            "partition_data": [{"index": rng.randrange(100),
                                                "records": rng.choice([None, b"", rng.randbytes(rng.randrange(1, 200))])}
                                               for _ in range(rng.randrange(0, 4))]}
                           for _ in range(rng.randrange(0, 4))]}


@pytest.mark.parametrize("version", VERSIONS)
def test_requests_read_as_kio_reads_them(version):
    rng = random.Random(version)
    for _ in range(50):
        theirs = build(request_type(0, version), random_request(rng, version))
        ours = produce_codec.decode_request(version, b"\x01" + kio_bytes(theirs), 1)
        assert (ours.transactional_id, ours.acks) == (theirs.transactional_id, theirs.acks)
        assert ours.timeout_ms == theirs.timeout // datetime.timedelta(milliseconds=1)
        assert [(t.name, t.topic_id, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
                for t in ours.topic_data] == [
            (getattr(t, "name", None), getattr(t, "topic_id", None), [(p.index, p.records) for p in t.partition_data])
            for t in theirs.topic_data]


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_requests_are_malformed_not_crashes(version):
    rng = random.Random(100 + version)
    frame = kio_bytes(build(request_type(0, version), random_request(rng, version)))
    for cut in range(0, len(frame) - 1, max(1, len(frame) // 40)):
        with pytest.raises(MalformedRequestError):
            produce_codec.decode_request(version, frame[:cut], 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_responses_write_what_kio_writes(version):
    rng = random.Random(1000 + version)
    for _ in range(50):
        encoder = produce_codec.ResponseEncoder(version)
        kio_topics, topics = [], []
        for _ in range(rng.randrange(0, 4)):
            name, topic_id = f"t{rng.randrange(100)}", uuid.UUID(int=rng.getrandbits(128))
            kio_parts, parts = [], []
            for _ in range(rng.randrange(0, 4)):
                p = {"index": rng.randrange(100), "error_code": rng.choice([0, 6, 87]), "base_offset": rng.randrange(-1, 2**40),
                     "log_append_time": rng.choice([-1, 1_700_000_000_123]), "log_start_offset": rng.randrange(-1, 2**40),
                     "record_errors": [(rng.randrange(10), rng.choice([None, "bad"])) for _ in range(rng.randrange(3))],
                     "error_message": rng.choice([None, "why"]),
                     "current_leader": rng.choice([None, (-1, -1), (rng.randrange(5), rng.randrange(100))])}
                parts.append(encoder.partition(**p))
                kio_parts.append({**p, "record_errors": [{"batch_index": i, "batch_index_error_message": m}
                                                         for i, m in p["record_errors"]],
                                  "current_leader": dict(zip(("leader_id", "leader_epoch"), p["current_leader"] or ()))})
            topics.append(encoder.topic(name, topic_id, parts))
            kio_topics.append({"name": name, "topic_id": topic_id, "partition_responses": kio_parts})
        endpoints = [(rng.randrange(5), "localhost", rng.randrange(65536), rng.choice([None, "r1"])) for _ in range(rng.randrange(3))]
        throttle = rng.randrange(100)
        expected = kio_bytes(build(response_type(0, version), {
            "responses": kio_topics, "throttle_time": throttle,
            "node_endpoints": [dict(zip(("node_id", "host", "port", "rack"), e)) for e in endpoints]}))
        assert b"".join(encoder.response(topics, throttle_time_ms=throttle, node_endpoints=endpoints)) == expected
