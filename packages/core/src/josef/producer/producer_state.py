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

Transactions (Kafka's ``ProducerAppendInfo.append``/``appendEndTxnMarker``):

* a transactional batch opens the producer's transaction in this partition
  at its first offset, unless one is open; a plain batch while one is open
  is INVALID_TXN_STATE;
* a marker (control batch) written by the transaction coordinator ends it.
  A marker from an older coordinator epoch is TRANSACTION_COORDINATOR_FENCED,
  one with an older producer epoch INVALID_PRODUCER_EPOCH. The marker's epoch
  becomes the producer's (Transactions V2 bumps it in every marker).
* the open transactions' first offsets, plus transactions completed by a
  marker the high watermark has not passed yet, give the *first unstable
  offset*: the partition's last stable offset (LSO) is the smaller of it and
  the high watermark. ``read_committed`` consumers read only below the LSO.
* a coordinator (TxnOffsetCommit) writes transactional batches without
  sequence numbers that mean anything (Kafka's ``AppendOrigin.COORDINATOR``):
  their sequences are not checked.

Expiry (Kafka's ``removeExpiredProducers``): a producer that wrote nothing
for ``producer.id.expiration.ms`` (by the timestamp of its last batch or
marker, as Kafka's ``lastTimestamp``) and has no open transaction is
forgotten, so the state of a partition that many short-lived idempotent
producers wrote to stays bounded. The broker scans for them every
``producer.id.expiration.check.interval.ms``
(:meth:`ProducerStateManager.remove_expired`), never per batch; the next
snapshot no longer holds them, and a snapshot read after a restart loses
the ones that expired meanwhile at the first scan. A forgotten producer
that writes again is an unknown producer: accepted, as above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.records import ABORT_MARKER, SEQUENCE_WRAP, ProducerBatch

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
    #: The timestamp of its last batch or marker (Kafka's ``lastTimestamp``); expiry counts from it.
    last_timestamp: int = -1

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

    def with_batch(self, epoch: int, batch: BatchMetadata, transactional: bool = False) -> ProducerEntry:
        """The entry after appending ``batch`` under ``epoch``: a new epoch forgets the old epoch's batches."""
        kept = self.batches if epoch == self.epoch else ()
        first = self.current_txn_first_offset
        if transactional and first < 0:
            first = batch.first_offset
        return attrs.evolve(self, epoch=epoch, batches=(kept + (batch,))[-MAX_CACHED_BATCHES:],
                            current_txn_first_offset=first, last_timestamp=batch.max_timestamp)

    def with_marker(self, epoch: int, coordinator_epoch: int, timestamp: int) -> ProducerEntry:
        """The entry after a transaction marker: no open transaction, the marker's epochs and timestamp."""
        return attrs.evolve(self, epoch=epoch, batches=self.batches if epoch == self.epoch else (),
                            coordinator_epoch=coordinator_epoch, current_txn_first_offset=-1,
                            last_timestamp=timestamp)

    def expired(self, now_ms: int, expiration_ms: int) -> bool:
        """Kafka's ``isProducerExpired``: silent for ``expiration_ms`` and no transaction open."""
        return self.current_txn_first_offset < 0 and now_ms - self.last_timestamp >= expiration_ms


@attrs.frozen
class CompletedTxn:
    """A transaction a marker ended in this partition: from the producer's first offset in it to the marker."""

    producer_id: int
    first_offset: int
    #: The marker's offset.
    last_offset: int
    aborted: bool


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
    #: Transactions the buffer's markers end.
    completed: tuple[CompletedTxn, ...] = ()


def _metadata(batch: ProducerBatch) -> BatchMetadata:
    return BatchMetadata(batch.base_sequence, batch.last_sequence, batch.first_offset, batch.last_offset,
                         batch.max_timestamp)


def _check(entry: ProducerEntry | None, batch: ProducerBatch, check_sequence: bool) -> None:
    """Kafka's ``checkProducerEpoch``, ``checkSequence`` and transaction checks; raises :class:`ProducerStateError`."""
    if entry is None or entry.epoch == NO_EPOCH:
        return  # unknown producer (never seen, or its state was lost): any sequence starts it
    pid, epoch, first_seq = batch.producer_id, batch.producer_epoch, batch.base_sequence
    if batch.marker >= 0:
        if batch.coordinator_epoch < entry.coordinator_epoch:
            raise ProducerStateError(ErrorCode.transaction_coordinator_fenced,
                                     f"marker for producer {pid} from coordinator epoch {batch.coordinator_epoch}, "
                                     f"older than {entry.coordinator_epoch}")
    if epoch < entry.epoch:
        raise ProducerStateError(ErrorCode.invalid_producer_epoch,
                                 f"producer {pid} has epoch {epoch}, older than its current epoch {entry.epoch}")
    if batch.marker >= 0:
        return
    if not batch.transactional and entry.current_txn_first_offset >= 0:
        raise ProducerStateError(ErrorCode.invalid_txn_state,
                                 f"producer {pid} wrote a non-transactional batch inside its open transaction")
    if not check_sequence:
        return
    if epoch != entry.epoch:
        if first_seq != 0:
            raise ProducerStateError(ErrorCode.out_of_order_sequence_number,
                                     f"producer {pid} starts new epoch {epoch} at sequence {first_seq}, not 0")
        return
    expected = (entry.last_seq + 1) % SEQUENCE_WRAP
    if first_seq != expected:
        raise ProducerStateError(ErrorCode.out_of_order_sequence_number,
                                 f"producer {pid} epoch {epoch} sent sequence {first_seq}, expected {expected}")


def _apply(entry: ProducerEntry | None, batch: ProducerBatch) -> tuple[ProducerEntry, CompletedTxn | None]:
    """The entry after ``batch`` (checked already, or replayed from the log), and the transaction a marker ends."""
    entry = entry or ProducerEntry(batch.producer_id, NO_EPOCH)
    if batch.marker < 0:
        return entry.with_batch(batch.producer_epoch, _metadata(batch), batch.transactional), None
    first = entry.current_txn_first_offset
    completed = CompletedTxn(batch.producer_id, first if first >= 0 else batch.first_offset, batch.first_offset,
                             batch.marker == ABORT_MARKER)
    return entry.with_marker(batch.producer_epoch, batch.coordinator_epoch, batch.max_timestamp), completed


class ProducerStateManager:
    """The producer entries of one partition, by producer id, and its open transactions."""

    def __init__(self, producers: Iterable[ProducerEntry] = ()) -> None:
        self._producers: dict[int, ProducerEntry] = {p.producer_id: p for p in producers}
        #: First offset of each producer's open transaction.
        self._ongoing: dict[int, int] = {p.producer_id: p.current_txn_first_offset
                                         for p in self._producers.values() if p.current_txn_first_offset >= 0}
        #: Transactions ended by a marker the high watermark has not passed: still unstable.
        self._unreplicated: list[CompletedTxn] = []

    @property
    def producers(self) -> Mapping[int, ProducerEntry]:
        return self._producers

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def validate(self, batches: Sequence[ProducerBatch], check_sequence: bool = True) -> AppendPlan:
        """Check the producer batches of one produce buffer (all or nothing); changes no state.

        Batches of the same producer in one buffer are checked against each
        other too, as Kafka does. Returns what :meth:`commit` applies, or the
        duplicate to answer with. ``check_sequence`` is False for a
        coordinator's own writes. Raises :class:`ProducerStateError`.
        """
        updates: dict[int, ProducerEntry] = {}
        completed = []
        for batch in batches:
            pid = batch.producer_id
            current = self._producers.get(pid)
            if current is not None and batch.marker < 0 and check_sequence:
                duplicate = current.find_duplicate(batch.producer_epoch, batch.base_sequence, batch.last_sequence)
                if duplicate is not None:
                    return AppendPlan(duplicate=duplicate)
            entry = updates.get(pid, current)
            _check(entry, batch, check_sequence)
            updates[pid], txn = _apply(entry, batch)
            if txn is not None:
                completed.append(txn)
        return AppendPlan(updates, completed=tuple(completed))

    def commit(self, plan: AppendPlan) -> None:
        """Apply a validated buffer's entries, once the log holds its batches."""
        self._producers.update(plan.updates)
        for pid, entry in plan.updates.items():
            self._track(pid, entry)
        self._unreplicated.extend(plan.completed)

    def replay(self, batch: ProducerBatch) -> CompletedTxn | None:
        """Apply a batch that is already in the log, unchecked (a follower's fetch, rebuilding state after a snapshot).

        Returns the transaction a marker ends, so the caller can index it when aborted.
        """
        entry, completed = _apply(self._producers.get(batch.producer_id), batch)
        self._producers[batch.producer_id] = entry
        self._track(batch.producer_id, entry)
        if completed is not None:
            self._unreplicated.append(completed)
        return completed

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget the producers that :meth:`ProducerEntry.expired` says are; their ids, for the log.

        The map is replaced rather than changed in place, so a snapshot
        being taken meanwhile (a segment roll in a worker thread) copies a
        whole map, as it would copy an earlier or a later one.
        """
        expired = [pid for pid, entry in self._producers.items() if entry.expired(now_ms, expiration_ms)]
        if expired:
            gone = set(expired)
            self._producers = {pid: entry for pid, entry in self._producers.items() if pid not in gone}
        return expired

    def _track(self, pid: int, entry: ProducerEntry) -> None:
        if entry.current_txn_first_offset >= 0:
            self._ongoing[pid] = entry.current_txn_first_offset
        else:
            self._ongoing.pop(pid, None)

    def first_unstable_offset(self, high_watermark: int, *, prune: bool = True) -> int | None:
        """The first offset of an open transaction, or of one whose marker is not below ``high_watermark`` yet.

        None when every transaction is decided and replicated: the last
        stable offset is then the high watermark. ``prune=False`` reads
        without forgetting the replicated transactions, from another thread
        than the event loop's (the log cleaner's): it only copies.
        """
        if prune:  # the event loop's own call (every fetch's LSO): nothing copied when nothing is open
            if not self._unreplicated and not self._ongoing:
                return None
            if self._unreplicated:
                self._unreplicated = [t for t in self._unreplicated if t.last_offset >= high_watermark]
            unreplicated, ongoing = self._unreplicated, self._ongoing.values()
        else:
            unreplicated = [t for t in list(self._unreplicated) if t.last_offset >= high_watermark]
            ongoing = list(self._ongoing.values())
        firsts = [t.first_offset for t in unreplicated]
        if ongoing:
            firsts.append(min(ongoing))
        return min(firsts) if firsts else None

    def last_stable_offset_after(self, txn: CompletedTxn) -> int:
        """Kafka's ``lastStableOffset(completedTxn)``: stored with an aborted transaction in the index."""
        others = [first for pid, first in self._ongoing.items() if pid != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    @property
    def ongoing(self) -> Mapping[int, int]:
        """First offset of each producer's open transaction (DescribeProducers' currentTxnStartOffset)."""
        return self._ongoing

    def snapshot(self) -> tuple[ProducerEntry, ...]:
        """Every entry, for a snapshot file: immutable, so later appends do not change it."""
        return tuple(self._producers.values())
