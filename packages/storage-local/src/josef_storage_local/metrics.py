"""The local storage's metrics on the node's ``/metrics``, named as the JMX exporter's generic rules name Kafka's.

- ``kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs``: the summary
  ``kafka_log_logflushstats_logflushrateandtimems`` of log flushes (a full
  flush, or a rolled segment's), in ms: quantiles of the last
  :data:`FLUSH_SAMPLES`, ``_count`` and ``_sum`` since the start;
- ``kafka.log:type=LogCleaner``: ``max-clean-time-secs``,
  ``cleaner-recopy-percent``, ``max-buffer-utilization-percent`` (josef: of
  the offset map's usable capacity, ``log.cleaner.dedupe.buffer.size`` times
  its load factor; Kafka: of its slots), ``max-compaction-delay-secs`` and
  ``DeadThreadCount`` (``kafka_log_logcleaner_*``), from each cleaner thread's
  last pass;
- ``kafka.log:type=LogCleanerManager``: ``uncleanable-partitions-count`` and
  ``uncleanable-bytes`` per ``logDirectory`` (josef: logs whose last cleaning
  failed; it tries them again after ``log.cleaner.backoff.ms`` where Kafka
  leaves them until a restart), ``max-dirty-percent`` and
  ``time-since-last-run-ms`` (``kafka_log_logcleanermanager_*``);
- ``kafka.log:type=Log,name=NumLogSegments,topic=t,partition=p``
  (``kafka_log_log_numlogsegments``) of each open log (the core exports the
  logs' size and offsets);
- ``kafka.log:type=LogManager,name=OfflineLogDirectoryCount`` and
  ``LogDirectoryOffline{logDirectory}`` (``kafka_log_logmanager_*``).

Flushes and cleanings run in the storage's threads: they record under a
lock held for a few additions; a scrape reads copies.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from josef.metrics import Table, add_quantiles, summary

if TYPE_CHECKING:
    from josef_storage_local.storage import LocalLogStorage

#: How many recent flushes the flush-time quantiles are taken from.
FLUSH_SAMPLES = 1024


class FlushStats:
    """Kafka's LogFlushStats timer: the flushes of one storage's logs, whichever thread ran them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: deque[float] = deque(maxlen=FLUSH_SAMPLES)
        self._count = 0
        self._total_ms = 0.0

    def record(self, started: float) -> None:
        """A flush that began at ``started`` (``time.monotonic()``) is done."""
        ms = (time.monotonic() - started) * 1000
        with self._lock:
            self._recent.append(ms)
            self._count += 1
            self._total_ms += ms

    def read(self) -> tuple[list[float], int, float]:
        """Recent flush times, how many flushes there were and their total ms."""
        with self._lock:
            return list(self._recent), self._count, self._total_ms


def storage_metrics(storage: LocalLogStorage, metadata_topic: str) -> Iterable[Metric]:
    """Every family of ``storage``; logs of ``metadata_topic`` (the KRaft log, not a partition) are left out."""
    flushes = summary("kafka_log_logflushstats_logflushrateandtimems", "Milliseconds to flush a log to disk "
                      f"(quantiles of the last {FLUSH_SAMPLES} flushes).", [])
    add_quantiles(flushes, [], *storage.flush_stats.read())
    yield flushes

    yield Table("kafka_log_log_numlogsegments", "gauge", "Segments of the partition's log on this broker.",
                ("topic", "partition"), [(tp.topic, tp.partition, log.segment_count)
                                         # a copy: a worker thread may open or delete logs meanwhile
                                         for tp, log in list(storage.logs.items())
                                         if tp.topic != metadata_topic and not log.closed], 2)

    dirs = storage.log_dir_states()
    yield GaugeMetricFamily("kafka_log_logmanager_offlinelogdirectorycount", "Log directories offline after a disk "
                            "error (until the broker restarts).", value=sum(offline for _, offline in dirs))
    offline = GaugeMetricFamily("kafka_log_logmanager_logdirectoryoffline", "1 when the log directory is offline, "
                                "0 when it is online.", labels=["logDirectory"])
    for path, is_offline in dirs:
        offline.add_metric([path], int(is_offline))
    yield offline

    cleaner = storage.cleaner.state()
    for name, doc, value in (
        ("max_clean_time_secs", "The longest cleaning of the cleaner threads' last ones, in seconds.",
         cleaner.max_clean_time_s),
        ("cleaner_recopy_percent", "Bytes the cleaner threads' last cleanings wrote, as a percentage of what they "
                                   "read (averaged over the threads).", cleaner.recopy_percent),
        ("max_buffer_utilization_percent", "The fullest offset map of the cleaner threads' last cleanings, as a "
                                           "percentage of its usable capacity.", cleaner.max_buffer_utilization_percent),
        ("max_compaction_delay_secs", "How far past its max.compaction.lag.ms the most overdue log was when the "
                                      "cleaner last chose a log, in seconds.", cleaner.max_compaction_delay_s),
        ("deadthreadcount", "Cleaner threads that died.", cleaner.dead_threads),
    ):
        yield GaugeMetricFamily(f"kafka_log_logcleaner_{name}", doc, value=value)
    uncleanable = GaugeMetricFamily("kafka_log_logcleanermanager_uncleanable_partitions_count", "Compacted logs "
                                    "whose last cleaning failed.", labels=["logDirectory"])
    uncleanable_bytes = GaugeMetricFamily("kafka_log_logcleanermanager_uncleanable_bytes", "Bytes of the compacted "
                                          "logs whose last cleaning failed.", labels=["logDirectory"])
    for path, _ in dirs:
        logs = [log for log in cleaner.uncleanable if str(log.log_dir_path) == path and not log.closed]
        uncleanable.add_metric([path], len(logs))
        uncleanable_bytes.add_metric([path], sum(log.size_bytes for log in logs))
    yield uncleanable
    yield uncleanable_bytes
    yield GaugeMetricFamily("kafka_log_logcleanermanager_max_dirty_percent", "The dirty share of the dirtiest log "
                            "worth cleaning when the cleaner last chose a log, in percent.",
                            value=cleaner.max_dirty_percent)
    yield GaugeMetricFamily("kafka_log_logcleanermanager_time_since_last_run_ms", "Milliseconds since the cleaner "
                            "last looked for a log to clean.", value=cleaner.time_since_last_run_ms)
