"""Idempotent-producer state of one partition: per producer id, its epoch and its last five batches.

This is what makes ``enable.idempotence=true`` work without the transaction
plugin. A producer numbers its batches per partition (``baseSequence`` in the
batch header, ``lastOffsetDelta`` gives the last sequence) and may have up to
five requests in flight, so the leader remembers the sequence ranges and
offsets of the last five batches of each producer. Everything here runs once
per batch, on the fields of the 61-byte header; records are never looked at.

The rules are Kafka's (``ProducerStateManager``/``ProducerAppendInfo`` and
``UnifiedLog.analyzeAndValidateProducerState``), checked on the leader for
each batch with ``producerId >= 0``, in this order:

* **duplicate**: same epoch and exactly the first and last sequence of one of
  the five cached batches. The request is not appended; the client is answered
  NONE with the original batch's offsets, as Kafka does (a retry after a lost
  acknowledgement must look like the first answer). Like Kafka, duplicates are
  looked for in the state before the request.
* **fenced**: an epoch older than the producer's current one is
  INVALID_PRODUCER_EPOCH (Kafka 2.7+ answers this instead of PRODUCER_FENCED
  for produce requests).
* **new epoch**: a newer epoch (the client bumped it after an error, KIP-360)
  must start again at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER.
* **gap**: within an epoch the first sequence must follow the last one
  (``last + 1``, wrapping from Int.MAX to 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.
* **unknown producer**: accepted whatever its sequence. Kafka 2.5+ (KIP-360)
  no longer answers UNKNOWN_PRODUCER_ID to idempotent producers: their state
  may have been lost through retention or DeleteRecords, and refusing them
  would only make them fail. The first batch then starts the producer's state.

State changes only through :meth:`ProducerStateManager.commit`, which the
partition calls after the log accepted the batches, and
:meth:`ProducerStateManager.replay`, which rebuilds state from batches already
in the log (a snapshot's tail after a restart), without any check.

Entries are immutable, so a snapshot is a tuple of the current entries and
stays consistent while appends go on.

Not yet: transaction markers (control batches) are skipped, since they arrive
with the transaction plugin; producers are never expired
(``producer.id.expiration.ms``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.records import SEQUENCE_WRAP, ProducerBatch

#: Batches remembered per producer: the most a producer has in flight (max.in.flight.requests.per.connection).
MAX_CACHED_BATCHES = 5
NO_EPOCH = -1
NO_SEQUENCE = -1


@attrs.frozen
class BatchMetadata:
    """Sequence range and offsets of one appended batch of a producer."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@attrs.frozen
class ProducerEntry:
    """One producer's state in one partition: its epoch and its last batches, oldest first."""

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...] = ()
    #: The epoch of the transaction coordinator that wrote this producer's last marker (fences older coordinators).
    coordinator_epoch: int = -1
    #: First offset of the producer's open transaction in this partition; -1 when none is open.
    current_txn_first_offset: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range, if any (Kafka's ``findDuplicateBatch``)."""
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def with_batch(self, epoch: int, batch: BatchMetadata) -> ProducerEntry:
        """The entry after appending ``batch`` under ``epoch``: a new epoch forgets the old epoch's batches."""
        kept = self.batches if epoch == self.epoch else ()
        return ProducerEntry(self.producer_id, epoch, (kept + (batch,))[-MAX_CACHED_BATCHES:])


@attrs.frozen
class ProducerSnapshot:
    """The producer state as of ``offset`` (every batch below it applied), as stored beside the segments."""

    offset: int
    producers: tuple[ProducerEntry, ...]


class ProducerStateError(Exception):
    """A batch breaks the idempotence rules; ``code`` is what the producer is answered."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class AppendPlan:
    """The outcome of validating one produce buffer: entries to commit after the append, or a duplicate."""

    updates: Mapping[int, ProducerEntry] = attrs.field(factory=dict)
    #: Set when the buffer repeats a cached batch: nothing is appended, the client gets these offsets.
    duplicate: BatchMetadata | None = None


def _metadata(batch: ProducerBatch) -> BatchMetadata:
    return BatchMetadata(batch.base_sequence, batch.last_sequence, batch.first_offset, batch.last_offset,
                         batch.max_timestamp)


def _check(entry: ProducerEntry | None, batch: ProducerBatch) -> None:
    """Kafka's ``checkProducerEpoch`` and ``checkSequence`` for a client's batch; raises :class:`ProducerStateError`."""
    if entry is None or entry.epoch == NO_EPOCH:
        return  # unknown producer (never seen, or its state was lost): any sequence starts it
    pid, epoch, first_seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
    if epoch < entry.epoch:
        raise ProducerStateError(ErrorCode.invalid_producer_epoch,
                                 f"producer {pid} has epoch {epoch}, older than its current epoch {entry.epoch}")
    if epoch != entry.epoch:
        if first_seq != 0:
            raise ProducerStateError(ErrorCode.out_of_order_sequence_number,
                                     f"producer {pid} starts new epoch {epoch} at sequence {first_seq}, not 0")
        return
    expected = (entry.last_seq + 1) % SEQUENCE_WRAP
    if first_seq != expected:
        raise ProducerStateError(ErrorCode.out_of_order_sequence_number,
                                 f"producer {pid} epoch {epoch} sent sequence {first_seq}, expected {expected}")


class ProducerStateManager:
    """The producer entries of one partition, by producer id."""

    def __init__(self, producers: Iterable[ProducerEntry] = ()) -> None:
        self._producers: dict[int, ProducerEntry] = {p.producer_id: p for p in producers}

    @property
    def producers(self) -> Mapping[int, ProducerEntry]:
        return self._producers

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def validate(self, batches: Sequence[ProducerBatch]) -> AppendPlan:
        """Check the producer batches of one produce buffer (all or nothing); changes no state.

        Batches of the same producer in one buffer are checked against each
        other too, as Kafka does. Returns what :meth:`commit` applies, or the
        duplicate to answer with. Raises :class:`ProducerStateError`.
        """
        updates: dict[int, ProducerEntry] = {}
        for batch in batches:
            pid = batch.producer_id
            current = self._producers.get(pid)
            if current is not None:
                duplicate = current.find_duplicate(batch.producer_epoch, batch.base_sequence, batch.last_sequence)
                if duplicate is not None:
                    return AppendPlan(duplicate=duplicate)
            entry = updates.get(pid, current)
            _check(entry, batch)
            updates[pid] = (entry or ProducerEntry(pid, NO_EPOCH)).with_batch(batch.producer_epoch, _metadata(batch))
        return AppendPlan(updates)

    def commit(self, plan: AppendPlan) -> None:
        """Apply a validated buffer's entries, once the log holds its batches."""
        self._producers.update(plan.updates)

    def replay(self, batch: ProducerBatch) -> None:
        """Apply a batch that is already in the log, unchecked (rebuilding state after a snapshot)."""
        entry = self._producers.get(batch.producer_id) or ProducerEntry(batch.producer_id, NO_EPOCH)
        self._producers[batch.producer_id] = entry.with_batch(batch.producer_epoch, _metadata(batch))

    def snapshot(self) -> tuple[ProducerEntry, ...]:
        """Every entry, for a snapshot file: immutable, so later appends do not change it."""
        return tuple(self._producers.values())
