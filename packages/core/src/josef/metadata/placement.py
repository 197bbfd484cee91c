"""Controller decisions as pure functions, shared by every metadata backend."""

from __future__ import annotations

import random
from typing import Sequence


def assign_replicas(
    brokers: Sequence[int],
    num_partitions: int,
    replication_factor: int,
    *,
    first_partition: int = 0,
    start_index: int | None = None,
    shift: int | None = None,
) -> list[list[int]]:
    """Kafka's rack-unaware replica placement.

    Leaders go round-robin over the brokers from a random start; followers
    follow the leader at a shift that grows each time the brokers wrap, so
    leadership and replicas spread evenly.
    """
    if replication_factor > len(brokers):
        raise ValueError(f"replication factor {replication_factor} is larger than the {len(brokers)} available brokers")
    ordered = sorted(brokers)
    n = len(ordered)
    start = random.randrange(n) if start_index is None else start_index
    next_shift = random.randrange(n) if shift is None else shift
    result = []
    for p in range(first_partition, first_partition + num_partitions):
        if p > 0 and p % n == 0:
            next_shift += 1
        first = (p + start) % n
        replicas = [ordered[first]]
        for j in range(replication_factor - 1):
            replicas.append(ordered[(first + 1 + (next_shift + j) % (n - 1)) % n])
        result.append(replicas)
    return result

