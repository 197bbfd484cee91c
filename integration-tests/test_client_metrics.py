"""A client-metrics subscription (KIP-714) made with ``josef client-metrics`` drives librdkafka's pushes.

The broker runs in this process (``BrokerThread``) with a test receiver
that asks for nothing itself, so librdkafka pushes only what the
subscription asks for; the tool runs as a user runs it, against the
broker's socket.
"""

import subprocess
import sys
import threading

from confluent_kafka import Producer

from josef import hookimpl
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.telemetry import ClientTelemetryPush
from josef.testing import broker_overrides, eventually


class Receiver:
    """Keeps every push; asks for no metrics, so clients push only for a subscription."""

    requested_metrics = ()

    def __init__(self) -> None:
        self.pushes: list[ClientTelemetryPush] = []
        self.pushed = threading.Event()

    def receive_push(self, push: ClientTelemetryPush) -> None:
        self.pushes.append(push)
        self.pushed.set()


def client_metrics(bootstrap: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "josef", "client-metrics", "--bootstrap-server", bootstrap, *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_subscription_makes_librdkafka_push_until_it_is_deleted(tmp_path):
    receiver = Receiver()

    class Plugin:
        @hookimpl
        def register_client_telemetry(self, register):
            register("test-receiver", lambda: receiver)

    # The workspace's josef-client-telemetry asks every client for every metric when there is no subscription.
    pm = get_plugin_manager(plugins=[Plugin()], block=["josef-client-telemetry"])
    with BrokerThread(broker_overrides(tmp_path), pm=pm) as broker:
        bootstrap = broker.bootstrap_servers
        assert client_metrics(bootstrap, "--alter", "--name", "all", "--metrics", "org.apache.kafka.producer.",
                              "--interval", "1000") == "Altered client metrics config for all.\n"
        assert client_metrics(bootstrap, "--list") == "all\n"
        assert client_metrics(bootstrap, "--describe", "--name", "all") == (
            "Client metrics configs for all are:\n  interval.ms=1000\n  match=\n  metrics=org.apache.kafka.producer.\n")

        producer = Producer({"bootstrap.servers": bootstrap, "client.id": "metered-app"})
        producer.produce("metered", b"v")
        assert producer.flush(30) == 0
        assert receiver.pushed.wait(30), "librdkafka never pushed its metrics"
        push = receiver.pushes[0]
        assert (push.client_id, push.client_software_name) == ("metered-app", "confluent-kafka-python")
        assert push.client_address == "127.0.0.1" and push.listener == "PLAINTEXT"
        assert b"org.apache.kafka.producer." in push.payload  # the OTLP metrics carry their names
        assert b"org.apache.kafka.consumer." not in push.payload

        assert client_metrics(bootstrap, "--delete", "--name", "all") == "Deleted client metrics config for all.\n"
        assert client_metrics(bootstrap, "--list") == "\n"
        # librdkafka's next push is refused (its subscription id is stale); it asks again and gets no metrics.
        eventually(lambda: broker.broker.telemetry.subscription_of(push.client_instance_id).requested_metrics == (),
                   what="the client's subscription to end")
        receiver.pushed.clear()
        assert not receiver.pushed.wait(2.5), "pushes went on after the subscription was deleted"
        producer.flush(5)
