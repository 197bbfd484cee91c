"""The receiver: each client's latest series from its pushes, exported as Prometheus metric families.

The broker calls :meth:`PrometheusTelemetryReceiver.receive_push` on its
event loop for every PushTelemetry, and ``/metrics`` calls
:meth:`~PrometheusTelemetryReceiver.collect` (prometheus-client's custom
collector protocol) on the same loop at scrape time; neither blocks nor does
I/O, and nothing here is shared with another thread.

Clients push sums as deltas (josef's subscriptions ask for delta
temporality, as Kafka's brokers do): each delta is added to the series'
total, so counters are exported cumulative, as Prometheus wants them.
Cumulative sums and gauges replace what the series held.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Callable, Iterator

import attrs
from google.protobuf.message import DecodeError
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.utils import floatToGoString

from josef.telemetry import ClientTelemetryPush
from josef_client_telemetry.points import Labels, Point, decode

log = logging.getLogger(__name__)

#: How often clients are asked to push, in milliseconds. Kafka's default is five minutes; 30 s keeps the
#: exported values about as fresh as a usual Prometheus scrape interval (15-60 s) at one small request per
#: client every 30 s. The broker asks for the shortest interval of its receivers, so another receiver may
#: make clients push more often, never less.
PUSH_INTERVAL_MS = 30_000
#: A client that has not pushed for this many push intervals is forgotten with its series: it stopped
#: without a terminating push, or now pushes to another broker. Three lets one push be late or lost
#: without a gap in its series.
EXPIRY_INTERVALS = 3
#: Series one client may have. Enough for a Java client's per-node and per-topic metrics on a large
#: cluster; a client pushing more (a bug, or a label of unbounded values) has its new series dropped,
#: while those it already has go on updating.
MAX_SERIES_PER_CLIENT = 2_000
#: Series all clients may have together, so that many clients (or one that reconnects under new instance
#: ids) cannot fill the broker's memory either: at a few hundred bytes a series, tens of megabytes.
MAX_SERIES = 100_000
#: Prometheus names of the broker's own metrics (Kafka's as the JMX exporter names them, josef's, and
#: prometheus-client's process and platform collectors'). A client metric named so would repeat one of the
#: broker's families, and Prometheus refuses a whole scrape with a family twice, so it is dropped. Kafka's
#: clients name theirs org.apache.kafka.*.
RESERVED_PREFIXES = ("kafka_", "josef_", "process_", "python_")

#: The Prometheus type of each kind of point, and the family that exports it.
FAMILIES: dict[str, type[Metric]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
    "summary": SummaryMetricFamily,
}



@attrs.define
class Client:
    """One client instance: the labels that say who it is, when it last pushed, and its series."""

    labels: dict[str, str]
    last_push: float
    series: dict[tuple[str, Labels], Point] = attrs.Factory(dict)


def identity(push: ClientTelemetryPush) -> dict[str, str]:
    """The labels every series of a client carries, from what the broker knows of it (not from its payload)."""
    labels = {"client_instance_id": str(push.client_instance_id)}
    if push.client_id is not None:
        labels["client_id"] = push.client_id
    labels["client_software_name"] = push.client_software_name
    labels["client_software_version"] = push.client_software_version
    return labels


class PrometheusTelemetryReceiver:
    """A client telemetry receiver (``josef.telemetry.ClientTelemetryReceiver``) that is a Prometheus collector.

    ``requested_metrics`` are metric-name prefixes clients are asked for ("": every metric);
    ``push_interval_ms`` how often they push. ``clock`` (monotonic seconds) is for tests.
    """

    def __init__(self, requested_metrics: tuple[str, ...] = ("",), push_interval_ms: int = PUSH_INTERVAL_MS, *,
                 max_series_per_client: int = MAX_SERIES_PER_CLIENT, max_series: int = MAX_SERIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.requested_metrics = requested_metrics
        self.push_interval_ms = push_interval_ms
        self.max_series_per_client = max_series_per_client
        self.max_series = max_series
        self.clock = clock
        #: In order of their last push, oldest first, so that expiry looks only at the front.
        self.clients: dict[uuid.UUID, Client] = {}
        self.series = 0
        self.malformed_pushes = 0
        self.dropped_points = 0
        self._warned: set[str] = set()

    def receive_push(self, push: ClientTelemetryPush) -> None:
        """Take one push: forget a terminating client, else update its series. Never raises on a client's input."""
        now = self.clock()
        self._expire(now)
        instance = push.client_instance_id
        if push.terminating:
            # Its last values would sit unchanged until they expire; a closed client has no metrics.
            if (closed := self.clients.pop(instance, None)) is not None:
                self.series -= len(closed.series)
            return
        try:
            points = decode(push.payload)
        except DecodeError as exc:
            self.malformed_pushes += 1
            self._warn("malformed", "dropped a push that is not OTLP metrics from client %r (instance %s): %s",
                       push.client_id, instance, exc)
            return
        # Out and back in: the dict stays in the order of the clients' last pushes.
        client = self.clients.pop(instance, None) or Client(identity(push), now)
        client.last_push = now
        for point in points:
            self._update(client, point)
        if client.series:  # a client with nothing kept (all dropped, or an empty push) costs nothing
            self.clients[instance] = client

    def _update(self, client: Client, point: Point) -> None:
        key = (point.name, point.labels)
        held = client.series.get(key)
        if held is None:
            if point.name.startswith(RESERVED_PREFIXES):
                self.dropped_points += 1
                self._warn("reserved", "client %r (instance %s) pushed %s, a name of the broker's own metrics: "
                           "dropped", client.labels.get("client_id"), client.labels["client_instance_id"], point.name)
                return
            if len(client.series) >= self.max_series_per_client:
                self.dropped_points += 1
                self._warn("client limit", "client %r (instance %s) has %d series, the most one client may have: "
                           "its new series are dropped, from %s on", client.labels.get("client_id"),
                           client.labels["client_instance_id"], len(client.series), point.name)
                return
            if self.series >= self.max_series:
                self.dropped_points += 1
                self._warn("limit", "clients have %d series, the most this broker keeps: new series are dropped, "
                           "from client %r's %s on", self.series, client.labels.get("client_id"), point.name)
                return
            self.series += 1
            client.series[key] = point
        elif point.delta:
            client.series[key] = attrs.evolve(point, value=held.value.plus(point.value))
        else:
            client.series[key] = point

    def _expire(self, now: float) -> None:
        """Forget the clients that stopped pushing: the oldest first, until one pushed recently enough."""
        horizon = now - EXPIRY_INTERVALS * self.push_interval_ms / 1000
        while self.clients:
            instance, client = next(iter(self.clients.items()))
            if client.last_push > horizon:
                break
            del self.clients[instance]
            self.series -= len(client.series)

    def _warn(self, reason: str, message: str, *args: object) -> None:
        """Log the first drop of each kind as a warning, later ones at debug level: they are counted in collect()."""
        level = logging.DEBUG if reason in self._warned else logging.WARNING
        self._warned.add(reason)
        log.log(level, message, *args)

    def collect(self) -> Iterator[Metric]:
        """Every client's series, one family per metric name, and what was dropped (prometheus-client's collector)."""
        self._expire(self.clock())
        families: dict[str, Metric] = {}
        for client in self.clients.values():
            for point in client.series.values():
                kind = point.value.kind
                # A counter's family drops the _total its samples get back (prometheus-client's naming).
                name = point.name.removesuffix("_total") if kind == "counter" else point.name
                family = families.get(name)
                if family is None:
                    family = families[name] = FAMILIES[kind](point.name, point.description)
                elif family.type != kind:
                    self._warn("type", "metric %s is a %s for one client and a %s for client %r: the latter is not "
                               "exported", point.name, family.type, kind, client.labels.get("client_id"))
                    continue
                _add_samples(family, {**dict(point.labels), **client.labels}, point)
        yield from families.values()
        yield CounterMetricFamily("josef_client_telemetry_malformed_pushes",
                                  "Client metric pushes dropped because their payload is not OTLP metrics",
                                  value=self.malformed_pushes)
        yield CounterMetricFamily("josef_client_telemetry_dropped_points",
                                  "Client metric data points dropped: their series would exceed a limit (per "
                                  "client or in all), or their name is one of the broker's", value=self.dropped_points)


def _add_samples(family: Metric, labels: dict[str, str], point: Point) -> None:
    """The samples of one series, as prometheus-client names them for the family's type."""
    value = point.value
    if value.kind == "counter":
        family.add_sample(f"{family.name}_total", labels, value.value)
    elif value.kind == "gauge":
        family.add_sample(family.name, labels, value.value)
    else:
        if value.kind == "histogram":
            cumulative = 0.0
            for bound, count in zip(value.bounds, value.buckets):
                cumulative += count
                family.add_sample(f"{family.name}_bucket", {**labels, "le": floatToGoString(bound)}, cumulative)
            family.add_sample(f"{family.name}_bucket", {**labels, "le": "+Inf"}, value.count)
        family.add_sample(f"{family.name}_count", labels, value.count)
        if value.sum is not None:
            family.add_sample(f"{family.name}_sum", labels, value.sum)
