"""One push decoded: the data points of an OTLP ``ExportMetricsServiceRequest`` as plain values.

A :class:`Point` is one series' value in one push, named and labelled as
Prometheus will show it (see :mod:`josef_client_telemetry.names`); whether it
is a delta to add to what the series held or the series' whole value is
``delta``. Kinds map to Prometheus types:

- OTLP Gauge, and Sum that is not monotonic (an up-down counter): ``gauge``;
- monotonic Sum: ``counter``;
- Histogram: ``histogram``, with its explicit bucket bounds;
- ExponentialHistogram and Summary: ``summary``, their count and sum only
  (exponential buckets and quantiles have no simple Prometheus equivalent).
"""

from __future__ import annotations

from typing import Iterator, Literal

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, Metric

from josef_client_telemetry.names import label_name, label_value, metric_name

Kind = Literal["counter", "gauge", "histogram", "summary"]
Labels = tuple[tuple[str, str], ...]

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
#: DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK: a point that only says the series has no value now.
NO_RECORDED_VALUE = 1


@attrs.frozen
class Value:
    """What one series holds: ``value`` for counters and gauges; ``count``, ``sum`` and the buckets otherwise.

    ``buckets`` are per bucket (not cumulative), one more than ``bounds`` (the
    last is everything above the last bound), or both empty when the
    histogram has no buckets; ``sum`` is None when the client did not send it.
    """

    kind: Kind
    value: float = 0.0
    count: float = 0.0
    sum: float | None = None
    bounds: tuple[float, ...] = ()
    buckets: tuple[float, ...] = ()

    def plus(self, delta: Value) -> Value:
        """This value with a delta point added; the delta alone when their shapes differ (the client started over)."""
        if delta.kind != self.kind or delta.bounds != self.bounds or len(delta.buckets) != len(self.buckets):
            return delta
        total = None if self.sum is None or delta.sum is None else self.sum + delta.sum
        buckets = tuple(mine + theirs for mine, theirs in zip(self.buckets, delta.buckets))
        return Value(self.kind, self.value + delta.value, self.count + delta.count, total, self.bounds, buckets)


@attrs.frozen
class Point:
    """One series' value in one push: its Prometheus name and labels (sorted), and whether it is a delta."""

    name: str
    description: str
    labels: Labels
    delta: bool
    value: Value


def decode(payload: bytes) -> list[Point]:
    """Every data point of one push; ``google.protobuf.message.DecodeError`` when the payload is not OTLP metrics.

    Resource attributes become labels of every point under them, the
    points' own attributes winning when both name the same label.
    """
    request = ExportMetricsServiceRequest.FromString(payload)
    points = []
    for resource_metrics in request.resource_metrics:
        resource = _labels(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points.extend(_points(metric, resource))
    return points


def _labels(attributes) -> dict[str, str]:
    return {label_name(kv.key): label_value(kv.value) for kv in attributes}


def _points(metric: Metric, resource: dict[str, str]) -> Iterator[Point]:
    data = metric.WhichOneof("data")
    # Without a description, HELP shows the name the client gave the metric.
    name, description = metric_name(metric.name), metric.description or metric.name

    def point(p, delta: bool, value: Value) -> Point:
        labels = tuple(sorted({**resource, **_labels(p.attributes)}.items()))
        return Point(name, description, labels, delta, value)

    if data == "gauge" or data == "sum":
        # A gauge has no temporality: each point is the current value.
        delta = data == "sum" and metric.sum.aggregation_temporality == DELTA
        kind: Kind = "counter" if data == "sum" and metric.sum.is_monotonic else "gauge"
        for p in getattr(metric, data).data_points:
            which = p.WhichOneof("value")
            if which is None or p.flags & NO_RECORDED_VALUE:
                continue
            yield point(p, delta, Value(kind, p.as_double if which == "as_double" else float(p.as_int)))
    elif data == "histogram":
        delta = metric.histogram.aggregation_temporality == DELTA
        for p in metric.histogram.data_points:
            if p.flags & NO_RECORDED_VALUE:
                continue
            bounds, buckets = tuple(p.explicit_bounds), tuple(float(c) for c in p.bucket_counts)
            if len(buckets) != len(bounds) + 1:  # no buckets sent, or not as many as the bounds need
                bounds, buckets = (), ()
            total = p.sum if p.HasField("sum") else None
            yield point(p, delta, Value("histogram", count=float(p.count), sum=total, bounds=bounds, buckets=buckets))
    elif data == "exponential_histogram":
        delta = metric.exponential_histogram.aggregation_temporality == DELTA
        for p in metric.exponential_histogram.data_points:
            if p.flags & NO_RECORDED_VALUE:
                continue
            yield point(p, delta, Value("summary", count=float(p.count), sum=p.sum if p.HasField("sum") else None))
    elif data == "summary":
        for p in metric.summary.data_points:  # always cumulative
            if p.flags & NO_RECORDED_VALUE:
                continue
            yield point(p, False, Value("summary", count=float(p.count), sum=p.sum))
