"""Replication throttles (KIP-73): Kafka's ReplicationQuotaManager, one for leaders and one for followers.

Moving a partition to a new broker copies its whole log over the network
at full speed, which can starve the replication and the clients of every
other partition. An operator (or ``josef reassign-partitions --throttle``)
caps it with two pieces of configuration:

- the byte rates, per broker and dynamic: ``leader.replication.throttled.rate``
  (what a leader serves to throttled followers) and
  ``follower.replication.throttled.rate`` (what a follower fetches for
  throttled partitions);
- which replicas are throttled, per topic:
  ``leader.replication.throttled.replicas`` and
  ``follower.replication.throttled.replicas``, lists of
  ``partition:broker`` or ``*`` for all of them.

A throttled partition is held back only while the measured rate is above
the bound and only for a replica that is not in sync, so the replicas that
keep acks=all writes committed are never slowed, and neither is anything
not listed. The bytes of every throttled partition count towards the rate.
"""

from __future__ import annotations

import collections
import re
import time
from typing import Callable

import attrs

from josef.config import INT64_MAX, ConfigError
from josef.protocol.topic_partition import TopicPartition

_REPLICA = re.compile(r"[0-9]+:[0-9]+")


def check_throttled_replicas(entries: list[str]) -> None:
    """Kafka's ThrottledReplicaListValidator: ``*`` alone, or ``partition:broker`` entries."""
    if entries == ["*"] or all(_REPLICA.fullmatch(entry) for entry in entries):
        return
    raise ConfigError("must be the literal '*' or a list of replicas in the following format: "
                      "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


@attrs.define
class _Sample:
    start: float
    value: float = 0.0


class Rate:
    """A rate over a sliding window of ``samples`` windows of ``window_s`` seconds each.

    The sum of the kept samples is divided by the time since the oldest
    one started, but never by less than ``full_windows`` windows: with one
    (Kafka's SimpleRate, replication throttles) a single burst counts as
    that much in one window, not as an infinite rate; client quotas use
    ``samples - 1`` as Kafka's Rate does, so a new client's first burst is
    spread over the whole window.
    """

    def __init__(self, samples: int, window_s: float, *, full_windows: int = 1) -> None:
        self.window_s = window_s
        #: The least time a rate is measured over, in windows (Kafka's Rate: one less than the samples).
        self._least_s = full_windows * window_s
        self._span_s = samples * window_s
        self._samples: collections.deque[_Sample] = collections.deque(maxlen=samples)

    def record(self, value: float, now: float) -> None:
        self._forget(now)
        if not self._samples or now - self._samples[-1].start >= self.window_s:
            self._samples.append(_Sample(now))
        self._samples[-1].value += value

    def measure(self, now: float) -> float:
        self._forget(now)
        if not self._samples:
            return 0.0
        elapsed = now - self._samples[0].start
        return sum(s.value for s in self._samples) / max(elapsed, self._least_s)

    def span(self, now: float) -> float:
        """The time the rate is measured over now, in seconds (Kafka's ``windowSize``)."""
        self._forget(now)
        return max(now - self._samples[0].start, self._least_s) if self._samples else self._least_s

    def _forget(self, now: float) -> None:
        while self._samples and now - self._samples[0].start >= self._span_s:
            self._samples.popleft()


class ReplicationQuota:
    """The throttle of one side of replication on this broker: a bound in bytes/s and the throttled partitions."""

    def __init__(self, broker_id: int, samples: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.broker_id = broker_id
        #: Bytes per second; Long.MAX_VALUE (the default) means no throttle at all.
        self.bound = INT64_MAX
        self._rate = Rate(samples, window_s)
        self._clock = clock
        self._all_partitions: set[str] = set()
        self._partitions: dict[str, frozenset[int]] = {}

    def mark_throttled(self, topic: str, replicas: list[str]) -> None:
        """Apply a topic's ``*.replication.throttled.replicas``: ``*``, or the entries naming this broker.

        Kafka's ``parseThrottledPartitions``; an empty list ends the topic's throttle.
        """
        self._all_partitions.discard(topic)
        self._partitions.pop(topic, None)
        if replicas == ["*"]:
            self._all_partitions.add(topic)
            return
        mine = frozenset(int(p) for p, b in (entry.split(":") for entry in replicas) if int(b) == self.broker_id)
        if mine:
            self._partitions[topic] = mine

    def is_throttled(self, tp: TopicPartition) -> bool:
        return tp.topic in self._all_partitions or tp.partition in self._partitions.get(tp.topic, ())

    def is_exceeded(self) -> bool:
        return self.bound < INT64_MAX and self._rate.measure(self._clock()) > self.bound

    def should_throttle(self, tp: TopicPartition, in_sync: bool) -> bool:
        """Kafka's shouldLeaderThrottle/shouldFollowerThrottle: a lagging replica of a throttled partition, over the bound."""
        return not in_sync and self.is_throttled(tp) and self.is_exceeded()

    def record(self, nbytes: int) -> None:
        """Count bytes of throttled partitions that were sent or appended, whether or not the bound is exceeded."""
        if nbytes:
            self._rate.record(nbytes, self._clock())
