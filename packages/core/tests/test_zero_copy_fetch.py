"""Fetched record data goes from the segment file to the socket with os.sendfile, and the bytes are those of the copied path."""

import os
import socket
import struct
import threading
import time

import pytest
from kio.schema.errors import ErrorCode as E

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request
from josef.protocol.records import build_batch, iter_batches, iter_records
from josef.server import network
from josef.testing import RawClient

API_VERSIONS = {"client_software_name": "t", "client_software_version": "1"}


def setup_topic(port: int, topic: str, batches: int, value_size: int, partitions: int = 1) -> None:
    client = RawClient(port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": topic, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 10000, "validate_only": False})
        assert created.topics[0].error_code == E.none
        for partition in range(partitions):
            for i in range(batches):
                batch = build_batch([(None, bytes([i]) * value_size, int(time.time() * 1000)) for _ in range(4)])
                answer = client.call(ApiKey.PRODUCE, 9, {"acks": 1, "timeout": 5000, "transactional_id": None,
                                                         "topic_data": [{"name": topic, "partition_data": [
                                                             {"index": partition, "records": batch}]}]})
                assert answer.responses[0].partition_responses[0].error_code == E.none
    finally:
        client.close()


def fetch_body(topic: str, partitions: int = 1, partition_max_bytes: int = 50 << 20) -> dict:
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 200 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [
                {"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes,
                 "current_leader_epoch": -1, "log_start_offset": -1} for p in range(partitions)]}]}


def raw_fetch(port: int, body: dict, version: int = 11) -> bytes:
    """One Fetch over a new socket; the whole response frame as the broker wrote it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(encode_request(ApiKey.FETCH, version, 7, b"raw", body))
        size = struct.unpack(">i", receive(sock, 4))[0]
        return receive(sock, size)


def receive(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the broker closed the connection"
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("version", [11, 12])
def test_sendfile_responses_are_byte_identical_to_the_copied_path(josef_broker, monkeypatch, version):
    setup_topic(josef_broker.port, "big", batches=6, value_size=50_000)
    sent = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd, in_fd, offset, count):
        n = real_sendfile(out_fd, in_fd, offset, count)
        sent.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    zero_copy = raw_fetch(josef_broker.port, fetch_body("big"), version)
    _, response = decode_response(ApiKey.FETCH, version, zero_copy)
    answer = response.responses[0].partitions[0]
    records = bytes(answer.records or b"")
    values = [record.value for pos, header in iter_batches(records)
              for record in iter_records(records[pos:pos + header.size])]
    assert len(values) == 24, (answer.error_code, answer.high_watermark, len(records))
    assert values[0] == bytes([0]) * 50_000 and values[-1] == bytes([5]) * 50_000
    assert sum(sent) > 1_000_000, sent  # the record data went through sendfile
    monkeypatch.setattr(network._Writer, "zero_copy", False)
    sent.clear()
    copied = raw_fetch(josef_broker.port, fetch_body("big"), version)
    assert not sent
    assert zero_copy == copied


def test_a_consumer_that_does_not_read_its_response_does_not_stall_anyone_else(josef_broker):
    setup_topic(josef_broker.port, "slow", batches=10, value_size=100_000, partitions=4)
    slow = socket.create_connection(("127.0.0.1", josef_broker.port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    other = RawClient(josef_broker.port, timeout=10)
    try:
        # About 16 MB owed to a client that reads nothing: the broker must go on serving others.
        for correlation in range(3):
            slow.sendall(encode_request(ApiKey.FETCH, 11, correlation, b"slow", fetch_body("slow", 4)))
        for _ in range(50):
            assert other.call(ApiKey.API_VERSIONS, 3, API_VERSIONS).error_code == E.none
        setup_topic(josef_broker.port, "meanwhile", batches=1, value_size=10)
    finally:
        other.close()
        slow.close()


def test_a_response_larger_than_the_socket_takes_goes_out_by_sendfile_alone(josef_broker, monkeypatch):
    """A full socket makes the writer wait and go on from the same file offset: records are never read into memory."""
    setup_topic(josef_broker.port, "wait", batches=8, value_size=100_000, partitions=3)
    reads, waited_once = [], threading.Event()
    real_read, real_wait = network.FileRegion.read, network._Writer._socket_writable
    monkeypatch.setattr(network.FileRegion, "read", lambda self, *a: reads.append(a) or real_read(self, *a))
    monkeypatch.setattr(network._Writer, "_socket_writable", lambda self: waited_once.set() or real_wait(self))
    with socket.create_connection(("127.0.0.1", josef_broker.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
        sock.sendall(encode_request(ApiKey.FETCH, 11, 7, b"raw", fetch_body("wait", 3)))
        # Read nothing until the broker has found the socket full: a reader as fast as the broker never fills it.
        assert waited_once.wait(30), "the socket never filled: the test did not test waiting"
        size = struct.unpack(">i", receive(sock, 4))[0]
        assert size > 9_000_000  # more than the broker's socket buffer (4 MiB) and ours hold together
        waited = receive(sock, size)
    assert reads == []
    monkeypatch.setattr(network._Writer, "zero_copy", False)
    assert waited == raw_fetch(josef_broker.port, fetch_body("wait", 3))
