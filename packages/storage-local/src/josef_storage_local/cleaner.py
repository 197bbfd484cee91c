"""The storage's background log cleaner (Kafka's ``LogCleaner`` and ``LogCleanerManager``): threads that compact the dirtiest logs.

``log.cleaner.threads`` daemon threads each take the dirtiest compacted log
that no other thread is cleaning, clean it (:meth:`LocalLog.clean`) and
look again; when no log is worth it they sleep ``log.cleaner.backoff.ms``.
A log is worth cleaning when its dirty share exceeds its
``min.cleanable.dirty.ratio``, or at once when it holds records older than
``max.compaction.lag.ms`` or tombstones past their delete horizon; the
dirtiest goes first. All threads share one throttle of
``log.cleaner.io.max.bytes.per.second`` (bytes read plus written) and split
``log.cleaner.dedupe.buffer.size`` and ``log.cleaner.io.buffer.size``
between them, as Kafka's do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import attrs

from josef.config import Config
from josef.log import CleanerStats, LogDirError

from josef_storage_local.compaction import CleanerOptions
from josef_storage_local.log import Clock, LocalLog
from josef_storage_local.offset_map import capacity

logger = logging.getLogger(__name__)

#: How often the throttle compares the observed rate with the allowed one (Kafka's checkIntervalMs).
THROTTLE_CHECK_S = 0.3


class Throttler:
    """Kafka's ``Throttler``: shared by the cleaner threads, sleeps whoever goes past the allowed rate.

    A sleep ends early when ``stop`` is set, so closing the storage is prompt.
    """

    def __init__(self, bytes_per_second: float, stop: threading.Event) -> None:
        self.bytes_per_second = bytes_per_second
        self._stop = stop
        self._lock = threading.Lock()
        self._period_start = time.monotonic()
        self._observed = 0
        #: Set while a thread sleeps off the rate (what a close must interrupt).
        self.sleeping = threading.Event()

    def __call__(self, count: int) -> None:
        if not 0 < self.bytes_per_second < 1e300:
            return
        with self._lock:
            if self._observed == 0:  # a window starts with its first bytes, not after an idle time
                self._period_start = time.monotonic()
            self._observed += count
            elapsed = time.monotonic() - self._period_start
            if elapsed < THROTTLE_CHECK_S and self._observed < self.bytes_per_second * THROTTLE_CHECK_S:
                return
            delay = self._observed / self.bytes_per_second - elapsed
            if delay > 0:
                self.sleeping.set()
                self._stop.wait(delay)
                self.sleeping.clear()
            self._period_start = time.monotonic()
            self._observed = 0


@dataclass(frozen=True)
class CleanerState:
    """What Kafka's LogCleaner and LogCleanerManager gauges read (:mod:`josef_storage_local.metrics`)."""

    max_clean_time_s: float
    recopy_percent: float
    max_buffer_utilization_percent: float
    max_compaction_delay_s: float
    dead_threads: int
    #: Logs whose last cleaning failed (Kafka's uncleanable partitions; here tried again after the back-off).
    uncleanable: list[LocalLog]
    max_dirty_percent: float
    time_since_last_run_ms: float


class LogCleaner:
    """The cleaner threads of one storage; :meth:`start` after the logs are opened, :meth:`stop` before they close."""

    def __init__(self, logs: Callable[[], Sequence[LocalLog]], config: Config, clock: Clock) -> None:
        self._logs = logs
        self._clock = clock
        self._config = config
        self._lock = threading.Lock()
        self._in_progress: set[int] = set()  # id() of the logs being cleaned
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._throttler = Throttler(config["log.cleaner.io.max.bytes.per.second"], self._stop)
        # For the metrics: written by the threads, read by a scrape, each under _stats_lock for a moment.
        self._stats_lock = threading.Lock()
        #: Each thread's last completed cleaning and how full its offset map was (0-1), by thread number.
        self._last_stats: dict[int, tuple[CleanerStats, float]] = {}
        self._uncleanable: dict[int, LocalLog] = {}
        self._max_dirty_ratio = 0.0
        self._max_compaction_delay_ms = 0
        self._last_run = time.monotonic()

    def start(self) -> None:
        count = self._config["log.cleaner.threads"]
        with self._stats_lock:
            self._last_stats = {n: last for n, last in self._last_stats.items() if n < count}
        self._started = True
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), name=f"kafka-log-cleaner-thread-{n}", daemon=True)
            for n in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop every thread; a running pass is given up at its next batch read or throttle sleep."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._started = False

    def update_config(self, config: Config) -> None:
        """Apply dynamic ``log.cleaner.*`` changes: the throttle at once, thread count and buffers by restarting the threads."""
        old, self._config = self._config, config
        self._throttler.bytes_per_second = config["log.cleaner.io.max.bytes.per.second"]
        keys = ("log.cleaner.threads", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.size",
                "log.cleaner.io.buffer.load.factor")
        if self._started and any(old[key] != config[key] for key in keys):
            self.stop()
            self.start()

    def _options(self) -> CleanerOptions:
        config = self._config
        threads = max(config["log.cleaner.threads"], 1)
        return CleanerOptions(
            map_capacity=capacity(config["log.cleaner.dedupe.buffer.size"] // threads,
                                  config["log.cleaner.io.buffer.load.factor"]),
            read_bytes=max(config["log.cleaner.io.buffer.size"] // threads // 2, 4096),
            throttle=self._throttler,
            stopped=self._stop.is_set,
        )

    def grab_filthiest(self, now_ms: int) -> LocalLog | None:
        """The dirtiest log worth cleaning that no thread is cleaning, marked as taken (Kafka's ``grabFilthiestCompactedLog``)."""
        with self._lock:
            self._last_run = time.monotonic()
            best, best_ratio = None, -1.0
            max_delay_ms = 0
            for log in self._logs():
                if id(log) in self._in_progress:
                    continue
                try:
                    priority = log.cleaning_priority(now_ms)
                except LogDirError:
                    continue
                if priority is None:
                    continue
                max_delay_ms = max(max_delay_ms, log.compaction_delay_ms)
                ratio, due = priority
                if (due or ratio > log.config.min_cleanable_dirty_ratio) and ratio > best_ratio:
                    best, best_ratio = log, ratio
            if best is not None:
                self._in_progress.add(id(best))
            with self._stats_lock:
                self._max_dirty_ratio = max(best_ratio, 0.0)
                self._max_compaction_delay_ms = max_delay_ms
            return best

    def state(self) -> CleanerState:
        """The cleaner's gauges now, as Kafka computes them from each thread's last cleaning."""
        with self._stats_lock:
            for key in [key for key, log in self._uncleanable.items() if log.closed]:  # deleted, moved away
                del self._uncleanable[key]
            last = list(self._last_stats.values())
            uncleanable = list(self._uncleanable.values())
            max_dirty, max_delay_ms, last_run = self._max_dirty_ratio, self._max_compaction_delay_ms, self._last_run
        threads = max(len(self._threads), 1)
        dead = sum(not thread.is_alive() for thread in self._threads) if not self._stop.is_set() else 0
        return CleanerState(
            max_clean_time_s=max((stats.elapsed_s for stats, _ in last), default=0.0),
            recopy_percent=100 * sum(stats.bytes_written / max(stats.bytes_read, 1) for stats, _ in last) / threads,
            max_buffer_utilization_percent=100 * max((used for _, used in last), default=0.0),
            max_compaction_delay_s=max_delay_ms / 1000,
            dead_threads=dead,
            uncleanable=uncleanable,
            max_dirty_percent=100 * max_dirty,
            time_since_last_run_ms=(time.monotonic() - last_run) * 1000,
        )

    def _run(self, number: int) -> None:
        backoff_s = self._config["log.cleaner.backoff.ms"] / 1000
        used = [0.0]  # how full this pass's offset map got

        def map_used(keys: int, capacity: int) -> None:
            used[0] = keys / max(capacity, 1)

        options = attrs.evolve(self._options(), map_used=map_used)
        while not self._stop.is_set():
            log = self.grab_filthiest(self._clock())
            if log is None:
                self._stop.wait(backoff_s)
                continue
            try:
                stats = log.clean(self._clock(), options)
            except Exception:
                # Kafka marks the partition uncleanable; here it is tried again after the back-off.
                logger.exception("log cleaner thread %d failed to clean %s", number, log.tp)
                with self._stats_lock:
                    self._uncleanable[id(log)] = log
                self._stop.wait(backoff_s)
                continue
            finally:
                with self._lock:
                    self._in_progress.discard(id(log))
            if stats.cleaned_to >= 0:
                with self._stats_lock:
                    self._last_stats[number] = (stats, used[0])
                    self._uncleanable.pop(id(log), None)
                logger.info("log cleaner thread %d cleaned %s: %s", number, log.tp, summary(stats))
            else:  # given up (the log changed or closed): not again at once
                self._stop.wait(backoff_s)


def summary(stats: CleanerStats) -> str:
    """Kafka's cleaning summary in one line: what was read and written, how fast."""
    mb = 1024 * 1024
    elapsed = max(stats.elapsed_s, 1e-9)
    kept = 100 * stats.bytes_written / stats.bytes_read if stats.bytes_read else 100.0
    return (
        f"dirty section up to {stats.cleaned_to}; {stats.bytes_read / mb:.1f} MB of log processed in "
        f"{stats.elapsed_s:.1f} seconds ({stats.bytes_read / mb / elapsed:.1f} MB/sec), "
        f"{stats.records_written} of {stats.records_read} records kept, "
        f"{stats.bytes_written / mb:.1f} MB written ({kept:.1f}% size, {100 - kept:.1f}% reduction)"
    )
