"""The state of one ``__transaction_state`` partition: its transactional ids, rebuilt by replay.

This is the :class:`josef.coordinator.runtime.CoordinatorShard` of the
transaction coordinator. Records are applied only while loading; afterwards
memory leads, as in Kafka 4.x's TransactionStateManager: a transition is
prepared in memory (its ``pending`` state guards the transactional id),
appended through the runtime (batched with the partition's other writes),
and made current once its record is committed (:meth:`TransactionShard.start_write`).
So memory never runs ahead of the log and never falls behind it: a write
that times out is answered COORDINATOR_NOT_AVAILABLE but keeps its pending
state, and becomes current as soon as its record commits (a committed
Prepare* then sends its markers); one whose append fails leaves nothing but
a cleared pending state. Reads (DescribeTransactions, ListTransactions)
therefore see committed states only, and ids whose first record is not
committed yet are not shown.

Requests do not hold the shard's lock: the pending state already keeps two
requests for one id apart, so the partition's other transactional ids go on
meanwhile, as Kafka's per-transaction locks allow. Every decision between
two awaits is synchronous, which is what makes a pending state set before a
write the only guard needed on one event loop.

The coordinator epoch is the partition's leader epoch when the shard was
loaded; the runtime loads the shard again when that epoch rises, so markers
always carry the current one, and partitions refuse markers from an older one.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from kio.schema.errors import ErrorCode

from josef.coordinator import clock
from josef.coordinator.runtime import CoordinatorError, PendingWrite, Records, ShardContext
from josef.services import ProducerIdUnavailable
from josef_coordinator_txn import transactions
from josef_coordinator_txn.configs import TxnSettings
from josef_coordinator_txn.metadata import TransactionMetadata, TransactionState, TxnError, TxnTransit
from josef_coordinator_txn.records import RecordFormatError, decode_key, decode_value, encode_key, encode_value

if TYPE_CHECKING:
    from josef_coordinator_txn.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)

ABORT_TIMED_OUT_TIMER = "abort-timed-out-transactions"
EXPIRE_IDS_TIMER = "remove-expired-transactional-ids"


class TransactionShard:
    """Transactional ids of one partition, their transitions, and the timers that abort and expire them."""

    #: Plugin API 1.2: records go through the runtime's timeline model; this shard applies them only while
    #: loading (afterwards a transition becomes current when its write commits), so it keeps no timeline state.
    timeline = True

    def __init__(self, context: ShardContext, coordinator: TransactionCoordinator) -> None:
        self.context = context
        self.coordinator = coordinator
        self.transactions: dict[str, TransactionMetadata] = {}
        self.loading = True
        self.coordinator_epoch: int = context.leader_epoch
        #: The runtime builds a shard when it starts loading its partition: the load's start, then its duration.
        self._load_started = time.monotonic()
        #: How long loading the partition took, in ms (None while it loads): Kafka's partition-load-time.
        self.load_time_ms: float | None = None

    @property
    def active(self) -> bool:
        return bool(self.context.active)

    def settings(self) -> TxnSettings:
        return self.coordinator.settings()

    # CoordinatorShard -----------------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, offset: int) -> None:
        if not self.loading:
            return  # a write of this shard's own, already applied when its transition completed
        try:
            transactional_id = decode_key(key)
            if transactional_id is None:
                return
            if value is None:
                self.transactions.pop(transactional_id, None)
            else:
                self.transactions[transactional_id] = TransactionMetadata.from_log(transactional_id,
                                                                                   decode_value(value))
        except (RecordFormatError, ValueError) as exc:
            log.warning("skipping unreadable record at %s offset %d: %s", self.context.tp, offset, exc)

    def loaded(self) -> None:
        """Finish what the previous coordinator left in Prepare*: send its markers again; start the timers."""
        self.loading = False
        self.load_time_ms = (time.monotonic() - self._load_started) * 1000
        now = clock.now_ms()
        for metadata in self.transactions.values():
            if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                transactions.send_markers(self, metadata, metadata.prepare_complete(now))
        settings = self.settings()
        self.schedule(ABORT_TIMED_OUT_TIMER, settings.abort_timed_out_interval_ms, transactions.abort_timed_out)
        self.schedule(EXPIRE_IDS_TIMER, settings.remove_expired_interval_ms, transactions.expire_transactional_ids)

    def unloaded(self) -> None:
        """The partition moved: its markers still queued give up (they check :attr:`active`); forget its state."""
        self.transactions.clear()

    # Transactional ids -----------------------------------------------------------------------------------

    def committed_transactions(self) -> list[TransactionMetadata]:
        """The ids whose state is committed (reads leave out one whose first record is not yet)."""
        return [m for m in self.transactions.values() if m.persisted]

    def transaction(self, transactional_id: str) -> TransactionMetadata | None:
        if not self.active:
            raise TxnError(ErrorCode.not_coordinator, f"{self.context.tp} is no longer coordinated here")
        return self.transactions.get(transactional_id)

    def put_if_absent(self, metadata: TransactionMetadata) -> TransactionMetadata:
        """Add a new transactional id, or return the one another request added meanwhile."""
        existing = self.transaction(metadata.transactional_id)
        if existing is not None:
            return existing
        self.transactions[metadata.transactional_id] = metadata
        return metadata

    def owns(self, metadata: TransactionMetadata) -> bool:
        """Whether ``metadata`` is still this loaded shard's state of its id (not unloaded, expired or replaced)."""
        return self.active and self.transactions.get(metadata.transactional_id) is metadata

    def server_transaction_version(self) -> int:
        """The finalized ``transaction.version``: what the coordinator's own aborts use, and the record version."""
        return int(self.coordinator.services.image.features.get("transaction.version", 0))

    async def generate_producer_id(self) -> int:
        """A new producer id from the broker's block; its failures are answered as Kafka's ProducerIdManager's."""
        try:
            producer_id = await self.coordinator.services.new_producer_id()
        except ProducerIdUnavailable as exc:
            raise TxnError(exc.code, exc.message) from exc
        self.coordinator.producer_ids_allocated += 1
        return producer_id

    # Writes --------------------------------------------------------------------------------------------

    async def append(self, metadata: TransactionMetadata, transit: TxnTransit) -> ErrorCode:
        """Write ``transit`` (Kafka's ``appendTransactionToLog``) and wait for it within ``request.timeout.ms``.

        The error a client is told, or NONE. The transition becomes current
        when its record commits, even after the wait timed out.
        """
        started = self.start_write(metadata, transit)
        if isinstance(started, ErrorCode):
            return started
        try:
            await self.context.wait(started, self.settings().write_timeout_ms / 1000)
        except CoordinatorError as exc:
            return exc.code
        return ErrorCode.none

    def start_write(self, metadata: TransactionMetadata, transit: TxnTransit, *,
                    keep_claim: bool = False) -> PendingWrite | ErrorCode:
        """Append ``transit``'s record; the write, whose commit makes it current, or the error if nothing was appended.

        A record that commits completes the transition (even when the write
        is answered NOT_ENOUGH_REPLICAS_AFTER_APPEND: it is in the log); one
        that could not be appended clears the pending state, so the client
        may retry, unless ``keep_claim`` and the error is retriable
        (COORDINATOR_NOT_AVAILABLE): the completion of a transaction keeps its
        claim and writes again.
        """
        if not self.active:
            return ErrorCode.not_coordinator
        version = 0 if self.server_transaction_version() == 0 else 1
        record = (encode_key(metadata.transactional_id), encode_value(transit.log_value(), version))
        try:
            pending = self.context.append([record])
        except CoordinatorError as exc:
            self._abandon(metadata, transit, exc.code, keep_claim)
            return exc.code
        pending.add_done_callback(lambda done: self._written(metadata, transit, done, keep_claim))
        return pending

    def _written(self, metadata: TransactionMetadata, transit: TxnTransit, done: PendingWrite,
                 keep_claim: bool) -> None:
        if not self.owns(metadata) or metadata.pending != transit.state:
            return
        if not done.committed:
            self._abandon(metadata, transit, done.error.code if done.error else ErrorCode.unknown_server_error,
                          keep_claim)
            return
        metadata.complete_transition(transit)
        if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            transactions.send_markers(self, metadata, metadata.prepare_complete(clock.now_ms()))

    def _abandon(self, metadata: TransactionMetadata, transit: TxnTransit, error: ErrorCode, keep_claim: bool) -> None:
        if keep_claim and error == ErrorCode.coordinator_not_available:
            return
        if self.owns(metadata) and metadata.pending == transit.state:
            log.info("%s: writing %s failed with %s; the transition is abandoned", metadata.transactional_id,
                     transit.state.kafka_name, error.name)
            metadata.pending = None

    async def write(self, records: Records) -> tuple[ErrorCode, PendingWrite | None]:
        """Append ``records`` and wait within ``request.timeout.ms``: the error a client is told (or NONE), and
        the write (None if nothing was appended), whose callbacks still run when it commits after a timeout."""
        if not self.active:
            return ErrorCode.not_coordinator, None
        try:
            pending = self.context.append(records)
        except CoordinatorError as exc:
            return exc.code, None
        try:
            await self.context.wait(pending, self.settings().write_timeout_ms / 1000)
        except CoordinatorError as exc:
            return exc.code, pending
        return ErrorCode.none, pending

    # Timers --------------------------------------------------------------------------------------------

    def schedule(self, key: str, interval_ms: int, job: Callable[[TransactionShard], Awaitable[None]]) -> None:
        """Run ``job(self)`` every ``interval_ms`` while the shard is loaded."""

        async def run() -> None:
            try:
                if self.active:
                    await job(self)
            finally:
                if self.active:
                    self.schedule(key, interval_ms, job)

        self.context.schedule(key, interval_ms / 1000, run)
