"""The history checker on synthetic histories: each guarantee's violation is found, clean runs pass.

Every test builds a history as a workload would record it and the final
read-back a cluster would give, then asserts exactly which violations
:func:`check` reports. The clean run exercises every kind of event at once.
"""

from __future__ import annotations

import io

import pytest

from josef.protocol.topic_partition import TopicPartition
from josef.testing.history import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FinalReads,
    GroupOffset,
    History,
    LogRecord,
    PartitionRead,
    Send,
    check,
    decode_value,
    encode_value,
    value_id,
)

T = "t"
RU, RC = READ_UNCOMMITTED, READ_COMMITTED


def tp(partition: int) -> TopicPartition:
    return TopicPartition(T, partition)


def final(unc: dict[int, list], rc: dict[int, list] | None = None, *, ends: dict[int, int] | None = None,
          reached: dict[int, int] | None = None, starts: dict[int, int] | None = None,
          groups: tuple[GroupOffset, ...] = ()) -> FinalReads:
    """Read-backs of topic ``t``: ``{partition: [(offset, value[, epoch]), ...]}`` per isolation level (rc: as unc)."""
    rc = unc if rc is None else rc
    ends = ends or {}
    parts = []
    for isolation, logs in ((RU, unc), (RC, rc)):
        for partition, records in logs.items():
            end = ends.get(partition, max((r[0] for r in records), default=-1) + 1)
            parts.append(PartitionRead(topic=T, partition=partition, isolation=isolation,
                                       start=(starts or {}).get(partition, 0), end=end,
                                       reached=(reached or {}).get(partition, end), records=records))
    return FinalReads(partitions=parts, groups=groups)


def produce(h: History, process: str, partition: int, sequence: int, offset: int | None, txn: str | None = None) -> str:
    """A send, and its acknowledgement at ``offset`` (none when None)."""
    value = value_id(process, sequence)
    h.send(process, T, partition, value, txn)
    if offset is not None:
        h.ack(process, value, T, partition, offset)
    return value


def kinds(verdict) -> dict[str, int]:
    return dict(verdict.kinds())


# Values --------------------------------------------------------------------------------------------------------


def test_values_carry_their_id_through_padding_and_foreign_records_never_match():
    assert decode_value(encode_value("p-1:42")) == "p-1:42"
    padded = encode_value("p:7", 100)
    assert len(padded) == 100 and decode_value(padded) == "p:7"
    assert decode_value(b"hello").startswith("?") and decode_value(None) == "?null"
    assert decode_value(b"\xff\xfe:1").startswith("?")
    with pytest.raises(ValueError, match="cannot hold"):
        value_id("a:b", 1)


# A clean run ---------------------------------------------------------------------------------------------------


def clean_run() -> tuple[History, FinalReads]:
    """Idempotent and transactional producers, indefinite failures, two readers and a group of two, a fault."""
    h = History()
    h.nemesis("partition", [1], "from [2, 3]")
    produce(h, "p", 0, 0, 0)
    produce(h, "p", 1, 1, 0)
    produce(h, "p", 0, 2, 1)
    produce(h, "p", 1, 3, 1)
    h.fail("p", produce(h, "p", 0, 4, None), T, 0, "timed out", definite=False)  # absent: allowed
    h.fail("p", produce(h, "p", 1, 5, None), T, 1, "timed out", definite=False)  # present once: allowed
    h.fail("p", produce(h, "p", 0, 6, None), T, 0, "record too large", definite=True)
    h.txn_begin("x", "x#1")
    committed = [produce(h, "x", 0, 0, 2, "x#1"), produce(h, "x", 1, 1, 3, "x#1")]
    h.txn_commit("x", "x#1", committed, "ok")
    h.txn_begin("x", "x#2")
    aborted = [produce(h, "x", 0, 2, 4, "x#2")]
    h.txn_abort("x", "x#2", aborted, "ok")
    h.txn_begin("x", "x#3")  # its commit timed out, then committed: all of it is there
    unknown = [produce(h, "x", 0, 3, 7, "x#3"), produce(h, "x", 1, 4, 5, "x#3")]
    h.txn_commit("x", "x#3", unknown, "unknown")
    produce(h, "p", 0, 7, 6)
    h.nemesis("heal", [])
    unc = {0: [(0, "p:0", 1), (1, "p:2", 1), (2, "x:0", 1), (4, "x:2", 2), (6, "p:7", 2), (7, "x:3", 2)],
           1: [(0, "p:1", 1), (1, "p:3", 1), (2, "p:5", 1), (3, "x:1", 1), (5, "x:4", 2)]}
    rc = {0: [(0, "p:0", 1), (1, "p:2", 1), (2, "x:0", 1), (6, "p:7", 2), (7, "x:3", 2)],
          1: [(0, "p:1", 1), (1, "p:3", 1), (2, "p:5", 1), (3, "x:1", 1), (5, "x:4", 2)]}
    h.assign("rc", [tp(0), tp(1)])
    for partition in (0, 1):
        for offset, value, epoch in rc[partition]:
            h.read("rc", RC, T, partition, offset, value, epoch)
    h.assign("ru", [tp(0)])
    for offset, value, epoch in unc[0]:
        h.read("ru", RU, T, 0, offset, value, epoch)
    # A group of two: m2 gives partition 1 up to m1 in a rebalance.
    h.assign("m1", [tp(0)], group="g")
    h.assign("m2", [tp(1)], group="g")
    for offset, value, epoch in rc[0][:2]:
        h.read("m1", RC, T, 0, offset, value, epoch, group="g")
    h.commit("g", "m1", T, 0, 2, True)
    for offset, value, epoch in rc[1][:2]:
        h.read("m2", RC, T, 1, offset, value, epoch, group="g")
    h.commit("g", "m2", T, 1, 2, True)
    h.revoke("m1", [tp(0)], group="g")
    h.revoke("m2", [tp(1)], group="g")
    h.assign("m1", [tp(0), tp(1)], group="g")
    for offset, value, epoch in rc[0][2:]:
        h.read("m1", RC, T, 0, offset, value, epoch, group="g")
    h.commit("g", "m1", T, 0, 8, True)
    h.read("m1", RC, T, 1, 1, "p:3", 1, group="g")  # the rebalance made it read offset 1 again: allowed
    for offset, value, epoch in rc[1][2:]:
        h.read("m1", RC, T, 1, offset, value, epoch, group="g")
    h.commit("g", "m1", T, 1, 1, False, "REBALANCE_IN_PROGRESS")  # failed commits do not count
    h.commit("g", "m1", T, 1, 6, True)
    groups = (GroupOffset(group="g", topic=T, partition=0, offset=8, isolation=RC),
              GroupOffset(group="g", topic=T, partition=1, offset=6, isolation=RC))
    return h, final(unc, rc, ends={0: 9, 1: 7}, groups=groups)


def test_a_clean_history_passes_with_its_summary():
    h, reads = clean_run()
    verdict = check(h, reads)
    assert verdict.ok, verdict.report()
    report = verdict.report()
    assert report.startswith("history check: OK")
    assert "sent 13, acknowledged 10, failed 1 for sure and 2 maybe (indefinite)" in report
    assert "transactions 1 committed, 1 aborted, 1 unknown" in report
    assert "read 27 records by 4 consumer(s); 5 offset commits (1 failed); 3 group assignments" in report
    assert "t-0: 6 acknowledged, 6 / 5 in the log, 0..9" in report
    assert "group g committed t-1 at 6" in report
    assert "2 fault events" in report


def test_a_transaction_of_unknown_outcome_may_be_absent_whole():
    h = History()
    h.txn_begin("x", "x#1")
    values = [produce(h, "x", 0, 0, 0, "x#1"), produce(h, "x", 1, 1, 0, "x#1")]
    h.txn_commit("x", "x#1", values, "unknown")
    h.txn_abort("x", "x#1", values, "unknown")
    verdict = check(h, final({0: [(0, "x:0")], 1: [(0, "x:1")]}, {0: [], 1: []}, ends={0: 2, 1: 2}))
    assert verdict.ok, verdict.report()
    assert "0 committed, 0 aborted, 1 unknown" in verdict.report()


# Each violation ------------------------------------------------------------------------------------------------


def test_an_acknowledged_record_missing_from_the_log_is_lost():
    h = History()
    produce(h, "p", 0, 0, 0)
    produce(h, "p", 0, 1, 1)
    produce(h, "p", 0, 2, 2)
    verdict = check(h, final({0: [(0, "p:0"), (2, "p:2")]}))
    assert kinds(verdict) == {"lost": 1}
    [lost] = verdict.violations
    assert lost.tp == tp(0) and lost.offset == 1
    assert "acknowledged p:1 at t-0@1 is not in the log: no record is at that offset" in lost.message


def test_an_acknowledged_record_at_another_offset_or_below_the_log_start_is_lost():
    h = History()
    produce(h, "p", 0, 0, 0)
    produce(h, "p", 0, 1, 1)
    verdict = check(h, final({0: [(2, "p:1")]}, starts={0: 1}))
    assert kinds(verdict) == {"lost": 2}
    messages = [v.message for v in verdict.violations]
    assert "acknowledged p:0 at t-0@0 is below the log start offset 1" in messages
    assert "acknowledged p:1 at t-0@1 is not in the log: no record is at that offset; it is at t-0@2" in messages


def test_a_record_twice_in_the_log_is_a_duplicate_and_an_indefinite_failure_may_be_there_once():
    h = History()
    produce(h, "p", 0, 0, 0)
    h.fail("p", produce(h, "p", 0, 1, None), T, 0, "timed out", definite=False)
    h.fail("p", produce(h, "p", 0, 2, None), T, 0, "timed out", definite=False)
    assert check(h, final({0: [(0, "p:0"), (1, "p:1")]})).ok
    verdict = check(h, final({0: [(0, "p:0"), (1, "p:1"), (2, "p:1")]}))
    assert kinds(verdict) == {"duplicate": 1}
    assert verdict.violations[0].message == "p:1 is at 2 places: t-0@1, t-0@2"


def test_a_record_its_producer_wrote_again_under_a_newer_epoch_is_reported_apart_and_tolerated():
    """CI's shape (librdkafka#4953): 455 and 456 written in epoch 0, their answers lost, then both renumbered from
    sequence 0 after an epoch bump and written again: the client's copies, neither duplicates nor out of order."""
    h = History()
    produce(h, "q", 0, 0, 0)
    for sequence, offset in ((455, 3), (456, 4)):
        value = produce(h, "p", 0, sequence, offset)
        h.read("c", RU, T, 0, offset - 3 + 1, value)
    log = [(0, "q:0", 0, 7, 0, 0), (1, "p:455", 0, 5, 0, 455), (2, "p:456", 0, 5, 0, 456),
           (3, "p:455", 0, 5, 1, 0), (4, "p:456", 0, 5, 1, 1)]
    verdict = check(h, final({0: log}))
    assert verdict.ok
    assert kinds(verdict) == {"resent": 2}
    assert verdict.of("resent")[0].message == (
        "p:455 was written again by its producer under a newer epoch: t-0@1 (producer 5 epoch 0 sequence 455), "
        "t-0@3 (producer 5 epoch 1 sequence 0)")
    assert verdict.report().startswith("history check: OK; 2 record(s) resent by their producer")
    # The same copies under one producer epoch are the broker's: a duplicate, and out of the producer's order.
    same_epoch = [(o, v, e, pid, 0, seq) for o, v, e, pid, _, seq in log]
    assert kinds(check(h, final({0: same_epoch}))) == {"duplicate": 2, "order": 1}
    # So are copies without producer fields (a read-back that could not ask the leaders).
    assert kinds(check(h, final({0: [r[:3] for r in log]}))) == {"duplicate": 2, "order": 1}


def test_an_acknowledged_record_read_back_at_a_second_offset_is_a_duplicate():
    h = History()
    produce(h, "p", 0, 0, 0)
    h.read("c", RU, T, 0, 0, "p:0")
    h.read("c", RU, T, 0, 1, "p:0")  # a reader saw it again, where the log now holds nothing
    verdict = check(h, final({0: [(0, "p:0")]}, ends={0: 2}))
    assert kinds(verdict) == {"duplicate": 1, "disagreement": 1}
    assert verdict.of("disagreement")[0].message == ("readers disagree on t-0@1: the final read has no record there; "
                                                     "c saw p:0 (epoch -1)")


def test_a_record_that_failed_for_sure_must_not_be_in_the_log():
    h = History()
    h.fail("p", produce(h, "p", 0, 0, None), T, 0, "MSG_SIZE_TOO_LARGE", definite=True)
    verdict = check(h, final({0: [(0, "p:0")]}))
    assert kinds(verdict) == {"failed-present": 1}
    assert "failed for sure (MSG_SIZE_TOO_LARGE) yet is at t-0@0" in verdict.violations[0].message


def test_a_producers_records_out_of_send_order_are_reported_once_per_producer():
    h = History()
    produce(h, "p", 0, 0, 1)
    produce(h, "p", 0, 1, 0)
    produce(h, "q", 0, 0, 2)
    produce(h, "p", 0, 2, 4)
    produce(h, "p", 0, 3, 3)
    verdict = check(h, final({0: [(0, "p:1"), (1, "p:0"), (2, "q:0"), (3, "p:3"), (4, "p:2")]}))
    assert kinds(verdict) == {"order": 1}
    assert verdict.violations[0].message == "p sent p:0 before p:1, but the log has it after: t-0@1 follows t-0@0"


def test_a_record_never_sent_is_a_phantom_whether_read_or_in_the_log():
    h = History()
    produce(h, "p", 0, 0, 0)
    h.read("c", RU, T, 0, 1, "?b'planted'")
    verdict = check(h, final({0: [(0, "p:0"), (1, "?b'planted'"), (2, "z:9")]}))
    assert kinds(verdict) == {"phantom": 2}
    assert "c read ?b'planted' at t-0@1, which was never sent" in verdict.violations[0].message


def test_readers_that_disagree_with_the_log_or_its_leader_epoch_are_reported():
    h = History()
    produce(h, "p", 0, 0, 0)
    produce(h, "p", 0, 1, 1)
    h.read("a", RU, T, 0, 0, "p:0", 3)
    h.read("b", RU, T, 0, 0, "p:0", 4)  # the same record in another epoch: rewritten since
    h.read("a", RU, T, 0, 1, "p:1", 3)
    verdict = check(h, final({0: [(0, "p:0", 3), (1, "p:1", 3)]}, {0: [(0, "p:0", 3), (1, "p:0", 3)]}))
    assert kinds(verdict) == {"disagreement": 2, "duplicate": 1}
    messages = sorted(v.message for v in verdict.of("disagreement"))
    assert messages[0] == ("readers disagree on t-0@0: the final read saw p:0 (epoch 3); b saw p:0 (epoch 4)")
    assert "the final read_committed read saw p:0 (epoch 3)" in messages[1]


def test_two_records_acknowledged_at_one_offset_and_epochs_going_back_are_split_brain():
    h = History()
    produce(h, "p", 0, 0, 0)
    produce(h, "q", 0, 0, 0)  # an isolated leader acknowledged q:0 at the same offset
    produce(h, "p", 0, 1, 1)
    verdict = check(h, final({0: [(0, "p:0", 5), (1, "p:1", 4)]}))
    assert kinds(verdict) == {"split-brain": 1, "epoch-regression": 1, "lost": 1}
    assert "two different records acknowledged at t-0@0: p:0 and q:0" in [v.message for v in verdict.violations]


def test_read_committed_never_sees_an_aborted_transaction():
    h = History()
    h.txn_begin("x", "x#1")
    values = [produce(h, "x", 0, 0, 0, "x#1")]
    h.txn_commit("x", "x#1", values, "failed")  # surely not committed
    h.txn_abort("x", "x#1", values, "unknown")
    h.read("c", RC, T, 0, 0, "x:0")
    verdict = check(h, final({0: [(0, "x:0")]}, {0: [(0, "x:0")]}, ends={0: 2}))
    assert kinds(verdict) == {"aborted-read": 2}
    assert "c (read_committed) read x:0 of aborted transaction x#1 at t-0@0" in verdict.violations[0].message


def test_a_committed_transaction_is_all_or_nothing_in_the_read_committed_log():
    h = History()
    h.txn_begin("x", "x#1")
    values = [produce(h, "x", 0, 0, 0, "x#1"), produce(h, "x", 1, 1, 0, "x#1")]
    h.txn_commit("x", "x#1", values, "ok")
    h.txn_begin("x", "x#2")
    maybe = [produce(h, "x", 0, 2, 2, "x#2"), produce(h, "x", 1, 3, 2, "x#2")]
    h.txn_commit("x", "x#2", maybe, "unknown")
    unc = {0: [(0, "x:0"), (2, "x:2")], 1: [(0, "x:1"), (2, "x:3")]}
    verdict = check(h, final(unc, {0: [(0, "x:0"), (2, "x:2")], 1: []}, ends={0: 4, 1: 4}))
    assert kinds(verdict) == {"txn-partial": 2}
    messages = sorted(v.message for v in verdict.violations)
    assert messages[0] == "committed transaction x#1: the read_committed log lacks x:1 (t-1@0) but holds x:0 (t-0@0)"
    assert messages[1] == "unknown transaction x#2: the read_committed log lacks x:3 (t-1@2) but holds x:2 (t-0@2)"


def test_a_read_committed_consumer_that_skips_part_of_a_committed_transaction_is_caught():
    h = History()
    h.txn_begin("x", "x#1")
    values = [produce(h, "x", 0, i, i, "x#1") for i in range(3)]
    h.txn_commit("x", "x#1", values, "ok")
    produce(h, "p", 0, 0, 4)
    h.assign("c", [tp(0)])
    h.read("c", RC, T, 0, 0, "x:0")
    h.read("c", RC, T, 0, 2, "x:2")  # x:1 at offset 1 skipped
    h.read("c", RC, T, 0, 4, "p:0")  # the marker at 3 is no record: no gap
    h.assign("c", [tp(0)])  # a new assignment may start anywhere
    h.read("c", RC, T, 0, 4, "p:0")
    logs = {0: [(0, "x:0"), (1, "x:1"), (2, "x:2"), (4, "p:0")]}
    verdict = check(h, final(logs))
    assert kinds(verdict) == {"txn-partial": 1}
    assert verdict.violations[0].message == ("c (read_committed) read t-0@0 then t-0@2, skipping 1 record(s) the log "
                                             "holds, first x:1 of committed transaction x#1 at offset 1")


def test_a_read_uncommitted_consumer_that_skips_a_record_is_caught():
    h = History()
    for i in range(3):
        produce(h, "p", 0, i, i)
    h.read("c", RU, T, 0, 0, "p:0")
    h.read("c", RU, T, 0, 2, "p:2")
    verdict = check(h, final({0: [(0, "p:0"), (1, "p:1"), (2, "p:2")]}))
    assert kinds(verdict) == {"skipped": 1}


def test_committed_offsets_never_go_back_while_a_member_owns_the_partition():
    h = History()
    h.assign("m1", [tp(0)], group="g")
    h.commit("g", "m1", T, 0, 5, True)
    h.commit("g", "m1", T, 0, 3, False, "ILLEGAL_GENERATION")  # a failed commit does not count
    h.commit("g", "m1", T, 0, 4, True)
    h.revoke("m1", [tp(0)], group="g")
    h.assign("m1", [tp(0)], group="g")
    h.commit("g", "m1", T, 0, 2, True)  # owning it anew: from the committed offset it got
    verdict = check(h, final({0: []}))
    assert kinds(verdict) == {"offset-regression": 1}
    assert verdict.violations[0].message == "m1 of group g committed t-0 at 4 after 5, owning it throughout"


def test_a_group_that_missed_records_or_did_not_commit_to_the_end_is_reported():
    h = History()
    for i in range(3):
        produce(h, "p", 0, i, i)
    h.assign("m1", [tp(0)], group="g")
    h.read("m1", RU, T, 0, 0, "p:0", group="g")
    h.read("c", RU, T, 0, 1, "p:1")  # another consumer, not of the group
    h.commit("g", "m1", T, 0, 1, True)
    groups = (GroupOffset(group="g", topic=T, partition=0, offset=1),)
    verdict = check(h, final({0: [(0, "p:0"), (1, "p:1"), (2, "p:2")]}, groups=groups))
    assert kinds(verdict) == {"group-lag": 1, "group-missed": 1}
    messages = [v.message for v in verdict.violations]
    assert "group g committed t-0 at 1, but the read_uncommitted log has records up to offset 2" in messages
    assert "group g never consumed 2 of the 3 records of t-0, first p:1 at offset 1" in messages


def test_an_incomplete_read_back_is_reported_and_only_what_it_reached_is_judged():
    h = History()
    produce(h, "p", 0, 0, 0)
    produce(h, "p", 0, 1, 1)
    produce(h, "p", 1, 2, 0)
    verdict = check(h, FinalReads(partitions=[
        PartitionRead(topic=T, partition=0, isolation=RU, start=0, end=2, reached=1, records=[(0, "p:0")])]))
    assert kinds(verdict) == {"unreadable": 2}
    assert "the final read_uncommitted read of t-0 reached offset 1 of 2" in verdict.violations[0].message
    assert "t-1 was written or read but never read back at the end" in verdict.violations[1].message


# The report ----------------------------------------------------------------------------------------------------


def test_the_report_names_the_first_violation_with_its_records_and_the_faults_around_it():
    h = History()
    produce(h, "p", 0, 0, 0)
    h.nemesis("partition", [2], "from [1, 3]")
    produce(h, "p", 0, 1, 1)  # lost: the first violation by time
    produce(h, "p", 0, 2, 2)
    h.nemesis("heal", [])
    produce(h, "p", 0, 3, 3)
    h.read("c", RU, T, 0, 3, "p:3")
    h.read("c", RU, T, 0, 3, "p:2")  # a later disagreement
    verdict = check(h, final({0: [(0, "p:0", 1), (2, "p:2", 1), (3, "p:3", 2)]}))
    assert not verdict.ok
    assert [v.kind for v in verdict.violations] == ["lost", "duplicate", "disagreement"]
    report = verdict.report()
    lines = report.splitlines()
    assert lines[0] == "history check: FAILED, 3 violation(s): disagreement x1, duplicate x1, lost x1"
    first = lines.index("first violation: [lost] acknowledged p:1 at t-0@1 is not in the log: no record is at that "
                        "offset")
    context = "\n".join(lines[first:])
    assert "+0.000s #3 send process=p topic=t partition=0 value=p:1" in context
    assert "#4 ack process=p value=p:1 topic=t partition=0 offset=1" in context
    assert ("the final read_uncommitted log of t-0 around offset 1: 0=p:0(epoch 1), 2=p:2(epoch 1), 3=p:3(epoch 2)"
            in context)
    assert "nemesis action=partition nodes=(2,) detail=from [1, 3]" in context
    assert "nemesis action=heal" in context
    assert "other violations:\n  [duplicate] p:2 is at 2 places: t-0@2, t-0@3\n  [disagreement] readers" in report


# Recording -----------------------------------------------------------------------------------------------------


def test_a_history_and_its_read_back_survive_json_and_check_the_same(tmp_path):
    h, reads = clean_run()
    h.commit("g", "m1", T, 0, 3, True)  # a regression, to compare a failing verdict too
    h.dump(tmp_path / "history.jsonl")
    reads.dump(tmp_path / "final.json")
    loaded, loaded_reads = History.load(tmp_path / "history.jsonl"), FinalReads.load(tmp_path / "final.json")
    assert loaded.events == h.events
    assert loaded_reads == reads
    assert check(loaded, loaded_reads).report() == check(h, reads).report()
    assert kinds(check(loaded, loaded_reads)) == {"offset-regression": 1}
    with pytest.raises(ValueError, match="line 2 of the history is not an event: unknown history event kind 'boom'"):
        History.load(io.StringIO('{"kind": "nemesis", "seq": 0, "mono": 1, "wall": 1, "action": "kill", "nodes": [1]}\n'
                                 '{"kind": "boom"}\n'))


def test_a_history_with_a_log_file_writes_each_event_as_it_happens(tmp_path):
    path = tmp_path / "live.jsonl"
    h = History(log=path)
    h.send("p", T, 0, "p:0")
    h.nemesis("kill", [3])
    h.close()
    assert [e.kind for e in History.load(path).events] == ["send", "nemesis"]


def test_recording_is_thread_safe_and_numbers_events_in_order():
    import threading

    h = History()

    def send(n: int) -> None:
        for i in range(500):
            h.send(f"p{n}", T, 0, value_id(f"p{n}", i))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    events = h.of(Send)
    assert [e.seq for e in events] == list(range(2000))
    assert all(a.mono <= b.mono for a, b in zip(events, events[1:]))


def test_faults_are_recorded_through_the_listener_and_bad_input_is_refused():
    class Fault:  # what josef.testing.faults.FaultEvent carries
        action, nodes, detail = "partition-one-way", (1, 2), "from [3]"

    h = History()
    h.on_fault(Fault())
    assert h.events[0].describe() == "#0 nemesis action=partition-one-way nodes=(1, 2) detail=from [3]"
    with pytest.raises(ValueError, match="isolation level"):
        h.read("c", "read_dirty", T, 0, 0, "p:0")
    with pytest.raises(ValueError, match="transaction outcome"):
        h.txn_commit("x", "x#1", [], "maybe")
    assert LogRecord(1, "p:0") == (1, "p:0", -1, -1, -1, -1)
