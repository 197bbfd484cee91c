"""A node's metrics, in Prometheus' text format, named as Kafka's MBeans are once a JMX exporter renamed them.

Dashboards, alerts and autoscalers written for Kafka read names such as
``kafka_server_brokertopicmetrics_messagesin_total``: what the generic rules
of the JMX exporter configuration the Kafka world uses (Strimzi's
``kafka-metrics.yaml``) make of ``kafka.server:type=BrokerTopicMetrics,
name=MessagesInPerSec,topic=t``. josef exports the same names directly:

- a meter (``...PerSec``): its ``Count`` as a counter ``kafka_<domain>_<type>_<name without PerSec>_total``;
- a gauge: ``kafka_<domain>_<type>_<name>``;
- a histogram or timer (``TotalTimeMs``): a summary, ``kafka_<domain>_<type>_<name>{quantile="0.99"}`` and
  ``..._count`` (and ``_sum``, which the JMX rules cannot give);

all lower case, the MBean's other keys as labels (``topic``, ``request``...).
The list of every metric is in ``docs/metrics.md``.

Collection is split in two so that it stays off the hot path: counters are
plain integers a handler adds to once per request or per batch (never per
record, :mod:`josef.metrics.topics`, :mod:`josef.metrics.requests`), and
everything else is read from the node's state when Prometheus scrapes
(:class:`NodeMetrics` collectors). Collectors follow prometheus-client's
custom-collector protocol (a ``collect()`` yielding metric families); any
object a plugin gives the node (log storage, metadata quorum, coordinator,
telemetry receiver) that has one is exported with the rest, and plugins may
add more through :attr:`josef.services.BrokerServices.metrics`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Protocol, Sequence

import anyio
import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric, SummaryMetricFamily
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

#: The quantiles of Kafka's histograms (Yammer's 50th...999thPercentile), as the JMX rules label them.
QUANTILES = ((0.5, "0.50"), (0.75, "0.75"), (0.95, "0.95"), (0.98, "0.98"), (0.99, "0.99"), (0.999, "0.999"))


class Collector(Protocol):
    """prometheus-client's custom collector: families built from the state it reads, when scraped."""

    def collect(self) -> Iterable[Metric]: ...


@attrs.frozen
class Table:
    """A family read as rows on the event loop and written as text in the worker thread.

    For the families with a series per partition: building prometheus-client
    samples for tens of thousands of partitions held the event loop for tens
    of ms per scrape (and the garbage collector for more), where a list of
    tuples costs a few. Each row holds the label values in ``labels``' order,
    then values; ``value`` is the index of this family's value in a row, so
    several families may share rows. Label values must need no escaping
    (topic names, numbers).
    """

    name: str
    kind: str
    documentation: str
    labels: tuple[str, ...]
    rows: Sequence[tuple[Any, ...]]
    value: int

    @property
    def samples(self) -> list[Sample]:
        """The series as prometheus-client's samples, for readers other than the scrape (which writes :meth:`text`)."""
        n = len(self.labels)
        return [Sample(self.name, dict(zip(self.labels, map(str, row[:n]))), row[self.value]) for row in self.rows]

    def text(self) -> str:
        n = len(self.labels)
        head = f"# HELP {self.name} {_help(self.documentation)}\n# TYPE {self.name} {self.kind}\n"
        series = self.name + "{" + ",".join(f'{label}="%s"' for label in self.labels) + "} %s\n"
        value = self.value
        if n == 2:  # (topic, partition): the common case, without building a tuple per row
            return head + "".join([series % (row[0], row[1], row[value]) for row in self.rows])
        return head + "".join([series % (*row[:n], row[value]) for row in self.rows])


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class NodeMetrics:
    """Every metric of one node: several nodes may share a process (tests), so each has a registry of its own."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def register(self, collector: Collector) -> None:
        """Export what ``collector`` yields at every scrape, from now on."""
        self._collectors.append(collector)

    def register_if_collector(self, plugin_object: Any) -> None:
        """Export a plugin's object (a log storage, a quorum, a coordinator...) when it has ``collect()``."""
        if callable(getattr(plugin_object, "collect", None)):
            self.register(plugin_object)

    def families(self) -> list[Metric | Table]:
        """Every collector's families, read now: on the node's event loop, where the state they read changes."""
        families: list[Metric | Table] = []
        for collector in self._collectors:
            try:
                families.extend(collector.collect())
            except Exception:  # one broken collector must not take the others' metrics away
                log.exception("metrics collector %r failed; its metrics are left out of this scrape", collector)
        return families

    async def exposition(self) -> bytes:
        """The text Prometheus scrapes: families read on the event loop, written out in a worker thread.

        Writing is the costly part (every sample formatted); reading the
        node's state is kept to building the families, so a scrape of a
        broker with many partitions does not hold the event loop for the
        whole of it.
        """
        started = time.perf_counter()
        families = self.families()
        collected = time.perf_counter()
        text = await anyio.to_thread.run_sync(_exposition, self.registry, families)
        log.debug("scrape: %d families read in %.1f ms, written in %.1f ms", len(families),
                  (collected - started) * 1000, (time.perf_counter() - collected) * 1000)
        return text


class _Families:
    """A collector that yields families already read (the registry's writer asks its collectors for them)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _exposition(registry: CollectorRegistry, families: Sequence[Metric | Table]) -> bytes:
    own = CollectorRegistry(auto_describe=False)
    tables = [f for f in families if isinstance(f, Table)]
    own.register(_Families(list(registry.collect()) + [f for f in families if not isinstance(f, Table)]))
    return generate_latest(own) + "".join(table.text() for table in tables).encode()


def summary(name: str, documentation: str, labels: Sequence[str]) -> SummaryMetricFamily:
    """A family for Kafka histograms: quantile samples, ``_count`` and ``_sum`` (see :func:`add_quantiles`)."""
    return SummaryMetricFamily(name, documentation, labels=list(labels))


def add_quantiles(family: SummaryMetricFamily, label_values: Sequence[str], values: Sequence[float], count: int,
                  total: float) -> None:
    """Add one series to ``family``: the quantiles of ``values`` (recent samples), and the all-time count and sum."""
    family.add_metric(list(label_values), count, total)
    if not values:
        return
    ordered = sorted(values)
    labels = dict(zip(family._labelnames, label_values))  # noqa: SLF001 (prometheus-client keeps them there)
    last = len(ordered) - 1
    for q, text in QUANTILES:
        family.samples.append(Sample(family.name, {**labels, "quantile": text}, ordered[min(last, int(q * len(ordered)))]))
