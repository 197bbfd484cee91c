"""End to end: a broker with this distribution installed serves librdkafka's metrics on its /metrics."""

from __future__ import annotations

import time
import urllib.request

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from josef import hookimpl
from josef.node.cluster import free_ports
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.testing import broker_overrides
from josef_client_telemetry.receiver import PrometheusTelemetryReceiver

class Hurry:
    """Asks for no metric, every second: clients push at the shortest interval of the broker's receivers,
    so the test need not wait for the plugin's own 30 s."""

    requested_metrics = ()
    push_interval_ms = 1000

    def receive_push(self, push) -> None:
        pass


class HurryPlugin:
    @hookimpl
    def register_client_telemetry(self, register):
        register("hurry", Hurry)


def scrape(port: int) -> list:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def test_librdkafkas_metrics_are_on_the_brokers_metrics_endpoint(tmp_path):
    pm = get_plugin_manager(autoload=True, plugins=[HurryPlugin()])
    assert pm.get_plugin("client-telemetry") is not None  # installed with the workspace, found by its entry point
    [port] = free_ports(1)
    with BrokerThread(broker_overrides(tmp_path, **{"http.listeners": f"http://127.0.0.1:{port}"}), pm=pm) as broker:
        assert any(isinstance(r, PrometheusTelemetryReceiver) for r in broker.broker.telemetry.receivers)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "client.id": "e2e"})
        producer.produce("metered", b"v")
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while not (found := [s for s in scrape(port) if s.name == "org_apache_kafka_producer_node_request_latency_avg"
                             and s.labels.get("client_id") == "e2e"]):
            assert time.monotonic() < deadline, "librdkafka's metrics never reached /metrics"
            producer.poll(0.2)
        assert found[0].labels["node_id"] == "1" and found[0].labels["client_software_name"]
        del producer
