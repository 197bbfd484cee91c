"""Client telemetry (KIP-714): the subscription, pushes to receivers over a real socket, and their refusals."""

import threading
import uuid

import pytest
import zstandard
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.codecs import Compression
from josef.node.runner import BrokerThread
from josef.telemetry import DEFAULT_PUSH_INTERVAL_MS, ClientTelemetry, TelemetryError
from josef.testing import RawClient, broker_overrides

ZERO = uuid.UUID(int=0)


class Receiver:
    """Keeps every push; ``pushed`` is set by the first."""

    def __init__(self, metrics=("org.apache.kafka.producer.",), interval_ms=1000):
        self.requested_metrics = metrics
        self.push_interval_ms = interval_ms
        self.received: list[tuple[uuid.UUID, bytes, bool]] = []
        self.pushed = threading.Event()

    def receive(self, client_instance_id, payload, terminating):
        self.received.append((client_instance_id, payload, terminating))
        self.pushed.set()


def plugin_with(receiver):
    class Plugin:
        @hookimpl
        def register_client_telemetry(self, register):
            register("test", lambda: receiver)

    return get_plugin_manager(plugins=[Plugin()])


def test_the_subscription_is_the_union_of_the_receivers():
    telemetry = ClientTelemetry([Receiver(("a.", "b."), 5000), Receiver(("b.", "c."), 2000)], 1 << 20)
    assert telemetry.subscription.requested_metrics == ("a.", "b.", "c.")
    assert telemetry.subscription.push_interval_ms == 2000
    everything = ClientTelemetry([Receiver(("a.",)), Receiver(("",))], 1 << 20)
    assert everything.subscription.requested_metrics == ("",)
    none = ClientTelemetry([], 1 << 20)
    assert none.subscription.requested_metrics == () and none.subscription.push_interval_ms == DEFAULT_PUSH_INTERVAL_MS
    assert ClientTelemetry([Receiver(("a.",))], 1).subscription == ClientTelemetry([Receiver(("a.",))], 9).subscription
    assert telemetry.instance_id(ZERO) != ZERO
    mine = uuid.uuid4()
    assert telemetry.instance_id(mine) == mine


def test_without_a_receiver_the_telemetry_apis_are_not_advertised(josef_broker):
    """As Kafka's brokers: clients of a broker that would discard their metrics never collect or push them."""
    versions = RawClient(josef_broker.port).call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                                          "client_software_version": "1"})
    advertised = {k.api_key for k in versions.api_keys}
    assert ApiKey.GET_TELEMETRY_SUBSCRIPTIONS not in advertised and ApiKey.PUSH_TELEMETRY not in advertised
    assert ApiKey.GET_TELEMETRY_SUBSCRIPTIONS not in josef_broker.broker.dispatcher.apis


def test_a_receiver_alone_with_no_metrics_wanted_gets_no_pushes():
    telemetry = ClientTelemetry([Receiver(())], 1 << 20)
    assert telemetry.subscription.requested_metrics == ()
    with pytest.raises(TelemetryError) as refused:
        telemetry.push(uuid.uuid4(), telemetry.subscription.subscription_id, 0, b"x", False)
    assert refused.value.code == ErrorCode.unknown_subscription_id


def test_pushes_reach_the_receiver_and_bad_ones_are_refused(tmp_path):
    receiver = Receiver()
    with BrokerThread(broker_overrides(tmp_path, **{"telemetry.max.bytes": "1000"}), pm=plugin_with(receiver)) as broker:
        client = RawClient(broker.port)
        sub = client.call(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, {"client_instance_id": ZERO})
        assert sub.requested_metrics == ("org.apache.kafka.producer.",)
        assert sub.push_interval.total_seconds() == 1 and sub.telemetry_max_bytes == 1000
        assert int(Compression.ZSTD) in sub.accepted_compression_types
        me = sub.client_instance_id

        def push(metrics, *, compression=0, subscription=sub.subscription_id, instance=me, terminating=False):
            return client.call(ApiKey.PUSH_TELEMETRY, 0, {
                "client_instance_id": instance, "subscription_id": subscription, "terminating": terminating,
                "compression_type": compression, "metrics": metrics}).error_code

        assert push(zstandard.ZstdCompressor().compress(b"otlp-bytes"), compression=int(Compression.ZSTD),
                    terminating=True) == ErrorCode.none
        assert receiver.received == [(me, b"otlp-bytes", True)]
        assert push(b"x", subscription=sub.subscription_id + 1) == ErrorCode.unknown_subscription_id
        assert push(b"x" * 1001) == ErrorCode.telemetry_too_large
        assert push(b"x", compression=9) == ErrorCode.unsupported_compression_type
        assert push(b"not zstd", compression=int(Compression.ZSTD)) == ErrorCode.invalid_record
        assert push(b"x", instance=ZERO) == ErrorCode.invalid_request
        assert len(receiver.received) == 1
