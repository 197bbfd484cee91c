"""The josef_broker pytest fixture runs a real broker that answers on a real socket."""

import socket
import struct

import pytest


def api_versions(port):
    request = struct.pack(">hhih", 18, 0, 11, -1)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        body = sock.recv(size, socket.MSG_WAITALL)
    return struct.unpack(">ih", body[:6])


def test_fixture_serves_on_a_free_port(josef_broker):
    assert josef_broker.port > 0
    assert josef_broker.bootstrap_servers == f"127.0.0.1:{josef_broker.port}"
    assert api_versions(josef_broker.port) == (11, 0)


@pytest.mark.josef_config(**{"num.partitions": "4"})
def test_marker_configures_the_broker(josef_broker):
    broker = josef_broker.broker
    assert broker.config["num.partitions"] == 4
    josef_broker.call(broker.controller.create_topic, "t")
    josef_broker.call(broker.replicas.storage_settled)  # the logs open in a worker thread
    assert len(broker.image.topics["t"].partitions) == 4
    assert len(broker.replicas.partitions) == 4


def test_restart_keeps_topics(josef_broker):
    josef_broker.call(josef_broker.broker.controller.create_topic, "kept", 2)
    josef_broker.restart()
    assert sorted(josef_broker.broker.image.topics["kept"].partitions) == [0, 1]
    assert api_versions(josef_broker.port) == (11, 0)
