"""OTLP names as Prometheus names: Kafka's dotted client metric names and attribute keys."""

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

from josef_client_telemetry.names import label_name, label_value, metric_name


@pytest.mark.parametrize("otlp, prometheus", [
    ("org.apache.kafka.producer.node.request.latency.avg", "org_apache_kafka_producer_node_request_latency_avg"),
    ("org.apache.kafka.consumer.coordinator.rebalance.latency.total",
     "org_apache_kafka_consumer_coordinator_rebalance_latency_total"),
    ("app-metric/µs", "app_metric__s"),
    ("9lives", "_9lives"),
    ("ratio:avg", "ratio_avg"),
])
def test_metric_names(otlp, prometheus):
    assert metric_name(otlp) == prometheus


@pytest.mark.parametrize("key, label", [
    ("node.id", "node_id"), ("topic", "topic"), ("client-rack", "client_rack"), ("0rack", "key_0rack"),
    ("__name__", "key__name__"), ("_private", "_private"), ("", "key_"),
])
def test_label_names(key, label):
    assert label_name(key) == label


def test_label_values():
    assert label_value(AnyValue(string_value="orders")) == "orders"
    assert label_value(AnyValue(int_value=3)) == "3"
    assert label_value(AnyValue(bool_value=True)) == "true"
    assert label_value(AnyValue(double_value=0.5)) == "0.5"
    assert label_value(AnyValue(bytes_value=b"\x01\xff")) == "01ff"
    assert label_value(AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="a")]))) \
        == '["1","a"]'
    assert label_value(AnyValue()) == ""
