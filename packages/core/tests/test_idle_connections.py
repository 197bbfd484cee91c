"""connections.max.idle.ms: a connection with no traffic is closed; one owed an answer (a long poll) is not."""

from __future__ import annotations

import socket
import time

import pytest
from kio.schema.errors import ErrorCode as E

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient

IDLE_MS = 400
API_VERSIONS = {"client_software_name": "t", "client_software_version": "1"}


def closed_by_broker(sock: socket.socket, within: float) -> float:
    """Seconds until the broker closed ``sock`` (recv returns end of stream); fails after ``within``."""
    start = time.monotonic()
    sock.settimeout(within)
    assert sock.recv(1) == b""
    return time.monotonic() - start


@pytest.mark.josef_config(**{"connections.max.idle.ms": IDLE_MS})
def test_a_silent_connection_is_closed_after_connections_max_idle_ms(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        assert client.call(ApiKey.API_VERSIONS, 3, API_VERSIONS).error_code == E.none
        waited = closed_by_broker(client.sock, within=10)
        assert waited >= IDLE_MS / 1000 * 0.9  # not before the setting (timers may round a little)
    finally:
        client.close()


@pytest.mark.josef_config(**{"connections.max.idle.ms": IDLE_MS})
def test_traffic_keeps_a_connection_open(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        # 10 x IDLE_MS / 4 > 2 x IDLE_MS in all; each gap leaves 3/4 of the idle time for a slow round trip.
        for _ in range(10):
            time.sleep(IDLE_MS / 4000)
            assert client.call(ApiKey.API_VERSIONS, 3, API_VERSIONS).error_code == E.none
    finally:
        client.close()


@pytest.mark.josef_config(**{"connections.max.idle.ms": IDLE_MS})
def test_a_long_poll_fetch_longer_than_the_idle_time_is_answered(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        created = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [
            {"name": "quiet", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout": 10000, "validate_only": False})
        assert created.topics[0].error_code == E.none
        start = time.monotonic()
        response = client.call(ApiKey.FETCH, 11, {
            "replica_id": -1, "max_wait": 3 * IDLE_MS, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "quiet", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                          "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
        assert time.monotonic() - start >= 2 * IDLE_MS / 1000  # it did wait, past the idle time
        assert response.responses[0].partitions[0].error_code == E.none
        closed_by_broker(client.sock, within=10)  # and idleness counts again from the answer
    finally:
        client.close()
