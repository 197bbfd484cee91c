"""One transactional id's state and the transitions between its states, as Kafka's TransactionMetadata.

A change happens in two steps, as in Kafka: ``prepare_*`` checks that the
transition is legal, sets :attr:`TransactionMetadata.pending` and returns the
new state as a :class:`TxnTransit` without touching the current one; the
transit is written to ``__transaction_state`` and, once committed,
:meth:`TransactionMetadata.complete_transition` makes it current (a failed
write clears ``pending`` instead). While a transition is pending, requests
for the id are answered CONCURRENT_TRANSACTIONS, which is what keeps two
requests for one transactional id from interleaving while a write is in
flight.

Transaction versions (``transaction.version``, KIP-890): with version 2 a
client's EndTxn bumps the producer epoch of every transaction (the markers
carry the new epoch, so a late write of the finished transaction is fenced),
and a producer whose epoch runs out continues under a new producer id
(``next_producer_id``), which the completion makes current.
"""

from __future__ import annotations

import enum
import logging

import attrs
from kio.schema.errors import ErrorCode

from josef_coordinator_txn.records import Partitions, TransactionLogValue

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Java's Short.MAX_VALUE: the coordinator keeps the last epoch for itself, to fence a producer at MAX-1.
MAX_EPOCH = 32767
#: ``transaction.version`` 2, the first with an epoch bump at the end of every transaction.
TV_2 = 2


class TxnError(Exception):
    """A request for a transactional id is answered with ``code`` (the message goes to the log, not the client)."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


class IllegalTransitionError(RuntimeError):
    """A transition the state machine never makes: a bug, logged and answered UNKNOWN_SERVER_ERROR."""


class TransactionState(enum.IntEnum):
    """Kafka's TransactionState, numbered by the id ``__transaction_state`` stores (TransactionStatus)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name Kafka's DescribeTransactions and ListTransactions show (``PrepareCommit``...)."""
        return _NAMES[self]

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)

    @property
    def expiration_allowed(self) -> bool:
        """Whether an id in this state may be forgotten after ``transactional.id.expiration.ms``."""
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @property
    def valid_previous(self) -> frozenset[TransactionState]:
        return _VALID_PREVIOUS[self]


S = TransactionState
_NAMES = {S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit", S.PREPARE_ABORT: "PrepareAbort",
          S.COMPLETE_COMMIT: "CompleteCommit", S.COMPLETE_ABORT: "CompleteAbort", S.DEAD: "Dead",
          S.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}
_BY_NAME = {name: state for state, name in _NAMES.items()}
_DONE = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
_VALID_PREVIOUS = {
    S.EMPTY: _DONE,
    S.ONGOING: _DONE | {S.ONGOING},
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # Transactions V2 may abort from Empty and the complete states (an abort with no partition added).
    S.PREPARE_ABORT: _DONE | {S.ONGOING, S.PREPARE_EPOCH_FENCE},
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: _DONE,
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka refuses to hand out MAX_EPOCH, so a producer at MAX-1 can always still be fenced."""
    return epoch >= MAX_EPOCH - 1


@attrs.frozen
class TxnTransit:
    """The state a pending transition leads to (Kafka's TxnTransitMetadata): what is written to the log."""

    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TransactionState
    partitions: Partitions
    start_ms: int
    last_update_ms: int
    client_transaction_version: int

    def log_value(self) -> TransactionLogValue:
        return TransactionLogValue(
            producer_id=self.producer_id, producer_epoch=self.producer_epoch, timeout_ms=self.timeout_ms,
            state_id=int(self.state), partitions=self.partitions, last_update_ms=self.last_update_ms,
            start_ms=self.start_ms, previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id, client_transaction_version=self.client_transaction_version)


@attrs.define(eq=False)
class TransactionMetadata:
    """The current state of one transactional id, with the transition in flight (if any)."""

    transactional_id: str
    producer_id: int
    timeout_ms: int
    last_update_ms: int
    state: TransactionState = TransactionState.EMPTY
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    #: The producer id before the last rotation (a retry of the request that rotated it is recognised by it).
    previous_producer_id: int = NO_PRODUCER_ID
    #: Transactions V2: the producer id a transaction ending with an exhausted epoch continues under.
    next_producer_id: int = NO_PRODUCER_ID
    partitions: set[tuple[str, int]] = attrs.field(factory=set)
    start_ms: int = -1
    client_transaction_version: int = 0
    pending: TransactionState | None = None
    #: A fencing epoch bump whose write failed: the next fence reuses that epoch instead of bumping again.
    has_failed_epoch_fence: bool = False
    #: Some record of this id is committed (it was loaded, or a transition completed): reads may show it.
    persisted: bool = False

    @classmethod
    def from_log(cls, transactional_id: str, value: TransactionLogValue) -> TransactionMetadata:
        """A loaded state; the last epoch is not persisted (as in Kafka), so a retry spanning a failover is fenced."""
        state = TransactionState(value.state_id)
        return cls(transactional_id, value.producer_id, value.timeout_ms, value.last_update_ms, state=state,
                   producer_epoch=value.producer_epoch, previous_producer_id=value.previous_producer_id,
                   next_producer_id=value.next_producer_id,
                   partitions=set() if state == S.EMPTY else set(value.partitions), start_ms=value.start_ms,
                   client_transaction_version=value.client_transaction_version, persisted=True)

    @property
    def producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def pending_transition(self) -> bool:
        return self.pending is not None

    def remove_partition(self, tp: tuple[str, int]) -> None:
        """A marker was written to ``tp`` (or its topic is gone): it no longer waits for this transaction."""
        if self.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionError(f"{self.transactional_id}: removing {tp} in state {self.state.kafka_name}")
        self.partitions.discard(tp)

    # Preparing transitions --------------------------------------------------------------------------------

    def prepare_fence_producer_epoch(self) -> TxnTransit:
        """Bump the epoch so the ongoing transaction's producer is fenced, before aborting that transaction."""
        if self.producer_epoch == MAX_EPOCH:
            raise IllegalTransitionError(f"{self.transactional_id}: cannot fence a producer at epoch {MAX_EPOCH}")
        epoch = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH)

    def prepare_increment_producer_epoch(self, timeout_ms: int, expected_epoch: int | None, now_ms: int) -> TxnTransit:
        """InitProducerId: the next epoch (or, for a retry of a bump that succeeded, the current one again)."""
        if self.producer_epoch_exhausted:
            raise IllegalTransitionError(f"{self.transactional_id}: no epoch left for producer id {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        else:
            log.info("%s: expected producer epoch %d is neither the current %d nor the previous %d",
                     self.transactional_id, expected_epoch, self.producer_epoch, self.last_producer_epoch)
            raise TxnError(ErrorCode.producer_fenced)
        return self._prepare(S.EMPTY, producer_epoch=epoch, last_producer_epoch=last, timeout_ms=timeout_ms,
                             partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransit:
        if self.state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionError(f"{self.transactional_id}: rotating the producer id during a transaction")
        return self._prepare(S.EMPTY, producer_id=new_producer_id, producer_epoch=0,
                             last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             timeout_ms=timeout_ms, partitions=frozenset(), start_ms=-1, last_update_ms=now_ms)

    def prepare_add_partitions(self, added: Partitions, now_ms: int, client_transaction_version: int) -> TxnTransit:
        start = now_ms if self.state in _DONE else self.start_ms
        return self._prepare(S.ONGOING, partitions=frozenset(self.partitions | added), start_ms=start,
                             last_update_ms=now_ms, client_transaction_version=client_transaction_version)

    def prepare_abort_or_commit(self, state: TransactionState, client_transaction_version: int, next_producer_id: int,
                                now_ms: int, no_partition_added: bool) -> TxnTransit:
        if client_transaction_version >= TV_2:
            epoch, last = self.producer_epoch + 1, self.producer_epoch
        else:
            epoch, last = self.producer_epoch, self.last_producer_epoch
        # An abort with no partition added (V2) has no start time: the update time stands for it.
        start = now_ms if no_partition_added else self.start_ms
        return self._prepare(state, next_producer_id=next_producer_id, producer_epoch=epoch, last_producer_epoch=last,
                             start_ms=start, last_update_ms=now_ms, client_transaction_version=client_transaction_version)

    def prepare_complete(self, now_ms: int) -> TxnTransit:
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False
        producer_id, epoch = self.producer_id, self.producer_epoch
        if self.client_transaction_version >= TV_2 and self.next_producer_id != NO_PRODUCER_ID:
            # The epoch ran out: the producer goes on under the id chosen when the transaction ended.
            producer_id, epoch = self.next_producer_id, 0
        return self._prepare(state, producer_id=producer_id, next_producer_id=NO_PRODUCER_ID, producer_epoch=epoch,
                             partitions=frozenset(), last_update_ms=now_ms)

    def prepare_dead(self) -> TxnTransit:
        return self._prepare(S.DEAD, partitions=frozenset())

    def _prepare(self, state: TransactionState, **changes: object) -> TxnTransit:
        if self.pending is not None:
            raise IllegalTransitionError(f"{self.transactional_id}: preparing {state.kafka_name} while "
                                         f"{self.pending.kafka_name} is pending")
        if self.state not in state.valid_previous:
            raise IllegalTransitionError(f"{self.transactional_id}: {self.state.kafka_name} -> {state.kafka_name}")
        values: dict[str, object] = dict(
            producer_id=self.producer_id, previous_producer_id=self.producer_id, next_producer_id=self.next_producer_id,
            producer_epoch=self.producer_epoch, last_producer_epoch=self.last_producer_epoch,
            timeout_ms=self.timeout_ms, state=state, partitions=frozenset(self.partitions), start_ms=self.start_ms,
            last_update_ms=self.last_update_ms, client_transaction_version=self.client_transaction_version)
        values.update(changes)
        transit = TxnTransit(**values)  # type: ignore[arg-type]
        if transit.producer_id < 0 or (state != S.DEAD and transit.producer_epoch < 0):
            raise IllegalTransitionError(f"{self.transactional_id}: {transit}")
        self.pending = state
        return transit

    # Completing them -------------------------------------------------------------------------------------

    def complete_transition(self, transit: TxnTransit) -> None:
        """Make ``transit`` current once its record is committed; checks what Kafka checks (a failure is a bug)."""
        if self.pending != transit.state:
            raise IllegalTransitionError(f"{self.transactional_id}: completing {transit.state.kafka_name} while "
                                         f"{self.pending.kafka_name if self.pending else 'nothing'} is pending")
        state = transit.state
        ok = True
        if state == S.EMPTY:
            ok = ((transit.producer_epoch == self.producer_epoch or self._valid_epoch_bump(transit))
                  and not transit.partitions and transit.start_ms == -1)
        elif state == S.ONGOING:
            ok = (self._valid_epoch(transit) and self.partitions <= transit.partitions
                  and transit.timeout_ms == self.timeout_ms)
        elif state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            empty_abort = (state == S.PREPARE_ABORT and transit.client_transaction_version >= TV_2
                           and self.state in _DONE)
            ok = (self._valid_epoch(transit) and set(transit.partitions) == self.partitions
                  and transit.timeout_ms == self.timeout_ms
                  and (transit.start_ms == self.start_ms or empty_abort))
        elif state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            ok = self._valid_epoch(transit) and transit.timeout_ms == self.timeout_ms and transit.start_ms != -1
        else:  # Dead ends in removal, PrepareEpochFence in PrepareAbort: neither is ever completed.
            ok = False
        if not ok:
            raise IllegalTransitionError(f"{self.transactional_id}: {self} cannot become {transit}")
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.next_producer_id = transit.next_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.timeout_ms = transit.timeout_ms
        self.partitions = set(transit.partitions)
        self.start_ms = transit.start_ms
        self.last_update_ms = transit.last_update_ms
        self.client_transaction_version = transit.client_transaction_version
        self.pending = None
        self.state = state
        self.persisted = True

    def _valid_epoch(self, transit: TxnTransit) -> bool:
        """Kafka's validProducerEpoch: V2 moves the epoch on at Prepare*, and to a new id at Complete* on overflow."""
        if transit.client_transaction_version >= TV_2:
            if transit.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) and transit.producer_epoch == 0:
                return (transit.last_producer_epoch == self.last_producer_epoch
                        and transit.previous_producer_id == self.producer_id)
            if transit.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return transit.last_producer_epoch == self.producer_epoch and transit.producer_id == self.producer_id
        return transit.producer_epoch == self.producer_epoch and transit.producer_id == self.producer_id

    def _valid_epoch_bump(self, transit: TxnTransit) -> bool:
        return (transit.producer_epoch == self.producer_epoch + 1
                or (transit.producer_epoch == 0 and transit.producer_id != self.producer_id))
