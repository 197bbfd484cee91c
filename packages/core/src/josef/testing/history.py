"""A history of what clients did against a cluster, and a checker of the guarantees Kafka gives them.

Jepsen's method, for Kafka's promises: a workload (:mod:`josef.testing.workload`)
records every send, acknowledgement, failure, transaction, read, offset
commit and rebalance into a :class:`History`, while a nemesis injects faults
and records them too; at the end, every partition is read back from its start
at both isolation levels (:class:`FinalReads`), and :func:`check` holds the
history against that log::

    history = History()
    cluster.faults.listeners.append(history.on_fault)
    ... run the workload ...
    verdict = check(history, final_reads)
    print(verdict.report())
    assert verdict.ok

The checks, each a small function of :class:`Facts` (see :data:`CHECKS`), are
per partition: no acknowledged record lost, none twice, a producer's records
in its send order, nothing read that was never sent, every reader agreeing
with the log at every offset, read_committed readers never seeing an aborted
record and seeing a committed transaction whole, a group member's committed
offsets never going back while it owns the partition, no two leaders
acknowledging different records at one offset and leader epochs never going
back along the log, and a consumer group that consumed everything and
committed up to the end. A write whose outcome the client could not know (a
timeout: :attr:`Fail.definite` false) may be in the log or not, but once at
most.

Everything here is plain data and logic, with no client library: a history
dumped to JSON lines (:meth:`History.dump`) and the final reads
(:meth:`FinalReads.dump`) can be checked again later, elsewhere.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, NamedTuple

import attrs

from josef.protocol.topic_partition import TopicPartition

__all__ = [
    "CHECKS", "READ_COMMITTED", "READ_UNCOMMITTED", "Ack", "Assign", "Commit", "Event", "Facts", "Fail",
    "FinalReads", "GroupOffset", "History", "LogRecord", "Nemesis", "PartitionRead", "Read", "Revoke", "Send",
    "TxnAbort", "TxnBegin", "TxnCommit", "Verdict", "Violation", "check", "decode_value", "encode_value", "value_id",
]

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)

#: Outcomes of a transaction's commit or abort: acknowledged, refused for sure, or not known (a timeout).
OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


# Values ------------------------------------------------------------------------------------------------------

_VALUE_ID = re.compile(r"[A-Za-z0-9_.\-]+:\d+")


def value_id(process: str, sequence: int) -> str:
    """The unique id of a producer's ``sequence``-th record: ``process:sequence``."""
    if ":" in process or "|" in process:
        raise ValueError(f"a process name cannot hold ':' or '|': {process!r}")
    return f"{process}:{sequence}"


def encode_value(value: str, size: int = 0) -> bytes:
    """A record's value: its id, then ``|`` and padding up to ``size`` bytes when the id is shorter."""
    raw = value.encode()
    return raw if len(raw) >= size else raw + b"|" + b"." * (size - len(raw) - 1)


def decode_value(raw: bytes | None) -> str:
    """The id a record's value carries, or ``?`` and the value's start for a record no workload wrote.

    The ``?`` form never matches a sent id, so such a record is reported as
    never sent instead of failing the read.
    """
    if raw is None:
        return "?null"
    head = raw.split(b"|", 1)[0]
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if _VALUE_ID.fullmatch(text):
        return text
    return "?" + repr(raw[:40])


def _tp(value: Any) -> TopicPartition:
    return value if isinstance(value, TopicPartition) else TopicPartition(value[0], int(value[1]))


def _tps(values: Iterable[Any]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(_tp(v) for v in values))


# Events ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Event:
    """Something a client or the nemesis did; ``seq`` orders the history, ``mono`` and ``wall`` time it."""

    kind: ClassVar[str] = "event"
    seq: int
    mono: float
    wall: float

    def touches(self) -> tuple[TopicPartition, ...]:
        """The partitions this event is about, to find the events around a violation."""
        topic, partition = getattr(self, "topic", None), getattr(self, "partition", None)
        return (TopicPartition(topic, partition),) if topic is not None and partition is not None else ()

    def describe(self) -> str:
        fields = attrs.asdict(self, recurse=False)
        for name in ("seq", "mono", "wall"):
            fields.pop(name)
        text = " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v not in (None, "", ()))
        return f"#{self.seq} {self.kind} {text}"


def _short(value: Any) -> str:
    if isinstance(value, tuple) and len(value) > 8:
        return "(" + ", ".join(map(str, value[:8])) + f", ... {len(value)} in all)"
    if isinstance(value, tuple) and value and isinstance(value[0], TopicPartition):
        return "[" + ",".join(str(tp) for tp in value) + "]"
    return str(value)


@attrs.frozen(kw_only=True)
class Send(Event):
    """A producer handed a record to its client (``partition`` None when the client picks it)."""

    kind: ClassVar[str] = "send"
    process: str
    topic: str
    partition: int | None
    value: str
    txn: str | None = None


@attrs.frozen(kw_only=True)
class Ack(Event):
    """The cluster acknowledged a record at ``offset`` (``-1`` when the client does not say)."""

    kind: ClassVar[str] = "ack"
    process: str
    value: str
    topic: str
    partition: int
    offset: int


@attrs.frozen(kw_only=True)
class Fail(Event):
    """A send failed; ``definite`` when it surely wrote nothing, else (a timeout, a lost connection) it may have."""

    kind: ClassVar[str] = "fail"
    process: str
    value: str
    topic: str
    partition: int | None
    error: str
    definite: bool


@attrs.frozen(kw_only=True)
class TxnBegin(Event):
    """A transaction began; ``txn`` names it (the workload's: its transactional id, ``#`` and a number)."""

    kind: ClassVar[str] = "txn_begin"
    process: str
    txn: str


@attrs.frozen(kw_only=True)
class TxnCommit(Event):
    """A commit answered: ``ok``, ``failed`` (surely not committed) or ``unknown``."""

    kind: ClassVar[str] = "txn_commit"
    process: str
    txn: str
    values: tuple[str, ...] = attrs.field(converter=tuple)
    outcome: str
    error: str = ""


@attrs.frozen(kw_only=True)
class TxnAbort(Event):
    kind: ClassVar[str] = "txn_abort"
    process: str
    txn: str
    values: tuple[str, ...] = attrs.field(converter=tuple)
    outcome: str
    error: str = ""


@attrs.frozen(kw_only=True)
class Read(Event):
    """A consumer got the record at ``offset``; ``leader_epoch`` is its batch's, ``-1`` when unknown."""

    kind: ClassVar[str] = "read"
    consumer: str
    isolation: str
    topic: str
    partition: int
    offset: int
    value: str
    leader_epoch: int = -1
    group: str | None = None


@attrs.frozen(kw_only=True)
class Commit(Event):
    """A group member's synchronous offset commit for one partition, and whether it succeeded."""

    kind: ClassVar[str] = "commit"
    group: str
    member: str
    topic: str
    partition: int
    offset: int
    ok: bool
    error: str = ""


@attrs.frozen(kw_only=True)
class Assign(Event):
    """A consumer was given partitions (a group's rebalance, or ``assign()``): its reading of them starts over."""

    kind: ClassVar[str] = "assign"
    consumer: str
    partitions: tuple[TopicPartition, ...] = attrs.field(converter=_tps)
    group: str | None = None

    def touches(self) -> tuple[TopicPartition, ...]:
        return self.partitions


@attrs.frozen(kw_only=True)
class Revoke(Event):
    """Partitions taken from a group member; ``lost`` when it was fenced out without a chance to commit."""

    kind: ClassVar[str] = "revoke"
    consumer: str
    partitions: tuple[TopicPartition, ...] = attrs.field(converter=_tps)
    group: str | None = None
    lost: bool = False

    def touches(self) -> tuple[TopicPartition, ...]:
        return self.partitions


@attrs.frozen(kw_only=True)
class Nemesis(Event):
    """A fault started or ended: ``action`` (partition, heal, kill, pause, ...) on ``nodes``."""

    kind: ClassVar[str] = "nemesis"
    action: str
    nodes: tuple[int, ...] = attrs.field(converter=tuple)
    detail: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (Send, Ack, Fail, TxnBegin, TxnCommit, TxnAbort, Read, Commit, Assign, Revoke, Nemesis)
}


def event_to_json(event: Event) -> str:
    return json.dumps({"kind": event.kind, **attrs.asdict(event, recurse=False)})


def event_from_json(line: str) -> Event:
    data = json.loads(line)
    kind = data.pop("kind")
    try:
        cls = EVENT_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown history event kind {kind!r}; known: {sorted(EVENT_TYPES)}") from None
    return cls(**data)


# The recorder --------------------------------------------------------------------------------------------------


class History:
    """What clients and the nemesis did, in the order the test process saw it; safe to record from any thread.

    Each method records one event, numbered (``seq``) and timed with the
    monotonic clock (for order and distances) and the wall clock (to match
    broker logs). With ``log``, each event is also appended to that file as a
    JSON line when it happens, so a run that dies still leaves its history.
    """

    def __init__(self, events: Iterable[Event] = (), *, log: Path | str | None = None) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = list(events)
        self._sink: IO[str] | None = open(log, "a") if log is not None else None  # noqa: SIM115 (closed by close())

    def record(self, cls: type[Event], **fields: Any) -> Event:
        with self._lock:
            event = cls(seq=len(self._events), mono=time.monotonic(), wall=time.time(), **fields)
            self._events.append(event)
            if self._sink is not None:
                self._sink.write(event_to_json(event) + "\n")
        return event

    def send(self, process: str, topic: str, partition: int | None, value: str, txn: str | None = None) -> Event:
        return self.record(Send, process=process, topic=topic, partition=partition, value=value, txn=txn)

    def ack(self, process: str, value: str, topic: str, partition: int, offset: int | None) -> Event:
        # A client may not say where a record went (librdkafka gives no offset for some acknowledgements): -1.
        return self.record(Ack, process=process, value=value, topic=topic, partition=partition,
                           offset=-1 if offset is None else offset)

    def fail(self, process: str, value: str, topic: str, partition: int | None, error: str, *,
             definite: bool) -> Event:
        return self.record(Fail, process=process, value=value, topic=topic, partition=partition, error=error,
                           definite=definite)

    def txn_begin(self, process: str, txn: str) -> Event:
        return self.record(TxnBegin, process=process, txn=txn)

    def txn_commit(self, process: str, txn: str, values: Iterable[str], outcome: str, error: str = "") -> Event:
        return self.record(TxnCommit, process=process, txn=txn, values=tuple(values), outcome=_outcome(outcome),
                           error=error)

    def txn_abort(self, process: str, txn: str, values: Iterable[str], outcome: str, error: str = "") -> Event:
        return self.record(TxnAbort, process=process, txn=txn, values=tuple(values), outcome=_outcome(outcome),
                           error=error)

    def read(self, consumer: str, isolation: str, topic: str, partition: int, offset: int, value: str,
             leader_epoch: int = -1, group: str | None = None) -> Event:
        return self.record(Read, consumer=consumer, isolation=_isolation(isolation), topic=topic, partition=partition,
                           offset=offset, value=value, leader_epoch=leader_epoch, group=group)

    def commit(self, group: str, member: str, topic: str, partition: int, offset: int, ok: bool,
               error: str = "") -> Event:
        return self.record(Commit, group=group, member=member, topic=topic, partition=partition, offset=offset, ok=ok,
                           error=error)

    def assign(self, consumer: str, partitions: Iterable[TopicPartition | tuple[str, int]],
               group: str | None = None) -> Event:
        return self.record(Assign, consumer=consumer, partitions=partitions, group=group)

    def revoke(self, consumer: str, partitions: Iterable[TopicPartition | tuple[str, int]], group: str | None = None,
               lost: bool = False) -> Event:
        return self.record(Revoke, consumer=consumer, partitions=partitions, group=group, lost=lost)

    def nemesis(self, action: str, nodes: Iterable[int], detail: str = "") -> Event:
        return self.record(Nemesis, action=action, nodes=tuple(nodes), detail=detail)

    def on_fault(self, fault: Any) -> None:
        """A listener for :attr:`josef.testing.faults.Faults.listeners`: records the fault as a nemesis event."""
        self.nemesis(fault.action, fault.nodes, getattr(fault, "detail", ""))

    @property
    def events(self) -> list[Event]:
        """A snapshot of the events so far, in order."""
        with self._lock:
            return list(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def of(self, cls: type[Event]) -> list[Any]:
        """The events of one kind (``history.of(Ack)``)."""
        return [e for e in self.events if isinstance(e, cls)]

    def dump(self, target: Path | str | IO[str]) -> None:
        """Write every event as a JSON line (to a path, or an open text file)."""
        lines = "".join(event_to_json(e) + "\n" for e in self.events)
        if isinstance(target, (str, Path)):
            Path(target).write_text(lines)
        else:
            target.write(lines)

    @classmethod
    def load(cls, source: Path | str | IO[str]) -> History:
        """A history from :meth:`dump`'s JSON lines; a line that is not one says where it is."""
        text = Path(source).read_text() if isinstance(source, (str, Path)) else source.read()
        events = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                events.append(event_from_json(line))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"line {number} of the history is not an event: {exc}") from exc
        return cls(events)

    def close(self) -> None:
        """Close the ``log`` file, if any; the history stays readable."""
        with self._lock:
            if self._sink is not None:
                self._sink.close()
                self._sink = None


def _outcome(outcome: str) -> str:
    if outcome not in (OK, FAILED, UNKNOWN):
        raise ValueError(f"a transaction outcome is {OK!r}, {FAILED!r} or {UNKNOWN!r}, not {outcome!r}")
    return outcome


def _isolation(isolation: str) -> str:
    if isolation not in ISOLATION_LEVELS:
        raise ValueError(f"an isolation level is one of {ISOLATION_LEVELS}, not {isolation!r}")
    return isolation


# The final read-back ------------------------------------------------------------------------------------------


class LogRecord(NamedTuple):
    """A record of the final read-back; the producer fields (from the batch header) are -1 where not read."""

    offset: int
    value: str
    leader_epoch: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    sequence: int = -1


def _records(records: Iterable[Any]) -> tuple[LogRecord, ...]:
    return tuple(r if isinstance(r, LogRecord) else LogRecord(*r) for r in records)


@attrs.frozen(kw_only=True)
class PartitionRead:
    """One partition read back at one isolation level, from ``start`` (the log start offset) towards ``end``.

    ``end`` is the high watermark (read_uncommitted) or the last stable offset
    (read_committed) when the read began; ``reached`` is the position it got
    to, below ``end`` when it ran out of time. Only offsets below ``reached``
    are judged against it.
    """

    topic: str
    partition: int
    isolation: str = attrs.field(validator=lambda _, __, v: _isolation(v))
    start: int
    end: int
    reached: int
    records: tuple[LogRecord, ...] = attrs.field(converter=_records)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def complete(self) -> bool:
        return self.reached >= self.end

    def covers(self, offset: int) -> bool:
        """Whether the read tells what is at ``offset`` (a record, or nothing visible)."""
        return self.start <= offset < self.reached


@attrs.frozen(kw_only=True)
class GroupOffset:
    """A group's committed offset of one partition at the end (``-1``: none), and the isolation it reads with."""

    group: str
    topic: str
    partition: int
    offset: int
    isolation: str = READ_UNCOMMITTED

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@attrs.frozen(kw_only=True)
class FinalReads:
    """Every partition read from its start at both isolation levels after the run, and the groups' committed offsets."""

    partitions: tuple[PartitionRead, ...] = attrs.field(converter=tuple)
    groups: tuple[GroupOffset, ...] = attrs.field(converter=tuple, default=())

    def read(self, isolation: str, tp: TopicPartition) -> PartitionRead | None:
        for p in self.partitions:
            if p.isolation == isolation and p.tp == tp:
                return p
        return None

    def with_groups(self, groups: Iterable[GroupOffset]) -> FinalReads:
        return attrs.evolve(self, groups=tuple(groups))

    def to_json(self) -> str:
        return json.dumps({"partitions": [attrs.asdict(p, recurse=False) for p in self.partitions],
                           "groups": [attrs.asdict(g) for g in self.groups]})

    @classmethod
    def from_json(cls, text: str) -> FinalReads:
        data = json.loads(text)
        return cls(partitions=[PartitionRead(**p) for p in data["partitions"]],
                   groups=[GroupOffset(**g) for g in data.get("groups", ())])

    def dump(self, path: Path | str) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: Path | str) -> FinalReads:
        return cls.from_json(Path(path).read_text())


# What the checks look at -------------------------------------------------------------------------------------

COMMITTED, ABORTED = "committed", "aborted"


class Facts:
    """A history and the final reads, indexed once for every check."""

    def __init__(self, events: Iterable[Event], final: FinalReads) -> None:
        self.events = sorted(events, key=lambda e: e.seq)
        self.final = final
        self.sends: dict[str, Send] = {}
        self.acks: dict[str, list[Ack]] = defaultdict(list)
        self.fails: dict[str, list[Fail]] = defaultdict(list)
        self.reads: list[Read] = []
        self.txn_of: dict[str, str] = {}
        self.txn_values: dict[str, set[str]] = defaultdict(set)
        self.txn_ends: dict[str, list[TxnCommit | TxnAbort]] = defaultdict(list)
        self.txn_events: dict[str, list[Event]] = defaultdict(list)
        self.by_tp: dict[TopicPartition, list[Event]] = defaultdict(list)
        self.nemesis: list[Nemesis] = []
        for event in self.events:
            for tp in event.touches():
                self.by_tp[tp].append(event)
            if isinstance(event, Send):
                self.sends.setdefault(event.value, event)
                if event.txn is not None:
                    self.txn_of[event.value] = event.txn
                    self.txn_values[event.txn].add(event.value)
            elif isinstance(event, Ack):
                self.acks[event.value].append(event)
            elif isinstance(event, Fail):
                self.fails[event.value].append(event)
            elif isinstance(event, Read):
                self.reads.append(event)
            elif isinstance(event, (TxnBegin, TxnCommit, TxnAbort)):
                self.txn_events[event.txn].append(event)
                if not isinstance(event, TxnBegin):
                    self.txn_ends[event.txn].append(event)
                    for value in event.values:
                        self.txn_of.setdefault(value, event.txn)
                        self.txn_values[event.txn].add(value)
            elif isinstance(event, Nemesis):
                self.nemesis.append(event)
        self.txn_state = {txn: _txn_state(self.txn_ends.get(txn, ())) for txn in self.txn_values}
        self.logs: dict[str, dict[TopicPartition, PartitionRead]] = {i: {} for i in ISOLATION_LEVELS}
        self.log_at: dict[str, dict[TopicPartition, dict[int, LogRecord]]] = {i: {} for i in ISOLATION_LEVELS}
        self.log_offsets: dict[str, dict[TopicPartition, list[int]]] = {i: {} for i in ISOLATION_LEVELS}
        for read in final.partitions:
            self.logs[read.isolation][read.tp] = read
            self.log_at[read.isolation][read.tp] = {r.offset: r for r in read.records}
            self.log_offsets[read.isolation][read.tp] = sorted(r.offset for r in read.records)
        #: Where each value is in the read_uncommitted log.
        self.positions: dict[str, list[tuple[TopicPartition, int]]] = defaultdict(list)
        for tp, read in self.logs[READ_UNCOMMITTED].items():
            for record in read.records:
                self.positions[record.value].append((tp, record.offset))
        #: Later copies of a record its producer wrote again under a newer epoch of its producer id: see :func:`_resent`.
        self.resent: dict[str, list[tuple[TopicPartition, int]]] = {}
        for value, places in self.positions.items():
            if len(places) > 1:
                again = _resent(self, places)
                if again:
                    self.resent[value] = again
        self.resent_at = {place for places in self.resent.values() for place in places}

    def state_of(self, value: str) -> str | None:
        """The outcome of ``value``'s transaction (committed, aborted, unknown), None for a record outside one."""
        txn = self.txn_of.get(value)
        return None if txn is None else self.txn_state[txn]

    def value_events(self, value: str) -> tuple[Event, ...]:
        """The send, acknowledgements and failures of ``value``."""
        send = self.sends.get(value)
        return (*((send,) if send else ()), *self.acks.get(value, ()), *self.fails.get(value, ()))

    def partitions(self) -> list[TopicPartition]:
        """Every partition the history or the final reads name."""
        return sorted(set(self.by_tp) | {p.tp for p in self.final.partitions})


def _resent(f: Facts, places: Sequence[tuple[TopicPartition, int]]) -> list[tuple[TopicPartition, int]]:
    """The copies after the first, when each was written by the same producer id under a newer epoch than the last.

    An idempotent producer's sequence numbers make a retry of the same
    write harmless only within one producer epoch. After bumping its epoch
    (KIP-360) a client that sends a possibly written record again, renumbered
    from 0, makes a new write the broker cannot tell from another record:
    librdkafka does, when one partition's out-of-order error bumps the epoch
    while another partition's write is being retried
    (confluentinc/librdkafka#4953; the Java client does not bump there). The
    cluster cannot prevent such copies, so they are reported apart from
    violations. Copies under the same epoch are the broker's fault and stay
    duplicates.
    """
    records = sorted((f.log_at[READ_UNCOMMITTED][tp][offset], tp) for tp, offset in places)
    first = records[0][0]
    if len({tp for _, tp in records}) > 1 or first.producer_id < 0:
        return []
    epochs = [r.producer_epoch for r, _ in records]
    if any(r.producer_id != first.producer_id for r, _ in records) or any(b <= a for a, b in zip(epochs, epochs[1:])):
        return []
    return [(tp, r.offset) for r, tp in records[1:]]


def _txn_state(ends: Iterable[TxnCommit | TxnAbort]) -> str:
    """Committed once a commit is acknowledged; aborted once an abort is, or when no commit may have happened."""
    state = ABORTED
    for end in ends:
        if isinstance(end, TxnCommit):
            if end.outcome == OK:
                return COMMITTED
            if end.outcome == UNKNOWN:
                state = UNKNOWN
        elif end.outcome == OK:
            state = ABORTED
    return state


@attrs.frozen
class Violation:
    """One broken guarantee: ``kind`` names the check, ``events`` are those that show it."""

    kind: str
    message: str
    tp: TopicPartition | None = None
    offset: int | None = None
    events: tuple[Event, ...] = attrs.field(default=(), converter=tuple)

    @property
    def at(self) -> float | None:
        """When it first showed (the earliest of its events), to order violations and find what was around."""
        return min((e.mono for e in self.events), default=None)

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


def _where(positions: Iterable[tuple[TopicPartition, int]]) -> str:
    return ", ".join(f"{tp}@{offset}" for tp, offset in sorted(positions))


# The checks ---------------------------------------------------------------------------------------------------


def check_final_reads(f: Facts) -> Iterator[Violation]:
    """The read-back reached each partition's end; partitions with events but no read-back cannot be judged."""
    for read in f.final.partitions:
        if not read.complete:
            yield Violation("unreadable", f"the final {read.isolation} read of {read.tp} reached offset {read.reached} "
                            f"of {read.end}: later records cannot be judged", read.tp, read.reached)
    read_back = {p.tp for p in f.final.partitions if p.isolation == READ_UNCOMMITTED}
    for tp in sorted(set(f.by_tp) - read_back):
        if any(isinstance(e, (Ack, Read)) for e in f.by_tp[tp]):
            yield Violation("unreadable", f"{tp} was written or read but never read back at the end", tp)


def check_lost(f: Facts) -> Iterator[Violation]:
    """Every acknowledged record is in the log, at the offset its acknowledgement gave."""
    for value, acks in f.acks.items():
        for ack in acks:
            tp = TopicPartition(ack.topic, ack.partition)
            log = f.logs[READ_UNCOMMITTED].get(tp)
            if log is None:
                continue  # reported by check_final_reads
            if ack.offset < 0:
                if log.complete and not any(where == tp for where, _ in f.positions.get(value, ())):
                    yield Violation("lost", f"acknowledged {value} is nowhere in {tp}", tp, None, f.value_events(value))
                continue
            if ack.offset < log.start:
                yield Violation("lost", f"acknowledged {value} at {tp}@{ack.offset} is below the log start offset "
                                f"{log.start}", tp, ack.offset, f.value_events(value))
            elif log.covers(ack.offset):
                record = f.log_at[READ_UNCOMMITTED][tp].get(ack.offset)
                if record is None or record.value != value:
                    held = f"the offset holds {record.value}" if record else "no record is at that offset"
                    elsewhere = f.positions.get(value)
                    found = f"; it is at {_where(elsewhere)}" if elsewhere else ""
                    yield Violation("lost", f"acknowledged {value} at {tp}@{ack.offset} is not in the log: "
                                    f"{held}{found}", tp, ack.offset, f.value_events(value))


def check_definite_failures(f: Facts) -> Iterator[Violation]:
    """A send that failed for sure wrote nothing: its value is neither in the log nor read."""
    read_values = {r.value: r for r in f.reads}
    for value, fails in f.fails.items():
        definite = [x for x in fails if x.definite]
        if not definite or value in f.acks:
            continue
        places = list(f.positions.get(value, ()))
        read = read_values.get(value)
        if read is not None:
            places.append((TopicPartition(read.topic, read.partition), read.offset))
        if places:
            yield Violation("failed-present", f"{value} failed for sure ({definite[0].error}) yet is at "
                            f"{_where(set(places))}", places[0][0], places[0][1],
                            (*f.value_events(value), *((read,) if read else ())))


def check_duplicates(f: Facts) -> Iterator[Violation]:
    """Each value is at one offset of one partition at most: in the log and in every read."""
    places: dict[str, set[tuple[TopicPartition, int]]] = defaultdict(set)
    for value, positions in f.positions.items():
        places[value].update(positions)
    for tp, read in f.logs[READ_COMMITTED].items():
        for record in read.records:
            places[record.value].add((tp, record.offset))
    first_read: dict[tuple[str, TopicPartition, int], Read] = {}
    for read_event in f.reads:
        tp = TopicPartition(read_event.topic, read_event.partition)
        places[read_event.value].add((tp, read_event.offset))
        first_read.setdefault((read_event.value, tp, read_event.offset), read_event)
    for value, where in places.items():
        where -= f.resent_at
        if len(where) > 1:
            ordered = sorted(where)
            reads = [first_read[(value, tp, o)] for tp, o in ordered if (value, tp, o) in first_read]
            yield Violation("duplicate", f"{value} is at {len(where)} places: {_where(where)}", ordered[1][0],
                            ordered[1][1], (*f.value_events(value), *reads[:4]))


def check_order(f: Facts) -> Iterator[Violation]:
    """Along each partition's log, each producer's acknowledged records come in the order it sent them.

    A copy its producer wrote again under a newer epoch (:func:`_resent`) is
    not a place of its record: its first copy is.
    """
    for tp, read in f.logs[READ_UNCOMMITTED].items():
        last: dict[str, tuple[Send, LogRecord]] = {}
        reported: set[str] = set()
        for record in read.records:
            send = f.sends.get(record.value)
            if send is None or record.value not in f.acks or (tp, record.offset) in f.resent_at:
                continue
            previous = last.get(send.process)
            if previous is not None and send.seq < previous[0].seq and send.process not in reported:
                reported.add(send.process)
                earlier_send, earlier = previous
                yield Violation("order", f"{send.process} sent {record.value} before {earlier.value}, but the log has "
                                f"it after: {tp}@{record.offset} follows {tp}@{earlier.offset}", tp, record.offset,
                                (*f.value_events(earlier.value), *f.value_events(record.value)))
            if previous is None or send.seq > previous[0].seq:
                last[send.process] = (send, record)


def check_phantoms(f: Facts) -> Iterator[Violation]:
    """Every record read, and every record in the log, was sent by the workload."""
    reported: set[str] = set()
    for read_event in f.reads:
        if read_event.value not in f.sends and read_event.value not in reported:
            reported.add(read_event.value)
            yield Violation("phantom", f"{read_event.consumer} read {read_event.value} at {read_event.topic}-"
                            f"{read_event.partition}@{read_event.offset}, which was never sent",
                            TopicPartition(read_event.topic, read_event.partition), read_event.offset, (read_event,))
    for isolation in ISOLATION_LEVELS:
        for tp, read in f.logs[isolation].items():
            for record in read.records:
                if record.value not in f.sends and record.value not in reported:
                    reported.add(record.value)
                    yield Violation("phantom", f"the {isolation} log holds {record.value} at {tp}@{record.offset}, "
                                    "which was never sent", tp, record.offset)


NOTHING = "<nothing>"


def check_agreement(f: Facts) -> Iterator[Violation]:
    """Every reader, and both final reads, see the same record (and leader epoch) at each offset."""
    seen: dict[tuple[TopicPartition, int], tuple[str, int, str]] = {}
    mismatched: dict[tuple[TopicPartition, int], list[str]] = {}
    events: dict[tuple[TopicPartition, int], list[Read]] = defaultdict(list)

    def compare(tp: TopicPartition, offset: int, value: str, epoch: int, who: str, event: Read | None) -> None:
        key = (tp, offset)
        reference = seen.get(key)
        if reference is None:
            log = f.logs[READ_UNCOMMITTED].get(tp)
            if log is not None and log.covers(offset):
                record = f.log_at[READ_UNCOMMITTED][tp].get(offset)
                reference = (record.value, record.leader_epoch, "the final read") if record else (NOTHING, -1,
                                                                                                  "the final read")
            else:
                reference = (value, epoch, who)
            seen[key] = reference
        ref_value, ref_epoch, ref_who = reference
        if value != ref_value or (epoch >= 0 and ref_epoch >= 0 and epoch != ref_epoch):
            first = (f"{ref_who} has no record there" if ref_value == NOTHING
                     else f"{ref_who} saw {ref_value} (epoch {ref_epoch})")
            mismatched.setdefault(key, [first]).append(f"{who} saw {value} (epoch {epoch})")
            if event is not None:
                events[key].append(event)

    for tp, read in f.logs[READ_COMMITTED].items():
        for record in read.records:
            compare(tp, record.offset, record.value, record.leader_epoch, "the final read_committed read", None)
    for read_event in f.reads:
        compare(TopicPartition(read_event.topic, read_event.partition), read_event.offset, read_event.value,
                read_event.leader_epoch, read_event.consumer, read_event)
    for (tp, offset), accounts in sorted(mismatched.items()):
        unique = list(dict.fromkeys(accounts))
        yield Violation("disagreement", f"readers disagree on {tp}@{offset}: " + "; ".join(unique[:6]), tp, offset,
                        events[(tp, offset)][:6])


def check_split_brain(f: Facts) -> Iterator[Violation]:
    """No two acknowledged writes at one offset; leader epochs never go back along a log."""
    acked_at: dict[tuple[TopicPartition, int], Ack] = {}
    for acks in f.acks.values():
        for ack in acks:
            if ack.offset < 0:
                continue
            key = (TopicPartition(ack.topic, ack.partition), ack.offset)
            other = acked_at.setdefault(key, ack)
            if other.value != ack.value:
                yield Violation("split-brain", f"two different records acknowledged at {key[0]}@{key[1]}: "
                                f"{other.value} and {ack.value}", key[0], key[1], (other, ack))
    for tp, read in f.logs[READ_UNCOMMITTED].items():
        previous: LogRecord | None = None
        for record in read.records:
            if record.leader_epoch < 0:
                continue
            if previous is not None and record.leader_epoch < previous.leader_epoch:
                yield Violation("epoch-regression", f"{tp}@{record.offset} was written in leader epoch "
                                f"{record.leader_epoch}, after {tp}@{previous.offset} in epoch {previous.leader_epoch}",
                                tp, record.offset, f.value_events(record.value))
            previous = record


def check_aborted_reads(f: Facts) -> Iterator[Violation]:
    """read_committed readers (and the read_committed read-back) never see a record of an aborted transaction."""
    for read_event in f.reads:
        if read_event.isolation == READ_COMMITTED and f.state_of(read_event.value) == ABORTED:
            txn = f.txn_of[read_event.value]
            yield Violation("aborted-read", f"{read_event.consumer} (read_committed) read {read_event.value} of "
                            f"aborted transaction {txn} at {read_event.topic}-{read_event.partition}@"
                            f"{read_event.offset}", TopicPartition(read_event.topic, read_event.partition),
                            read_event.offset, (read_event, *f.txn_events[txn]))
    for tp, read in f.logs[READ_COMMITTED].items():
        for record in read.records:
            if f.state_of(record.value) == ABORTED:
                txn = f.txn_of[record.value]
                yield Violation("aborted-read", f"the read_committed log holds {record.value} of aborted transaction "
                                f"{txn} at {tp}@{record.offset}", tp, record.offset, f.txn_events[txn])


def check_transactions(f: Facts) -> Iterator[Violation]:
    """In the read_committed log, a committed transaction is whole, one of unknown outcome whole or absent."""
    for txn, values in f.txn_values.items():
        state = f.txn_state[txn]
        if state == ABORTED:
            continue
        present, absent = [], []
        for value in sorted(values):
            places = f.positions.get(value) or [(TopicPartition(a.topic, a.partition), a.offset)
                                               for a in f.acks.get(value, ()) if a.offset >= 0]
            if not places:
                absent.append(f"{value} (nowhere)")
                continue
            tp, offset = places[0]
            log = f.logs[READ_COMMITTED].get(tp)
            if log is None or not log.covers(offset):
                continue  # beyond what the read_committed read reached: cannot say
            record = f.log_at[READ_COMMITTED][tp].get(offset)
            (present if record is not None and record.value == value else absent).append(f"{value} ({tp}@{offset})")
        if absent and (state == COMMITTED or present):
            yield Violation("txn-partial", f"{state} transaction {txn}: the read_committed log lacks "
                            f"{', '.join(absent[:5])}" + (f" but holds {', '.join(present[:5])}" if present else ""),
                            None, None, f.txn_events[txn])


def check_skipped_reads(f: Facts) -> Iterator[Violation]:
    """A consumer reading a partition on from where it was given it skips no record visible at its isolation level.

    Between two reads of one consumer in one partition (with no rebalance or
    assignment in between, and going forward) the final log of the same
    isolation level holds nothing: for read_committed readers this is
    "a committed transaction's records, all or none".
    """
    last: dict[tuple[str, TopicPartition], Read] = {}
    for event in f.events:
        if isinstance(event, (Assign, Revoke)):
            for tp in event.partitions:
                last.pop((event.consumer, tp), None)
            continue
        if not isinstance(event, Read):
            continue
        tp = TopicPartition(event.topic, event.partition)
        key = (event.consumer, tp)
        previous = last.get(key)
        last[key] = event
        if previous is None or event.offset <= previous.offset + 1:
            continue
        offsets = f.log_offsets[event.isolation].get(tp)
        log = f.logs[event.isolation].get(tp)
        if offsets is None or log is None or not log.covers(event.offset):
            continue
        i = bisect.bisect_right(offsets, previous.offset)
        if i < len(offsets) and offsets[i] < event.offset:
            skipped = f.log_at[event.isolation][tp][offsets[i]]
            count = bisect.bisect_left(offsets, event.offset) - i
            txn = f.txn_of.get(skipped.value)
            kind = "txn-partial" if txn is not None and event.isolation == READ_COMMITTED else "skipped"
            part = f" of {f.txn_state[txn]} transaction {txn}" if txn is not None else ""
            yield Violation(kind, f"{event.consumer} ({event.isolation}) read {tp}@{previous.offset} then "
                            f"{tp}@{event.offset}, skipping {count} record(s) the log holds, first "
                            f"{skipped.value}{part} at offset {skipped.offset}", tp, skipped.offset,
                            (previous, event, *(f.txn_events[txn] if txn else ())))


def check_group_commits(f: Facts) -> Iterator[Violation]:
    """A member's successful commits of a partition never go back while it owns the partition."""
    owned: dict[tuple[str | None, str], set[TopicPartition]] = defaultdict(set)
    last: dict[tuple[str, str, TopicPartition], Commit] = {}
    for event in f.events:
        if isinstance(event, Assign):
            owned[(event.group, event.consumer)].update(event.partitions)
            for tp in event.partitions:
                last.pop((event.group or "", event.consumer, tp), None)
        elif isinstance(event, Revoke):
            owned[(event.group, event.consumer)].difference_update(event.partitions)
        elif isinstance(event, Commit) and event.ok:
            tp = TopicPartition(event.topic, event.partition)
            if tp not in owned[(event.group, event.member)]:
                continue
            key = (event.group, event.member, tp)
            previous = last.get(key)
            if previous is not None and event.offset < previous.offset:
                yield Violation("offset-regression", f"{event.member} of group {event.group} committed {tp} at "
                                f"{event.offset} after {previous.offset}, owning it throughout", tp, event.offset,
                                (previous, event))
            if previous is None or event.offset >= previous.offset:
                last[key] = event


def check_groups(f: Facts) -> Iterator[Violation]:
    """Each group of the final reads consumed every record it could see, and committed up to the log's end."""
    for group_offset in f.final.groups:
        tp, group = group_offset.tp, group_offset.group
        log = f.logs[group_offset.isolation].get(tp)
        if log is None:
            yield Violation("group-lag", f"group {group}'s partition {tp} was not read back", tp)
            continue
        if log.records and group_offset.offset <= log.records[-1].offset:
            yield Violation("group-lag", f"group {group} committed {tp} at {group_offset.offset}, but the "
                            f"{group_offset.isolation} log has records up to offset {log.records[-1].offset}",
                            tp, group_offset.offset)
        if group_offset.offset > log.end:
            yield Violation("group-lag", f"group {group} committed {tp} at {group_offset.offset}, past the log end "
                            f"{log.end}", tp, group_offset.offset)
        consumed = {r.value for r in f.by_tp.get(tp, ()) if isinstance(r, Read) and r.group == group}
        missed = [r for r in log.records if r.value not in consumed]
        if missed:
            yield Violation("group-missed", f"group {group} never consumed {len(missed)} of the {len(log.records)} "
                            f"records of {tp}, first {missed[0].value} at offset {missed[0].offset}", tp,
                            missed[0].offset, f.value_events(missed[0].value))


def check_resent(f: Facts) -> Iterator[Violation]:
    """Records their producer wrote again under a newer producer epoch (:func:`_resent`): the client's doing.

    Reported as the kind ``resent``, which :attr:`Verdict.ok` tolerates.
    """
    for value, again in f.resent.items():
        first = min(set(f.positions[value]) - set(again))
        records = [f.log_at[READ_UNCOMMITTED][tp][offset] for tp, offset in (first, *again)]
        stamps = ", ".join(f"{tp}@{r.offset} (producer {r.producer_id} epoch {r.producer_epoch} sequence {r.sequence})"
                           for (tp, _), r in zip((first, *again), records))
        yield Violation(RESENT, f"{value} was written again by its producer under a newer epoch: {stamps}",
                        again[0][0], again[0][1], f.value_events(value))


CHECKS: tuple[Callable[[Facts], Iterable[Violation]], ...] = (
    check_final_reads, check_lost, check_definite_failures, check_duplicates, check_order, check_phantoms,
    check_agreement, check_split_brain, check_aborted_reads, check_transactions, check_skipped_reads,
    check_group_commits, check_groups, check_resent,
)

#: The kind of :func:`check_resent`: a client's doing, listed in the report but not a violation of the cluster's.
RESENT = "resent"


# The verdict -----------------------------------------------------------------------------------------------------

#: Events shown around the first violation: on its partition, and faults.
CONTEXT_EVENTS, CONTEXT_FAULTS, CONTEXT_OFFSETS = 10, 5, 3


@attrs.frozen
class Verdict:
    """The violations found (the first, by time, described with what was around it) and a summary of the run."""

    violations: tuple[Violation, ...]
    summary: tuple[str, ...]
    context: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No violation but those of kind ``resent`` (:func:`check_resent`): what the client did, not the cluster."""
        return all(v.kind == RESENT for v in self.violations)

    def kinds(self) -> Counter[str]:
        return Counter(v.kind for v in self.violations)

    def of(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def report(self, limit: int = 20) -> str:
        """A short text: the outcome, the summary, the first violation in context, then the others (up to ``limit``)."""
        if not self.violations:
            head = "history check: OK, no violation"
        elif self.ok:
            head = (f"history check: OK; {len(self.violations)} record(s) resent by their producer under a newer "
                    "producer epoch (a client's doing, see josef.testing.history.check_resent)")
        else:
            kinds = ", ".join(f"{kind} x{n}" for kind, n in sorted(self.kinds().items()))
            head = f"history check: FAILED, {len(self.violations)} violation(s): {kinds}"
        lines = [head, *self.summary, *self.context]
        if len(self.violations) > 1:
            lines.append("other violations:")
            lines += [f"  {v}" for v in self.violations[1:limit + 1]]
            if len(self.violations) > limit + 1:
                lines.append(f"  ... and {len(self.violations) - limit - 1} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def check(history: History | Iterable[Event], final: FinalReads) -> Verdict:
    """Run every check of :data:`CHECKS` on ``history`` against the read-back ``final``."""
    facts = Facts(history.events if isinstance(history, History) else history, final)
    violations = [v for each in CHECKS for v in each(facts)]
    never = float("inf")
    violations.sort(key=lambda v: (v.kind == RESENT, v.at if v.at is not None else never))
    context = _context(facts, violations[0]) if violations else []
    return Verdict(tuple(violations), tuple(_summary(facts)), tuple(context))


def _summary(f: Facts) -> list[str]:
    fails = [x for fails in f.fails.values() for x in fails]
    definite = sum(1 for x in fails if x.definite)
    states = Counter(f.txn_state.values())
    consumers = {r.consumer for r in f.reads}
    commits = [e for e in f.events if isinstance(e, Commit)]
    rebalances = sum(1 for e in f.events if isinstance(e, Assign) and e.group is not None)
    lines = [
        f"sent {len(f.sends)}, acknowledged {len(f.acks)}, failed {definite} for sure and {len(fails) - definite} "
        f"maybe (indefinite); transactions {states[COMMITTED]} committed, {states[ABORTED]} aborted, "
        f"{states[UNKNOWN]} unknown",
        f"read {len(f.reads)} records by {len(consumers)} consumer(s); {len(commits)} offset commits "
        f"({sum(1 for c in commits if not c.ok)} failed); {rebalances} group assignments; "
        f"{len(f.nemesis)} fault events",
        "partition: acknowledged, log records (read_uncommitted / read_committed), log start..end",
    ]
    acked = Counter((a.topic, a.partition) for acks in f.acks.values() for a in acks)
    for tp in f.partitions():
        unc, rc = f.logs[READ_UNCOMMITTED].get(tp), f.logs[READ_COMMITTED].get(tp)
        span = f"{unc.start}..{unc.end}" if unc else "not read back"
        lines.append(f"  {tp}: {acked[tp]} acknowledged, {len(unc.records) if unc else '-'} / "
                     f"{len(rc.records) if rc else '-'} in the log, {span}")
    for g in f.final.groups:
        lines.append(f"  group {g.group} committed {g.tp} at {g.offset}")
    return lines


def _context(f: Facts, violation: Violation) -> list[str]:
    """The first violation with its events, the log around its offset, and the nearest events and faults."""
    anchor = violation.at
    lines = [f"first violation: {violation}"]

    def timed(event: Event) -> str:
        when = f"{event.mono - anchor:+8.3f}s" if anchor is not None else time.strftime(
            "%H:%M:%S", time.localtime(event.wall))
        return f"    {when} {event.describe()}"

    if violation.events:
        lines.append("  its events:")
        lines += [timed(e) for e in sorted(violation.events, key=lambda e: e.seq)]
    tp, offset = violation.tp, violation.offset
    if tp is not None and offset is not None:
        for isolation in ISOLATION_LEVELS:
            records = f.log_at[isolation].get(tp)
            if records is None:
                continue
            near = [records[o] for o in range(offset - CONTEXT_OFFSETS, offset + CONTEXT_OFFSETS + 1) if o in records]
            lines.append(f"  the final {isolation} log of {tp} around offset {offset}: " + (
                ", ".join(f"{r.offset}={r.value}({_stamp(r)})" for r in near) or "nothing"))
    if anchor is None:
        anchor = f.events[-1].mono if f.events else None
    if anchor is not None:
        nearby: list[Event] = []
        if tp is not None:
            nearby += _nearest(f.by_tp.get(tp, []), anchor, CONTEXT_EVENTS)
        nearby += _nearest(f.nemesis, anchor, CONTEXT_FAULTS)
        shown = {e.seq for e in violation.events}
        nearby = sorted({e.seq: e for e in nearby if e.seq not in shown}.values(), key=lambda e: e.seq)
        if nearby:
            lines.append("  nearest events" + (f" on {tp}" if tp is not None else "") + " and faults:")
            lines += [timed(e) for e in nearby]
    return lines


def _stamp(record: LogRecord) -> str:
    producer = f", producer {record.producer_id} epoch {record.producer_epoch} sequence {record.sequence}"
    return f"epoch {record.leader_epoch}" + (producer if record.producer_id >= 0 else "")


def _nearest(events: Sequence[Event], at: float, n: int) -> list[Event]:
    """The ``n`` events of a time-ordered list closest in time to ``at``."""
    i = bisect.bisect_left(events, at, key=lambda e: e.mono)
    window = events[max(i - n, 0): i + n]
    return sorted(window, key=lambda e: abs(e.mono - at))[:n]
