"""A real push: librdkafka's producer metrics, captured from an in-process broker, through the receiver.

The broker runs in this process (``BrokerThread``) with a receiver that keeps
what it is handed; confluent-kafka's producer asks it for a subscription and
pushes on its own, every second, and once more, terminating, when it closes.
"""

from __future__ import annotations

import threading
import time
from importlib import metadata
from typing import Any

import confluent_kafka
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from josef import hookimpl
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.testing import broker_overrides
from josef_client_telemetry.receiver import PrometheusTelemetryReceiver

CLIENT_ID = "metered-producer"


class Capture:
    """Keeps every push as the broker hands it."""

    requested_metrics = ("",)
    push_interval_ms = 1000

    def __init__(self) -> None:
        self.pushes: list[Any] = []
        self.terminated = threading.Event()

    def receive_push(self, push: Any) -> None:
        self.pushes.append(push)
        if push.terminating:
            self.terminated.set()


@pytest.fixture(scope="module")
def pushes(tmp_path_factory) -> list[Any]:
    """The pushes of a producer that wrote to a topic, the last one terminating."""
    capture = Capture()

    class Plugin:
        @hookimpl
        def register_client_telemetry(self, register):
            register("capture", lambda: capture)

    # This distribution's own receiver (installed, so autoloaded) is left out: the capture is the only one.
    pm = get_plugin_manager(plugins=[Plugin()], block=["client-telemetry"])
    with BrokerThread(broker_overrides(tmp_path_factory.mktemp("josef")), pm=pm) as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": CLIENT_ID})
        producer.produce("metered", b"v")
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while len(capture.pushes) < 2 and time.monotonic() < deadline:  # one at least after the produce
            producer.poll(0.1)
        assert len(capture.pushes) >= 2, "librdkafka did not push its metrics"
        del producer  # closing: the terminating push
        assert capture.terminated.wait(30), "librdkafka did not push on closing"
    return capture.pushes


@pytest.fixture
def real(pushes) -> list[Any]:
    """The captured pushes, with the client's software as confluent-kafka says it in ApiVersions."""
    version = f"{metadata.version('confluent-kafka')}-rdkafka-{confluent_kafka.libversion()[0]}"
    assert all((p.client_id, p.client_software_name, p.client_software_version)
               == (CLIENT_ID, "confluent-kafka-python", version) for p in pushes)
    return pushes


def test_librdkafkas_producer_metrics_are_exported_with_the_client_labels(real):
    receiver = PrometheusTelemetryReceiver()
    for one in real[:-1]:
        receiver.receive_push(one)
    registry = CollectorRegistry()
    registry.register(receiver)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in receiver.collect()}
    latency = families["org_apache_kafka_producer_node_request_latency_avg"]
    assert latency.type == "gauge"
    [sample] = latency.samples
    assert sample.labels["client_id"] == CLIENT_ID and sample.labels["node_id"] == "1"
    assert sample.labels["client_instance_id"] == str(real[0].client_instance_id)
    assert sample.labels["client_software_name"] == real[0].client_software_name
    connections = families["org_apache_kafka_producer_connection_creation"]  # a delta sum: a counter
    assert connections.type == "counter" and connections.samples[0].name.endswith("_total")
    assert "org_apache_kafka_producer_record_queue_time_max{" in text
    assert receiver.malformed_pushes == 0 and receiver.dropped_points == 0


def test_librdkafkas_terminating_push_forgets_it(real):
    receiver = PrometheusTelemetryReceiver()
    for one in real:
        receiver.receive_push(one)
    assert real[-1].terminating and receiver.clients == {}
    assert {f.name for f in receiver.collect() if f.samples and not f.name.startswith("josef_")} == set()
