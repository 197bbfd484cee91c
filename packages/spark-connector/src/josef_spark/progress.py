"""What an exactly-once write records in the cluster, so that a later attempt or a later run knows what is written.

Both records are committed offsets of consumer groups that have no members
(the coordinator keeps them like any group's offsets, until
``offsets.retention.minutes`` after the last commit):

- A partition's progress, group ``{prefix}-{write id}-{partition}``: offset
  ``batch id + 1`` in partition 0 of the topic written, committed in the
  transaction that writes the partition's rows (see :mod:`josef_spark.writer`).
  For a batch write with a ``writeId`` its metadata describes those rows,
  ``rows=N digest=HEX``, so that a re-run can tell whether its partition holds
  the same rows: its input, or how it is partitioned, may have changed.
- A batch write's outcome, group ``{prefix}-{write id}-write``: offset = the
  number of Spark partitions the write had, metadata ``complete`` or
  ``failed``, committed by the driver when the job ends (``commit()`` or
  ``abort()``). A re-run reads it when it is planned: a complete write is not
  written again, and a failed one must be re-run with as many partitions.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import attrs

from josef_client import Admin, Consumer, OffsetAndMetadata, TopicPartition

#: The suffix of a batch write's outcome group; partition progress groups end in the partition's number instead.
OUTCOME_SUFFIX = "write"
COMPLETE, FAILED = "complete", "failed"
#: The digest adds up one hash of this many bytes per row, modulo 2 to this many bits: the order of rows is left out.
HASH_BYTES = 16
HASH_MODULUS = 1 << (8 * HASH_BYTES)


class RowDigest:
    """The row count and an order-independent digest of a partition's rows.

    Spark gives a partition the same rows on every run of a deterministic
    input, but a shuffle may give them in another order; so the digest is the
    sum of one hash per row, which any order adds up to.
    """

    def __init__(self) -> None:
        self.rows = 0
        self._sum = 0

    def add(self, row: tuple[Any, ...]) -> None:
        """Count a row: ``(topic, value, key, partition, headers)`` of str, bytes, int, None and lists of pairs."""
        self.rows += 1
        digest = hashlib.blake2b(repr(row).encode(), digest_size=HASH_BYTES).digest()
        self._sum = (self._sum + int.from_bytes(digest, "big")) % HASH_MODULUS

    @property
    def metadata(self) -> str:
        """How a partition's progress record describes its rows."""
        return f"rows={self.rows} digest={self._sum:0{2 * HASH_BYTES}x}"


@attrs.frozen
class Outcome:
    """How an earlier run of a batch write ended: with this many Spark partitions, complete or failed."""

    partitions: int
    complete: bool


def outcome_group(prefix: str, write_id: str) -> str:
    return f"{prefix}-{write_id}-{OUTCOME_SUFFIX}"


def read_outcome(admin_config: Mapping[str, Any], prefix: str, write_id: str) -> Outcome | None:
    """The outcome an earlier run recorded, None if no run ended (none ran, or its driver was killed)."""
    with Admin(dict(admin_config)) as admin:
        committed = admin.list_consumer_group_offsets(outcome_group(prefix, write_id))
    for offset in committed.values():
        return Outcome(offset.offset, offset.metadata == COMPLETE)
    return None


def record_outcome(admin_config: Mapping[str, Any], prefix: str, write_id: str, topic: str, outcome: Outcome) -> None:
    """Commit the outcome, in partition 0 of ``topic`` (a topic the write wrote to, so one that exists)."""
    group = outcome_group(prefix, write_id)
    with Consumer({**admin_config, "group.id": group, "enable.auto.commit": False}) as consumer:
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(outcome.partitions,
                                                                    COMPLETE if outcome.complete else FAILED)})
