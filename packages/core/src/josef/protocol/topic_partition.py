"""A partition of a topic: the unit the broker stores and the client reads and writes."""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A named tuple, not an attrs class: every fetch and produce makes one per partition it names and looks
    it up, and a tuple is built, hashed and compared in C."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        """The inverse of ``str()``, as used in directory names (``orders-3``)."""
        topic, sep, partition = text.rpartition("-")
        if not sep or not topic or not partition.isdigit():
            raise ValueError(f"{text!r} is not TOPIC-PARTITION")
        return cls(topic, int(partition))
