"""The transaction coordinator's state machine on a real shard and marker channel (see txn_harness)."""

from __future__ import annotations

import anyio
import pytest
from kio.schema.errors import ErrorCode

from josef_coordinator_txn import transactions
from josef_coordinator_txn.metadata import MAX_EPOCH, TransactionState, TxnError
from txn_harness import Harness

pytestmark = pytest.mark.anyio
E = ErrorCode
S = TransactionState


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
async def h(monkeypatch):
    async with anyio.create_task_group() as tg:
        yield Harness(tg, monkeypatch)
        tg.cancel_scope.cancel()


async def error_of(operation) -> ErrorCode:
    with pytest.raises(TxnError) as raised:
        await operation
    return raised.value.code


def states(h: Harness, transactional_id: str = "tx") -> list[str]:
    return [S(value.state_id).kafka_name for key, value in h.records() if key == transactional_id and value is not None]


# InitProducerId -------------------------------------------------------------------------------------------


async def test_first_init_gives_a_new_producer_id_at_epoch_0(h):
    assert await h.init() == (1000, 0)
    [(key, value)] = h.records()
    assert key == "tx" and (value.producer_id, value.producer_epoch, value.state_id) == (1000, 0, 0)
    assert value.timeout_ms == 60_000 and value.start_ms == -1


async def test_next_init_bumps_the_epoch_and_fences_the_previous_producer(h):
    old = await h.init()
    assert await h.init() == (1000, 1)
    assert await error_of(h.add(old)) == E.producer_fenced
    assert await error_of(h.end(old)) == E.producer_fenced


async def test_init_of_a_producer_resuming_with_its_epoch(h):
    """KIP-360: the current epoch is bumped; a retry of that bump gets the same epoch again; others are fenced."""
    first = await h.init()
    assert await h.init(expected=first) == (1000, 1)
    assert await h.init(expected=first) == (1000, 1)  # a retry: the response was lost
    assert await error_of(h.init(expected=(1000, 5))) == E.producer_fenced
    assert await error_of(h.init(expected=(999, 1))) == E.producer_fenced


async def test_init_with_exhausted_epochs_moves_to_a_new_producer_id(h):
    await h.init()
    h.state().producer_epoch = MAX_EPOCH - 1
    assert await h.init() == (1001, 0)
    assert h.state().previous_producer_id == 1000


async def test_init_during_an_ongoing_transaction_aborts_it_first(h):
    old = await h.init()
    await h.add(old, ("orders", 0), ("orders", 1))
    assert await error_of(h.init()) == E.concurrent_transactions
    aborting = h.state()
    assert aborting.state == S.PREPARE_ABORT and aborting.producer_epoch == 1  # the fencing epoch
    await h.settle()
    assert h.state().state == S.COMPLETE_ABORT
    assert await h.init() == (1000, 2)
    assert states(h) == ["Empty", "Ongoing", "PrepareAbort", "CompleteAbort", "Empty"]
    marker = h.services.peers.requests[0][1]["markers"][0]
    assert (marker["producer_epoch"], marker["transaction_result"]) == (1, False)
    assert await error_of(h.end(old)) == E.producer_fenced


# AddPartitionsToTxn and verification ---------------------------------------------------------------------


async def test_add_partitions_starts_the_transaction(h):
    producer = await h.init()
    h.clock.now += 5
    await h.add(producer, ("orders", 0))
    state = h.state()
    assert state.state == S.ONGOING and state.partitions == {("orders", 0)} and state.start_ms == h.clock.now
    written = len(h.context.written)
    await h.add(producer, ("orders", 0))  # already in: answered without a write
    assert len(h.context.written) == written
    h.clock.now += 5
    await h.add(producer, ("orders", 1))
    assert h.state().partitions == {("orders", 0), ("orders", 1)} and h.state().start_ms == h.clock.now - 5


async def test_add_partitions_errors(h):
    assert await error_of(h.add((1000, 0))) == E.invalid_producer_id_mapping
    producer = await h.init()
    assert await error_of(h.add((1234, 0))) == E.invalid_producer_id_mapping
    assert await error_of(h.add((producer[0], 3))) == E.producer_fenced


async def test_verify_partitions(h):
    producer = await h.init()
    await h.add(producer, ("orders", 0))
    verify = transactions.verify_partitions
    asked = frozenset({("orders", 0), ("orders", 1)})
    assert verify(h.shard, "tx", *producer, asked) == {("orders", 0): E.none, ("orders", 1): E.transaction_abortable}
    assert set(verify(h.shard, "tx", producer[0], 9, asked).values()) == {E.producer_fenced}
    assert set(verify(h.shard, "tx", 77, 0, asked).values()) == {E.invalid_producer_id_mapping}
    assert set(verify(h.shard, "other", 77, 0, asked).values()) == {E.invalid_producer_id_mapping}


async def test_a_request_during_a_write_sees_concurrent_transactions(h):
    producer = await h.init()
    h.context.hold = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.add, producer)
        await anyio.wait_all_tasks_blocked()
        assert h.state().pending == S.ONGOING and h.state().state == S.EMPTY  # written, not committed
        assert await error_of(h.add(producer, ("orders", 1))) == E.concurrent_transactions
        assert await error_of(h.init()) == E.concurrent_transactions
        h.context.hold = False
        h.context.commit()
    assert h.state().state == S.ONGOING and not h.state().pending_transition


async def test_a_failed_write_abandons_the_transition(h):
    producer = await h.init()
    h.context.fail_appends = E.not_coordinator
    assert await error_of(h.add(producer)) == E.not_coordinator
    assert h.state().state == S.EMPTY and h.state().pending is None
    h.context.fail_appends = None
    await h.add(producer)
    assert h.state().state == S.ONGOING


# EndTxn and markers ---------------------------------------------------------------------------------------


async def test_commit_writes_markers_per_broker_then_completes(h):
    producer = await h.init()
    await h.add(producer, ("orders", 0), ("orders", 1), ("orders", 2))
    assert await h.end(producer) == (-1, -1)  # answered once PrepareCommit is written
    assert h.state().state == S.PREPARE_COMMIT
    await h.settle()
    assert states(h) == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]
    done = h.state()
    assert done.state == S.COMPLETE_COMMIT and done.partitions == set() and done.producer_epoch == 0
    sent = {node: body["markers"] for node, body in h.services.peers.requests}
    assert set(sent) == {1, 2, 3}
    assert sent[2] == [{"producer_id": 1000, "producer_epoch": 0, "transaction_result": True,
                        "topics": [{"name": "orders", "partition_indexes": [1]}], "coordinator_epoch": 7,
                        "transaction_version": 0}]


async def test_markers_of_several_transactions_share_a_request(h):
    one, two = await h.init("one"), await h.init("two")
    await h.add(one, ("orders", 0), transactional_id="one")
    await h.add(two, ("orders", 0), transactional_id="two")
    h.context.hold = True  # both PrepareCommits commit together: their markers queue before any is sent
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: h.end(one, transactional_id="one"))
        tg.start_soon(lambda: h.end(two, commit=False, transactional_id="two"))
        await anyio.wait_all_tasks_blocked()
        h.context.hold = False
        h.context.commit()
    await h.settle("one")
    await h.settle("two")
    [(node, body)] = h.services.peers.requests
    assert node == 1 and [(m["producer_id"], m["transaction_result"]) for m in body["markers"]] == [
        (one[0], True), (two[0], False)]


async def test_requests_while_markers_are_written(h):
    producer = await h.init()
    await h.add(producer)
    h.services.peers.gate = anyio.Event()
    sent = h.services.peers.sent  # the markers go out as soon as PrepareCommit commits, before EndTxn is answered
    await h.end(producer)
    await sent.wait()
    assert await error_of(h.init()) == E.concurrent_transactions
    assert await error_of(h.add(producer)) == E.concurrent_transactions
    assert await error_of(h.end(producer)) == E.concurrent_transactions
    h.services.peers.gate.set()
    await h.settle()
    assert await h.end(producer) == (-1, -1)  # a retry of the commit after it completed
    assert await error_of(h.end(producer, commit=False)) == E.invalid_txn_state


async def test_end_errors_v1(h):
    assert await error_of(h.end((1000, 0))) == E.invalid_producer_id_mapping
    producer = await h.init()
    assert await error_of(h.end(producer)) == E.invalid_txn_state  # Empty
    await h.add(producer)
    assert await error_of(h.end((producer[0], 4))) == E.producer_fenced
    assert await error_of(h.end((producer[0] + 1, 0))) == E.invalid_producer_id_mapping


async def test_a_marker_retried_on_a_new_leader(h):
    producer = await h.init()
    await h.add(producer, ("orders", 1))
    h.services.peers.errors[("orders", 1)] = [E.not_leader_or_follower]
    h.services.peers.gate = anyio.Event()
    sent = h.services.peers.sent
    await h.end(producer)
    await sent.wait()
    h.services.add_topic("orders", {0: 1, 1: 3, 2: 3})  # the leader moved while the marker was on its way
    h.services.peers.gate.set()
    await h.settle()
    assert [node for node, _ in h.services.peers.requests] == [2, 3]
    assert h.state().state == S.COMPLETE_COMMIT


async def test_markers_wait_for_an_unknown_leader_and_an_unreachable_broker(h):
    producer = await h.init()
    await h.add(producer, ("orders", 0), ("orders", 1))
    h.services.add_topic("orders", {0: -1, 1: 2})
    h.services.peers.unreachable = {2}
    sent = h.services.peers.sent
    await h.end(producer)
    await sent.wait()
    assert h.state().state == S.PREPARE_COMMIT
    h.services.add_topic("orders", {0: 1, 1: 2})
    h.services.peers.unreachable = set()
    await h.settle()
    assert h.state().state == S.COMPLETE_COMMIT
    assert {node for node, _ in h.services.peers.requests} == {1, 2}


async def test_partitions_of_a_deleted_topic_need_no_marker(h):
    h.services.add_topic("gone", {0: 1})
    producer = await h.init()
    await h.add(producer, ("gone", 0))
    del h.services.image.topics["gone"]
    await h.end(producer, commit=False)
    await h.settle()
    assert h.state().state == S.COMPLETE_ABORT and h.services.peers.requests == []


async def test_a_fenced_coordinator_stops_sending(h):
    producer = await h.init()
    await h.add(producer)
    h.services.peers.errors[("orders", 0)] = [E.transaction_coordinator_fenced]
    sent = h.services.peers.sent
    await h.end(producer)
    await sent.wait()
    await anyio.wait_all_tasks_blocked()
    assert h.state().state == S.PREPARE_COMMIT and len(h.services.peers.requests) == 1
    assert states(h)[-1] == "PrepareCommit"


async def test_a_new_coordinator_resumes_prepared_transactions(h):
    producer = await h.init()
    await h.add(producer, ("orders", 2))
    h.services.peers.gate = anyio.Event()
    sent = h.services.peers.sent
    await h.end(producer)
    await sent.wait()
    shard = h.new_shard()  # leadership moved here: the state is loaded from the partition
    assert shard.transactions["tx"].state == S.PREPARE_COMMIT
    h.services.peers.gate.set()
    await h.settle()
    assert h.state().state == S.COMPLETE_COMMIT
    assert states(h) == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]  # the old shard wrote nothing more


# Transactions V2 ------------------------------------------------------------------------------------------


async def test_v2_end_bumps_the_epoch(h):
    producer = await h.init()
    await h.add(producer, version=2)
    assert await h.end(producer, version=2) == (1000, 1)
    assert h.state().producer_epoch == 1 and h.state().last_producer_epoch == 0
    await h.settle()
    marker = h.services.peers.requests[0][1]["markers"][0]
    assert (marker["producer_epoch"], marker["transaction_version"]) == (1, 2)
    assert await h.end(producer, version=2) == (1000, 1)  # a retry, told apart by the previous epoch
    assert await error_of(h.end(producer, commit=False, version=2)) == E.invalid_txn_state
    await h.add((1000, 1), version=2)
    assert await h.end((1000, 1), commit=False, version=2) == (1000, 2)


async def test_v2_abort_with_nothing_added(h):
    producer = await h.init()
    assert await h.end(producer, commit=False, version=2) == (1000, 1)
    await h.settle()
    assert h.state().state == S.COMPLETE_ABORT and h.services.peers.requests == []
    assert await error_of(h.end((1000, 1), version=2)) == E.invalid_txn_state  # nothing to commit


async def test_v2_exhausted_epoch_moves_on_to_the_next_producer_id(h):
    await h.init()
    h.state().producer_epoch = MAX_EPOCH - 1
    await h.add((1000, MAX_EPOCH - 1), version=2)
    assert await h.end((1000, MAX_EPOCH - 1), version=2) == (1001, 0)
    marker_epoch = h.state().producer_epoch
    await h.settle()
    assert marker_epoch == MAX_EPOCH
    state = h.state()
    assert (state.producer_id, state.producer_epoch, state.previous_producer_id) == (1001, 0, 1000)
    assert await h.end((1000, MAX_EPOCH - 1), version=2) == (1001, 0)  # a retry from before the rotation


# The coordinator's own work ------------------------------------------------------------------------------


@pytest.mark.parametrize("transaction_version", [0, 2])
async def test_timed_out_transactions_are_aborted_and_their_producer_fenced(monkeypatch, transaction_version):
    async with anyio.create_task_group() as tg:
        h = Harness(tg, monkeypatch, transaction_version=transaction_version)
        producer = await h.init(timeout_ms=1000)
        await h.add(producer)
        await transactions.abort_timed_out(h.shard)
        assert h.state().state == S.ONGOING
        h.clock.now += 1001
        await transactions.abort_timed_out(h.shard)
        await h.settle()
        assert h.state().state == S.COMPLETE_ABORT
        [prepare] = [value for _, value in h.records() if value.state_id == S.PREPARE_ABORT]
        assert prepare.producer_epoch == 1  # the producer's epoch 0 is fenced
        assert await error_of(h.end(producer)) == E.producer_fenced
        assert await error_of(h.add(producer)) == E.producer_fenced
        assert await h.init() == (1000, 2)
        version = {0: 0, 2: 1}[transaction_version]
        assert {int.from_bytes(value[:2], "big") for _, value in h.context.written} == {version}
        tg.cancel_scope.cancel()


async def test_the_abort_timer_is_scheduled_and_reschedules_itself(h):
    delay, run = h.context.timers["abort-timed-out-transactions"]
    assert delay == 10.0 and h.context.timers["remove-expired-transactional-ids"][0] == 3600.0
    del h.context.timers["abort-timed-out-transactions"]
    await run()
    assert "abort-timed-out-transactions" in h.context.timers


async def test_idle_transactional_ids_expire(h):
    await h.init("idle")
    busy = await h.init("busy")
    await h.add(busy, transactional_id="busy")
    h.clock.now += 604800000
    await transactions.expire_transactional_ids(h.shard)
    assert set(h.shard.transactions) == {"busy"}
    assert h.records()[-1] == ("idle", None)
    assert h.new_shard().transactions.keys() == {"busy"}
    assert await h.init("idle") == (1002, 0)  # a new start: a new producer id
