"""Choosing a partition for a record, exactly as the Java client does.

``murmur2`` (the default) hashes keys with Kafka's murmur2 and sends keyless
records to one partition at a time (sticky partitioning, KIP-480), switching
when a batch is sent. ``round-robin`` spreads records one by one.
Others can be registered through the ``register_partitioners`` hook.
"""

from __future__ import annotations

import random
from typing import Any

from josef.coordinator.hashing import murmur2, to_positive

class Murmur2Partitioner:
    """Keyed records: ``to_positive(murmur2(key)) % partitions``; keyless ones stick to a partition per batch."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.ignore_keys = bool((config or {}).get("partitioner.ignore.keys", False))
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, value: bytes | None, partitions: int) -> int:
        if key is not None and not self.ignore_keys:
            return to_positive(murmur2(key)) % partitions
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= partitions:
            sticky = self._sticky[topic] = random.randrange(partitions)
        return sticky

    def on_new_batch(self, topic: str, partitions: int, previous: int) -> None:
        """A batch of ``previous`` was closed: move keyless records to another partition (KIP-480)."""
        if self._sticky.get(topic) == previous and partitions > 1:
            choice = random.randrange(partitions - 1)
            self._sticky[topic] = choice if choice < previous else choice + 1


class RoundRobinPartitioner:
    """Every record to the next partition, keys ignored (Java's RoundRobinPartitioner)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._next: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, value: bytes | None, partitions: int) -> int:
        n = self._next.get(topic, 0)
        self._next[topic] = n + 1
        return n % partitions
