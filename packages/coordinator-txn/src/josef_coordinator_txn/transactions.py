"""What the transaction coordinator does with a request, as Kafka's TransactionCoordinator does it.

Each operation reads a transactional id's metadata, decides synchronously
(preparing a transition, which marks the id pending), writes the transition
to the shard's partition and completes it. Errors are raised as
:class:`~josef_coordinator_txn.metadata.TxnError` carrying the code the
client is told.

Ending a transaction takes two writes: Prepare* (the client is answered once
it is committed), then the markers on every partition of the transaction,
then Complete* (:func:`write_completion`). Until then the id stays pending,
so the producer's next InitProducerId or AddPartitionsToTxn is answered
CONCURRENT_TRANSACTIONS and retried, as with Kafka.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import CoordinatorError, PendingWrite
from josef_coordinator_txn.markers import RETRY_BACKOFF_S, PendingCompletion
from josef_coordinator_txn.metadata import (
    MAX_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TV_2,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
    TxnError,
    TxnTransit,
    is_epoch_exhausted,
)
from josef_coordinator_txn.records import Partitions, encode_key

if TYPE_CHECKING:
    from josef_coordinator_txn.shard import TransactionShard

log = logging.getLogger(__name__)

S = TransactionState
E = ErrorCode
_DONE = (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
_PREPARED = (S.PREPARE_COMMIT, S.PREPARE_ABORT)
#: (producer id, epoch) of an answer that carries none (InitProducerId errors, EndTxn before V2).
NO_PRODUCER = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)


def _illegal(metadata: TransactionMetadata) -> IllegalTransitionError:
    return IllegalTransitionError(f"{metadata.transactional_id} is in state {metadata.state.kafka_name}, "
                                  "which no request should ever find")


def _invalid_state(metadata: TransactionMetadata, commit: bool) -> TxnError:
    return TxnError(E.invalid_txn_state, f"{metadata.transactional_id} is {metadata.state.kafka_name}: "
                                         f"cannot {'commit' if commit else 'abort'}")


# InitProducerId ------------------------------------------------------------------------------------------


async def init_producer_id(shard: TransactionShard, transactional_id: str, timeout_ms: int,
                           expected: tuple[int, int] | None) -> tuple[int, int]:
    """The producer id and epoch of a (re)starting transactional producer.

    ``expected`` is the producer's current id and epoch (KIP-360, v3+) when
    it resumes after an error rather than starting afresh. A new producer
    fences the previous one: an ongoing transaction of the previous instance
    is aborted first (its epoch bumped), and this request is answered
    CONCURRENT_TRANSACTIONS so that the client retries once the abort is
    complete, when it gets the next epoch.
    """
    metadata = shard.transaction(transactional_id)
    if metadata is None:
        producer_id = await shard.generate_producer_id()
        metadata = shard.put_if_absent(TransactionMetadata(transactional_id, producer_id, timeout_ms, clock.now_ms()))
    new_producer_id = NO_PRODUCER_ID
    if _rotates(metadata, expected):
        new_producer_id = await shard.generate_producer_id()
    # Other requests may have run while ids were generated: decide on the state as it is now.
    current = shard.transaction(transactional_id)
    if current is None:
        raise TxnError(E.concurrent_transactions, f"{transactional_id} expired while its producer id was chosen")
    transit = _prepare_init(current, timeout_ms, expected, new_producer_id)
    if transit.state == S.PREPARE_EPOCH_FENCE:
        await end_transaction(shard, transactional_id, transit.producer_id, transit.producer_epoch, commit=False,
                              from_client=False, client_transaction_version=shard.server_transaction_version())
        raise TxnError(E.concurrent_transactions, f"{transactional_id}: aborting the previous producer's transaction")
    error = await shard.append(current, transit)
    if error != E.none:
        raise TxnError(error)
    log.info("initialized transactional id %r with producer id %d and epoch %d on %s", transactional_id,
             transit.producer_id, transit.producer_epoch, shard.context.tp)
    return transit.producer_id, transit.producer_epoch


def _rotates(metadata: TransactionMetadata, expected: tuple[int, int] | None) -> bool:
    """Whether InitProducerId will move the id to a new producer id (its epochs are used up)."""
    return (metadata.state in _DONE and not metadata.pending_transition and metadata.producer_epoch_exhausted
            and (expected is None or expected[1] == metadata.producer_epoch))


def _prepare_init(metadata: TransactionMetadata, timeout_ms: int, expected: tuple[int, int] | None,
                  new_producer_id: int) -> TxnTransit:
    if metadata.pending_transition:
        raise TxnError(E.concurrent_transactions)
    if expected is not None and not _valid_expected_producer(metadata, *expected):
        raise TxnError(E.producer_fenced, f"{metadata.transactional_id}: producer {expected} is not the current one")
    if metadata.state in _PREPARED:
        raise TxnError(E.concurrent_transactions)
    if metadata.state in _DONE:
        if _rotates(metadata, expected):
            if new_producer_id == NO_PRODUCER_ID:
                raise TxnError(E.concurrent_transactions)
            return metadata.prepare_producer_id_rotation(new_producer_id, timeout_ms, clock.now_ms(),
                                                         record_last_epoch=expected is not None)
        return metadata.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1],
                                                         clock.now_ms())
    if metadata.state == S.ONGOING:
        # The epoch this returns is never given to a client: the abort uses it to fence the previous producer.
        return metadata.prepare_fence_producer_epoch()
    raise _illegal(metadata)


def _valid_expected_producer(metadata: TransactionMetadata, producer_id: int, epoch: int) -> bool:
    """Kafka's isValidProducerId: a new id, the current id, or a retry of the rotation away from an exhausted one."""
    return (metadata.producer_epoch == NO_PRODUCER_EPOCH or producer_id == metadata.producer_id
            or (producer_id == metadata.previous_producer_id and is_epoch_exhausted(epoch)))


# AddPartitionsToTxn, AddOffsetsToTxn ----------------------------------------------------------------------


async def add_partitions(shard: TransactionShard, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: Partitions, client_transaction_version: int) -> None:
    """Add partitions to the producer's transaction, starting it if none is ongoing."""
    metadata = shard.transaction(transactional_id)
    if metadata is None:
        raise TxnError(E.invalid_producer_id_mapping, f"{transactional_id} is not known")
    if metadata.producer_id != producer_id:
        if producer_id == metadata.next_producer_id and metadata.pending_transition:
            # A V2 producer already moved to the id its exhausted epoch rotates to: let it wait for the rotation.
            raise TxnError(E.concurrent_transactions)
        raise TxnError(E.invalid_producer_id_mapping,
                       f"{transactional_id} has producer id {metadata.producer_id}, not {producer_id}")
    if metadata.producer_epoch != producer_epoch:
        raise TxnError(E.producer_fenced,
                       f"{transactional_id} has producer epoch {metadata.producer_epoch}, not {producer_epoch}")
    if metadata.pending_transition or metadata.state in _PREPARED:
        raise TxnError(E.concurrent_transactions)
    if metadata.state == S.ONGOING and partitions <= metadata.partitions:
        return
    transit = metadata.prepare_add_partitions(partitions, clock.now_ms(), client_transaction_version)
    error = await shard.append(metadata, transit)
    if error != E.none:
        raise TxnError(error)


def verify_partitions(shard: TransactionShard, transactional_id: str, producer_id: int, producer_epoch: int,
                      partitions: Partitions) -> dict[tuple[str, int], ErrorCode]:
    """KIP-890: whether each partition is in the producer's transaction (a leader asks before a transactional write).

    Pending transitions are not looked at: partitions join once their
    AddPartitionsToTxn is written and leave once the end marker is.
    """
    metadata = shard.transaction(transactional_id)
    error = E.none
    if metadata is None or metadata.producer_id != producer_id:
        error = E.invalid_producer_id_mapping
    elif metadata.producer_epoch != producer_epoch:
        error = E.producer_fenced
    elif metadata.state in _PREPARED:
        error = E.concurrent_transactions
    if error != E.none:
        return dict.fromkeys(partitions, error)
    assert metadata is not None
    return {tp: E.none if tp in metadata.partitions else E.transaction_abortable for tp in partitions}


# EndTxn --------------------------------------------------------------------------------------------------


async def end_transaction(shard: TransactionShard, transactional_id: str, producer_id: int, producer_epoch: int, *,
                          commit: bool, from_client: bool, client_transaction_version: int) -> tuple[int, int]:
    """Commit or abort; returns the producer id and epoch a Transactions V2 client goes on with (else -1, -1).

    Answered once Prepare* is committed; the markers and Complete* follow.
    ``from_client`` is False for the coordinator's own aborts (a fenced or
    timed-out producer), whose producer is fenced with a bumped epoch.
    """
    metadata = shard.transaction(transactional_id)
    if metadata is None:
        raise TxnError(E.invalid_producer_id_mapping, f"{transactional_id} is not known")
    v2 = client_transaction_version >= TV_2
    next_producer_id = NO_PRODUCER_ID
    if v2 and metadata.producer_epoch_exhausted and metadata.pending is None and metadata.state not in _PREPARED:
        next_producer_id = await shard.generate_producer_id()
        metadata = shard.transaction(transactional_id)
        if metadata is None:
            raise TxnError(E.invalid_producer_id_mapping, f"{transactional_id} expired meanwhile")
    fencing = metadata.pending == S.PREPARE_EPOCH_FENCE
    try:
        if v2:
            decided = _decide_end_v2(metadata, producer_id, producer_epoch, commit, from_client, next_producer_id)
        else:
            decided = _decide_end_v1(metadata, producer_id, producer_epoch, commit, from_client)
    except TxnError:
        if metadata.pending == S.PREPARE_EPOCH_FENCE:
            metadata.pending = None  # the fence goes nowhere: leave the transaction as it was
        raise
    if isinstance(decided, tuple):
        return decided
    error = await shard.append(metadata, decided)
    if error != E.none:
        if fencing and shard.owns(metadata):
            # The bumped epoch may never have been written: the next fence must not bump it again.
            metadata.has_failed_epoch_fence = True
            log.warning("%s: fencing epoch %d could not be written (%s)", transactional_id, decided.producer_epoch,
                        error.name)
        raise TxnError(error)
    # Prepare* is committed: the shard has sent its markers (it does whenever a Prepare* commits).
    if not v2:
        return NO_PRODUCER
    if metadata.next_producer_id != NO_PRODUCER_ID:
        return metadata.next_producer_id, 0
    return metadata.producer_id, metadata.producer_epoch


def _decide_end_v1(metadata: TransactionMetadata, producer_id: int, producer_epoch: int, commit: bool,
                   from_client: bool) -> TxnTransit | tuple[int, int]:
    """Transactions V1 (EndTxn v0-v4): the epoch stays; only the exact epoch of the producer may end its transaction."""
    if metadata.producer_id != producer_id:
        raise TxnError(E.invalid_producer_id_mapping)
    if (from_client and producer_epoch != metadata.producer_epoch) or producer_epoch < metadata.producer_epoch:
        raise TxnError(E.producer_fenced)
    if metadata.pending_transition and metadata.pending != S.PREPARE_EPOCH_FENCE:
        raise TxnError(E.concurrent_transactions)
    state = metadata.state
    if state == S.ONGOING:
        if not commit and metadata.pending == S.PREPARE_EPOCH_FENCE:
            metadata.pending = None
            metadata.producer_epoch = producer_epoch
            metadata.last_producer_epoch = NO_PRODUCER_EPOCH
        return metadata.prepare_abort_or_commit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, 0, NO_PRODUCER_ID,
                                                clock.now_ms(), no_partition_added=False)
    return _answer_for_finished(metadata, commit, retry=True, answer=NO_PRODUCER)


def _answer_for_finished(metadata: TransactionMetadata, commit: bool, *, retry: bool,
                         answer: tuple[int, int]) -> tuple[int, int]:
    """EndTxn for a transaction that is ending or has ended: a retry succeeds, anything else is refused."""
    state = metadata.state
    if state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        if retry and (state == S.COMPLETE_COMMIT) == commit:
            return answer
        raise _invalid_state(metadata, commit)
    if state in _PREPARED:
        if (state == S.PREPARE_COMMIT) == commit:
            raise TxnError(E.concurrent_transactions)
        raise _invalid_state(metadata, commit)
    if state == S.EMPTY:
        raise _invalid_state(metadata, commit)
    raise _illegal(metadata)


def _decide_end_v2(metadata: TransactionMetadata, producer_id: int, producer_epoch: int, commit: bool,
                   from_client: bool, next_producer_id: int) -> TxnTransit | tuple[int, int]:
    """Transactions V2 (EndTxn v5+): every end bumps the epoch, so a retry is told apart by the epoch it carries."""
    fencing = metadata.pending == S.PREPARE_EPOCH_FENCE
    retry_on_overflow = (not fencing and metadata.previous_producer_id == producer_id
                         and producer_epoch == MAX_EPOCH - 1 and metadata.producer_epoch == 0)
    retry_on_bump = not fencing and metadata.producer_epoch == producer_epoch + 1
    if fencing:
        valid_epoch = ((not from_client or producer_epoch == metadata.producer_epoch)
                       and producer_epoch >= metadata.producer_epoch)
    elif metadata.state in _PREPARED:
        valid_epoch = retry_on_bump
    elif metadata.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        valid_epoch = retry_on_bump or retry_on_overflow or producer_epoch == metadata.producer_epoch
    else:
        valid_epoch = producer_epoch == metadata.producer_epoch
    retry = retry_on_bump or retry_on_overflow
    if metadata.producer_id != producer_id and not retry_on_overflow:
        raise TxnError(E.invalid_producer_id_mapping)
    if not valid_epoch:
        raise TxnError(E.producer_fenced)
    if metadata.pending_transition and not fencing:
        raise TxnError(E.concurrent_transactions)

    def prepare(state: TransactionState, no_partition_added: bool) -> TxnTransit:
        next_id = NO_PRODUCER_ID
        if not fencing and metadata.producer_epoch_exhausted:
            if next_producer_id == NO_PRODUCER_ID:
                raise TxnError(E.concurrent_transactions)
            next_id = next_producer_id
        if fencing:
            metadata.pending = None  # the abort's own epoch bump is the fencing one
        return metadata.prepare_abort_or_commit(state, TV_2, next_id, clock.now_ms(), no_partition_added)

    state = metadata.state
    current = (metadata.producer_id, metadata.producer_epoch)
    if state == S.ONGOING:
        return prepare(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, False)
    if not commit and (state == S.EMPTY or (state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) and not retry)):
        # V2 aborts even with no partition added (a producer aborting after an error before any write).
        return prepare(S.PREPARE_ABORT, True)
    return _answer_for_finished(metadata, commit, retry=retry, answer=current)


def send_markers(shard: TransactionShard, metadata: TransactionMetadata, completion: TxnTransit) -> None:
    """Hand a committed Prepare* to the marker channel, which writes Complete* once every partition has its marker."""
    shard.coordinator.markers.send(PendingCompletion(
        shard, metadata, completion, commit=metadata.state == S.PREPARE_COMMIT,
        coordinator_epoch=shard.coordinator_epoch, producer_id=metadata.producer_id,
        producer_epoch=metadata.producer_epoch, transaction_version=metadata.client_transaction_version))


async def write_completion(completion: PendingCompletion) -> None:
    """Write CompleteCommit/CompleteAbort; written again while the partition refuses it, dropped once it moved.

    Nobody waits for the answer, so the write is waited for without a
    timeout: once appended it completes the transition when it commits.
    """
    shard, metadata = completion.shard, completion.metadata
    while completion.current:
        started = shard.start_write(metadata, completion.transit, keep_claim=True)
        error = started if isinstance(started, ErrorCode) else E.none
        if not isinstance(started, ErrorCode):
            try:
                await shard.context.wait(started)
            except CoordinatorError as exc:
                error = exc.code
            if started.committed:
                log.debug("%s: transaction %s", metadata.transactional_id, metadata.state.kafka_name)
                return
        if error != E.coordinator_not_available:
            log.info("%s: not completing the transaction here (%s); its next coordinator will",
                     metadata.transactional_id, error.name)
            return
        markers = shard.coordinator.markers
        markers.log_append_retries += 1
        try:
            await anyio.sleep(RETRY_BACKOFF_S)
        finally:
            markers.log_append_retries -= 1


# The coordinator's own work ----------------------------------------------------------------------------


async def abort_timed_out(shard: TransactionShard) -> None:
    """Abort transactions open for longer than their timeout, fencing their producer with an epoch bump."""
    now = clock.now_ms()
    expired = [m for m in shard.transactions.values()
               if m.state == S.ONGOING and not m.pending_transition and m.start_ms + m.timeout_ms < now]
    async with anyio.create_task_group() as tg:
        for metadata in expired:
            tg.start_soon(_abort_timed_out, shard, metadata)


async def _abort_timed_out(shard: TransactionShard, metadata: TransactionMetadata) -> None:
    if not shard.owns(metadata) or metadata.pending_transition or metadata.state != S.ONGOING:
        return
    transit = metadata.prepare_fence_producer_epoch()
    log.info("aborting transaction of %r (producer id %d, epoch %d): open for longer than its %d ms timeout",
             metadata.transactional_id, metadata.producer_id, metadata.producer_epoch, metadata.timeout_ms)
    try:
        await end_transaction(shard, metadata.transactional_id, transit.producer_id, transit.producer_epoch,
                              commit=False, from_client=False,
                              client_transaction_version=shard.server_transaction_version())
    except TxnError as exc:
        log.info("timed-out transaction of %r was not aborted: %s", metadata.transactional_id, exc)


async def expire_transactional_ids(shard: TransactionShard) -> None:
    """Forget ids idle for ``transactional.id.expiration.ms``: tombstones, written in one batch; forgotten once committed."""
    horizon = clock.now_ms() - shard.settings().transactional_id_expiration_ms
    expired = [(m, m.prepare_dead()) for m in list(shard.transactions.values())
               if not m.pending_transition and m.state.expiration_allowed and m.last_update_ms <= horizon]
    if not expired:
        return

    def written(done: PendingWrite) -> None:
        for metadata, transit in expired:
            if not shard.owns(metadata):
                continue
            if done.committed and metadata.pending == S.DEAD and metadata.producer_epoch == transit.producer_epoch:
                del shard.transactions[metadata.transactional_id]
            else:
                metadata.pending = None

    error, pending = await shard.write([(encode_key(m.transactional_id), None) for m, _ in expired])
    if pending is None:
        written(PendingWrite(-1))  # nothing appended: the ids stay
    else:
        pending.add_done_callback(written)
    log.info("%s: %d transactional ids expired%s", shard.context.tp, len(expired),
             "" if error == E.none else f", but their tombstones are not committed ({error.name})")
