"""One partition replica on this broker: leader state, high watermark and the log under it.

Designed for replication from the start: the log end offset (LEO) belongs
to the log, the high watermark is the smallest LEO across the ISR, the ISR is
data set by the controller, and every batch a leader appends is stamped with
its leader epoch, which the log's epoch cache remembers.

Each partition also keeps the idempotent producers' state
(:mod:`josef.producer.producer_state`): loaded from the log's latest producer snapshot
plus the batch headers after it, checked on every leader append, and handed
to the log, which snapshots it when a segment rolls and when it closes.
The open transactions in that state give the last stable offset; every
aborted transaction a marker ends (as leader, as follower, or replayed at
start) goes to the log's aborted-transaction index.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping

import attrs

from kio.schema.errors import ErrorCode

from josef.log import AbortedTxn, FileRegion, Log, LogConfig, RemoteRecords
from josef.metadata.image import RECOVERING, PartitionImage
from josef.producer.producer_state import AppendPlan, CompletedTxn, ProducerStateError, ProducerStateManager
from josef.protocol.codecs import Compression
from josef.protocol.record_scan import records_without_key
from josef.protocol.records import (
    AppendInfo,
    ProducerBatch,
    RecordErrors,
    build_marker,
    describe_batches,
    iter_batches,
    producer_batch,
    recompress,
    validate_and_assign,
)
from josef.protocol.topic_partition import TopicPartition
from josef.protocol.wire import writable


#: What a read may see (Fetch and ListOffsets ``isolation_level``; a follower sees the whole log).
READ_UNCOMMITTED, READ_COMMITTED, FOLLOWER = 0, 1, -1

#: Who appends as leader (Kafka's AppendOrigin): clients are held to the idempotence rules (sequences);
#: a coordinator writing its own records in a producer's transaction is not.
CLIENT, COORDINATOR = "client", "coordinator"


class PartitionError(Exception):
    """A request on this partition fails with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@attrs.define
class FollowerState:
    """What a leader knows of one follower, learnt from its fetches (Kafka's ``Replica``)."""

    #: The follower's log end offset: the offset it fetches from (-1 until its first fetch).
    log_end_offset: int = -1
    #: The last time it had everything the leader had; a follower silent past replica.lag.time.max.ms leaves the ISR.
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    #: The leader's log end offset at that fetch.
    last_fetch_leader_end: int = -1

    def fetched(self, offset: int, leader_end: int, now_ms: int) -> None:
        """Kafka's ``Replica.updateFetchState``: caught up if it asked for the leader's end now or at its last fetch."""
        if offset >= leader_end:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif offset >= self.last_fetch_leader_end:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = offset
        self.last_fetch_leader_end = leader_end
        self.last_fetch_ms = now_ms

    def caught_up(self, leader_end: int, now_ms: int, max_lag_ms: int) -> bool:
        return self.log_end_offset >= leader_end or now_ms - self.last_caught_up_ms <= max_lag_ms


def now_ms() -> int:
    return int(time.time() * 1000)


class Partition:
    def __init__(self, tp: TopicPartition, topic_id: str, broker_id: int, log: Log,
                 topic_config: Mapping[str, Any], high_watermark: int | None = None) -> None:
        self.tp = tp
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.log = log
        self.topic_config = dict(topic_config)
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        #: The ISR the controller committed; min.insync.replicas counts these.
        self.isr: tuple[int, ...] = ()
        #: An ISR sent to the controller in AlterPartition and not answered yet (leader only).
        self.pending_isr: tuple[int, ...] | None = None
        #: Every other replica's fetch state (leader only).
        self.followers: dict[int, FollowerState] = {}
        #: Elected uncleanly and not yet said so to the controller (KIP-704): the ISR stays this leader alone.
        self.recovering = False
        #: Eligible leader replicas are on (KIP-966): the high watermark stands still while the ISR is below
        #: min.insync.replicas, so that the replicas that left it (the ELR) hold everything committed.
        self.strict_min_isr = False
        #: The log end offset when this broker became leader: a follower joins the ISR only past it.
        self.leader_epoch_start_offset = -1
        # From the checkpoint, never the log end: what lies past it may not be replicated.
        self.high_watermark = min(log.log_end_offset, max(high_watermark or 0, log.log_start_offset))
        self.producers = self._load_producer_state()
        log.attach_producer_state(self.producers.snapshot)
        log.attach_last_stable_offset(self._stable_offset_for_cleaner)
        #: Producers whose transaction membership is being checked with the coordinator (KIP-890), by producer id.
        self._verifying: dict[int, object] = {}

    def _load_producer_state(self) -> ProducerStateManager:
        """The latest snapshot, then every batch header after it: per batch, never per record.

        After a clean shutdown the snapshot is at the log end and nothing is
        replayed; after a crash the tail since the last segment roll is. With
        no snapshot (a new log, or one written before idempotence) the whole
        log from its start offset is replayed.
        """
        snapshot = self.log.latest_producer_snapshot()
        producers = ProducerStateManager(snapshot.producers if snapshot else ())
        start = snapshot.offset if snapshot else self.log.log_start_offset
        headers = [h for h in self.log.batch_headers(start) if h.producer_id >= 0 and h.last_offset >= start]
        for header in headers:
            if header.is_control:  # a marker: its type and coordinator epoch are in its one record
                raw = self.log.read(header.base_offset, header.size, header.base_offset + 1)
                batch = producer_batch(raw, 0, header)
            else:
                batch = ProducerBatch(header.producer_id, header.producer_epoch, header.base_sequence, header.base_offset,
                                      header.last_offset, header.max_timestamp, header.is_transactional)
            completed = producers.replay(batch)
            if completed is not None and completed.aborted:
                self.log.append_aborted_txn(AbortedTxn(completed.producer_id, completed.first_offset,
                                                       completed.last_offset, producers.last_stable_offset_after(completed)))
        return producers

    @property
    def last_stable_offset(self) -> int:
        """Below this every transaction is decided and replicated: what ``read_committed`` consumers may read."""
        first_unstable = self.producers.first_unstable_offset(self.high_watermark)
        return self.high_watermark if first_unstable is None else min(first_unstable, self.high_watermark)

    def _stable_offset_for_cleaner(self) -> int:
        """:attr:`last_stable_offset`, read from a cleaner thread (nothing is changed, so it is safe there)."""
        high_watermark = self.high_watermark
        first_unstable = self.producers.first_unstable_offset(high_watermark, prune=False)
        return high_watermark if first_unstable is None else min(first_unstable, high_watermark)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the high watermark waits for: the committed one plus any member being added (Kafka's maximalIsr).

        A follower being added must have the data before the controller
        confirms it, so that an ISR it joins never lacks a committed record.
        """
        if self.pending_isr is None:
            return self.isr
        return self.isr + tuple(b for b in self.pending_isr if b not in self.isr)

    def update_state(self, state: PartitionImage, at_ms: int | None = None) -> bool:
        """Apply the controller's view (leader, epochs, replicas, ISR); True when the leader or its epoch changed.

        A state older than the one applied (an AlterPartition answer can
        arrive before the metadata record that carries it) is ignored.
        """
        if state.partition_epoch < self.partition_epoch:
            return False
        new_term = state.leader != self.leader_id or state.leader_epoch != self.leader_epoch
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = state.replicas
        self.isr = state.isr
        self.recovering = state.leader_recovery_state == RECOVERING
        self.pending_isr = None
        if not self.is_leader:
            self.followers = {}
        elif new_term:
            # Kafka's makeLeader: a new epoch starts at the log end; ISR members count as caught up now.
            self.log.assign_epoch(self.leader_epoch, self.log.log_end_offset)
            self.leader_epoch_start_offset = self.log.log_end_offset
            now = now_ms() if at_ms is None else at_ms
            self.followers = {b: FollowerState(last_caught_up_ms=now if b in self.isr else 0)
                              for b in self.replicas if b != self.broker_id}
        else:
            self.followers = {b: self.followers.get(b) or FollowerState() for b in self.replicas if b != self.broker_id}
        self._maybe_advance_high_watermark()
        return new_term

    def update_config(self, topic_config: Mapping[str, Any]) -> None:
        self.topic_config = dict(topic_config)
        self.log.update_config(LogConfig.from_topic_config(topic_config))

    def _maybe_advance_high_watermark(self) -> bool:
        """The leader's high watermark: the smallest log end offset over the (maximal) ISR; it never goes back."""
        if not self.is_leader:
            return False
        if self.strict_min_isr and len(self.isr) < self.topic_config.get("min.insync.replicas", 1):
            return False
        new = self.log.log_end_offset
        for b in self.maximal_isr:
            if b != self.broker_id:
                follower = self.followers.get(b)
                new = min(new, follower.log_end_offset if follower is not None else -1)
        new = max(new, self.log.log_start_offset)
        if new > self.high_watermark:
            self.high_watermark = new
            return True
        return False

    # Leader side: followers' fetches and the ISR ------------------------------------

    def follower_fetched(self, replica_id: int, offset: int, at_ms: int | None = None) -> bool:
        """A follower fetched from ``offset`` (its log end); True when the high watermark moved."""
        follower = self.followers.get(replica_id)
        if follower is None:
            raise PartitionError(ErrorCode.not_leader_or_follower,
                                 f"broker {replica_id} is not a replica of {self.tp} (replicas {list(self.replicas)})")
        follower.fetched(offset, self.log.log_end_offset, now_ms() if at_ms is None else at_ms)
        return self._maybe_advance_high_watermark()

    def isr_to_expand(self, eligible: Callable[[int], bool]) -> tuple[int, ...] | None:
        """The ISR with every follower that caught up (Kafka's isFollowerInSync), or None if nobody joins.

        A follower joins once it holds the high watermark and something of
        this leader's epoch, and its broker is registered and not fenced or
        shutting down (``eligible``).
        """
        if not self.is_leader or self.pending_isr is not None or self.recovering:
            return None
        joining = [b for b, f in self.followers.items()
                   if b not in self.isr and f.log_end_offset >= max(self.high_watermark, self.leader_epoch_start_offset)
                   and eligible(b)]
        return self.isr + tuple(sorted(joining)) if joining else None

    def isr_to_shrink(self, max_lag_ms: int, at_ms: int | None = None) -> tuple[int, ...] | None:
        """The ISR without the followers that have not caught up for ``max_lag_ms``, or None if all have."""
        if not self.is_leader or self.pending_isr is not None:
            return None
        now = now_ms() if at_ms is None else at_ms
        end = self.log.log_end_offset
        lagging = {b for b in self.isr if b != self.broker_id
                   and not self.followers.get(b, FollowerState()).caught_up(end, now, max_lag_ms)}
        return tuple(b for b in self.isr if b not in lagging) if lagging else None

    def isr_committed(self, isr: tuple[int, ...], leader_epoch: int, partition_epoch: int, recovering: bool) -> None:
        """The controller accepted an ISR change (its AlterPartition answer, ahead of the metadata record)."""
        if leader_epoch == self.leader_epoch and partition_epoch > self.partition_epoch:
            self.isr, self.partition_epoch, self.recovering = isr, partition_epoch, recovering
            self._maybe_advance_high_watermark()

    def check_enough_replicas(self) -> None:
        """acks=all after the high watermark passed a write: fail if the ISR shrank below min.insync.replicas meanwhile."""
        min_isr = self.topic_config.get("min.insync.replicas", 1)
        if len(self.isr) < min_isr:
            raise PartitionError(ErrorCode.not_enough_replicas_after_append,
                                 f"{self.tp} has {len(self.isr)} in-sync replicas after the append, "
                                 f"min.insync.replicas is {min_isr}")

    def check_leader_epoch(self, requested: int) -> None:
        """Kafka's fencing of a client or follower that knows a different leader epoch (-1: not checked)."""
        if requested == -1 or requested == self.leader_epoch:
            return
        if requested > self.leader_epoch:
            raise PartitionError(ErrorCode.unknown_leader_epoch, f"{self.tp}: epoch {requested} is newer than {self.leader_epoch}")
        raise PartitionError(ErrorCode.fenced_leader_epoch, f"{self.tp}: epoch {requested} is older than {self.leader_epoch}")

    def check_epoch_seen(self, seen: int) -> None:
        """Refuse a client or follower that holds records of a newer leader epoch than this broker's (-1: not checked).

        Such records exist only if a newer leader took over, so this broker's
        metadata is behind: it was frozen or cut off and has not caught up.
        Kafka answers from its stale state here (an OffsetForLeaderEpoch end
        offset of -1, which a consumer takes as truncation and resets to its
        ``auto.offset.reset``); UNKNOWN_LEADER_EPOCH makes the client refresh
        its metadata and ask again instead.
        """
        if seen > self.leader_epoch:
            raise PartitionError(ErrorCode.unknown_leader_epoch,
                                 f"{self.tp}: records of epoch {seen} exist, this broker knows epoch {self.leader_epoch}")

    def require_leader(self) -> None:
        if not self.is_leader:
            raise PartitionError(ErrorCode.not_leader_or_follower, f"broker {self.broker_id} does not lead {self.tp}")

    def in_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether the producer has an open transaction here at this epoch: its batches need no verification."""
        entry = self.producers.get(producer_id)
        return entry is not None and entry.current_txn_first_offset >= 0 and entry.epoch == producer_epoch

    def start_verification(self, producer_id: int) -> object:
        """A guard for an append that waits on the coordinator's verification; a marker meanwhile voids it."""
        guard = self._verifying[producer_id] = object()
        return guard

    def append_as_leader(self, records: bytes | bytearray | memoryview, required_acks: int, origin: str = CLIENT,
                         verification: object | None = None) -> tuple[AppendInfo, int]:
        """Validate, stamp and append a produce request's batches; returns the info and the log append time (-1 for CreateTime).

        Idempotent batches are checked against the producer state after the
        batch checks (CRC first, so a corrupt batch is never mistaken for a
        duplicate) and before anything reaches the log: the offsets written
        so far are only in this request's private copy of the buffer, the
        log end has not moved, which is Kafka's order too. A duplicate is
        answered with the original batch's offsets and not appended; the
        state changes only once the log accepted the batches.
        """
        self.require_leader()
        if required_acks == -1:
            self._check_min_isr()
        append_time = int(time.time() * 1000) if self.topic_config.get("message.timestamp.type") == "LogAppendTime" else None
        codec = self.topic_config.get("compression.type", "producer")
        if codec != "producer":
            buf = recompress(records, Compression.from_name(codec))
        elif writable(records):
            buf = records  # a large request's own buffer (josef.protocol.frames): stamped where it lies, no copy
        else:
            buf = bytearray(records)
        info = validate_and_assign(buf, self.log.log_end_offset, self.leader_epoch,
                                   self.topic_config.get("max.message.bytes", 1048588), append_time)
        if self.log.config.compact:
            self._check_keys(buf)
        plan = self._check_producers(info, origin)
        if verification is not None and plan is not None and plan.duplicate is None:
            if any(self._verifying.get(b.producer_id) is not verification for b in info.producer_ids):
                raise PartitionError(ErrorCode.invalid_txn_state,
                                     f"{self.tp}: the transaction ended while the partition was being verified")
        if plan is not None and plan.duplicate is not None:
            original = plan.duplicate
            duplicate = AppendInfo(original.first_offset, original.last_offset, original.max_timestamp,
                                   original.last_offset, 0, ())
            return duplicate, original.max_timestamp if append_time is not None else -1
        self.log.append(buf, info)
        if plan is not None:
            self.producers.commit(plan)
            self._index_aborted(plan.completed)
        self._maybe_advance_high_watermark()
        return info, append_time if append_time is not None else -1

    def _check_keys(self, buf: bytearray) -> None:
        """A compacted topic keeps the latest record per key, so it refuses records without one (Kafka's LogValidator).

        The whole request is refused, naming each keyless record: the one
        place a produce looks at every record, and only for compacted topics.
        """
        keyless = records_without_key(buf)
        if keyless:
            why = f"Compacted topic cannot accept message without key in topic partition {self.tp}."
            raise RecordErrors([(index, why) for index in keyless])

    def append_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool) -> AppendInfo:
        """Write a transaction marker as leader (WriteTxnMarkers): ends ``producer_id``'s transaction here.

        The marker is checked against the producer's state like any batch
        (an older coordinator or producer epoch is refused) and an abort is
        indexed. The caller waits for the high watermark to pass it.
        """
        self.require_leader()
        self._check_min_isr()
        end = self.log.log_end_offset
        buf = build_marker(producer_id, producer_epoch, coordinator_epoch, commit, int(time.time() * 1000),
                           base_offset=end, leader_epoch=self.leader_epoch)
        info = describe_batches(buf, end)
        plan = self._check_producers(info, COORDINATOR)
        self.log.append(buf, info)
        if plan is not None:  # (none for producer id -1: Kafka appends such a marker, which ends nothing)
            self.producers.commit(plan)
            self._index_aborted(plan.completed)
        self._maybe_advance_high_watermark()
        return info

    def _check_min_isr(self) -> None:
        min_isr = self.topic_config.get("min.insync.replicas", 1)
        if len(self.isr) < min_isr:
            raise PartitionError(ErrorCode.not_enough_replicas,
                                 f"{self.tp} has {len(self.isr)} in-sync replicas, min.insync.replicas is {min_isr}")

    def _check_producers(self, info: AppendInfo, origin: str) -> AppendPlan | None:
        if not info.producer_ids:
            return None
        try:
            return self.producers.validate(info.producer_ids, check_sequence=origin == CLIENT)
        except ProducerStateError as exc:
            raise PartitionError(exc.code, f"{self.tp}: {exc}") from None

    def _index_aborted(self, completed: Iterable[CompletedTxn]) -> None:
        for txn in completed:
            self._verifying.pop(txn.producer_id, None)
            if txn.aborted:
                self.log.append_aborted_txn(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                                       self.producers.last_stable_offset_after(txn)))

    # Follower side ------------------------------------------------------------------

    def append_as_follower(self, records: bytes, leader_high_watermark: int, leader_log_start: int) -> int:
        """Append the leader's batches unchanged, learn its epochs, high watermark and log start; returns bytes appended.

        The batches are checked (whole, CRC, contiguous from our log end, no
        epoch above the leader's) but never rewritten: every replica holds
        the same bytes at the same offsets. Producer state follows the
        batches, so a follower that becomes leader keeps deduplicating.
        """
        if records:
            info = describe_batches(records, self.log.log_end_offset, self.leader_epoch)
            latest = self.log.epoch_entries()[-1].epoch if self.log.epoch_entries() else -1
            for _, header in iter_batches(records):
                if header.partition_leader_epoch > latest:
                    latest = header.partition_leader_epoch
                    self.log.assign_epoch(latest, header.base_offset)
            self.log.append(records, info)
            self._index_aborted(filter(None, map(self.producers.replay, info.producer_ids)))
        self.high_watermark = max(self.high_watermark, min(leader_high_watermark, self.log.log_end_offset))
        if leader_log_start > self.log.log_start_offset:
            self.log.delete_records_before(min(leader_log_start, self.high_watermark))
        return len(records)

    def truncation_point(self, leader_epoch: int, leader_end_offset: int) -> tuple[int, bool]:
        """Where to cut the log, given the leader's ``(epoch, end offset)`` for our latest epoch (KIP-101, KIP-279).

        Kafka's ``getOffsetTruncationState``: the second value is False when
        we do not know the leader's epoch, so after cutting to our own end of
        the epoch below it we must ask again with our new latest epoch.
        """
        end = self.log.log_end_offset
        if leader_end_offset < 0:  # the leader knows no epoch that old: fall back to the high watermark
            return min(self.high_watermark, end), True
        if leader_epoch < 0:
            return min(leader_end_offset, end), True
        ours, our_end = self.log.end_offset_for_epoch(leader_epoch)
        if ours < 0:
            return min(leader_end_offset, end), True
        if ours != leader_epoch:
            return min(our_end, end), False
        return min(leader_end_offset, our_end, end), True

    def latest_epoch(self) -> int:
        entries = self.log.epoch_entries()
        return entries[-1].epoch if entries else -1

    def truncate_to(self, offset: int) -> None:
        """Drop the log from ``offset`` on (a follower diverging from its leader) and rebuild the producer state."""
        if offset < self.log.log_end_offset:
            self.log.truncate_to(offset)
            self._reload_producers()
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int, producer_snapshot: bytes | None = None,
                                    log_start_offset: int | None = None) -> None:
        """Start empty at the leader's log start: everything we hold is below it (Kafka's OFFSET_OUT_OF_RANGE handling).

        ``producer_snapshot``: the producer state at ``offset``, in the
        storage's format, when what is below is kept in remote storage
        (:meth:`josef.log.Log.remote_producer_snapshot`); ``log_start_offset``
        then is the leader's log start, where what remote storage keeps
        begins. A snapshot that cannot be one raises :class:`ValueError` once
        the log has started empty there all the same, without it.
        """
        if log_start_offset is not None and log_start_offset < offset:
            self.log.truncate_fully_and_start_at(offset, log_start_offset=log_start_offset)
        else:
            self.log.truncate_fully_and_start_at(offset)
        try:
            if producer_snapshot is not None:
                self.log.install_producer_snapshot(offset, producer_snapshot)
        finally:
            self._reload_producers()
            self.high_watermark = offset

    def _reload_producers(self) -> None:
        self.producers = self._load_producer_state()
        self.log.attach_producer_state(self.producers.snapshot)

    def read(self, offset: int, max_bytes: int, min_one_batch: bool, isolation: int = READ_UNCOMMITTED, *,
             zero_copy: bool = False) -> bytes | FileRegion:
        """Batches from ``offset`` below the high watermark (consumers), the last stable offset (``read_committed``) or the log end (followers).

        ``zero_copy`` lets the storage answer with a :class:`josef.log.FileRegion` for the network to send as it is.
        """
        limit = {READ_UNCOMMITTED: self.high_watermark, READ_COMMITTED: self.last_stable_offset}.get(
            isolation, self.log.log_end_offset)
        if zero_copy:
            return self.log.read_region(offset, max_bytes, limit, min_one_batch)
        return self.log.read(offset, max_bytes, limit, min_one_batch)

    async def read_remote(self, offset: int, max_bytes: int, min_one_batch: bool, read_committed: bool) -> RemoteRecords:
        """A consumer's read below the local log start, from remote storage: what :meth:`read` answers above it."""
        limit = self.last_stable_offset if read_committed else self.high_watermark
        return await self.log.read_remote(offset, max_bytes, limit, min_one_batch, read_committed)
