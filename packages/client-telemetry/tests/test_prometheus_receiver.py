"""The receiver on hand-built OTLP pushes: kinds and temporalities, labels, expiry, limits, malformed payloads."""

from __future__ import annotations

import logging
import uuid

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from josef_client_telemetry.receiver import EXPIRY_INTERVALS, PrometheusTelemetryReceiver

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
LATENCY = "org.apache.kafka.producer.node.request.latency.avg"
CONNECTIONS = "org.apache.kafka.producer.connection.creation.total"
A, B = uuid.UUID(int=1), uuid.UUID(int=2)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def attributes(labels: dict[str, object]) -> list[KeyValue]:
    def value(v: object) -> AnyValue:
        if isinstance(v, bool):
            return AnyValue(bool_value=v)
        if isinstance(v, int):
            return AnyValue(int_value=v)
        if isinstance(v, float):
            return AnyValue(double_value=v)
        return AnyValue(string_value=str(v))

    return [KeyValue(key=k, value=value(v)) for k, v in labels.items()]


def number(value: float, labels: dict[str, object]) -> NumberDataPoint:
    if isinstance(value, int):
        return NumberDataPoint(as_int=value, attributes=attributes(labels))
    return NumberDataPoint(as_double=value, attributes=attributes(labels))


def gauge(name: str, value: float, **labels: object) -> Metric:
    return Metric(name=name, gauge=Gauge(data_points=[number(value, labels)]))


def total(name: str, value: float, temporality=DELTA, monotonic=True, **labels: object) -> Metric:
    return Metric(name=name, sum=Sum(data_points=[number(value, labels)], aggregation_temporality=temporality,
                                     is_monotonic=monotonic))


def histogram(name: str, bounds: list[float], counts: list[int], sum_: float, temporality=DELTA) -> Metric:
    point = HistogramDataPoint(count=sum(counts), sum=sum_, bucket_counts=counts, explicit_bounds=bounds)
    return Metric(name=name, histogram=Histogram(data_points=[point], aggregation_temporality=temporality))


def request(*metrics: Metric, resource: dict[str, object] | None = None) -> bytes:
    resource_metrics = ResourceMetrics(resource=Resource(attributes=attributes(resource or {})),
                                       scope_metrics=[ScopeMetrics(metrics=list(metrics))])
    return ExportMetricsServiceRequest(resource_metrics=[resource_metrics]).SerializeToString()


def samples(receiver: PrometheusTelemetryReceiver, name: str) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` of every sample named ``name`` that the receiver exports."""
    return [(s.labels, s.value) for family in receiver.collect() for s in family.samples if s.name == name]


def value(receiver: PrometheusTelemetryReceiver, name: str, **labels: str) -> float:
    [found] = [v for sample_labels, v in samples(receiver, name) if labels.items() <= sample_labels.items()]
    return found


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def receiver(clock: Clock) -> PrometheusTelemetryReceiver:
    return PrometheusTelemetryReceiver(clock=clock)


def test_a_gauge_is_its_latest_value_labelled_with_the_client_and_its_attributes(receiver, push):
    receiver.receive_push(push(request(gauge(LATENCY, 6.5, **{"node.id": 1})), instance=A, client_id="payments"))
    receiver.receive_push(push(request(gauge(LATENCY, 2.25, **{"node.id": 1})), instance=A, client_id="payments"))
    [(labels, latest)] = samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")
    assert latest == 2.25
    assert labels == {"node_id": "1", "client_instance_id": str(A), "client_id": "payments",
                      "client_software_name": "librdkafka", "client_software_version": "2.16.0"}


def test_labels_come_from_the_resource_the_point_and_the_broker_in_rising_precedence(receiver, push):
    metric = gauge(LATENCY, 1.0, rack="from-the-point", client_id="spoofed", **{"node.id": 3})
    receiver.receive_push(push(request(metric, resource={"rack": "from-the-resource", "group.id": "g"}),
                               instance=A, client_id="real"))
    [(labels, _)] = samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")
    assert labels["rack"] == "from-the-point" and labels["group_id"] == "g" and labels["node_id"] == "3"
    assert labels["client_id"] == "real"  # what the broker knows of the client, not what its payload claims


def test_a_client_without_a_client_id_has_no_client_id_label(receiver, push):
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=A, client_id=None))
    [(labels, _)] = samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")
    assert "client_id" not in labels and labels["client_instance_id"] == str(A)


def test_delta_sums_accumulate_into_a_counter(receiver, push):
    for delta in (2, 0, 3):
        receiver.receive_push(push(request(total(CONNECTIONS, delta)), instance=A))
    receiver.receive_push(push(request(total(CONNECTIONS, 4)), instance=B))
    assert value(receiver, "org_apache_kafka_producer_connection_creation_total", client_instance_id=str(A)) == 5
    assert value(receiver, "org_apache_kafka_producer_connection_creation_total", client_instance_id=str(B)) == 4
    [family] = [f for f in receiver.collect() if f.name == "org_apache_kafka_producer_connection_creation"]
    assert family.type == "counter"


def test_cumulative_sums_are_taken_as_they_are(receiver, push):
    for cumulative in (2, 5, 9):
        receiver.receive_push(push(request(total("app.requests", cumulative, CUMULATIVE)), instance=A))
    assert value(receiver, "app_requests_total") == 9


def test_a_sum_that_is_not_monotonic_is_a_gauge(receiver, push):
    for delta in (5, -2):
        receiver.receive_push(push(request(total("app.in.flight", delta, monotonic=False)), instance=A))
    [family] = [f for f in receiver.collect() if f.name == "app_in_flight"]
    assert family.type == "gauge" and family.samples[0].value == 3


def test_delta_histograms_accumulate_into_a_prometheus_histogram(receiver, push):
    receiver.receive_push(push(request(histogram("app.latency", [1.0, 10.0], [1, 2, 0], 12.0)), instance=A))
    receiver.receive_push(push(request(histogram("app.latency", [1.0, 10.0], [0, 1, 1], 25.0)), instance=A))
    buckets = {labels["le"]: v for labels, v in samples(receiver, "app_latency_bucket")}
    assert buckets == {"1.0": 1, "10.0": 4, "+Inf": 5}
    assert value(receiver, "app_latency_count") == 5 and value(receiver, "app_latency_sum") == 37.0


def test_a_histogram_whose_bounds_change_starts_over(receiver, push):
    receiver.receive_push(push(request(histogram("app.latency", [1.0], [1, 2], 3.0)), instance=A))
    receiver.receive_push(push(request(histogram("app.latency", [5.0], [4, 0], 2.0)), instance=A))
    assert {labels["le"]: v for labels, v in samples(receiver, "app_latency_bucket")} == {"5.0": 4, "+Inf": 4}


def test_an_exponential_histogram_is_exported_as_its_count_and_sum(receiver, push):
    point = ExponentialHistogramDataPoint(count=3, sum=7.5, scale=2)
    metric = Metric(name="app.sizes", exponential_histogram=ExponentialHistogram(
        data_points=[point], aggregation_temporality=DELTA))
    receiver.receive_push(push(request(metric), instance=A))
    receiver.receive_push(push(request(metric), instance=A))
    assert value(receiver, "app_sizes_count") == 6 and value(receiver, "app_sizes_sum") == 15.0


def test_the_exposition_is_valid_prometheus_text(receiver, push):
    payload = request(gauge(LATENCY, 6.5, **{"node.id": 1}), total(CONNECTIONS, 2),
                      histogram("app.latency", [1.0], [1, 1], 3.0))
    receiver.receive_push(push(payload, instance=A, client_id="payments"))
    registry = CollectorRegistry()
    registry.register(receiver)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["org_apache_kafka_producer_node_request_latency_avg"].type == "gauge"
    assert families["org_apache_kafka_producer_connection_creation"].type == "counter"
    assert families["app_latency"].type == "histogram"
    assert families["josef_client_telemetry_malformed_pushes"].samples[0].value == 0
    assert ('org_apache_kafka_producer_connection_creation_total{client_id="payments",client_instance_id="'
            f'{A}",client_software_name="librdkafka",client_software_version="2.16.0"}} 2.0') in text


def test_a_terminating_push_forgets_the_client(receiver, push):
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=A))
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=B))
    receiver.receive_push(push(request(gauge(LATENCY, 2.0)), instance=A, terminating=True))
    assert [labels["client_instance_id"] for labels, _ in samples(
        receiver, "org_apache_kafka_producer_node_request_latency_avg")] == [str(B)]
    assert receiver.series == 1


def test_a_client_that_stops_pushing_is_forgotten_after_a_few_intervals(clock, push):
    receiver = PrometheusTelemetryReceiver(push_interval_ms=10_000, clock=clock)
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=A))
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=B))
    clock.now += 10 * EXPIRY_INTERVALS - 1
    receiver.receive_push(push(request(gauge(LATENCY, 2.0)), instance=A))  # A goes on pushing, B stopped
    assert len(samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")) == 2
    clock.now += 2
    assert [labels["client_instance_id"] for labels, _ in samples(
        receiver, "org_apache_kafka_producer_node_request_latency_avg")] == [str(A)]
    assert receiver.series == 1
    clock.now += 10 * EXPIRY_INTERVALS
    assert samples(receiver, "org_apache_kafka_producer_node_request_latency_avg") == [] and receiver.series == 0


def test_a_client_over_its_series_limit_keeps_its_series_and_gets_no_more(clock, push, caplog):
    receiver = PrometheusTelemetryReceiver(max_series_per_client=2, clock=clock)
    caplog.set_level(logging.WARNING, "josef_client_telemetry")
    receiver.receive_push(push(request(*(gauge(LATENCY, 1.0, topic=f"t{i}") for i in range(4))), instance=A))
    receiver.receive_push(push(request(*(gauge(LATENCY, 2.0, topic=f"t{i}") for i in range(4))), instance=A))
    receiver.receive_push(push(request(*(gauge(LATENCY, 3.0, topic=f"t{i}") for i in range(4))), instance=B))
    exported = samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")
    assert sorted((labels["client_instance_id"], labels["topic"], v) for labels, v in exported) == [
        (str(A), "t0", 2.0), (str(A), "t1", 2.0), (str(B), "t0", 3.0), (str(B), "t1", 3.0)]
    assert value(receiver, "josef_client_telemetry_dropped_points_total") == 6
    assert len([r for r in caplog.records if "series" in r.getMessage()]) == 1  # the first drop only


def test_all_clients_together_stay_under_the_broker_wide_limit(clock, push):
    receiver = PrometheusTelemetryReceiver(max_series=3, clock=clock)
    receiver.receive_push(push(request(*(gauge(LATENCY, 1.0, topic=f"t{i}") for i in range(2))), instance=A))
    receiver.receive_push(push(request(*(gauge(LATENCY, 1.0, topic=f"t{i}") for i in range(2))), instance=B))
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=uuid.UUID(int=3)))
    assert len(samples(receiver, "org_apache_kafka_producer_node_request_latency_avg")) == 3
    assert receiver.series == 3 and uuid.UUID(int=3) not in receiver.clients  # kept nothing, so not kept itself
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=A, terminating=True))
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=uuid.UUID(int=3)))
    assert receiver.series == 2 and uuid.UUID(int=3) in receiver.clients


@pytest.mark.parametrize("payload", [b"not protobuf", b"\xff\xff\xff"])
def test_a_payload_that_is_not_otlp_is_dropped_with_one_line(receiver, push, caplog, payload):
    receiver.receive_push(push(request(gauge(LATENCY, 1.0)), instance=A, client_id="payments"))
    caplog.set_level(logging.WARNING, "josef_client_telemetry")
    receiver.receive_push(push(payload, instance=A, client_id="payments"))
    receiver.receive_push(push(payload, instance=A, client_id="payments"))
    assert value(receiver, "org_apache_kafka_producer_node_request_latency_avg") == 1.0  # what it had is kept
    assert value(receiver, "josef_client_telemetry_malformed_pushes_total") == 2
    [line] = [r.getMessage() for r in caplog.records]
    assert "'payments'" in line and str(A) in line


def test_a_metric_of_two_types_is_exported_as_the_first_it_was_seen_as(receiver, push, caplog):
    receiver.receive_push(push(request(gauge("app.connections", 3.0)), instance=A))
    receiver.receive_push(push(request(total("app.connections", 3, CUMULATIVE)), instance=B))
    [family] = [f for f in receiver.collect() if f.name == "app_connections"]
    assert family.type == "gauge" and len(family.samples) == 1
    assert "app_connections" in caplog.text


def test_a_client_metric_named_as_the_brokers_own_is_dropped(receiver, push):
    """Two families of one name would make Prometheus refuse the broker's whole /metrics."""
    payload = request(gauge("kafka.server.replicamanager.leadercount", 1.0), gauge("process.cpu.seconds", 1.0),
                      gauge(LATENCY, 1.0))
    receiver.receive_push(push(payload, instance=A))
    exported = {f.name for f in receiver.collect() if f.samples and not f.name.startswith("josef_client_telemetry_")}
    assert exported == {"org_apache_kafka_producer_node_request_latency_avg"}
    assert value(receiver, "josef_client_telemetry_dropped_points_total") == 2
