"""Throughput per topic over the last minutes: the sum of its partitions' end offsets, sampled every few seconds.

Records produced to a topic between two samples are the difference of the
sums of its partitions' high watermarks, so one ListOffsets request per
partition leader every ``console.throughput.sample.ms`` gives every topic's
rate, whichever broker the records went to and whoever consumed them. Each
topic keeps a bounded ring of (time, sum) samples covering
``console.throughput.window.ms``; memory is one small deque per topic.

The sampler runs as the broker's background work (``services.spawn``) and
awaits its requests: it never blocks the event loop, and a failed sample is
skipped, not fatal (an exception in spawned work would stop the broker).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

import anyio

log = logging.getLogger(__name__)


class Throughput:
    """Rings of (monotonic time, sum of end offsets) per topic, and the rates between consecutive samples."""

    def __init__(self, window_s: float = 300.0, interval_s: float = 5.0) -> None:
        self.window_s = window_s
        #: Samples kept per topic: enough for the window at the sampling interval, plus the one before it.
        self.capacity = max(2, int(window_s / interval_s) + 2)
        self.rings: dict[str, deque[tuple[float, int]]] = {}

    def record(self, at: float, totals: Mapping[str, int | None], existing: set[str] | None = None) -> None:
        """Add one sample: ``totals`` maps a topic to the sum of its end offsets (None: not all partitions answered,
        so this sample skips it). Topics not in ``existing`` (deleted ones) are forgotten."""
        if existing is not None:
            for gone in set(self.rings) - existing:
                del self.rings[gone]
        for topic, total in totals.items():
            if total is None:
                continue
            ring = self.rings.get(topic)
            if ring is None:
                ring = self.rings[topic] = deque(maxlen=self.capacity)
            elif ring and total < ring[-1][1]:
                ring.clear()  # the topic was deleted and created again between samples: its offsets started over
            ring.append((at, total))
            while len(ring) > 2 and at - ring[1][0] > self.window_s:
                ring.popleft()

    def rates(self, topic: str) -> list[float]:
        """Records per second between each pair of consecutive samples, oldest first."""
        ring = list(self.rings.get(topic, ()))
        return [max(0, b - a) / (tb - ta) for (ta, a), (tb, b) in zip(ring, ring[1:]) if tb > ta]

    def rate(self, topic: str) -> float | None:
        """The latest rate (None: fewer than two samples yet)."""
        rates = self.rates(topic)
        return rates[-1] if rates else None

    def total(self, topic: str) -> int | None:
        """The latest sum of end offsets (the records the topic ever had, as far as its offsets tell)."""
        ring = self.rings.get(topic)
        return ring[-1][1] if ring else None


async def run_sampler(throughput: Throughput, sample: Callable[[], Awaitable[tuple[Mapping[str, int | None], set[str]]]],
                      interval_s: Callable[[], float]) -> None:
    """Sample forever: ``sample()`` gives the topics' sums and the topics that exist; ``interval_s()`` is read each
    time so a dynamic change applies. Errors are logged and the sample skipped."""
    while True:
        started = time.monotonic()
        try:
            totals, existing = await sample()
        except Exception as exc:  # noqa: BLE001 - a sample that fails is skipped; an exception here would stop the broker
            log.debug("throughput sample failed: %s", exc)
        else:
            throughput.record(time.monotonic(), totals, existing)
        await anyio.sleep(max(0.5, interval_s() - (time.monotonic() - started)))
