"""Client-metrics resources (KIP-714): Kafka's validation, the subscriptions they give clients, and their APIs."""

import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.push_telemetry.v0.request import PushTelemetryRequest

from josef.metadata.client_metrics import ClientMetricsError, check, resources
from josef.metadata.image import MetadataImage
from josef.metadata.records import CLIENT_METRICS_RESOURCE
from josef.node.runner import BrokerThread
from josef.protocol.api_keys import ApiKey
from josef.security import Session
from josef.telemetry import ClientTelemetry, TelemetryError
from josef.testing import RawClient, broker_overrides

ZERO = uuid.UUID(int=0)
SET, DELETE, APPEND = 0, 1, 2


@pytest.mark.parametrize(("configs", "code", "message"), [
    ({"metric": "a"}, ErrorCode.invalid_request, "Unknown client metrics configuration: metric"),
    ({"interval.ms": "99"}, ErrorCode.invalid_request,
     "Invalid value 99 for interval.ms, interval must be between 100 and 3600000 (1 hour)"),
    ({"interval.ms": "3600001"}, ErrorCode.invalid_request, None),
    ({"interval.ms": "soon"}, ErrorCode.invalid_config, None),
    ({"match": "client_idd=a"}, ErrorCode.invalid_config, "Illegal client matching pattern: client_idd=a"),
    ({"match": "client_id=a=b"}, ErrorCode.invalid_config, None),
    ({"match": "client_id="}, ErrorCode.invalid_config, None),  # Java's split drops the empty regex
    ({"match": "client_id=(unclosed"}, ErrorCode.invalid_config, None),
])
def test_configs_are_refused_as_kafka_refuses_them(configs, code, message):
    with pytest.raises(ClientMetricsError) as refused:
        check("sub", configs)
    assert refused.value.code == code
    if message is not None:
        assert str(refused.value) == message


def test_match_selects_clients_on_every_selector_in_full():
    resource = check("sub", {"metrics": "org.apache.kafka.producer., org.apache.kafka.consumer.",
                             "match": "client_software_name = librdkafka, client_id=app-.*"})
    assert resource.metrics == ("org.apache.kafka.producer.", "org.apache.kafka.consumer.")
    assert resource.interval_ms == 300_000
    client = {"client_software_name": "librdkafka", "client_id": "app-1"}
    assert resource.matches(client)
    assert not resource.matches({**client, "client_id": "my-app-1"})  # the whole value must match
    assert not resource.matches({**client, "client_id": None})  # a client without one is not selected
    assert check("everyone", {"interval.ms": "1000"}).matches({})


def test_a_resource_is_its_configs_until_they_are_all_deleted():
    image = {(CLIENT_METRICS_RESOURCE, "b"): {"metrics": "*"}, (CLIENT_METRICS_RESOURCE, "gone"): {},
             (CLIENT_METRICS_RESOURCE, "a"): {"interval.ms": "500"}, (2, "topic"): {"retention.ms": "1"},
             (CLIENT_METRICS_RESOURCE, "broken"): {"interval.ms": "1"}}  # written by something else: skipped
    assert [r.name for r in resources(image)] == ["a", "b"]


def session(software: str) -> Session:
    return Session("PLAINTEXT", "PLAINTEXT", "10.1.2.3", 40000, client_software_name=software,
                   client_software_version="1.0")


def image_with(**subscriptions: dict) -> MetadataImage:
    return MetadataImage(configs={(CLIENT_METRICS_RESOURCE, name): configs for name, configs in subscriptions.items()})


class Receiver:
    requested_metrics = ("receiver.",)
    push_interval_ms = 60_000

    def receive_push(self, push):
        pass


def test_subscriptions_come_from_the_matching_resources():
    telemetry = ClientTelemetry([Receiver()], 1 << 20)
    rdkafka, java = session("librdkafka"), session("apache-kafka-java")
    # No resource: the receivers' own wish.
    assert telemetry.subscribe(MetadataImage(), rdkafka, "a", ZERO)[1].requested_metrics == ("receiver.",)
    image = image_with(rd={"metrics": "org.apache.kafka.producer.", "interval.ms": "2000",
                           "match": "client_software_name=librdkafka"},
                       all={"metrics": "org.apache.kafka.client.", "interval.ms": "5000"},
                       none={"metrics": "x.", "match": "client_source_port=1"})
    _, mine = telemetry.subscribe(image, rdkafka, "a", ZERO)
    assert (mine.requested_metrics, mine.push_interval_ms) == (
        ("org.apache.kafka.client.", "org.apache.kafka.producer."), 2000)
    _, theirs = telemetry.subscribe(image, java, "a", ZERO)
    assert (theirs.requested_metrics, theirs.push_interval_ms) == (("org.apache.kafka.client.",), 5000)
    _, star = telemetry.subscribe(image_with(all={"metrics": "*,a."}, other={"metrics": "b."}), java, "a", ZERO)
    assert star.requested_metrics == ("*",)
    # A client no resource selects is asked for nothing, at Kafka's default interval.
    _, nothing = telemetry.subscribe(image_with(none={"metrics": "x.", "match": "client_id=other"}), java, "a", ZERO)
    assert (nothing.requested_metrics, nothing.push_interval_ms) == ((), 300_000)


def test_a_changed_subscription_gets_a_new_id_and_a_stale_push_is_refused():
    telemetry = ClientTelemetry([Receiver()], 1 << 20)
    client = session("librdkafka")
    before = image_with(sub={"metrics": "a.", "interval.ms": "1000"})
    me, first = telemetry.subscribe(before, client, "app", ZERO)
    # The same client gets the same id from another broker (a new ClientTelemetry); another client another id.
    assert ClientTelemetry([], 1 << 20).subscribe(before, client, "app", me)[1] == first
    assert telemetry.subscribe(before, client, "app", ZERO)[1].subscription_id != first.subscription_id

    def push(image, subscription_id):
        telemetry.push(image, client, "app", PushTelemetryRequest(
            client_instance_id=me, subscription_id=subscription_id, terminating=False, compression_type=0,
            metrics=b"m"))

    push(before, first.subscription_id)
    after = image_with(sub={"metrics": "a.,b.", "interval.ms": "1000"})
    with pytest.raises(TelemetryError) as refused:
        push(after, first.subscription_id)
    assert refused.value.code == ErrorCode.unknown_subscription_id
    _, second = telemetry.subscribe(after, client, "app", me)  # at once, though within the interval
    assert second.requested_metrics == ("a.", "b.") and second.subscription_id != first.subscription_id
    assert telemetry.subscription_of(me) == second
    # The same set again is the same subscription: a new image with equal resources changes nothing.
    assert telemetry.subscribe(image_with(sub={"metrics": "a.,b.", "interval.ms": "1000"}), client, "app",
                               ZERO)[1].requested_metrics == ("a.", "b.")
    assert telemetry.subscription_of(me) == second


def alter(client: RawClient, name: str, *ops: tuple[str, int, str | None]):
    body = {"validate_only": False, "resources": [{"resource_type": CLIENT_METRICS_RESOURCE, "resource_name": name,
                                                   "configs": [{"name": k, "config_operation": op, "value": v}
                                                               for k, op, v in ops]}]}
    answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body).responses[0]
    return answer.error_code, answer.error_message


def describe(client: RawClient, name: str, keys=None):
    return client.call(ApiKey.DESCRIBE_CONFIGS, 4, {
        "resources": [{"resource_type": CLIENT_METRICS_RESOURCE, "resource_name": name, "configuration_keys": keys}],
        "include_synonyms": True, "include_documentation": True}).results[0]


def listed(client: RawClient, version: int, types=()) -> list:
    answer = client.call(ApiKey.LIST_CONFIG_RESOURCES, version, {"resource_types": list(types)})
    assert answer.error_code == ErrorCode.none, answer
    return [(r.resource_name, getattr(r, "resource_type", None)) for r in answer.config_resources]


def test_resources_are_altered_described_listed_and_kept_across_a_restart(tmp_path):
    overrides = broker_overrides(tmp_path)
    with BrokerThread(overrides) as broker:
        client = RawClient(broker.port)
        assert alter(client, "sub", ("interval.ms", SET, "50")) == (
            ErrorCode.invalid_request, "Invalid value 50 for interval.ms, interval must be between 100 and 3600000 "
                                       "(1 hour)")
        assert alter(client, "sub", ("colour", SET, "red")) == (
            ErrorCode.invalid_request, "Unknown client metrics configuration: colour")
        assert alter(client, "", ("interval.ms", SET, "1000")) == (
            ErrorCode.invalid_request, "Subscription name can't be empty")
        assert alter(client, "sub", ("metrics", SET, "a."), ("match", SET, "client_id=app")) == (ErrorCode.none, None)
        assert alter(client, "sub", ("metrics", APPEND, "b.")) == (ErrorCode.none, None)
        described = describe(client, "sub")
        assert described.error_code == ErrorCode.none
        assert [(c.name, c.value, c.config_source, c.config_type) for c in described.configs] == [
            ("metrics", "a.,b.", 7, 7), ("interval.ms", "300000", 5, 3), ("match", "client_id=app", 7, 7)]
        assert described.configs[0].synonyms[0].source == 7 and described.configs[0].documentation
        assert [c.name for c in describe(client, "sub", ["interval.ms"]).configs] == ["interval.ms"]
        assert [c.value for c in describe(client, "absent").configs] == ["", "300000", ""]  # Kafka's defaults
        assert describe(client, "").error_code == ErrorCode.invalid_request
        client.call(ApiKey.CREATE_TOPICS, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1,
                                                          "assignments": [], "configs": []}],
                                              "timeout": 10000, "validate_only": False})
        assert listed(client, 0) == [("sub", None)]
        assert listed(client, 1, [16, 2]) == [("sub", 16), ("t", 2)]
        node = str(broker.broker.node_id)
        assert listed(client, 1) == [("sub", 16), (node, 8), (node, 4), ("t", 2)]
        refused = client.call(ApiKey.LIST_CONFIG_RESOURCES, 1, {"resource_types": [16, 1]})
        assert (refused.error_code, refused.config_resources) == (ErrorCode.unsupported_version, ())
        assert alter(client, "gone", ("interval.ms", SET, "1000")) == (ErrorCode.none, None)
        assert alter(client, "gone", ("interval.ms", DELETE, None)) == (ErrorCode.none, None)
        assert listed(client, 0) == [("sub", None)]
        client.close()
    with BrokerThread(overrides) as broker:
        client = RawClient(broker.port)
        assert listed(client, 0) == [("sub", None)]
        assert describe(client, "sub").configs[0].value == "a.,b."
        client.close()
