"""All partition logs of one broker under ``log.dirs``: :class:`LocalLogStorage` implements :class:`josef.log.LogStorage`."""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from pathlib import Path

from josef.config import Config
from josef.log import LogConfig
from josef.protocol.topic_partition import TopicPartition
from josef_storage_local.files import dir_error, fsync_dir
from josef_storage_local.log import Clock, LocalLog, wall_clock_ms
from josef_storage_local.logdir import DELETE_SUFFIX, LogDir


class LocalLogStorage:
    """Logs in Kafka's on-disk layout, one directory per partition, in the directories of ``log.dirs``.

    New logs go to the first directory; existing ones are found in any.
    Open logs are cached. A log is recovered when it is first opened after
    an unclean shutdown (the directory had no ``.kafka_cleanshutdown``).
    """

    def __init__(self, config: Config, *, clock: Clock = wall_clock_ms) -> None:
        paths = config["log.dirs"] or [config["log.dir"]]
        interval = config["log.flush.offset.checkpoint.interval.ms"]
        self._clock = clock
        self._lock = threading.Lock()  # open() runs on the event loop, delete() in worker threads
        self._logs: dict[TopicPartition, LocalLog] = {}
        self._dirs = []
        for path in paths:
            try:
                self._dirs.append(LogDir(Path(path), interval, clock))
            except OSError as exc:
                raise dir_error(exc, "opening log directory", path) from exc

    @property
    def dirs(self) -> list[Path]:
        return [log_dir.path for log_dir in self._dirs]

    def _dir_of(self, tp: TopicPartition) -> LogDir:
        return next((log_dir for log_dir in self._dirs if log_dir.holds(tp)), self._dirs[0])

    def open(self, tp: TopicPartition, config: LogConfig) -> LocalLog:
        """The open log of ``tp`` (its config updated), else loaded from disk or created."""
        with self._lock:
            log = self._logs.get(tp)
            if log is not None and not log.closed:
                log.update_config(config)
                return log
            log_dir = self._dir_of(tp)
            log = LocalLog(
                tp,
                log_dir.path / str(tp),
                config,
                log_dir,
                recover=log_dir.needs_recovery(tp),
                clock=self._clock,
            )
            log_dir.recovered(tp)
            self._logs[tp] = log
            return log

    def stored(self) -> list[TopicPartition]:
        return sorted({tp for log_dir in self._dirs for tp in log_dir.stored()})

    def delete(self, tp: TopicPartition) -> None:
        """Close the log and remove its directory: renamed to ``topic-partition.<uuid>-delete`` first, as Kafka does.

        The rename is atomic, so a crash never leaves a half-deleted log that
        looks alive; a leftover ``-delete`` directory is removed at the next
        start. Removal is immediate (Kafka waits file.delete.delay.ms).
        """
        with self._lock:
            log = self._logs.pop(tp, None)
        if log is not None:
            log.release()
        log_dir = self._dir_of(tp)
        path = log_dir.path / str(tp)
        log_dir.forget(tp)
        try:
            log_dir.checkpoint()
            if path.exists():
                doomed = path.with_name(f"{tp}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
                os.rename(path, doomed)
                fsync_dir(log_dir.path)
                shutil.rmtree(doomed)
        except OSError as exc:
            raise dir_error(exc, "deleting", path) from exc

    def close(self) -> None:
        """Close every log (fsync, trim indexes), write the checkpoints and the clean-shutdown markers."""
        with self._lock:
            logs = list(self._logs.values())
            self._logs.clear()
        for log in logs:
            log.close()
        for log_dir in self._dirs:
            try:
                log_dir.checkpoint()
                log_dir.mark_clean_shutdown()
            except OSError as exc:
                raise dir_error(exc, "checkpointing", log_dir.path) from exc
