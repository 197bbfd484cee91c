"""One partition replica on this broker: leader state, high watermark and the log under it.

Designed for replication from the start: the log end offset (LEO) belongs
to the log, the high watermark is the smallest LEO across the ISR, the ISR is
data set by the controller, and every batch a leader appends is stamped with
its leader epoch, which the log's epoch cache remembers.

Each partition also keeps the idempotent producers' state
(:mod:`josef.producer_state`): loaded from the log's latest producer snapshot
plus the batch headers after it, checked on every leader append, and handed
to the log, which snapshots it when a segment rolls and when it closes.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from kio.schema.errors import ErrorCode

from josef.log import Log, LogConfig
from josef.metadata.image import PartitionImage
from josef.producer_state import AppendPlan, ProducerStateError, ProducerStateManager
from josef.protocol.codecs import Compression
from josef.protocol.records import AppendInfo, ProducerBatch, recompress, validate_and_assign
from josef.protocol.topic_partition import TopicPartition


class PartitionError(Exception):
    """A request on this partition fails with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


class Partition:
    def __init__(self, tp: TopicPartition, topic_id: str, broker_id: int, log: Log,
                 topic_config: Mapping[str, Any]) -> None:
        self.tp = tp
        self.topic_id = topic_id
        self.broker_id = broker_id
        self.log = log
        self.topic_config = dict(topic_config)
        self.leader_id = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        #: LEO of each follower in the ISR, as learnt from their fetches (leader only).
        self.follower_end_offsets: dict[int, int] = {}
        self.high_watermark = log.log_end_offset
        self.producers = self._load_producer_state()
        log.attach_producer_state(self.producers.snapshot)

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
        for header in self.log.batch_headers(start):
            if header.producer_id >= 0 and not header.is_control:
                producers.replay(ProducerBatch(header.producer_id, header.producer_epoch, header.base_sequence,
                                               header.base_offset, header.last_offset, header.max_timestamp))
        return producers

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    def update_state(self, state: PartitionImage) -> None:
        """Apply the controller's view: leader, epoch, replicas, ISR."""
        became_leader = state.leader == self.broker_id and (not self.is_leader or state.leader_epoch != self.leader_epoch)
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.replicas = state.replicas
        self.isr = state.isr
        if became_leader:
            self.log.assign_epoch(self.leader_epoch, self.log.log_end_offset)
            self.follower_end_offsets = {b: -1 for b in self.isr if b != self.broker_id}
        self._maybe_advance_high_watermark()

    def update_config(self, topic_config: Mapping[str, Any]) -> None:
        self.topic_config = dict(topic_config)
        self.log.update_config(LogConfig.from_topic_config(topic_config))

    def _maybe_advance_high_watermark(self) -> bool:
        end_offsets = [self.log.log_end_offset] + [
            self.follower_end_offsets.get(b, -1) for b in self.isr if b != self.broker_id
        ]
        new = max(min(end_offsets), self.log.log_start_offset)
        if new > self.high_watermark:
            self.high_watermark = new
            return True
        return False

    def check_leader_epoch(self, requested: int) -> None:
        """Kafka's fencing of a client or follower that knows a different leader epoch (-1: not checked)."""
        if requested == -1 or requested == self.leader_epoch:
            return
        if requested > self.leader_epoch:
            raise PartitionError(ErrorCode.unknown_leader_epoch, f"{self.tp}: epoch {requested} is newer than {self.leader_epoch}")
        raise PartitionError(ErrorCode.fenced_leader_epoch, f"{self.tp}: epoch {requested} is older than {self.leader_epoch}")

    def require_leader(self) -> None:
        if not self.is_leader:
            raise PartitionError(ErrorCode.not_leader_or_follower, f"broker {self.broker_id} does not lead {self.tp}")

    def append_as_leader(self, records: bytes, required_acks: int) -> tuple[AppendInfo, int]:
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
        min_isr = self.topic_config.get("min.insync.replicas", 1)
        if required_acks == -1 and len(self.isr) < min_isr:
            raise PartitionError(ErrorCode.not_enough_replicas,
                                 f"{self.tp} has {len(self.isr)} in-sync replicas, min.insync.replicas is {min_isr}")
        append_time = int(time.time() * 1000) if self.topic_config.get("message.timestamp.type") == "LogAppendTime" else None
        codec = self.topic_config.get("compression.type", "producer")
        buf = bytearray(records) if codec == "producer" else recompress(records, Compression.from_name(codec))
        info = validate_and_assign(buf, self.log.log_end_offset, self.leader_epoch,
                                   self.topic_config.get("max.message.bytes", 1048588), append_time)
        plan = self._check_producers(info)
        if plan is not None and plan.duplicate is not None:
            original = plan.duplicate
            duplicate = AppendInfo(original.first_offset, original.last_offset, original.max_timestamp,
                                   original.last_offset, 0, ())
            return duplicate, original.max_timestamp if append_time is not None else -1
        self.log.append(buf, info)
        if plan is not None:
            self.producers.commit(plan)
        self._maybe_advance_high_watermark()
        return info, append_time if append_time is not None else -1

    def _check_producers(self, info: AppendInfo) -> AppendPlan | None:
        if not info.producer_ids:
            return None
        try:
            return self.producers.validate(info.producer_ids)
        except ProducerStateError as exc:
            raise PartitionError(exc.code, f"{self.tp}: {exc}") from None

    def truncate_to(self, offset: int) -> None:
        """Drop the log from ``offset`` on (a follower diverging from its leader) and rebuild the producer state."""
        self.log.truncate_to(offset)
        self.producers = self._load_producer_state()
        self.log.attach_producer_state(self.producers.snapshot)
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    def read(self, offset: int, max_bytes: int, min_one_batch: bool, isolation_committed: bool = True) -> bytes:
        """Batches from ``offset`` below the high watermark (consumers) or the log end (followers)."""
        limit = self.high_watermark if isolation_committed else self.log.log_end_offset
        return self.log.read(offset, max_bytes, limit, min_one_batch)
