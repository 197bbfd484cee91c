"""Kafka's hashes, where the same key must land where a Kafka cluster or client would put it: which internal
partition owns a group id or transactional id (Java's ``String.hashCode``), which partition a keyed record goes
to and which ``__remote_log_metadata`` partition a tiered partition's records go to (Kafka's murmur2)."""

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


_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(value: int) -> int:
    return value & 0x7FFFFFFF
