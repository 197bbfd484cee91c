"""One directory of ``log.dirs``: its partition directories, offset checkpoints and clean-shutdown marker.

Kafka keeps the recovery point and the log start offset of every partition
in two files per log directory, and a ``.kafka_cleanshutdown`` marker that
says whether the logs were closed properly. The marker is removed when the
directory is opened, so a crash from then on leaves it absent and the next
start recovers the logs from their recovery points.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from josef.log import LogDirError
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.checkpoints import read_offsets, write_offsets
from josef_storage_local.files import write_atomically

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
#: Suffix of a partition directory being deleted (``topic-0.<uuid>-delete``), as Kafka names it.
DELETE_SUFFIX = "-delete"
#: The longest file name the file systems logs live on accept, in bytes.
MAX_NAME_BYTES = 255

logger = logging.getLogger(__name__)


def delete_dir_name(tp: TopicPartition) -> str:
    """``topic-partition.<uuid>-delete``, the topic cut short enough for the name to fit in a directory entry
    (Kafka's ``logDeleteDirName``): a topic of 249 characters, which is legal, would otherwise make a name the
    file system refuses, and the failed rename would take the whole log directory offline."""
    suffix = f"-{tp.partition}.{uuid.uuid4().hex}{DELETE_SUFFIX}"
    return tp.topic[:MAX_NAME_BYTES - len(suffix)] + suffix  # topic names are ASCII


def _read_or_empty(path: Path) -> dict[TopicPartition, int]:
    """A checkpoint, or nothing when it is unreadable: Kafka then recovers from offset 0, which is safe."""
    try:
        return read_offsets(path)
    except ValueError as exc:
        logger.warning(
            "ignoring corrupt checkpoint %s (logs are recovered from their start): %s", path, exc
        )
        return {}


def _broker_epoch(marker: Path) -> int:
    """The broker epoch in a clean-shutdown marker; -1 when it has none (empty, as older josef wrote it, or damaged)."""
    try:
        epoch = json.loads(marker.read_text(encoding="utf-8") or "{}").get("brokerEpoch", -1)
    except (ValueError, AttributeError):
        return -1
    return epoch if isinstance(epoch, int) else -1


class LogDir:
    """Checkpoints of one log directory, shared by the logs in it; thread-safe (logs flush in worker threads).

    Also whether the directory still works: the first disk error of any log
    in it takes it offline until the next start (:meth:`fail`), as Kafka's
    LogDirFailureChannel does, so one failing disk stops only its own logs.
    """

    def __init__(self, path: Path, checkpoint_interval_ms: int, clock: Callable[[], int]) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        #: Why the directory is offline (the first disk error seen in it); None while it works.
        self.error: LogDirError | None = None
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._recovery_points = _read_or_empty(path / RECOVERY_POINT_FILE)
        self._log_start_offsets = _read_or_empty(path / LOG_START_OFFSET_FILE)
        self._last_checkpoint_ms = clock()
        for leftover in path.glob("*" + DELETE_SUFFIX):
            if leftover.is_dir():
                shutil.rmtree(leftover)  # a deletion interrupted by a crash
        marker = path / CLEAN_SHUTDOWN_FILE
        #: The broker epoch the clean shutdown recorded; -1 after an unclean stop.
        self.clean_shutdown_epoch = -1
        if marker.exists():
            self._unrecovered: set[TopicPartition] = set()
            self.clean_shutdown_epoch = _broker_epoch(marker)
            marker.unlink()
        else:
            # Logs on disk not yet recovered since the unclean stop: recovered
            # when opened; while any is left, the marker must not be written.
            self._unrecovered = set(self.stored())

    @classmethod
    def unusable(cls, path: Path, error: LogDirError) -> LogDir:
        """A directory that could not even be opened at start: offline from the outset, never touched."""
        log_dir = cls.__new__(cls)
        log_dir.path = path
        log_dir.error = error
        log_dir._lock = threading.Lock()
        log_dir._recovery_points, log_dir._log_start_offsets, log_dir._unrecovered = {}, {}, set()
        log_dir.clean_shutdown_epoch = -1
        logger.error("log directory %s is offline: %s", path, error)
        return log_dir

    def fail(self, error: LogDirError) -> None:
        """Take the directory offline for good (until a restart); the first error is the one reported."""
        with self._lock:
            if self.error is not None:
                return
            self.error = error
        logger.error("log directory %s is offline: %s", self.path, error)

    def check_online(self) -> None:
        """Raise :class:`LogDirError` at once when the directory is offline: no log in it touches the disk again."""
        if self.error is not None:
            raise LogDirError(f"log directory {self.path} is offline: {self.error}")

    def stored(self) -> list[TopicPartition]:
        """Partitions with a directory here; anything not named TOPIC-PARTITION (``-delete``...) is skipped."""
        found = []
        with os.scandir(self.path) as entries:  # the entry's type comes with the listing: no stat per partition
            for entry in entries:
                if entry.is_dir():
                    try:
                        found.append(TopicPartition.parse(entry.name))
                    except ValueError:
                        continue
        return found

    def holds(self, tp: TopicPartition) -> bool:
        return (self.path / str(tp)).is_dir()

    def needs_recovery(self, tp: TopicPartition) -> bool:
        return tp in self._unrecovered

    def recovered(self, tp: TopicPartition) -> None:
        self._unrecovered.discard(tp)

    def recovery_point(self, tp: TopicPartition) -> int:
        return self._recovery_points.get(tp, 0)

    def log_start_offset(self, tp: TopicPartition) -> int:
        return self._log_start_offsets.get(tp, 0)

    def update(self, tp: TopicPartition, *, recovery_point: int, log_start_offset: int) -> None:
        """Record a log's offsets in memory; :meth:`checkpoint` writes them."""
        with self._lock:
            self._recovery_points[tp] = recovery_point
            self._log_start_offsets[tp] = log_start_offset

    def forget(self, tp: TopicPartition) -> None:
        """Drop a deleted log from the checkpoints."""
        with self._lock:
            self._recovery_points.pop(tp, None)
            self._log_start_offsets.pop(tp, None)
            self._unrecovered.discard(tp)

    def checkpoint(self) -> None:
        """Write both checkpoint files (atomically) now."""
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()

    def checkpoint_recovery_points(self) -> None:
        """Write ``recovery-point-offset-checkpoint`` (Kafka's kafka-recovery-point-checkpoint task)."""
        with self._lock:
            write_offsets(self.path / RECOVERY_POINT_FILE, self._recovery_points)
            self._last_checkpoint_ms = self._clock()

    def checkpoint_log_start_offsets(self) -> None:
        """Write ``log-start-offset-checkpoint`` (Kafka's kafka-log-start-offset-checkpoint task)."""
        with self._lock:
            write_offsets(self.path / LOG_START_OFFSET_FILE, self._log_start_offsets)

    def checkpoint_if_due(self) -> None:
        """Write the checkpoints if log.flush.offset.checkpoint.interval.ms has passed.

        Flushes call this: rewriting a file that lists every partition on
        each flush of each partition would cost more than the flushes. A
        stale recovery point only makes a crash recovery read more.
        """
        if self._clock() - self._last_checkpoint_ms >= self._checkpoint_interval_ms:
            self.checkpoint()

    def high_watermarks(self) -> dict[TopicPartition, int]:
        return _read_or_empty(self.path / HIGH_WATERMARK_FILE)

    def write_high_watermarks(self, offsets: Mapping[TopicPartition, int]) -> None:
        write_offsets(self.path / HIGH_WATERMARK_FILE, offsets)

    def mark_clean_shutdown(self, broker_epoch: int) -> bool:
        """Write the clean-shutdown marker, unless a log here still awaits its recovery; returns whether written.

        Kafka's format (CleanShutdownFileHandler): JSON with the broker epoch.
        """
        if self._unrecovered:
            return False
        write_atomically(self.path / CLEAN_SHUTDOWN_FILE, json.dumps({"version": 0, "brokerEpoch": broker_epoch}))
        return True
