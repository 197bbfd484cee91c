"""One share partition's in-flight window on its partition leader (Kafka's SharePartition), without I/O.

A share group reads a partition through a window of offsets: below the
share-partition start offset (SPSO) every record is done with; from it to the
end offset (SPEO, the next offset never fetched) each record is AVAILABLE
(fetched, free to deliver), ACQUIRED (delivered to one member, locked until
``record.lock.duration.ms`` passes or it acknowledges), ACKNOWLEDGED or
ARCHIVED (done: rejected, or delivered ``group.share.delivery.count.limit``
times). Acknowledged and archived records at the start let the window move on.

The window is kept as ranges of offsets that share a state, a delivery count
and (when acquired) a member and lock deadline: whole record batches as
fetched, split only where members acknowledge parts of them differently. No
record is looked at: batch headers say which offsets a fetch holds, which are
control records (never delivered) and which belong to aborted transactions
(archived at once for ``read_committed`` groups).

The class is a pure state machine: the caller (:mod:`josef_coordinator_share.partitions`)
reads the log, persists what :meth:`SharePartition.acknowledge` and the lock
expiry change through the share coordinator, and rolls back with
:meth:`SharePartition.snapshot` / :meth:`SharePartition.restore` when that fails.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef_coordinator_share.state import ACKNOWLEDGED, ARCHIVED, AVAILABLE, StateBatch

ACQUIRED = 1
#: Acknowledge types of ShareFetch/ShareAcknowledge: GAP (no record at that offset), ACCEPT, RELEASE, REJECT, and
#: RENEW (v2: keep the lock).
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
ACKNOWLEDGE_TYPES = frozenset((GAP, ACCEPT, RELEASE, REJECT, RENEW))
_DONE = (ACKNOWLEDGED, ARCHIVED)


class ShareError(Exception):
    """A request about a share partition refused with a Kafka error code; nothing was changed."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@attrs.frozen
class Span:
    """Offsets ``first``..``last`` in one state."""

    first: int
    last: int
    state: int
    delivery_count: int = 0
    member_id: str | None = None
    #: When the acquisition lock expires (monotonic milliseconds of the caller's clock).
    deadline: int = 0

    def persisted(self) -> StateBatch:
        """The span as the share coordinator keeps it: a lock is not kept, an acquired record is AVAILABLE."""
        return StateBatch(self.first, self.last, AVAILABLE if self.state == ACQUIRED else self.state,
                          self.delivery_count)


@attrs.frozen
class Acquired:
    """Offsets handed to a member by one ShareFetch, as its AcquiredRecords entry."""

    first: int
    last: int
    delivery_count: int


@attrs.frozen
class BatchInfo:
    """What a fetch's batch header says: its offsets, producer, and whether it is transactional or control."""

    base_offset: int
    last_offset: int
    producer_id: int = -1
    transactional: bool = False
    control: bool = False


@attrs.frozen
class Snapshot:
    start: int
    end: int
    spans: tuple[Span, ...]


class SharePartition:
    """The window of one (group, topic partition) on its leader."""

    def __init__(self, start_offset: int, batches: Iterable[StateBatch] = (), *, delivery_count_limit: int = 5,
                 max_in_flight: int = 2000, read_committed: bool = False) -> None:
        self.start = start_offset
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight
        self.read_committed = read_committed
        spans = [Span(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                 for b in sorted(batches, key=lambda b: b.first_offset) if b.last_offset >= start_offset]
        self.spans: list[Span] = []
        self.end = start_offset
        for span in spans:  # offsets between persisted batches were never delivered: AVAILABLE, count 0
            first = max(span.first, self.end)
            if first > self.end:
                self.spans.append(Span(self.end, first - 1, AVAILABLE))
            self.spans.append(attrs.evolve(span, first=first))
            self.end = span.last + 1
        self._advance()

    # Reading the window ---------------------------------------------------------------------------------

    def next_fetch_offset(self) -> int:
        """Where the next read starts: the first AVAILABLE offset, else the end offset."""
        for span in self.spans:
            if span.state == AVAILABLE:
                return span.first
        return self.end

    def in_flight(self) -> int:
        return self.end - self.start

    def can_acquire(self) -> bool:
        """Whether a fetch may acquire anything: available records in the window, or room for new ones."""
        return any(s.state == AVAILABLE for s in self.spans) or self.in_flight() < self.max_in_flight

    def state_batches(self) -> tuple[StateBatch, ...]:
        return tuple(s.persisted() for s in self.spans)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.start, self.end, tuple(self.spans))

    def restore(self, snapshot: Snapshot) -> None:
        self.start, self.end, self.spans = snapshot.start, snapshot.end, list(snapshot.spans)

    # Acquiring ------------------------------------------------------------------------------------------

    def acquire(self, member_id: str, batches: Sequence[BatchInfo], aborted: Iterable[tuple[int, int]],
                max_records: int, deadline: int, *, strict: bool = False) -> list[Acquired]:
        """Acquire for ``member_id`` what the read ``batches`` hold: AVAILABLE records of the window first, then
        whole new batches past the end offset, up to ``max_records`` and the in-flight limit. A batch is not
        split (ShareFetch's batch-optimized acquire mode) unless ``strict`` (record-limit mode, v2).
        ``aborted``: ``(producer id, first offset)`` of transactions aborted among them."""
        if not batches:
            return []
        skip = self._skipped(batches, aborted)
        acquired: list[Acquired] = []
        budget = max_records
        read_end = batches[-1].last_offset
        # Records the window holds and nobody has: again, with one more delivery.
        for span in list(self.spans):
            if budget <= 0 or span.first > read_end:
                break
            if span.state != AVAILABLE:
                continue
            last = min(span.last, read_end, span.first + budget - 1)
            taken = Span(span.first, last, ACQUIRED, span.delivery_count + 1, member_id, deadline)
            self._replace(span.first, span.last, [taken] + ([attrs.evolve(span, first=last + 1)]
                                                           if last < span.last else []))
            acquired.append(Acquired(taken.first, taken.last, taken.delivery_count))
            budget -= last - span.first + 1
        # New batches, whole, while the window has room.
        for batch in batches:
            if batch.last_offset < self.end:
                continue
            if budget <= 0 or self.in_flight() >= self.max_in_flight:
                break
            first = max(batch.base_offset, self.end)
            if first > self.end:  # offsets the log no longer has (compaction, a deleted segment): done with
                self.spans.append(Span(self.end, first - 1, ARCHIVED))
            last = batch.last_offset
            if batch.base_offset in skip:
                self.spans.append(Span(first, last, ARCHIVED))
            else:
                if strict:
                    last = min(last, first + budget - 1)
                self.spans.append(Span(first, last, ACQUIRED, 1, member_id, deadline))
                acquired.append(Acquired(first, last, 1))
                budget -= last - first + 1
            self.end = last + 1
        self._advance()
        return _joined(acquired)

    def _skipped(self, batches: Sequence[BatchInfo], aborted: Iterable[tuple[int, int]]) -> set[int]:
        """Base offsets of batches never delivered: control batches, and (read_committed) aborted data."""
        skip = {b.base_offset for b in batches if b.control}
        if not self.read_committed:
            return skip
        pending = sorted(aborted, key=lambda a: a[1])
        open_aborted: set[int] = set()
        for batch in batches:  # Kafka's consumer logic, per batch header
            while pending and pending[0][1] <= batch.last_offset:
                open_aborted.add(pending.pop(0)[0])
            if batch.control:
                open_aborted.discard(batch.producer_id)  # the abort (or commit) marker ends it
            elif batch.transactional and batch.producer_id in open_aborted:
                skip.add(batch.base_offset)
        return skip

    # Acknowledging and releasing ------------------------------------------------------------------------

    def acknowledge(self, member_id: str, acknowledgements: Sequence[tuple[int, int, Sequence[int]]],
                    deadline: int, tally: list[int] | None = None) -> list[Span]:
        """Apply a member's acknowledgements, ``(first, last, types)`` with one type for the range or one per
        offset; the spans changed (what to persist). Raises :class:`ShareError` (INVALID_RECORD_STATE for
        offsets this member does not hold, INVALID_REQUEST for malformed batches) before changing anything.
        ``tally``, indexed by acknowledge type, is added the records acknowledged with each (once per range)."""
        plans: list[tuple[int, int, int]] = []
        for first, last, types in acknowledgements:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                raise ShareError(ErrorCode.invalid_request, f"acknowledgement batch {first}-{last} is malformed")
            if any(t not in ACKNOWLEDGE_TYPES for t in types):
                raise ShareError(ErrorCode.invalid_request, f"unknown acknowledge type in {list(types)}")
            if len(types) == 1:
                plans.append((first, last, types[0]))
            else:
                offset = first
                for t, run in _runs(types):
                    plans.append((offset, offset + run - 1, t))
                    offset += run
        for first, last, _ in plans:
            if first < self.start or last >= self.end:
                raise ShareError(ErrorCode.invalid_record_state,
                                 f"offsets {first}-{last} are outside the in-flight window {self.start}-{self.end - 1}")
            for span in self._overlapping(first, last):
                if span.state != ACQUIRED or span.member_id != member_id:
                    raise ShareError(ErrorCode.invalid_record_state,
                                     f"offsets {max(first, span.first)}-{min(last, span.last)} are not acquired by "
                                     f"member {member_id}")
        changed: list[Span] = []
        for first, last, ack in plans:
            changed += self._transition(first, last, lambda s, ack=ack: self._acknowledged(s, ack, deadline))
            if tally is not None:
                tally[ack] += last - first + 1
        self._advance()
        return changed

    def _acknowledged(self, span: Span, ack: int, deadline: int) -> Span:
        if ack == RENEW:
            return attrs.evolve(span, deadline=deadline)
        if ack == RELEASE:
            return self._released(span)
        return Span(span.first, span.last, ACKNOWLEDGED if ack == ACCEPT else ARCHIVED, span.delivery_count)

    def _released(self, span: Span) -> Span:
        state = ARCHIVED if span.delivery_count >= self.delivery_count_limit else AVAILABLE
        return Span(span.first, span.last, state, span.delivery_count)

    def release_member(self, member_id: str) -> list[Span]:
        """Release what ``member_id`` holds (it left, or its share session closed); the spans changed."""
        changed: list[Span] = []
        for span in [s for s in self.spans if s.state == ACQUIRED and s.member_id == member_id]:
            changed += self._transition(span.first, span.last, self._released)
        self._advance()
        return changed

    def expire_locks(self, now: int) -> list[Span]:
        """Release every acquisition whose lock expired by ``now``; the spans changed."""
        changed: list[Span] = []
        for span in [s for s in self.spans if s.state == ACQUIRED and s.deadline <= now]:
            changed += self._transition(span.first, span.last, self._released)
        self._advance()
        return changed

    def next_deadline(self) -> int | None:
        return min((s.deadline for s in self.spans if s.state == ACQUIRED), default=None)

    def move_start(self, offset: int) -> None:
        """The log start moved past the window's start (retention, DeleteRecords): what is gone is done with."""
        if offset <= self.start:
            return
        self.spans = [s if s.first >= offset else attrs.evolve(s, first=offset)
                      for s in self.spans if s.last >= offset]
        self.start = offset
        self.end = max(self.end, offset)
        self._advance()

    # The spans ------------------------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        return bisect.bisect_right([s.first for s in self.spans], offset) - 1

    def _overlapping(self, first: int, last: int) -> list[Span]:
        i = max(self._index(first), 0)
        out = []
        while i < len(self.spans) and self.spans[i].first <= last:
            if self.spans[i].last >= first:
                out.append(self.spans[i])
            i += 1
        return out

    def _replace(self, first: int, last: int, spans: list[Span]) -> None:
        """Replace the span(s) exactly covering ``first``..``last`` with ``spans``."""
        i = self._index(first)
        j = i
        while j < len(self.spans) and self.spans[j].last < last:
            j += 1
        self.spans[i:j + 1] = spans

    def _transition(self, first: int, last: int, change) -> list[Span]:
        """Apply ``change`` to offsets ``first``..``last``, splitting the spans at the edges; the new spans."""
        changed: list[Span] = []
        for span in self._overlapping(first, last):
            pieces = []
            if span.first < first:
                pieces.append(attrs.evolve(span, last=first - 1))
            middle = change(attrs.evolve(span, first=max(span.first, first), last=min(span.last, last)))
            pieces.append(middle)
            changed.append(middle)
            if span.last > last:
                pieces.append(attrs.evolve(span, first=last + 1))
            self._replace(span.first, span.last, pieces)
        return changed

    def _advance(self) -> None:
        """Drop done spans at the start (the start offset moves past them) and join equal neighbours."""
        while self.spans and self.spans[0].state in _DONE:
            self.start = self.spans.pop(0).last + 1
        if not self.spans:
            self.start = max(self.start, self.end)
        joined: list[Span] = []
        for span in self.spans:
            last = joined[-1] if joined else None
            if last is not None and last.last + 1 == span.first and _same(last, span):
                joined[-1] = attrs.evolve(last, last=span.last)
            else:
                joined.append(span)
        self.spans = joined


def _same(a: Span, b: Span) -> bool:
    return (a.state, a.delivery_count, a.member_id, a.deadline) == (b.state, b.delivery_count, b.member_id, b.deadline)


def _runs(types: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for t in types:
        if runs and runs[-1][0] == t:
            runs[-1] = (t, runs[-1][1] + 1)
        else:
            runs.append((t, 1))
    return runs


def _joined(acquired: list[Acquired]) -> list[Acquired]:
    out: list[Acquired] = []
    for a in sorted(acquired, key=lambda a: a.first):
        if out and out[-1].last + 1 == a.first and out[-1].delivery_count == a.delivery_count:
            out[-1] = Acquired(out[-1].first, a.last, a.delivery_count)
        else:
            out.append(a)
    return out
