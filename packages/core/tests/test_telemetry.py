"""Client telemetry (KIP-714): the subscription, pushes to receivers over a real socket, and their refusals."""

import threading
import uuid

import pytest
import zstandard
from kio.schema.errors import ErrorCode
from kio.schema.push_telemetry.v0.request import PushTelemetryRequest

from josef import hookimpl
from josef.metadata.image import MetadataImage
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.protocol.codecs import Compression
from josef.node.runner import BrokerThread
from josef.security import Session
from josef.telemetry import DEFAULT_PUSH_INTERVAL_MS, ClientTelemetry, ClientTelemetryPush, TelemetryError
from josef.testing import RawClient, broker_overrides

ZERO = uuid.UUID(int=0)
IMAGE = MetadataImage()
SESSION = Session("PLAINTEXT", "PLAINTEXT", "10.0.0.7", 51234, client_software_name="librdkafka",
                  client_software_version="2.6.0")


class Receiver:
    """A receiver of plugin API 1.4 (``receive``); ``pushed`` is set by the first push."""

    def __init__(self, metrics=("org.apache.kafka.producer.",), interval_ms=1000):
        self.requested_metrics = metrics
        self.push_interval_ms = interval_ms
        self.received: list[tuple[uuid.UUID, bytes, bool]] = []
        self.pushed = threading.Event()

    def receive(self, client_instance_id, payload, terminating):
        self.received.append((client_instance_id, payload, terminating))
        self.pushed.set()


class PushReceiver:
    """A receiver of plugin API 1.5: it gets each push with the client's context."""

    requested_metrics = ("org.apache.kafka.",)
    push_interval_ms = 1000

    def __init__(self):
        self.pushes: list[ClientTelemetryPush] = []

    def receive_push(self, push):
        self.pushes.append(push)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def plugins(*receivers):
    """A plugin manager whose only receivers are these (the workspace's josef-client-telemetry is left out)."""

    class Plugin:
        @hookimpl
        def register_client_telemetry(self, register):
            for n, receiver in enumerate(receivers):
                register(f"test-{n}", lambda receiver=receiver: receiver)

    return get_plugin_manager(plugins=[Plugin()], block=["josef-client-telemetry"])


def push_request(instance, subscription_id, metrics=b"m", *, compression=0, terminating=False):
    return PushTelemetryRequest(client_instance_id=instance, subscription_id=subscription_id, terminating=terminating,
                                compression_type=compression, metrics=metrics)


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


def test_without_a_receiver_the_telemetry_apis_are_not_advertised(tmp_path):
    """As Kafka's brokers: clients of a broker that would discard their metrics never collect or push them."""
    with BrokerThread(broker_overrides(tmp_path), pm=plugins()) as broker:
        versions = RawClient(broker.port).call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t",
                                                                        "client_software_version": "1"})
        advertised = {k.api_key for k in versions.api_keys}
        assert ApiKey.GET_TELEMETRY_SUBSCRIPTIONS not in advertised and ApiKey.PUSH_TELEMETRY not in advertised
        assert ApiKey.GET_TELEMETRY_SUBSCRIPTIONS not in broker.broker.dispatcher.apis


def test_a_receiver_alone_with_no_metrics_wanted_gets_no_pushes():
    """A receiver that names no metrics (or none at all: they are optional) leaves clients nothing to push."""

    class Bare:
        def receive_push(self, push):
            raise AssertionError("no push expected")

    for receivers in ([Receiver(())], [Bare()]):
        telemetry = ClientTelemetry(receivers, 1 << 20)
        _, subscription = telemetry.subscribe(IMAGE, SESSION, "app", ZERO)
        assert subscription.requested_metrics == ()
    assert subscription.push_interval_ms == DEFAULT_PUSH_INTERVAL_MS


def test_pushes_are_paced_and_checked_as_kafka_does():
    clock = Clock()
    receiver = Receiver()
    telemetry = ClientTelemetry([receiver], 1000, clock=clock)
    me, subscription = telemetry.subscribe(IMAGE, SESSION, "app", ZERO)
    assert me != ZERO and subscription.push_interval_ms == 1000
    # Asking again within the interval is throttled; the first push may follow the subscription at once.
    with pytest.raises(TelemetryError) as refused:
        telemetry.subscribe(IMAGE, SESSION, "app", me)
    assert refused.value.code == ErrorCode.throttling_quota_exceeded

    def push(request):
        try:
            telemetry.push(IMAGE, SESSION, "app", request)
        except TelemetryError as exc:
            return exc.code
        return ErrorCode.none

    sid = subscription.subscription_id
    assert push(push_request(me, sid, zstandard.ZstdCompressor().compress(b"otlp"),
                             compression=int(Compression.ZSTD))) == ErrorCode.none
    assert receiver.received == [(me, b"otlp", False)]
    assert push(push_request(me, sid)) == ErrorCode.throttling_quota_exceeded
    for request, code in ((push_request(me, sid + 1), ErrorCode.unknown_subscription_id),
                          (push_request(me, sid, compression=9), ErrorCode.unsupported_compression_type),
                          (push_request(me, sid, b"x" * 1001), ErrorCode.telemetry_too_large),
                          (push_request(me, sid, b"not zstd", compression=int(Compression.ZSTD)), ErrorCode.invalid_record),
                          (push_request(ZERO, sid), ErrorCode.invalid_request),
                          (push_request(uuid.UUID(int=1), sid), ErrorCode.invalid_request)):
        clock.now += 1
        assert push(request) == code, request
    # After an unknown subscription id the client may ask again at once; a terminating push is always taken.
    assert push(push_request(me, sid + 1)) == ErrorCode.unknown_subscription_id
    assert telemetry.subscribe(IMAGE, SESSION, "app", me)[1] == subscription
    assert push(push_request(me, sid, b"", terminating=True)) == ErrorCode.none  # empty: no receiver is called
    clock.now += 1
    assert push(push_request(me, sid)) == ErrorCode.invalid_request  # nothing after the terminating push
    assert len(receiver.received) == 1


def test_a_failing_receiver_does_not_keep_the_push_from_the_others():
    class Failing:
        def receive_push(self, push):
            raise RuntimeError("boom")

    good = PushReceiver()
    telemetry = ClientTelemetry([Failing(), good], 1 << 20)
    me, subscription = telemetry.subscribe(IMAGE, SESSION, "app", ZERO)
    with pytest.raises(TelemetryError) as refused:
        telemetry.push(IMAGE, SESSION, "app", push_request(me, subscription.subscription_id))
    assert refused.value.code == ErrorCode.invalid_record  # Kafka's answer when its receiver fails
    assert [p.payload for p in good.pushes] == [b"m"]


def test_pushes_reach_the_receiver_with_the_clients_context(tmp_path):
    receiver = PushReceiver()
    with BrokerThread(broker_overrides(tmp_path, **{"telemetry.max.bytes": "1000"}), pm=plugins(receiver)) as broker:
        client = RawClient(broker.port, client_id="meter")
        client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "raw-client", "client_software_version": "7.1"})
        sub = client.call(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, {"client_instance_id": ZERO})
        assert sub.requested_metrics == ("org.apache.kafka.",)
        assert sub.push_interval.total_seconds() == 1 and sub.telemetry_max_bytes == 1000
        assert int(Compression.ZSTD) in sub.accepted_compression_types
        pushed = client.call(ApiKey.PUSH_TELEMETRY, 0, {
            "client_instance_id": sub.client_instance_id, "subscription_id": sub.subscription_id, "terminating": True,
            "compression_type": int(Compression.ZSTD), "metrics": zstandard.ZstdCompressor().compress(b"otlp-bytes")})
        assert pushed.error_code == ErrorCode.none
        again = client.call(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, {"client_instance_id": sub.client_instance_id})
        assert again.error_code == ErrorCode.throttling_quota_exceeded
    assert receiver.pushes == [ClientTelemetryPush(
        client_instance_id=sub.client_instance_id, client_id="meter", client_software_name="raw-client",
        client_software_version="7.1", client_address="127.0.0.1", principal="User:ANONYMOUS", listener="PLAINTEXT",
        payload=b"otlp-bytes", terminating=True)]
