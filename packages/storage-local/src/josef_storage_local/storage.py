"""All partition logs of one broker under ``log.dirs``: :class:`LocalLogStorage` implements :class:`josef.log.LogStorage`."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Iterable, Mapping

from prometheus_client.core import Metric

from josef.config import Config
from josef.log import LogConfig, LogDirError, LogDirInfo, LogDirNotFoundError
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local import cleaner_checkpoint
from josef_storage_local.cleaner import LogCleaner
from josef_storage_local.files import dir_error, fsync_dir
from josef_storage_local.log import Clock, LocalLog, wall_clock_ms
from josef_storage_local.logdir import LogDir, delete_dir_name
from josef_storage_local.metrics import FlushStats, storage_metrics
from josef_storage_local.move import FUTURE_SUFFIX, finish_interrupted_moves, fsync_tree, sync
from josef_storage_local.scheduler import Scheduler

#: The KRaft metadata log's topic.
METADATA_TOPIC = "__cluster_metadata"


class LocalLogStorage:
    """Logs in Kafka's on-disk layout, one directory per partition, in the directories of ``log.dirs``.

    New logs go to the online directory holding the fewest partitions
    (Kafka's ``LogManager.nextLogDirs``); existing ones are found in any.
    Open logs are cached. A log is recovered when it is first opened after
    an unclean shutdown (the directory had no ``.kafka_cleanshutdown``).

    A disk error in a directory takes that directory offline until the next
    start (:class:`josef_storage_local.logdir.LogDir`): its logs fail fast,
    it gets no new logs, and the other directories carry on. A directory
    that cannot be opened at start is offline from the outset; the storage
    starts unless none can be opened.
    """

    def __init__(self, config: Config, *, clock: Clock = wall_clock_ms) -> None:
        paths = config["log.dirs"] or [config["log.dir"]]
        interval = config["log.flush.offset.checkpoint.interval.ms"]
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()  # open() and delete() run in a worker thread, lookups on the event loop
        self._logs: dict[TopicPartition, LocalLog] = {}
        self._move_lock = threading.Lock()  # one move at a time: a crash then leaves at most one future dir
        #: Flushes, checkpoints and delayed deletions, in a thread from :meth:`startup` on.
        self.scheduler = Scheduler(clock)
        self._cleaner = LogCleaner(self._open_logs, config, clock)
        #: Kafka's LogFlushStats: every flush of this storage's logs, timed (:mod:`josef_storage_local.metrics`).
        self.flush_stats = FlushStats()
        self._dirs = []
        # Absolute, as DescribeLogDirs reports them and AlterReplicaLogDirs names them.
        absolute = [Path(os.path.abspath(path)) for path in paths]
        try:
            settled = finish_interrupted_moves(absolute)
        except OSError as exc:
            raise dir_error(exc, "finishing interrupted moves in", paths) from exc
        for path in absolute:
            try:
                self._dirs.append(LogDir(path, interval, clock))
            except OSError as exc:  # offline alone, as Kafka starts without a failed disk; all of them: no start
                self._dirs.append(LogDir.unusable(path, dir_error(exc, "opening log directory", path)))
        if all(log_dir.error is not None for log_dir in self._dirs):
            raise self._dirs[0].error  # type: ignore[misc]
        for log_dir in self._dirs:
            if log_dir.error is not None:
                continue
            stale = [tp for tp in settled if not log_dir.holds(tp)]
            for tp in stale:
                log_dir.forget(tp)  # the checkpoint entry of the copy that lost
            if stale:
                try:
                    log_dir.checkpoint()
                except OSError as exc:
                    raise dir_error(exc, "checkpointing", log_dir.path) from exc

    @property
    def dirs(self) -> list[Path]:
        return [log_dir.path for log_dir in self._dirs]

    def _dir_of(self, tp: TopicPartition) -> LogDir:
        """Where ``tp``'s log is, or goes when it has none yet (:meth:`_place`)."""
        return self._holding(tp) or self._place(tp)

    def _place(self, tp: TopicPartition) -> LogDir:
        """The directory for a new log: the online one with the fewest partitions, the first of those on a tie.

        Kafka's ``LogManager.nextLogDirs``: counting partitions rather than
        bytes spreads logs that are all still empty when they are created.
        The metadata log is not counted; it goes to the first directory,
        Kafka's default ``metadata.log.dir``, where the quorum keeps its
        other files.
        """
        if tp.topic == METADATA_TOPIC:
            return self._dirs[0]
        online = [log_dir for log_dir in self._dirs if log_dir.error is None]
        if not online:
            raise LogDirError(f"every log directory is offline: {[str(p) for p in self.dirs]}")
        if len(online) == 1:
            return online[0]  # nothing to count: a broker creating 1,000 partitions must not list its directory 1,000 times
        counts = {log_dir.path: sum(tp.topic != METADATA_TOPIC for tp in log_dir.stored()) for log_dir in online}
        return min(online, key=lambda log_dir: counts[log_dir.path])

    def _holding(self, tp: TopicPartition) -> LogDir | None:
        for log_dir in self._dirs:
            try:
                if log_dir.holds(tp):
                    return log_dir
            except OSError as exc:
                if log_dir.error is None:
                    raise self._failed(log_dir, exc, "looking for the log of", log_dir.path / str(tp)) from exc
                return log_dir  # a failed disk that may hold it: never create it elsewhere meanwhile
        return None

    def _failed(self, log_dir: LogDir, exc: OSError, action: str, path: Path) -> LogDirError:
        """The :class:`LogDirError` for a disk error in ``log_dir``, which it takes offline."""
        error = dir_error(exc, action, path)
        log_dir.fail(error)
        return error

    # Metrics ---------------------------------------------------------------------------------

    @property
    def logs(self) -> Mapping[TopicPartition, LocalLog]:
        """The open logs (copy it before iterating: worker threads open and delete logs)."""
        return self._logs

    @property
    def cleaner(self) -> LogCleaner:
        return self._cleaner

    def log_dir_states(self) -> list[tuple[str, bool]]:
        """Each log directory and whether it is offline."""
        return [(str(log_dir.path), log_dir.error is not None) for log_dir in self._dirs]

    def collect(self) -> Iterable[Metric]:
        """The storage's metrics on the node's ``/metrics`` (:mod:`josef_storage_local.metrics`)."""
        return storage_metrics(self, METADATA_TOPIC)

    def offline_dirs(self) -> list[str]:
        return [str(log_dir.path) for log_dir in self._dirs if log_dir.error is not None]

    def _stored_in(self, tp: TopicPartition) -> LogDir:
        """The directory holding ``tp``'s log; KeyError (the contract's) when there is none."""
        found = self._holding(tp)
        if found is None:
            raise KeyError(tp)
        return found

    def log_dirs(self) -> list[LogDirInfo]:
        infos = []
        for log_dir in self._dirs:
            if log_dir.error is not None:
                infos.append(LogDirInfo(str(log_dir.path), error=str(log_dir.error)))
                continue
            try:
                usage = shutil.disk_usage(log_dir.path)
            except OSError as exc:
                infos.append(LogDirInfo(str(log_dir.path), error=str(dir_error(exc, "statting", log_dir.path))))
            else:
                infos.append(LogDirInfo(str(log_dir.path), usage.total, usage.free))
        return infos

    def dir_of(self, tp: TopicPartition) -> str:
        return str(self._stored_in(tp).path)

    def move(self, tp: TopicPartition, log_dir: str) -> None:
        """Copy into a future dir of the target, catch up under the log's lock, commit by renames (:mod:`josef_storage_local.move`)."""
        target = next((d for d in self._dirs if d.path == Path(os.path.abspath(log_dir))), None)
        if target is None:
            raise LogDirNotFoundError(f"{log_dir} is not one of the log directories {[str(p) for p in self.dirs]}")
        target.check_online()
        with self._move_lock:
            source = self._stored_in(tp)
            if source is target:
                return
            source.check_online()
            with self._lock:
                log = self._logs.get(tp)
            current, final = source.path / str(tp), target.path / str(tp)
            name = f"{tp}.{uuid.uuid4().hex}"
            future = target.path / f"{name}{FUTURE_SUFFIX}"
            doomed = source.path / delete_dir_name(tp)
            try:
                copied = sync(current, future, {}, None)

                def finish() -> tuple[Path, LogDir]:
                    active_base = max(int(p.stem) for p in current.glob("*.log") if p.stem.isdigit())
                    sync(current, future, copied, active_base)
                    fsync_tree(future)
                    fsync_dir(target.path)
                    target.update(tp, recovery_point=source.recovery_point(tp),
                                  log_start_offset=source.log_start_offset(tp))
                    target.checkpoint()
                    os.rename(current, doomed)  # the commit point, durable before the new copy is named
                    fsync_dir(source.path)
                    try:
                        os.rename(future, final)
                    except OSError:
                        os.rename(doomed, current)
                        raise
                    fsync_dir(target.path)
                    source.forget(tp)
                    source.checkpoint()
                    return final, target

                if log is None:
                    finish()
                else:
                    log.relocate(finish)
            except LogDirError:
                self._abandon(tp, target, future)
                raise
            except OSError as exc:
                self._abandon(tp, target, future)
                raise dir_error(exc, f"moving {tp} to", target.path) from exc
            try:
                shutil.rmtree(doomed)
            except OSError as exc:
                raise dir_error(exc, "removing the old copy", doomed) from exc

    def open(self, tp: TopicPartition, config: LogConfig) -> LocalLog:
        """The open log of ``tp`` (its config updated), else loaded from disk or created."""
        with self._lock:
            log = self._logs.get(tp)
            if log is not None and not log.closed:
                log.update_config(config)
                return log
            log_dir = self._dir_of(tp)
            log_dir.check_online()
            try:
                log = LocalLog(
                    tp,
                    log_dir.path / str(tp),
                    config,
                    log_dir,
                    recover=log_dir.needs_recovery(tp),
                    clock=self._clock,
                    flush_stats=self.flush_stats,
                )
            except LogDirError as exc:
                log_dir.fail(exc)
                raise
            log_dir.recovered(tp)
            if self.scheduler.running:
                log.attach_scheduler(self.scheduler)
            self._logs[tp] = log
            return log

    def startup(self) -> None:
        """Start the background thread (:mod:`josef_storage_local.scheduler`) and give it the open logs, then the cleaner threads.

        Kafka's LogManager.startup: rolled segments are flushed soon after
        each roll, logs past flush.ms every log.flush.scheduler.interval.ms,
        recovery points and log start offsets are checkpointed at their
        intervals, and deleted segment files go after file.delete.delay.ms.
        """
        config = self._config
        with self._lock:
            self.scheduler.start()
            logs = list(self._logs.values())
        for log in logs:
            log.attach_scheduler(self.scheduler)
        self.scheduler.schedule_periodically(self._flush_due_logs, config["log.flush.scheduler.interval.ms"])
        self.scheduler.schedule_periodically(
            self._checkpoint_recovery_points, config["log.flush.offset.checkpoint.interval.ms"]
        )
        self.scheduler.schedule_periodically(
            self._checkpoint_log_start_offsets, config["log.flush.start.offset.checkpoint.interval.ms"]
        )
        self._cleaner.start()

    def _open_logs(self) -> list[LocalLog]:
        with self._lock:
            return list(self._logs.values())

    def _flush_due_logs(self) -> None:
        now = self._clock()
        for log in self._open_logs():
            try:
                log.flush_if_due(now)
            except LogDirError:
                continue  # its directory is offline now: the others are still flushed

    def _checkpoint_recovery_points(self) -> None:
        for log_dir in self._dirs:
            if log_dir.error is None:
                try:
                    log_dir.checkpoint_recovery_points()
                except OSError as exc:
                    self._failed(log_dir, exc, "checkpointing recovery points in", log_dir.path)

    def _checkpoint_log_start_offsets(self) -> None:
        for log_dir in self._dirs:
            if log_dir.error is None:
                try:
                    log_dir.checkpoint_log_start_offsets()
                except OSError as exc:
                    self._failed(log_dir, exc, "checkpointing log start offsets in", log_dir.path)

    def update_config(self, config: Config) -> None:
        self._config = config
        self._cleaner.update_config(config)

    def stored(self) -> list[TopicPartition]:
        """Partitions with a log in an online directory: an offline one is not read again (Kafka lists live dirs only)."""
        return sorted({tp for log_dir in self._dirs if log_dir.error is None for tp in log_dir.stored()})

    def delete(self, tp: TopicPartition) -> None:
        """Close the log and remove its directory: renamed to ``topic-partition.<uuid>-delete`` first, as Kafka does.

        The rename is atomic, so a crash never leaves a half-deleted log that
        looks alive; a leftover ``-delete`` directory is removed at the next
        start. Once the background thread runs, the directory is removed after
        the log's ``file.delete.delay.ms`` (Kafka's ``LogManager.asyncDelete``);
        before, at once.
        """
        with self._lock:
            log = self._logs.pop(tp, None)
        delay_ms = log.config.file_delete_delay_ms if log is not None else self._config["log.segment.delete.delay.ms"]
        if log is not None:
            log.release()
        log_dir = self._holding(tp)
        if log_dir is None:
            return
        path = log_dir.path / str(tp)
        log_dir.forget(tp)
        if log_dir.error is not None:
            return  # the disk is not touched again; the next start finds the log stray and deletes it
        try:
            cleaner_checkpoint.update(log_dir.path, tp, None)
            doomed = None
            if path.exists():
                doomed = path.with_name(delete_dir_name(tp))
                os.rename(path, doomed)
            if self.scheduler.running:
                self._settle_later(log_dir)
                if doomed is not None:
                    self.scheduler.schedule(lambda: shutil.rmtree(doomed, ignore_errors=True), delay_ms,
                                            run_at_close=True)
            else:
                log_dir.checkpoint()
                fsync_dir(log_dir.path)
                if doomed is not None:
                    shutil.rmtree(doomed)
        except OSError as exc:
            raise self._failed(log_dir, exc, "deleting", path) from exc

    def _settle_later(self, log_dir: LogDir) -> None:
        """Checkpoint ``log_dir`` without its deleted logs and make their renames durable, once for all the
        deletions of a moment, on the background thread.

        Deleting a topic of 2,000 partitions otherwise rewrote both checkpoint
        files and fsynced the directory 2,000 times on the event loop (seconds
        without an answer to anyone). Until the task runs, a crash can bring a
        renamed directory back under its old name: the next start then finds
        a log of a topic that no longer exists and deletes it as stray.
        """
        self.scheduler.add_to_batch("settle-deletions", log_dir, self._settle)

    def _settle(self, log_dirs: list[LogDir]) -> None:
        for log_dir in dict.fromkeys(log_dirs):  # each directory once, however many of its logs went
            if log_dir.error is not None:
                continue
            try:
                log_dir.checkpoint()
                fsync_dir(log_dir.path)
            except OSError as exc:
                self._failed(log_dir, exc, "checkpointing after deleting logs in", log_dir.path)

    @staticmethod
    def _abandon(tp: TopicPartition, target: LogDir, future: Path) -> None:
        """Undo a move that failed before its commit: the log stayed in its old directory."""
        if not target.holds(tp):
            shutil.rmtree(future, ignore_errors=True)
            target.forget(tp)

    def high_watermarks(self) -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        for log_dir in self._dirs:
            if log_dir.error is not None:
                continue
            found.update((tp, offset) for tp, offset in log_dir.high_watermarks().items() if log_dir.holds(tp))
        return found

    def checkpoint_high_watermarks(self, offsets: Mapping[TopicPartition, int]) -> None:
        by_dir: dict[Path, dict[TopicPartition, int]] = {log_dir.path: {} for log_dir in self._dirs}
        for tp, offset in offsets.items():
            holder = self._holding(tp)
            if holder is not None:
                by_dir[holder.path][tp] = offset
        failure = None
        for log_dir in self._dirs:
            if log_dir.error is not None:
                continue
            try:
                log_dir.write_high_watermarks(by_dir[log_dir.path])
            except OSError as exc:
                failure = self._failed(log_dir, exc, "checkpointing high watermarks in", log_dir.path)
        if failure is not None:
            raise failure

    def clean_shutdown_epoch(self) -> int:
        epochs = {log_dir.clean_shutdown_epoch for log_dir in self._dirs}
        return epochs.pop() if len(epochs) == 1 else -1

    def close(self, broker_epoch: int = -1) -> None:
        """Stop the cleaner and the background thread, close every log (fsync, trim indexes), write the checkpoints and the clean-shutdown markers.

        Deleted segment files still waiting for file.delete.delay.ms are removed now.
        """
        self._cleaner.stop()
        self.scheduler.close()
        with self._lock:
            logs = list(self._logs.values())
            self._logs.clear()
        for log in logs:
            log.close()
        for log_dir in self._dirs:
            if log_dir.error is not None:
                continue  # no marker: its logs are recovered at the next start
            try:
                log_dir.checkpoint()
                log_dir.mark_clean_shutdown(broker_epoch)
            except OSError as exc:
                raise dir_error(exc, "checkpointing", log_dir.path) from exc
