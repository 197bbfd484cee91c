"""The cleaner's key-to-latest-offset map of a log's dirty section, bounded as Kafka's ``SkimpyOffsetMap`` is."""

from __future__ import annotations

#: Bytes Kafka's map spends per slot: a 16-byte MD5 of the key and an 8-byte offset.
ENTRY_BYTES = 24


def capacity(memory_bytes: int, load_factor: float) -> int:
    """How many keys a map of ``memory_bytes`` holds before it counts as full (Kafka's ``maxDesiredMapSize``)."""
    return max(1, int(memory_bytes // ENTRY_BYTES * load_factor))


class OffsetMap:
    """The latest offset of each key seen, up to :attr:`capacity` keys.

    Keys are the record keys themselves in a dict rather than MD5 hashes in
    a probing table: exact, and far faster in Python; the capacity is what
    ``log.cleaner.dedupe.buffer.size`` buys in Kafka, so the cleaner covers
    the same share of a dirty log per pass.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.offsets: dict[bytes, int] = {}
        #: The largest offset put; -1 when empty.
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self.offsets)

    def room(self) -> int:
        return self.capacity - len(self.offsets)

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``; -1 when it is not in the map."""
        return self.offsets.get(key, -1)
