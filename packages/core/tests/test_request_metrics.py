"""Kafka's RequestMetrics from requests' clock readings: counts per version, times, their sums over ring wraps."""

from __future__ import annotations

import pytest

from josef.metrics.requests import SAMPLES, RequestMetrics


def readings(i: int) -> tuple[float, ...]:
    """Request i: 1 ms queued, i ms handled, 2 ms remote, 0.5 ms throttled, 0 ms response queue, 3 ms sending."""
    arrived = i * 10.0
    started = arrived + 0.001
    handled = started + i / 1000
    ready = handled + 0.002
    return (arrived, started, handled, ready, ready, ready + 0.003, 0.0005)


def samples(metrics: RequestMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in metrics.collect() for s in f.samples}


def test_counts_times_and_sums_survive_the_ring_wrapping():
    metrics = RequestMetrics()
    requests = SAMPLES * 2 + 10
    for i in range(requests):
        metrics.of(0).record(9 if i % 2 else 11, readings(i))
    got = samples(metrics)
    assert got[("kafka_network_requestmetrics_requests_total", (("request", "Produce"), ("version", "9")))] == \
        requests // 2
    assert got[("kafka_network_requestmetrics_localtimems_count", (("request", "Produce"),))] == requests
    handled_ms = sum(range(requests))  # request i took i ms in its handler
    assert got[("kafka_network_requestmetrics_localtimems_sum", (("request", "Produce"),))] == \
        pytest.approx(handled_ms, rel=1e-6)
    total_ms = sum(1 + i + 2 + 3 for i in range(requests))
    assert got[("kafka_network_requestmetrics_totaltimems_sum", (("request", "Produce"),))] == \
        pytest.approx(total_ms, rel=1e-6)
    # Quantiles are over the last SAMPLES requests: handler times from requests - SAMPLES to requests - 1 ms.
    median = got[("kafka_network_requestmetrics_localtimems", (("quantile", "0.50"), ("request", "Produce")))]
    assert median == pytest.approx(requests - SAMPLES / 2, abs=1)
    assert got[("kafka_network_requestmetrics_throttletimems", (("quantile", "0.99"), ("request", "Produce")))] == \
        pytest.approx(0.5)
