"""Answers to pipelined requests: in order, sharing writes, and never held behind a request that waits."""

import socket
import struct
import time

from kio.schema.errors import ErrorCode as E

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request
from josef.protocol.records import build_batch
from josef.server import network
from josef.testing import RawClient

TOPIC = "pipelined"


def create_topic(port: int) -> None:
    client = RawClient(port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": TOPIC, "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 10000, "validate_only": False})
        assert created.topics[0].error_code == E.none
        # the first produce proves the partitions are served here
        answer = client.call(ApiKey.PRODUCE, 9, produce_body(0))
        assert answer.responses[0].partition_responses[0].error_code == E.none
    finally:
        client.close()


def produce_body(partition: int) -> dict:
    batch = build_batch([(None, b"v" * 100, int(time.time() * 1000))])
    return {"acks": 1, "timeout": 5000, "transactional_id": None,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": batch}]}]}


def read_answer(sock: socket.socket, api_key: int, version: int) -> tuple[int, object]:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return decode_response(api_key, version, sock.recv(size, socket.MSG_WAITALL))


def test_pipelined_produce_answers_come_in_order_and_share_writes(josef_broker, monkeypatch):
    create_topic(josef_broker.port)
    writes = []
    real_flush = network._Writer.flush_held

    def counting_flush(self):
        writes.append(len(self._held))
        real_flush(self)

    monkeypatch.setattr(network._Writer, "flush_held", counting_flush)
    with socket.create_connection(("127.0.0.1", josef_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(encode_request(ApiKey.PRODUCE, 9, c, b"p", produce_body(c % 2)) for c in range(100)))
        answers = [read_answer(sock, ApiKey.PRODUCE, 9) for _ in range(100)]
    assert [correlation for correlation, _ in answers] == list(range(100))
    assert all(a.responses[0].partition_responses[0].error_code == E.none for _, a in answers)
    assert max(writes) > 1  # some answers went out together


def test_an_answer_is_not_held_behind_a_fetch_that_waits(josef_broker):
    """Produce, then a long-poll fetch with nothing to read, sent together: the produce answer comes at once."""
    create_topic(josef_broker.port)
    fetch = {"replica_id": -1, "max_wait": 5000, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
             "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
             "topics": [{"topic": TOPIC, "partitions": [{"partition": 1, "fetch_offset": 0,
                                                         "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                                                         "log_start_offset": -1}]}]}
    with socket.create_connection(("127.0.0.1", josef_broker.port), timeout=10) as sock:
        sock.sendall(encode_request(ApiKey.PRODUCE, 9, 1, b"p", produce_body(0))
                     + encode_request(ApiKey.FETCH, 11, 2, b"p", fetch))
        sock.settimeout(2.5)  # half the fetch's wait: a produce answer held behind it would not be here
        correlation, answer = read_answer(sock, ApiKey.PRODUCE, 9)
        assert correlation == 1 and answer.responses[0].partition_responses[0].error_code == E.none
