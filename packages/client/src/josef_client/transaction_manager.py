"""A transactional producer's state machine and its requests to the transaction and group coordinators.

It follows the Java client's TransactionManager: the states
(UNINITIALIZED, INITIALIZING, READY, IN_TRANSACTION, COMMITTING_TRANSACTION,
ABORTING_TRANSACTION, ABORTABLE_ERROR, FATAL_ERROR), which methods each
allows, how each coordinator error is answered (find the coordinator again,
retry, make the transaction abortable, or make the producer unusable) and
the order of requests: partitions are added with AddPartitionsToTxn before
the first batch to them is sent (all partitions new since the last request
in one), EndTxn goes out only once every batch is acknowledged, and a
transaction that touched nothing ends without EndTxn.

One coordinator request is in flight at a time (``_serial``), as in the
Java client, so an AddPartitionsToTxn started by the sender is answered
before an EndTxn of the same transaction is sent. Calls wait at most
``max.block.ms`` for retriable errors to clear, then raise
:class:`KafkaTimeoutError` with the state unchanged: calling the method
again resumes it.

Transactions V2 (KIP-890 part 2) is used when the coordinator's broker
reports the finalized feature ``transaction.version`` >= 2 at
``init_transactions()``: partitions join the transaction with the Produce
request itself (v12), offsets with TxnOffsetCommit (v5), and EndTxn (v5)
bumps the epoch and answers the producer id and epoch to use next.

The partition sets are guarded by a lock: the synchronous producer adds
partitions from the caller's thread; everything else runs on the event loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from typing import Any, Callable, Mapping

from kio.schema.errors import ErrorCode

import josef
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.topic_partition import TopicPartition
from josef_client.cluster import Cluster
from josef_client.coordinator_requests import GROUP, TRANSACTION, OffsetAndMetadata, find_coordinator
from josef_client.group import CommitFailedError, ConsumerGroupMetadata
from josef_client.transaction_errors import (
    FatalProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionStateError,
)

log = logging.getLogger(__name__)

E = ErrorCode

#: The coordinator moved or is not up: look it up again.
REDISCOVER = frozenset({E.not_coordinator, E.coordinator_not_available})
#: Worth the same request again, to the same coordinator.
RETRY = frozenset({E.coordinator_load_in_progress, E.concurrent_transactions})
#: The coordinator holds an id or epoch this producer no longer has: abortable, with a new epoch afterwards.
EPOCH_BUMP = frozenset({E.unknown_producer_id, E.invalid_producer_id_mapping})
#: The transaction is lost, the producer is not.
ABORTABLE = frozenset({E.topic_authorization_failed, E.group_authorization_failed, E.operation_not_attempted,
                       E.transaction_abortable, E.fenced_instance_id, E.unknown_member_id, E.illegal_generation})
FENCED = frozenset({E.producer_fenced, E.invalid_producer_epoch})
#: Produce errors after which only closing the producer helps.
FATAL_PRODUCE = frozenset({E.producer_fenced, E.transactional_id_authorization_failed,
                           E.cluster_authorization_failed, E.unsupported_version})

#: Retry backoff of the first AddPartitionsToTxn of a transaction that finds the previous one still completing.
CONCURRENT_BACKOFF_S = 0.02
TRANSACTION_VERSION = "transaction.version"


class State(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


#: Which states each state may be entered from (FATAL_ERROR: from any).
_SOURCES = {
    State.INITIALIZING: {State.UNINITIALIZED, State.INITIALIZING},
    State.READY: {State.INITIALIZING, State.COMMITTING_TRANSACTION, State.ABORTING_TRANSACTION},
    State.IN_TRANSACTION: {State.READY},
    State.COMMITTING_TRANSACTION: {State.IN_TRANSACTION},
    State.ABORTING_TRANSACTION: {State.IN_TRANSACTION, State.ABORTABLE_ERROR},
    State.ABORTABLE_ERROR: {State.IN_TRANSACTION, State.COMMITTING_TRANSACTION, State.ABORTABLE_ERROR},
}
_CALLS = {State.INITIALIZING: "init_transactions()", State.IN_TRANSACTION: "begin_transaction()",
          State.COMMITTING_TRANSACTION: "commit_transaction()", State.ABORTING_TRANSACTION: "abort_transaction()"}


class _Again(Exception):
    """Raised inside a request loop: send the request again (after finding the coordinator when ``rediscover``)."""

    def __init__(self, why: ErrorCode, rediscover: bool = False, backoff_s: float | None = None) -> None:
        self.why, self.rediscover, self.backoff_s = why, rediscover, backoff_s


class TransactionManager:
    """The transactional half of a producer; the producer asks it what may be sent and tells it what failed."""

    def __init__(self, transactional_id: str, config: Mapping[str, Any], cluster: Cluster,
                 on_new_producer: Callable[[int, int], None]) -> None:
        self.transactional_id = transactional_id
        self.timeout_ms: int = config["transaction.timeout.ms"]
        self._block_s = config["max.block.ms"] / 1000
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._cluster = cluster
        self._on_new_producer = on_new_producer
        self.state = State.UNINITIALIZED
        self.last_error: KafkaError | None = None
        self.producer_id, self.producer_epoch = -1, -1
        #: Transactions V2 (KIP-890): learnt from the coordinator's finalized features at init.
        self.v2 = False
        self._lock = threading.Lock()
        self._new: set[TopicPartition] = set()
        self._adding: set[TopicPartition] = set()
        self.partitions: set[TopicPartition] = set()
        #: Whether the coordinator knows of this transaction (a partition or the offsets were added): EndTxn is due.
        self.started = False
        self._epoch_bump = False
        self._bump_supported = True
        self._coordinators: dict[tuple[int, str], tuple[str, int]] = {}
        self._serial = asyncio.Lock()

    # State ------------------------------------------------------------------------------------

    def _transition(self, target: State, error: KafkaError | None = None) -> None:
        if target is not State.FATAL_ERROR and self.state not in _SOURCES[target]:
            raise TransactionStateError(self._wrong_state(target))
        log.debug("transactional id %s: %s -> %s", self.transactional_id, self.state.value, target.value)
        self.state = target
        if error is not None:
            self.last_error = error

    def _wrong_state(self, target: State) -> str:
        call = _CALLS.get(target, target.value)
        if self.state is State.UNINITIALIZED:
            return f"{call} needs init_transactions() first"
        if target in (State.COMMITTING_TRANSACTION, State.ABORTING_TRANSACTION) and self.state is State.READY:
            return f"{call} needs a transaction: call begin_transaction() first"
        if target is State.IN_TRANSACTION and self.state is State.IN_TRANSACTION:
            return "begin_transaction() called twice: a transaction is already open"
        return f"{call} is not allowed in state {self.state.value}"

    def _raise_if_failed(self) -> None:
        """An error state stops every call but abort (abortable) and close (fatal)."""
        if self.state is State.FATAL_ERROR:
            raise self._fatal_again()
        if self.state is State.ABORTABLE_ERROR:
            raise self._abortable_again()

    def _fatal_again(self) -> FatalProducerError:
        error = self.last_error
        assert error is not None
        if isinstance(error, ProducerFencedError):
            return ProducerFencedError(error.message)
        return FatalProducerError(error.code, f"the producer failed for good, close it: {error.message}")

    def _abortable_again(self) -> TransactionAbortableError:
        error = self.last_error
        assert error is not None
        failure = TransactionAbortableError(error.code, f"the transaction must be aborted (abort_transaction()): {error.message}")
        failure.__cause__ = error
        return failure

    def fatal(self, error: KafkaError) -> FatalProducerError:
        """Enter FATAL_ERROR; returns the error to raise."""
        if not isinstance(error, FatalProducerError):
            error = FatalProducerError(error.code, error.message)
        self._transition(State.FATAL_ERROR, error)
        return error

    def abortable(self, error: KafkaError, *, bump_epoch: bool = False) -> TransactionAbortableError:
        """Enter ABORTABLE_ERROR (unless aborting already); returns the error to raise."""
        if bump_epoch and not self.v2:
            if not self._bump_supported:
                raise self.fatal(error)
            self._epoch_bump = True
        if self.state in _SOURCES[State.ABORTABLE_ERROR]:  # an abort under way stays one
            self._transition(State.ABORTABLE_ERROR, error)
        failure = TransactionAbortableError(error.code, error.message)
        failure.__cause__ = error
        return failure

    @property
    def has_error(self) -> bool:
        return self.state in (State.ABORTABLE_ERROR, State.FATAL_ERROR)

    def error_for_unsent(self) -> KafkaError | None:
        """What batches not yet sent fail with now: the error of a failed transaction, else None (send them)."""
        return self.last_error if self.has_error else None

    # The producer's questions -----------------------------------------------------------------

    def will_send_to(self, tp: TopicPartition) -> bool:
        """Called for each record (any thread): raises unless a record may be sent now; True when ``tp`` is new to the transaction."""
        state = self.state
        if state is not State.IN_TRANSACTION:
            if state in (State.ABORTABLE_ERROR, State.FATAL_ERROR):
                self._raise_if_failed()
            if self.producer_id < 0:
                raise TransactionStateError("send() on a transactional producer needs init_transactions() first")
            raise TransactionStateError(f"send() needs an open transaction (begin_transaction()); the producer is {state.value}")
        if tp in self.partitions:
            return False
        with self._lock:
            if self.v2:
                self.partitions.add(tp)  # the Produce request adds it (and starts the transaction: batches_sent)
                return False
            if tp in self._new or tp in self._adding:
                return False
            self._new.add(tp)
            return True

    def sendable(self, tp: TopicPartition) -> bool:
        """Whether batches of ``tp`` may go out: only once the coordinator has the partition in the transaction."""
        return tp in self.partitions and self.state is not State.FATAL_ERROR

    def batches_sent(self) -> None:
        """A Produce request of the transaction went out: with V2 it is what starts the transaction at the coordinator.

        Until then an abort needs no EndTxn, and must not send one: right
        after the previous EndTxn the coordinator may still be completing
        that transaction, and would take an EndTxn with the new epoch for a
        fenced producer.
        """
        self.started = True

    @property
    def partitions_to_add(self) -> bool:
        return bool(self._new)

    def batch_failed(self, error: KafkaError, had_sequence: bool) -> None:
        """A batch failed for good inside the transaction: the transaction (or, for fencing, the producer) is lost.

        A failed batch that had a sequence leaves a gap the broker would
        refuse the next batch for, so the abort also bumps the epoch, which
        starts every sequence again (KIP-360; with V2 every EndTxn does).
        """
        if self.state in (State.UNINITIALIZED, State.FATAL_ERROR):
            return
        if error.code in FATAL_PRODUCE:
            self.fatal(ProducerFencedError(error.message) if error.code == E.producer_fenced else error)
            return
        self.abortable(error, bump_epoch=had_sequence)

    # Coordinator requests ---------------------------------------------------------------------

    def _deadline(self, timeout_ms: int | None) -> float:
        return time.monotonic() + (self._block_s if timeout_ms is None else timeout_ms / 1000)

    async def _coordinator(self, key_type: int, key: str, deadline: float) -> Connection:
        while True:
            address = self._coordinators.get((key_type, key))
            try:
                if address is None:
                    address = self._coordinators[(key_type, key)] = await find_coordinator(self._cluster, key, key_type)
                return await self._cluster.connection(address)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                self._coordinators.pop((key_type, key), None)
                await self._pause(deadline, exc.code, f"reaching the coordinator of {key!r}")
            except UnsupportedVersionError as exc:
                raise self.fatal(exc) from None
            except KafkaError as exc:
                if exc.code in REDISCOVER or exc.code in RETRY:
                    await self._pause(deadline, exc.code, f"finding the coordinator of {key!r}")
                elif exc.code == E.group_authorization_failed:
                    raise self.abortable(exc) from None
                else:
                    raise self.fatal(exc) from None

    async def _pause(self, deadline: float, why: ErrorCode, doing: str, backoff_s: float | None = None) -> None:
        if time.monotonic() >= deadline:
            raise KafkaTimeoutError(f"transactional id {self.transactional_id!r}: gave up {doing} after max.block.ms "
                                    f"(last error {why.name.upper()}); call again to resume")
        await asyncio.sleep(self._backoff_s if backoff_s is None else backoff_s)

    async def _call(self, api_key: int, body: Callable[[], dict[str, Any]], judge: Callable[[Any], Any],
                    deadline: float, doing: str, *, group: str | None = None, cap: int | None = None) -> Any:
        """Send to the coordinator until ``judge(response)`` returns instead of raising :class:`_Again`."""
        key_type, key = (GROUP, group) if group is not None else (TRANSACTION, self.transactional_id)
        while True:
            conn = await self._coordinator(key_type, key, deadline)
            try:
                version = conn.version(api_key)
                response = await conn.request(api_key, body(), version=version if cap is None else min(version, cap))
                return judge(response)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                self._coordinators.pop((key_type, key), None)
                await self._pause(deadline, exc.code, doing)
            except UnsupportedVersionError as exc:
                raise self.fatal(exc) from None
            except _Again as again:
                if again.rediscover:
                    self._coordinators.pop((key_type, key), None)
                await self._pause(deadline, again.why, doing, again.backoff_s)

    def _judge(self, code: ErrorCode, doing: str, *, abortable_ok: bool = True) -> None:
        """Raise what a coordinator's error code means (nothing for NONE)."""
        if code == E.none:
            return
        if code in REDISCOVER:
            raise _Again(code, rediscover=True)
        if code in RETRY:
            raise _Again(code)
        message = f"{doing} for transactional id {self.transactional_id!r}"
        if code in FENCED:
            raise self.fatal(ProducerFencedError(f"{message}: {code.name.upper()}, a newer producer has the transactional id"))
        if abortable_ok and code in EPOCH_BUMP:
            raise self.abortable(KafkaError(code, message), bump_epoch=True)
        if abortable_ok and code in ABORTABLE:
            error: KafkaError = KafkaError(code, message)
            if code in (E.unknown_member_id, E.illegal_generation):
                error = CommitFailedError(code, f"{message}: the consumer group's generation or member id is stale")
            raise self.abortable(error)
        raise self.fatal(KafkaError(code, message))

    # init_transactions --------------------------------------------------------------------------

    async def init_transactions(self, timeout_ms: int | None = None) -> None:
        """FindCoordinator, then InitProducerId: a producer id, and an epoch that fences every older producer of the id."""
        if self.state is not State.INITIALIZING:
            self._transition(State.INITIALIZING)
        deadline = self._deadline(timeout_ms)
        async with self._serial:
            conn = await self._coordinator(TRANSACTION, self.transactional_id, deadline)
            self.v2 = await self._transaction_version(conn) >= 2
            self._bump_supported = conn.versions.get(ApiKey.INIT_PRODUCER_ID, (0, 0))[1] >= 3
            await self._init_producer_id(deadline, -1, -1)
        self._transition(State.READY)

    async def _transaction_version(self, conn: Connection) -> int:
        """The cluster's finalized transaction.version, from an ApiVersions request (v3+ carries features)."""
        try:
            version = conn.version(ApiKey.API_VERSIONS)
        except UnsupportedVersionError:
            return 0
        if version < 3:
            return 0
        response = await conn.request(ApiKey.API_VERSIONS, {"client_software_name": "josef",
                                                            "client_software_version": josef.__version__}, version=version)
        levels = {f.name: f.max_version_level for f in response.finalized_features or ()}
        return int(levels.get(TRANSACTION_VERSION, 0))

    async def _init_producer_id(self, deadline: float, producer_id: int, producer_epoch: int) -> None:
        """InitProducerId; with the current id and epoch (KIP-360) it bumps the epoch instead of fencing ourselves."""
        body = {"transactional_id": self.transactional_id, "transaction_timeout": self.timeout_ms,
                "producer_id": producer_id, "producer_epoch": producer_epoch}

        def judge(response: Any) -> None:
            self._judge(response.error_code, "InitProducerId", abortable_ok=False)
            self._set_producer(response.producer_id, response.producer_epoch)

        await self._call(ApiKey.INIT_PRODUCER_ID, lambda: body, judge, deadline, "InitProducerId")

    def _set_producer(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._on_new_producer(producer_id, producer_epoch)

    # Transactions -----------------------------------------------------------------------------------

    def begin_transaction(self) -> None:
        self._raise_if_failed()
        self._transition(State.IN_TRANSACTION)

    async def add_partitions(self) -> None:
        """AddPartitionsToTxn for every partition new since the last one (the sender calls this before their batches)."""
        async with self._serial:
            with self._lock:
                self._adding |= self._new
                self._new.clear()
                adding = sorted(self._adding)
            if not adding or self.state not in (State.IN_TRANSACTION, State.COMMITTING_TRANSACTION):
                self._adding.clear()
                return
            topics: dict[str, list[int]] = {}
            for tp in adding:
                topics.setdefault(tp.topic, []).append(tp.partition)
            body = {"v3_and_below_transactional_id": self.transactional_id,
                    "v3_and_below_producer_id": self.producer_id, "v3_and_below_producer_epoch": self.producer_epoch,
                    "v3_and_below_topics": [{"name": t, "partitions": p} for t, p in topics.items()]}
            first = not self.partitions
            try:
                await self._call(ApiKey.ADD_PARTITIONS_TO_TXN, lambda: body, lambda r: self._judge_added(r, first),
                                 self._deadline(None), "AddPartitionsToTxn")
            except KafkaTimeoutError as exc:
                self.abortable(exc)
            except KafkaError:
                pass  # the state says what failed; the sender fails the waiting batches
            finally:
                with self._lock:
                    self._adding.clear()

    def _judge_added(self, response: Any, first: bool) -> None:
        errors = {TopicPartition(t.name, p.partition_index): p.partition_error_code
                  for t in response.results_by_topic_v3_and_below for p in t.results_by_partition}
        if getattr(response, "error_code", E.none) != E.none:
            self._judge(response.error_code, "AddPartitionsToTxn")
        deciding = [c for c in errors.values() if c not in (E.none, E.topic_authorization_failed, E.operation_not_attempted)]
        for code in deciding:
            if code == E.concurrent_transactions:
                raise _Again(code, backoff_s=CONCURRENT_BACKOFF_S if first else None)
            if code == E.unknown_topic_or_partition:
                raise _Again(code)
            self._judge(code, "AddPartitionsToTxn")
        failed = {tp: c for tp, c in errors.items() if c != E.none}
        if failed:
            code = E.topic_authorization_failed if E.topic_authorization_failed in failed.values() else E.operation_not_attempted
            details = ", ".join(f"{tp.topic}-{tp.partition}: {c.name.upper()}" for tp, c in sorted(failed.items()))
            raise self.abortable(KafkaError(code, f"could not add partitions to the transaction: {details}"))
        with self._lock:
            self.partitions |= set(errors)
        self.started = True

    async def send_offsets(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
                           group: ConsumerGroupMetadata | str, timeout_ms: int | None = None) -> None:
        """AddOffsetsToTxn to the transaction coordinator (not with V2), then TxnOffsetCommit to the group's coordinator."""
        self._raise_if_failed()
        if self.state is not State.IN_TRANSACTION:
            raise TransactionStateError("send_offsets_to_transaction() needs an open transaction (begin_transaction())")
        metadata = ConsumerGroupMetadata(group) if isinstance(group, str) else group
        pending = {tp: om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om)) for tp, om in offsets.items()}
        deadline = self._deadline(timeout_ms)
        async with self._serial:
            if not self.v2:
                body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                        "producer_epoch": self.producer_epoch, "group_id": metadata.group_id}
                await self._call(ApiKey.ADD_OFFSETS_TO_TXN, lambda: body,
                                 lambda r: self._judge(r.error_code, "AddOffsetsToTxn"), deadline, "AddOffsetsToTxn")
            self.started = True
            await self._txn_offset_commit(pending, metadata, deadline)

    async def _txn_offset_commit(self, pending: dict[TopicPartition, OffsetAndMetadata], group: ConsumerGroupMetadata,
                                 deadline: float) -> None:
        def body() -> dict[str, Any]:
            topics: dict[str, list[dict[str, Any]]] = {}
            for tp, om in sorted(pending.items()):
                topics.setdefault(tp.topic, []).append({
                    "partition_index": tp.partition, "committed_offset": om.offset,
                    "committed_leader_epoch": om.leader_epoch, "committed_metadata": om.metadata or ""})
            return {"transactional_id": self.transactional_id, "group_id": group.group_id,
                    "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                    "generation_id": group.generation_id, "member_id": group.member_id,
                    "group_instance_id": group.group_instance_id,
                    "topics": [{"name": t, "partitions": p} for t, p in topics.items()]}

        def judge(response: Any) -> None:
            again: _Again | None = None
            for topic in response.topics:
                for part in topic.partitions:
                    tp, code = TopicPartition(topic.name, part.partition_index), part.error_code
                    if code == E.none:
                        pending.pop(tp, None)
                    elif code in REDISCOVER or code == E.request_timed_out:
                        again = _Again(code, rediscover=True)
                    elif code in (E.unknown_topic_or_partition, E.coordinator_load_in_progress):
                        again = again or _Again(code)
                    elif code == E.unsupported_for_message_format:
                        raise self.fatal(KafkaError(code, "TxnOffsetCommit"))
                    else:
                        self._judge(code, f"TxnOffsetCommit for group {group.group_id!r}")
            if pending:
                raise again or _Again(E.unknown_server_error)

        await self._call(ApiKey.TXN_OFFSET_COMMIT, body, judge, deadline, "TxnOffsetCommit", group=group.group_id,
                         cap=None if self.v2 else 4)

    def begin_commit(self) -> None:
        if self.state is State.COMMITTING_TRANSACTION:
            return  # a commit that timed out, resumed
        self._raise_if_failed()
        self._transition(State.COMMITTING_TRANSACTION)

    def begin_abort(self) -> None:
        """Abort from IN_TRANSACTION or ABORTABLE_ERROR; partitions not added yet are forgotten."""
        if self.state is not State.ABORTING_TRANSACTION:
            if self.state is State.FATAL_ERROR:
                raise self._fatal_again()
            self._transition(State.ABORTING_TRANSACTION)
        with self._lock:
            self._new.clear()

    async def end_transaction(self, commit: bool, timeout_ms: int | None = None) -> None:
        """EndTxn once every batch is acknowledged (the producer flushed); a transaction that touched nothing skips it."""
        deadline = self._deadline(timeout_ms)
        async with self._serial:
            if commit:
                self._raise_if_failed()  # a batch failed while flushing
            if self.started and not (self.last_error is not None and self.last_error.code == E.invalid_producer_id_mapping):
                body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                        "producer_epoch": self.producer_epoch, "committed": commit}
                what = "EndTxn(commit)" if commit else "EndTxn(abort)"

                def judge(response: Any) -> None:
                    self._judge(response.error_code, what)
                    if self.v2 and getattr(response, "producer_epoch", -1) >= 0:
                        self._set_producer(response.producer_id, response.producer_epoch)

                await self._call(ApiKey.END_TXN, lambda: body, judge, deadline, what, cap=None if self.v2 else 4)
            if self._epoch_bump:
                await self._init_producer_id(deadline, self.producer_id, self.producer_epoch)
            self._complete()

    def _complete(self) -> None:
        self._transition(State.READY)
        self.last_error = None
        self._epoch_bump = False
        self.started = False
        with self._lock:
            self._new.clear()
            self._adding.clear()
            self.partitions.clear()
