"""Kafka's RequestMetrics: requests per API and version, and where each request's time went.

``kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=11``
becomes ``kafka_network_requestmetrics_requests_total{request="Produce",version="11"}``,
and each of Kafka's request times (``TotalTimeMs``, ``RequestQueueTimeMs``,
``LocalTimeMs``, ``RemoteTimeMs``, ``ThrottleTimeMs``, ``ResponseQueueTimeMs``,
``ResponseSendTimeMs``) a summary ``kafka_network_requestmetrics_totaltimems{request,quantile}``.

What the times mean here, where one task per connection reads, handles and
answers its requests in order (:mod:`josef.server.network`):

- RequestQueueTimeMs: from the whole request's arrival in the connection's
  buffer until its handler starts (behind the requests pipelined before it);
- LocalTimeMs: the handler, until it answered or handed its answer to wait;
- RemoteTimeMs: the answer's wait (an acks=all produce for the ISR);
- ThrottleTimeMs: the quota throttle the request earned (the connection
  reads nothing more from the client for that long);
- ResponseQueueTimeMs: from the answer being ready until its write starts;
- ResponseSendTimeMs: its write (for an answer sent together with the next
  one's, the shared write);
- TotalTimeMs: arrival until written.

Recording is one tuple of the request's clock readings per request in a
ring of the last :data:`SAMPLES` per API (Kafka's histograms keep a
reservoir of 1028), plus counters; the times and their quantiles are
computed from the readings when Prometheus scrapes.
"""

from __future__ import annotations

from typing import Iterable

from kio.schema.index import api_key_map
from prometheus_client.core import CounterMetricFamily, Metric

from josef.metrics import add_quantiles, summary

#: Recent requests per API whose times the quantiles are computed over.
SAMPLES = 1024
#: Kafka's names of the request times, in the order :meth:`ApiRequests.record` takes them.
TIMES = ("RequestQueueTimeMs", "LocalTimeMs", "RemoteTimeMs", "ThrottleTimeMs", "ResponseQueueTimeMs",
         "ResponseSendTimeMs", "TotalTimeMs")


#: A request's clock readings (``time.monotonic()`` seconds): arrival, handler start, handler end, answer ready,
#: write start, write end; and its throttle (seconds).
Readings = tuple[float, float, float, float, float, float, float]


def times_of(readings: Readings) -> tuple[float, ...]:
    """A request's times in :data:`TIMES`' order, from its readings."""
    arrived, started, handled, ready, writing, sent, throttle = readings
    return (started - arrived, handled - started, ready - handled, throttle, writing - ready, sent - writing,
            sent - arrived)


def _request_name(api_key: int) -> str:
    """Kafka's ``request`` tag: the API's name as its Java enum spells it (``Produce``, ``OffsetCommit``)."""
    name = api_key_map.get(api_key)
    return "".join(part.capitalize() for part in name.split("_")) if name else str(api_key)


class ApiRequests:
    """One API's counts per version and its recent requests' times (seconds).

    A request costs one tuple stored and two counts: the all-time sums of
    the times are added up a whole ring at a time, when it wraps (so once
    per :data:`SAMPLES` requests), and for the part written since at scrape.
    """

    __slots__ = ("by_version", "count", "flushed", "samples", "next")

    def __init__(self) -> None:
        self.by_version: dict[int, int] = {}
        self.count = 0
        #: The sums of the times of every request before the current ring's first.
        self.flushed = [0.0] * len(TIMES)
        self.samples: list[tuple[float, ...] | None] = [None] * SAMPLES
        self.next = 0

    def record(self, version: int, readings: Readings) -> None:
        """Count one request of ``version`` and keep its clock readings."""
        by_version = self.by_version
        by_version[version] = by_version.get(version, 0) + 1
        self.count += 1
        i = self.next
        self.samples[i] = readings
        i += 1
        if i == SAMPLES:
            self.flushed = _summed(self.flushed, self.samples)  # type: ignore[arg-type]
            i = 0
        self.next = i

    def recent(self) -> list[tuple[float, ...]]:
        """The times of the last :data:`SAMPLES` requests (fewer before there were as many)."""
        return [times_of(s) for s in self.samples if s is not None]

    def sums(self) -> list[float]:
        """Each time's sum over every request recorded."""
        return _summed(self.flushed, self.samples[:self.next])  # type: ignore[arg-type]


def _summed(sums: list[float], readings: list[Readings]) -> list[float]:
    if not readings:
        return list(sums)
    return [total + sum(column) for total, column in zip(sums, zip(*map(times_of, readings)))]


class RequestMetrics:
    """Every API's :class:`ApiRequests`, and the collector that exports them."""

    def __init__(self) -> None:
        self.apis: dict[int, ApiRequests] = {}

    def of(self, api_key: int) -> ApiRequests:
        """The API's record (kept by connections, which look it up once per request)."""
        api = self.apis.get(api_key)
        if api is None:
            api = self.apis[api_key] = ApiRequests()
        return api

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests",
                                       "Requests received (Kafka's RequestsPerSec count), by API and version.",
                                       labels=["request", "version"])
        times = {name: summary(f"kafka_network_requestmetrics_{name.lower()}",
                               f"Kafka's {name} of the last {SAMPLES} requests of each API, in milliseconds.",
                               ["request"]) for name in TIMES}
        for key, api in sorted(self.apis.items()):
            request = _request_name(key)
            for version, count in sorted(api.by_version.items()):
                requests.add_metric([request, str(version)], count)
            recent = api.recent()
            sums = api.sums()
            for i, name in enumerate(TIMES):
                add_quantiles(times[name], [request], [s[i] * 1000 for s in recent], api.count, sums[i] * 1000)
        yield requests
        yield from times.values()
