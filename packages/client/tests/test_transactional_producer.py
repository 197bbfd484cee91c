"""The transactional producer against a fake coordinator: the state machine, the request order, every error class.

The fake (``txn_fake_broker``) checks what Kafka checks: transactional
batches only to partitions added to the transaction (before Transactions
V2), epochs, generations. End-to-end tests against josef's broker with a
read_committed consumer are in integration-tests/test_client_transactions.py.
"""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode as E
from txn_fake_broker import FakeBroker

from josef.protocol.api_keys import ApiKey
from josef.protocol.errors import ConfigError, KafkaError, KafkaTimeoutError
from josef.protocol.records import TRANSACTIONAL_BIT, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef.testing import eventually
from josef_client import (
    CommitFailedError,
    ConsumerGroupMetadata,
    FatalProducerError,
    OffsetAndMetadata,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
)
from josef_client.producer import AsyncProducer, Producer

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture
def fake():
    started: list[FakeBroker] = []

    def make(topics: dict[str, int] | None = None, **options) -> FakeBroker:
        broker = FakeBroker(topics or {"t": 2}, **options)
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.close()


def config(broker: FakeBroker, transactional_id: str | None = "tx", **extra) -> dict:
    settings = {"bootstrap.servers": broker.address, "linger.ms": 0, "retry.backoff.ms": 5, "max.block.ms": 5000}
    if transactional_id is not None:
        settings["transactional.id"] = transactional_id
    return {**settings, **{name.replace("_", "."): value for name, value in extra.items()}}


def run(coro):
    return asyncio.run(coro)


def produced(broker: FakeBroker) -> list[tuple[int, object]]:
    return broker.asked(ApiKey.PRODUCE)


# Configuration ---------------------------------------------------------------------------------


def test_transactional_id_needs_idempotence():
    with pytest.raises(ConfigError, match="transactional.id needs enable.idempotence=true"):
        AsyncProducer(bootstrap_servers="x:1", transactional_id="tx", enable_idempotence=False)
    with pytest.raises(ConfigError, match="acks=all"):  # idempotence is implied, so its conflicts are errors
        AsyncProducer(bootstrap_servers="x:1", transactional_id="tx", acks="1")
    producer = AsyncProducer(bootstrap_servers="x:1", transactional_id="tx")
    assert producer.config["transaction.timeout.ms"] == 60000 and producer._idempotent


def test_a_transactional_producer_has_no_producer_id_until_init_transactions(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        assert producer._producer.producer_id == -1 and not broker.asked(ApiKey.INIT_PRODUCER_ID)
        with pytest.raises(TransactionStateError, match=r"send\(\) on a transactional producer needs init_transactions"):
            producer.send("t", b"v", partition=0)
        producer.init_transactions()
        assert producer._producer.producer_id == 1001


# The state machine -------------------------------------------------------------------------------


def test_calls_in_the_wrong_state_say_what_is_missing(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        with pytest.raises(TransactionStateError, match=r"begin_transaction\(\) needs init_transactions\(\) first"):
            producer.begin_transaction()
        with pytest.raises(TransactionStateError, match=r"commit_transaction\(\) needs init_transactions\(\) first"):
            producer.commit_transaction()
        producer.init_transactions()
        with pytest.raises(TransactionStateError, match=r"commit_transaction\(\) needs a transaction: call begin_transaction\(\) first"):
            producer.commit_transaction()
        with pytest.raises(TransactionStateError, match=r"abort_transaction\(\) needs a transaction"):
            producer.abort_transaction()
        with pytest.raises(TransactionStateError, match=r"send\(\) needs an open transaction .* READY"):
            producer.send("t", b"v", partition=0)
        with pytest.raises(TransactionStateError, match=r"send_offsets_to_transaction\(\) needs an open transaction"):
            producer.send_offsets_to_transaction({T0: 1}, "g")
        with pytest.raises(TransactionStateError, match=r"init_transactions\(\) is not allowed in state READY"):
            producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(TransactionStateError, match=r"begin_transaction\(\) called twice"):
            producer.begin_transaction()
        producer.commit_transaction()
    assert not broker.asked(ApiKey.END_TXN)  # nothing was added: nothing to end


def test_a_plain_producer_has_no_transactions(fake):
    broker = fake()
    with Producer(config(broker, None)) as producer:
        with pytest.raises(TransactionStateError, match="transactional.id"):
            producer.init_transactions()
        with pytest.raises(TransactionStateError, match="transactional.id"):
            producer.begin_transaction()


# Committing and aborting ----------------------------------------------------------------------------


def test_init_finds_the_transaction_coordinator_and_gets_an_epoch(fake):
    broker = fake()

    async def main():
        async with AsyncProducer(config(broker, transaction_timeout_ms=12345)) as producer:
            await producer.init_transactions()
            return producer.producer_id, producer.producer_epoch

    assert run(main()) == (1001, 0)
    (version, found), = broker.asked(ApiKey.FIND_COORDINATOR)
    assert found.key_type == 1 and "tx" in ((found.key,) if version < 4 else found.coordinator_keys)
    (_, init), = broker.asked(ApiKey.INIT_PRODUCER_ID)
    assert (init.transactional_id, init.transaction_timeout.total_seconds(), init.producer_id, init.producer_epoch) == \
        ("tx", 12.345, -1, -1)


def test_commit_adds_partitions_in_one_request_before_their_batches(fake):
    broker = fake()

    async def main():
        async with AsyncProducer(config(broker)) as producer:
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.learn_topic("t")
            futures = [await producer.send("t", b"a", partition=0), await producer.send("t", b"b", partition=1)]
            futures.append(await producer.send("t", b"c", partition=0))
            await producer.commit_transaction()
            return [(m.partition, m.offset) for m in [await f for f in futures]]

    assert run(main()) == [(0, 0), (1, 0), (0, 1)]
    (_, added), = broker.asked(ApiKey.ADD_PARTITIONS_TO_TXN)  # both partitions at once, before any batch
    assert [(t.name, sorted(t.partitions)) for t in added.v3_and_below_topics] == [("t", [0, 1])]
    assert (added.v3_and_below_transactional_id, added.v3_and_below_producer_id) == ("tx", 1001)
    assert broker.values("t", 0) == [b"a", b"c"] and broker.values("t", 1) == [b"b"]
    for version, request in produced(broker):
        assert version == 11 and request.transactional_id == "tx"  # v12 would mean Transactions V2
        for partition in request.topic_data[0].partition_data:
            (_, header), = iter_batches(bytes(partition.records))
            assert header.attributes & TRANSACTIONAL_BIT and header.producer_id == 1001
    (version, end), = broker.asked(ApiKey.END_TXN)
    assert end.committed and version == 4 and broker.txns["tx"].state == "CompleteCommit"


def test_no_batch_goes_out_before_the_coordinator_added_its_partition(fake):
    broker = fake()
    broker.pause(ApiKey.ADD_PARTITIONS_TO_TXN)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        future = producer.send("t", b"v", partition=1)
        eventually(lambda: broker.asked(ApiKey.ADD_PARTITIONS_TO_TXN), 10, "AddPartitionsToTxn")
        assert not produced(broker) and not future.done()
        broker.release(ApiKey.ADD_PARTITIONS_TO_TXN)
        producer.commit_transaction()
        assert future.result(5).offset == 0
    assert broker.values("t", 1) == [b"v"]


def test_abort_fails_unsent_records_and_aborts_the_sent_ones(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        sent = producer.send("t", b"sent", partition=0)
        producer.flush()
        producer._producer._linger_s = 60  # the next record waits in its batch
        unsent = producer.send("t", b"unsent", partition=1)
        producer.abort_transaction()
        assert sent.result(1).offset == 0
        with pytest.raises(TransactionAbortedError):
            unsent.result(1)
        (_, end), = broker.asked(ApiKey.END_TXN)
        assert not end.committed
        assert broker.values("t", 0, "abort") == [b"sent"] and broker.logs[T1] == []
        producer._producer._linger_s = 0  # the producer goes on with the next transaction
        producer.begin_transaction()
        producer.send("t", b"next", partition=1)
        producer.commit_transaction()
    assert broker.values("t", 1) == [b"next"]


def test_the_sync_producer_commits_many_transactions(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        for n in range(3):
            producer.begin_transaction()
            for i in range(5):
                producer.send("t", f"{n}-{i}".encode(), key=str(i).encode())
            (producer.commit_transaction if n != 1 else producer.abort_transaction)()
    committed = sorted(broker.values("t", 0) + broker.values("t", 1))
    assert committed == sorted(f"{n}-{i}".encode() for n in (0, 2) for i in range(5))
    aborted = broker.values("t", 0, "abort") + broker.values("t", 1, "abort")  # what went out before the abort
    assert set(aborted) <= {f"1-{i}".encode() for i in range(5)}
    assert broker.values("t", 0, None) == broker.values("t", 1, None) == []  # nothing left open


# Errors ---------------------------------------------------------------------------------------------


def test_init_retries_through_coordinator_errors_and_finds_a_moved_coordinator(fake):
    broker = fake()
    broker.fail(ApiKey.FIND_COORDINATOR, E.coordinator_not_available)
    broker.fail(ApiKey.INIT_PRODUCER_ID, E.coordinator_load_in_progress, E.concurrent_transactions, E.not_coordinator)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        assert producer._producer.producer_id == 1001
    assert len(broker.asked(ApiKey.INIT_PRODUCER_ID)) == 4
    assert len(broker.asked(ApiKey.FIND_COORDINATOR)) == 3  # the first failed; NOT_COORDINATOR looked it up again


def test_init_gives_up_after_max_block_ms_and_resumes_when_called_again(fake):
    broker = fake()
    broker.fail(ApiKey.INIT_PRODUCER_ID, *[E.coordinator_load_in_progress] * 1000)
    with Producer(config(broker, max_block_ms=200)) as producer:
        with pytest.raises(KafkaTimeoutError, match="gave up InitProducerId after max.block.ms .*COORDINATOR_LOAD_IN_PROGRESS"):
            producer.init_transactions()
        broker.errors.clear()
        producer.init_transactions()
        producer.begin_transaction()


def test_authorization_failure_at_init_is_fatal(fake):
    broker = fake()
    broker.fail(ApiKey.INIT_PRODUCER_ID, E.transactional_id_authorization_failed)
    with Producer(config(broker)) as producer:
        with pytest.raises(FatalProducerError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            producer.init_transactions()
        with pytest.raises(FatalProducerError, match="close it"):
            producer.begin_transaction()


def test_a_newer_producer_fences_the_older_one(fake):
    broker = fake()
    with Producer(config(broker)) as old, Producer(config(broker)) as new:
        old.init_transactions()
        old.begin_transaction()
        old.send("t", b"zombie", partition=0)
        old.flush()
        new.init_transactions()  # the coordinator aborts the old producer's open transaction
        assert broker.values("t", 0, "abort") == [b"zombie"]
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
        for call in (old.begin_transaction, old.abort_transaction, lambda: old.send("t", b"x", partition=0)):
            with pytest.raises(ProducerFencedError):
                call()
        new.begin_transaction()
        new.send("t", b"current", partition=0)
        new.commit_transaction()
    assert broker.values("t", 0) == [b"current"]


def test_a_failed_batch_makes_the_transaction_abortable(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        broker.fail(ApiKey.PRODUCE, E.invalid_record)
        failed = producer.send("t", b"bad", partition=0)
        with pytest.raises(TransactionAbortableError, match="INVALID_RECORD") as raised:
            producer.commit_transaction()
        assert isinstance(raised.value.__cause__, KafkaError)
        with pytest.raises(KafkaError, match="INVALID_RECORD"):
            failed.result(1)
        with pytest.raises(TransactionAbortableError, match="abort_transaction"):
            producer.send("t", b"more", partition=0)
        with pytest.raises(TransactionAbortableError):
            producer.commit_transaction()
        producer.abort_transaction()
        assert producer._producer.producer_epoch == 1  # the failed batch's sequence is a gap: a new epoch
        producer.begin_transaction()
        producer.send("t", b"good", partition=0)
        producer.commit_transaction()
    assert broker.values("t", 0) == [b"good"]


def test_partitions_the_coordinator_refuses_make_the_transaction_abortable(fake):
    broker = fake()
    broker.fail(ApiKey.ADD_PARTITIONS_TO_TXN, E.concurrent_transactions, E.concurrent_transactions)  # retried
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"a", partition=0)
        producer.commit_transaction()
        broker.fail(ApiKey.ADD_PARTITIONS_TO_TXN, E.topic_authorization_failed)
        producer.begin_transaction()
        refused = producer.send("t", b"b", partition=1)
        with pytest.raises(TransactionAbortableError, match="TOPIC_AUTHORIZATION_FAILED.*t-1"):
            producer.commit_transaction()
        with pytest.raises(KafkaError, match="TOPIC_AUTHORIZATION_FAILED"):
            refused.result(1)
        producer.abort_transaction()
    assert broker.values("t", 0) == [b"a"] and broker.logs[T1] == []
    assert len(broker.asked(ApiKey.ADD_PARTITIONS_TO_TXN)) == 4


def test_end_txn_fencing_and_invalid_epoch_are_fatal(fake):
    for code in (E.invalid_producer_epoch, E.producer_fenced):
        broker = fake()
        broker.fail(ApiKey.END_TXN, code)
        with Producer(config(broker)) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("t", b"v", partition=0)
            with pytest.raises(ProducerFencedError, match=code.name.upper()):
                producer.commit_transaction()
            with pytest.raises(ProducerFencedError):
                producer.abort_transaction()


def test_commit_retries_end_txn_through_a_coordinator_move(fake):
    broker = fake()
    broker.fail(ApiKey.END_TXN, E.not_coordinator, E.concurrent_transactions)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        producer.commit_transaction()
    assert len(broker.asked(ApiKey.END_TXN)) == 3 and broker.values("t", 0) == [b"v"]


def test_an_unknown_producer_id_bumps_the_epoch_after_the_abort(fake):
    broker = fake()
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        broker.fail(ApiKey.ADD_OFFSETS_TO_TXN, E.unknown_producer_id)
        with pytest.raises(TransactionAbortableError, match="UNKNOWN_PRODUCER_ID"):
            producer.send_offsets_to_transaction({T0: 5}, "g")
        producer.abort_transaction()
        assert producer._producer.producer_epoch == 1
        bump = broker.asked(ApiKey.INIT_PRODUCER_ID)[-1][1]
        assert (bump.producer_id, bump.producer_epoch) == (1001, 0)  # KIP-360: the current id and epoch
        producer.begin_transaction()
        producer.send("t", b"w", partition=0)
        producer.commit_transaction()
    assert broker.values("t", 0) == [b"w"]


# Offsets in the transaction ---------------------------------------------------------------------------


def test_send_offsets_commits_with_the_consumer_generation(fake):
    broker = fake()
    member = ConsumerGroupMetadata("g", 5, "member-1", "instance-1")
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        producer.send_offsets_to_transaction({T0: 7, T1: OffsetAndMetadata(9, "meta")}, member)
        assert broker.committed_offsets["g"] == {}  # not before the commit
        producer.commit_transaction()
    assert broker.committed_offsets["g"] == {T0: (7, ""), T1: (9, "meta")}
    (_, added), = broker.asked(ApiKey.ADD_OFFSETS_TO_TXN)
    assert added.group_id == "g" and added.transactional_id == "tx"
    assert broker.txn_offset_members == [(5, "member-1", "instance-1")]


def test_send_offsets_with_a_group_id_and_retries_per_partition(fake):
    broker = fake()
    broker.fail(ApiKey.TXN_OFFSET_COMMIT, E.none, E.coordinator_load_in_progress)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({T0: 1, T1: 2}, "g")
        producer.commit_transaction()  # only offsets: the transaction still has to end
    first, second = [body for _, body in broker.asked(ApiKey.TXN_OFFSET_COMMIT)]
    assert [p.partition_index for p in first.topics[0].partitions] == [0, 1]
    assert [p.partition_index for p in second.topics[0].partitions] == [1]
    assert (first.generation_id, first.member_id) == (-1, "")
    assert broker.committed_offsets["g"] == {T0: (1, ""), T1: (2, "")}
    assert broker.asked(ApiKey.END_TXN)


def test_a_stale_generation_fails_the_transaction_not_the_producer(fake):
    broker = fake()
    broker.generations["g"] = 6
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(TransactionAbortableError, match="ILLEGAL_GENERATION") as raised:
            producer.send_offsets_to_transaction({T0: 1}, ConsumerGroupMetadata("g", 5, "m", None))
        assert isinstance(raised.value.__cause__, CommitFailedError)
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({T0: 1}, ConsumerGroupMetadata("g", 6, "m", None))
        producer.commit_transaction()
    assert broker.committed_offsets["g"] == {T0: (1, "")}


# Transactions V2 (KIP-890 part 2) ---------------------------------------------------------------------------


def test_transactions_v2_add_partitions_with_produce_and_bump_the_epoch_at_each_end(fake):
    broker = fake(transaction_version=2)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        for n in range(2):
            producer.begin_transaction()
            producer.send("t", f"v{n}".encode(), partition=0)
            producer.send_offsets_to_transaction({T0: n}, "g")
            producer.commit_transaction()
            assert producer._producer.producer_epoch == n + 1  # EndTxn v5 answered the next epoch
        producer.begin_transaction()
        producer.send("t", b"dropped", partition=0)
        producer.abort_transaction()
        assert producer._producer.producer_epoch == 3
    assert broker.values("t", 0) == [b"v0", b"v1"] and broker.values("t", 0, "abort") == [b"dropped"]
    assert not broker.asked(ApiKey.ADD_PARTITIONS_TO_TXN) and not broker.asked(ApiKey.ADD_OFFSETS_TO_TXN)
    assert {v for v, _ in produced(broker)} == {12}
    assert {v for v, _ in broker.asked(ApiKey.END_TXN)} == {5}
    assert {v for v, _ in broker.asked(ApiKey.TXN_OFFSET_COMMIT)} == {5}
    epochs = []
    for _, request in produced(broker):
        (_, header), = iter_batches(bytes(request.topic_data[0].partition_data[0].records))
        epochs.append((header.producer_epoch, header.base_sequence))
    assert epochs == [(0, 0), (1, 0), (2, 0)]  # each transaction a new epoch, sequences from 0


def test_a_v2_abort_before_any_batch_went_out_needs_no_end_txn(fake):
    broker = fake(transaction_version=2)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer._producer._linger_s = 60
        producer.begin_transaction()
        dropped = producer.send("t", b"never sent", partition=0)
        producer.abort_transaction()  # the coordinator never heard of this transaction
        with pytest.raises(TransactionAbortedError):
            dropped.result(1)
        assert producer._producer.producer_epoch == 0
        producer._producer._linger_s = 0
        producer.begin_transaction()
        producer.send("t", b"sent", partition=0)
        producer.commit_transaction()
    assert [body.committed for _, body in broker.asked(ApiKey.END_TXN)] == [True]
    assert broker.values("t", 0) == [b"sent"]


def test_without_transactions_v2_the_old_versions_are_kept(fake):
    broker = fake(transaction_version=1)
    with Producer(config(broker)) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("t", b"v", partition=0)
        producer.send_offsets_to_transaction({T0: 1}, "g")
        producer.commit_transaction()
        assert producer._producer.producer_epoch == 0
    assert {v for v, _ in produced(broker)} == {11}
    assert {v for v, _ in broker.asked(ApiKey.TXN_OFFSET_COMMIT)} == {4}
    assert broker.asked(ApiKey.ADD_PARTITIONS_TO_TXN) and broker.asked(ApiKey.ADD_OFFSETS_TO_TXN)
