"""The workload's bookkeeping, against an in-memory client: what it records when clients succeed, fail and die.

Real clients against real clusters are integration-tests/test_history_checker.py;
here a fake :class:`~josef.testing.workload.Client` (a log per partition in
memory) lets each test script the failures that are hard to cause on purpose
(a fatal producer error, a commit of unknown outcome) and assert exactly what
lands in the history, and that the checker then agrees.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import pytest

from josef.protocol.topic_partition import TopicPartition
from josef.testing import eventually
from josef.testing.history import (
    READ_COMMITTED,
    Ack,
    Assign,
    Commit,
    Fail,
    History,
    Read,
    Send,
    TxnAbort,
    TxnCommit,
    check,
)
from josef.testing.workload import (
    Failure,
    Group,
    Producers,
    Readers,
    Record,
    Transactions,
    Workload,
    final_read,
    resolve_client,
)

T = "t"


class FakeError(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.text)
        self.failure = failure


class FakeCluster:
    """Partitions as lists of ``[value, transaction state]``; transactions are "open", "committed" or "aborted"."""

    def __init__(self, partitions: int) -> None:
        self.lock = threading.Lock()
        self.logs: dict[int, list[list[Any]]] = {p: [] for p in range(partitions)}
        self.committed: dict[tuple[str, TopicPartition], int] = {}

    def append(self, partition: int, value: bytes, txn: list | None) -> int:
        with self.lock:
            entry = [value, "open" if txn is not None else "committed"]
            self.logs[partition].append(entry)
            if txn is not None:
                txn.append(entry)
            return len(self.logs[partition]) - 1

    def visible(self, partition: int, isolation: str) -> list[tuple[int, bytes]]:
        with self.lock:
            log = self.logs[partition]
            if isolation != READ_COMMITTED:
                return [(o, e[0]) for o, e in enumerate(log)]
            stable = next((o for o, e in enumerate(log) if e[1] == "open"), len(log))
            return [(o, e[0]) for o, e in enumerate(log[:stable]) if e[1] == "committed"]

    def end(self, partition: int, isolation: str) -> int:
        with self.lock:
            log = self.logs[partition]
            return next((o for o, e in enumerate(log) if e[1] == "open"), len(log)) if isolation == READ_COMMITTED \
                else len(log)


class FakeProducer:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.pending: list[tuple[Any, int, Any]] = []
        self.txn: list | None = None
        client.producers.append(self)

    def send(self, topic: str, partition: int, value: bytes, on_delivery: Any) -> None:
        error = self.client.script("send")
        if error is not None:
            raise FakeError(error)
        delivery_error = self.client.script("delivery")
        if delivery_error is not None:
            self.pending.append((on_delivery, -1, delivery_error))
            return
        offset = self.client.cluster.append(partition, value, self.txn)
        if not self.client.hold_acks:
            self.pending.append((on_delivery, offset, None))

    def poll(self, timeout: float) -> None:
        pending, self.pending = self.pending, []
        for on_delivery, offset, error in pending:
            on_delivery(offset, error)

    def flush(self, timeout: float) -> None:
        self.poll(0)

    def abandon(self) -> None:
        self.client.abandoned += 1

    def close(self, timeout: float) -> None:
        pass

    def init_transactions(self, timeout: float) -> None:
        self.client.inits += 1

    def begin_transaction(self) -> None:
        self.txn = []

    def _end(self, state: str, call: str) -> None:
        self.poll(0)
        error = self.client.script(call)
        if error is not None:
            raise FakeError(error)
        with self.client.cluster.lock:
            for entry in self.txn or ():
                entry[1] = state
        self.txn = None

    def commit_transaction(self, timeout: float) -> None:
        self._end("committed", "commit")

    def abort_transaction(self, timeout: float) -> None:
        self._end("aborted", "abort")


class FakeConsumer:
    def __init__(self, client: FakeClient, settings: dict[str, Any]) -> None:
        self.client = client
        self.isolation = settings["isolation.level"]
        self.group = settings["group.id"]
        self.positions: dict[TopicPartition, int] = {}
        self.listener: tuple[Any, Any, Any] | None = None

    def partitions(self, topic: str, timeout: float) -> int:
        return len(self.client.cluster.logs)

    def watermarks(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self.client.cluster.end(tp.partition, self.isolation)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.positions = {tp: 0 for tp in partitions}

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.listener = (on_assign, on_revoke, on_lost)

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        if self.listener is not None and not self.positions:  # join: everything, from the committed offsets
            tps = [TopicPartition(T, p) for p in self.client.cluster.logs]
            self.positions = {tp: max(self.client.cluster.committed.get((self.group, tp), 0), 0) for tp in tps}
            self.listener[0](tps)
        records = []
        for tp, position in self.positions.items():
            visible = [(o, v) for o, v in self.client.cluster.visible(tp.partition, self.isolation) if o >= position]
            records += [Record(tp.topic, tp.partition, o, v, 0) for o, v in visible]
            self.positions[tp] = max(position, self.client.cluster.end(tp.partition, self.isolation))
        if not records:
            threading.Event().wait(min(timeout, 0.01))
        return records[:max_records] if len(records) <= max_records else records

    def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, -1)

    def commit(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, Any]:
        self.client.cluster.committed.update({(self.group, tp): o for tp, o in offsets.items()})
        return {tp: None for tp in offsets}

    def committed(self, partitions: list[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        return {tp: self.client.cluster.committed.get((self.group, tp), -1) for tp in partitions}

    def close(self) -> None:
        if self.listener is not None and self.positions:
            self.listener[1](sorted(self.positions))


class FakeClient:
    """A client over a :class:`FakeCluster`; ``scripts[call]`` lists the failures its next calls get (None: success)."""

    name = "fake"

    def __init__(self, partitions: int = 3) -> None:
        self.cluster = FakeCluster(partitions)
        self.scripts: dict[str, list[Failure | None]] = defaultdict(list)
        self.producers: list[FakeProducer] = []
        self.hold_acks = False
        self.inits = self.abandoned = 0

    def script(self, call: str) -> Failure | None:
        return self.scripts[call].pop(0) if self.scripts[call] else None

    def producer(self, bootstrap: str, settings: Any) -> FakeProducer:
        return FakeProducer(self)

    def consumer(self, bootstrap: str, settings: Any) -> FakeConsumer:
        return FakeConsumer(self, dict(settings))

    def classify(self, error: Any) -> Failure:
        if isinstance(error, FakeError):
            return error.failure
        return error if isinstance(error, Failure) else Failure(repr(error))


def run(client: FakeClient, *parts: Any, acks: int = 50, **options: Any) -> tuple[History, Any]:
    """Run the parts until ``acks`` acknowledgements in all, then finish."""
    history = History()
    with Workload("fake:9092", T, history=history, parts=parts, seed=3, **options) as workload:
        workload.start()
        workload.await_acknowledged(acks, timeout=30)
        final = workload.finish(timeout=30, final_client=client)
    return history, final


def test_producers_readers_and_a_group_record_everything_and_pass_the_checker():
    client = FakeClient()
    history, final = run(client, Producers(count=2, client=client, rate=2000), Readers(client=client),
                         Group("g", members=1, client=client), Transactions(client=client, rate=200, abort_ratio=0.5))
    verdict = check(history, final)
    assert verdict.ok, verdict.report()
    sends = history.of(Send)
    assert {s.process for s in sends} == {"fake-p0", "fake-p1", "fake-t0"}
    assert all(s.value.startswith(f"{s.process}:") for s in sends)
    assert len(history.of(Ack)) == len(sends) and not history.of(Fail)
    assert {e.outcome for e in history.of(TxnCommit)} <= {"ok"} and history.of(TxnAbort)
    assert sorted(e.consumer for e in history.of(Assign)) == ["fake-read-committed-0", "g-fake-0"]
    assert {r.group for r in history.of(Read)} == {None, "g"}
    assert all(c.ok for c in history.of(Commit))
    assert [(g.group, g.offset) for g in final.groups] == [
        ("g", len(client.cluster.logs[p])) for p in range(3)]


def test_the_same_seed_sends_the_same_values_to_the_same_partitions():
    placements = []
    for _ in range(2):
        client = FakeClient()
        history, _ = run(client, Producers(client=client, rate=5000, records=40), acks=40)
        placements.append([(s.value, s.partition) for s in history.of(Send)])
    assert placements[0] == placements[1] and len({p for _, p in placements[0]}) == 3


def test_a_refused_send_is_a_definite_failure_and_a_fatal_error_replaces_the_producer():
    client = FakeClient()
    client.scripts["send"] = [None, Failure("MSG_SIZE_TOO_LARGE", definite=True)]
    client.scripts["delivery"] = [None, None, None, Failure("_FATAL: out of order", fatal=True)]
    history, final = run(client, Producers(client=client, rate=2000, records=20), acks=18)
    fails = {f.value: f for f in history.of(Fail)}
    assert fails["fake-p0:1"].definite and fails["fake-p0:1"].error == "MSG_SIZE_TOO_LARGE"
    assert not fails["fake-p0:4"].definite and "_FATAL" in fails["fake-p0:4"].error
    processes = [s.process for s in history.of(Send)]
    assert processes[:5] == ["fake-p0"] * 5 and processes[-1] == "fake-p0.1"  # a new client, under a new name
    assert history.of(Send)[-1].value == "fake-p0.1:19"  # the sequence goes on
    assert len(client.producers) == 2 and client.abandoned >= 1
    assert check(history, final).ok


def test_records_never_acknowledged_by_the_end_of_the_drain_are_indefinite():
    client = FakeClient()
    client.hold_acks = True  # written, never acknowledged
    history = History()
    with Workload("fake:9092", T, history=history, parts=[Producers(client=client, rate=5000, records=5)],
                  drain_s=0.2) as workload:
        workload.start()
        eventually(lambda: len(history.of(Send)) == 5, timeout=10, what="five sends")
        final = workload.finish(timeout=5, final_client=client)
    fails = history.of(Fail)
    assert len(fails) == 5 and {f.error for f in fails} == {"no acknowledgement by the end of the drain"}
    assert not any(f.definite for f in fails)
    verdict = check(history, final)
    assert verdict.ok, verdict.report()  # in the log once each: allowed


@pytest.mark.parametrize("commit, recorded, aborts, inits", [
    ([Failure("REQUEST_TIMED_OUT", retriable=True), None], ["ok"], [], 1),
    ([Failure("INVALID_PRODUCER_EPOCH", abortable=True)], ["failed"], ["ok"], 1),
    ([Failure("timed out", retriable=True)] * 3, ["unknown"], [], 2),
    ([Failure("PRODUCER_FENCED", fatal=True)], ["unknown"], [], 2),
])
def test_a_transactions_outcome_is_what_its_commit_said(commit, recorded, aborts, inits):
    client = FakeClient()
    client.scripts["commit"] = list(commit)
    history = History()
    with Workload("fake:9092", T, history=history, parts=[Transactions(client=client, rate=1000, abort_ratio=0)]) as w:
        w.start()
        w.progress(9, timeout=10)
        w.stop_producers(5)
    first = history.of(TxnCommit)[:len(recorded)]
    assert [e.outcome for e in first] == recorded and first[0].txn == "t-fake-t0#0"
    assert [e.outcome for e in history.of(TxnAbort) if e.txn == "t-fake-t0#0"] == aborts
    assert client.inits >= inits and (inits == 1) == all(s.process == "fake-t0" for s in history.of(Send))


def test_an_unfinished_read_back_says_how_far_it_got():
    client = FakeClient(partitions=1)
    for i in range(3):
        client.cluster.append(0, f"p:{i}".encode(), None)
    client.cluster.append(0, b"x:0", [])  # an open transaction: read_committed ends before it
    reads = final_read("fake:9092", [T], client=client)
    unc, rc = reads.partitions
    assert (unc.isolation, unc.end, unc.reached, [r.value for r in unc.records]) == (
        "read_uncommitted", 4, 4, ["p:0", "p:1", "p:2", "x:0"])
    assert (rc.isolation, rc.end, rc.reached, len(rc.records)) == ("read_committed", 3, 3, 3)


def test_clients_are_named_or_given_and_an_unknown_name_is_refused():
    client = FakeClient()
    assert resolve_client(client) is client
    with pytest.raises(ValueError, match="no workload client named 'kafka-python'"):
        resolve_client("kafka-python")
    with pytest.raises(TypeError, match="a workload part is"):
        Workload("fake:9092", T, parts=[object()])._build()  # type: ignore[list-item]
    one_group = Workload("fake:9092", T, parts=[Group("g", 2, client=client), Group("g", 1, client=client)])
    one_group._build()
    assert [(m.name, m.group) for m in one_group.consumers] == [("g-fake-0", "g"), ("g-fake-1", "g"), ("g-fake-2", "g")]
    with pytest.raises(ValueError, match="group 'g' is given two isolation levels"):
        Workload("fake:9092", T, parts=[Group("g", client=client),
                                        Group("g", client=client, isolation=READ_COMMITTED)])._build()
