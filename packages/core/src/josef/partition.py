"""One partition replica on this broker: leader state, high watermark and the log under it.

Designed for replication from the start: the log end offset (LEO) belongs
to the log, the high watermark is the smallest LEO across the ISR, the ISR is
data set by the controller, and every batch a leader appends is stamped with
its leader epoch, which the log's epoch cache remembers.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from kio.schema.errors import ErrorCode

from josef.log import Log, LogConfig, TopicPartition
from josef.metadata.image import PartitionImage
from josef.protocol.codecs import Compression
from josef.protocol.records import AppendInfo, recompress, validate_and_assign


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
        """Validate, stamp and append a produce request's batches; returns the info and the log append time (-1 for CreateTime)."""
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
        self.log.append(buf, info)
        self._maybe_advance_high_watermark()
        return info, append_time if append_time is not None else -1

    def read(self, offset: int, max_bytes: int, min_one_batch: bool, isolation_committed: bool = True) -> bytes:
        """Batches from ``offset`` below the high watermark (consumers) or the log end (followers)."""
        limit = self.high_watermark if isolation_committed else self.log.log_end_offset
        return self.log.read(offset, max_bytes, limit, min_one_batch)
