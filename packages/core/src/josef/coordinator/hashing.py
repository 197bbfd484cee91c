"""Which internal partition owns a group id or transactional id: the one a Kafka cluster would pick."""

from __future__ import annotations


def java_string_hashcode(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, with int32 overflow."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, partitions: int) -> int:
    """``abs(hashCode) % partitions``, with ``abs(Integer.MIN_VALUE)`` taken as 0 as Kafka's ``Utils.abs`` does."""
    h = java_string_hashcode(key)
    return (0 if h == -(2**31) else abs(h)) % partitions
