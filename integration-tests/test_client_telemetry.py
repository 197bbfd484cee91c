"""librdkafka's client metrics (KIP-714) reach a telemetry receiver plugin of the broker.

The broker runs in this process (``BrokerThread``) so that the test can give
it a receiver through its own plugin manager; librdkafka talks to it over a
real socket and asks for a subscription and pushes on its own.
"""

import threading
import uuid

from confluent_kafka import Producer

from josef import hookimpl
from josef.plugins import get_plugin_manager
from josef.node.runner import BrokerThread
from josef.testing import broker_overrides


class Receiver:
    requested_metrics = ("",)  # every metric
    push_interval_ms = 1000

    def __init__(self) -> None:
        self.pushes: list[tuple[uuid.UUID, bytes]] = []
        self.pushed = threading.Event()

    def receive(self, client_instance_id: uuid.UUID, payload: bytes, terminating: bool) -> None:
        self.pushes.append((client_instance_id, payload))
        self.pushed.set()


def test_librdkafka_pushes_its_metrics_to_the_receiver(tmp_path):
    receiver = Receiver()

    class Plugin:
        @hookimpl
        def register_client_telemetry(self, register):
            register("test-receiver", lambda: receiver)

    with BrokerThread(broker_overrides(tmp_path), pm=get_plugin_manager(plugins=[Plugin()])) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        producer.produce("metered", b"v")
        assert producer.flush(30) == 0
        assert receiver.pushed.wait(30), "librdkafka never pushed its metrics"
        producer.flush(5)
    instance, payload = receiver.pushes[0]
    assert instance.int != 0 and len(payload) > 0
