"""From options to offset ranges: which partitions a query reads and where each range starts and ends.

Runs where Spark plans (the driver's Python worker), with josef's admin
client. Offsets are plain ``{(topic, partition): offset}`` maps here; the
stream reader turns them into the JSON-friendly dicts Spark checkpoints.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, TypeVar

import attrs

from josef_client import Admin, KafkaError, TopicPartition
from josef_client.config import ADMIN
from josef_spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, ReadOptions

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], int]
ADMIN_KEYS = frozenset(key.name for key in ADMIN)
K = TypeVar("K")


class DataLossError(RuntimeError):
    """Offsets a query needs are gone (retention, DeleteRecords, a deleted topic) and failOnDataLoss is true."""


def data_lost(fail: bool, message: str, going_on: str) -> None:
    """Records a query needs are gone: :class:`DataLossError` (failOnDataLoss), or a warning and the query goes on."""
    if fail:
        raise DataLossError(f"{message}; set failOnDataLoss=false to {going_on}")
    log.warning("%s; going on: %s (failOnDataLoss=false)", message, going_on)


@attrs.frozen
class OffsetRange:
    """Records [start, end) of one partition: what one Spark input partition reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def open_admin(options: ReadOptions) -> Admin:
    shared = {k: v for k, v in options.client_config.items() if k in ADMIN_KEYS}
    return Admin({**shared, "bootstrap.servers": options.bootstrap_servers})


class Planner:
    """Answers the reader's questions about the cluster: partitions, earliest, latest and by-timestamp offsets."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.read_committed = options.client_config.get("isolation.level", "read_uncommitted") == "read_committed"
        self.admin = open_admin(options)

    def close(self) -> None:
        self.admin.close()

    def partitions(self) -> list[tuple[str, int]]:
        """The partitions the query reads now: named topics that exist, topics matching the pattern, or ``assign``."""
        o = self.options
        if o.assign is not None:
            return list(o.assign)
        if o.subscribe is not None:
            described = self.admin.describe_topics(o.subscribe, raise_errors=False)
            topics = {name: d for name, d in described.items() if not isinstance(d, KafkaError)}
        else:
            assert o.subscribe_pattern is not None
            names = [n for n in self.admin.list_topics() if o.subscribe_pattern.fullmatch(n)]
            topics = self.admin.describe_topics(names, raise_errors=False) if names else {}
            topics = {name: d for name, d in topics.items() if not isinstance(d, KafkaError)}
        return sorted((name, p.partition) for name, d in topics.items() for p in d.partitions)

    def list_offsets(self, specs: Mapping[tuple[str, int], int]) -> Offsets:
        """Offsets for each partition by spec: -2 earliest, -1 latest, or a timestamp (-1 when nothing is that late)."""
        if not specs:
            return {}
        found = self.admin.list_offsets({TopicPartition(t, p): s for (t, p), s in specs.items()},
                                        read_committed=self.read_committed)
        return {(tp.topic, tp.partition): info.offset for tp, info in found.items()}

    def earliest(self, partitions: Iterable[tuple[str, int]]) -> Offsets:
        return self.list_offsets({tp: EARLIEST for tp in partitions})

    def latest(self, partitions: Iterable[tuple[str, int]]) -> Offsets:
        return self.list_offsets({tp: LATEST for tp in partitions})

    def resolve(self, spec: OffsetSpec, partitions: list[tuple[str, int]], name: str) -> Offsets:
        """Concrete offsets for ``spec`` on ``partitions`` (``name``: startingOffsets or endingOffsets, for errors)."""
        if spec.kind == "earliest":
            return self.earliest(partitions)
        if spec.kind == "latest":
            return self.latest(partitions)
        if spec.kind == "offsets":
            missing = sorted(set(partitions) - set(spec.per_partition))
            if missing:
                raise OptionError(f"{name} must give an offset for every partition read; it lacks "
                                  + ", ".join(f"{t}-{p}" for t, p in missing[:10]))
            wanted = {tp: spec.per_partition[tp] for tp in partitions}
            symbolic = self.list_offsets({tp: o for tp, o in wanted.items() if o in (EARLIEST, LATEST)})
            return {tp: symbolic.get(tp, o) for tp, o in wanted.items()}
        timestamps = ({tp: spec.timestamp for tp in partitions} if spec.kind == "timestamp" else
                      self._per_partition_timestamps(spec, partitions, name))
        found = self.list_offsets(timestamps)
        unmatched = sorted(tp for tp, offset in found.items() if offset < 0)
        if unmatched and name.startswith("starting") and self.options.timestamp_strategy == "error":
            t, p = unmatched[0]
            raise OptionError(f"{name}: no record of {t}-{p} has a timestamp at or after {timestamps[(t, p)]}; "
                              'set startingOffsetsByTimestampStrategy="latest" to start at the end instead')
        # Past the last record: the end (for an ending timestamp, simply "read to the end").
        found.update(self.latest(unmatched))
        return found

    @staticmethod
    def _per_partition_timestamps(spec: OffsetSpec, partitions: list[tuple[str, int]], name: str) -> Offsets:
        missing = sorted(set(partitions) - set(spec.per_partition))
        if missing:
            raise OptionError(f"{name} must give a timestamp for every partition read; it lacks "
                              + ", ".join(f"{t}-{p}" for t, p in missing[:10]))
        return {tp: spec.per_partition[tp] for tp in partitions}

    def checked_start(self, start: Offsets, earliest: Offsets, what: str) -> Offsets:
        """``start`` with offsets below the earliest retained moved up to it, or :class:`DataLossError` (failOnDataLoss)."""
        lost = {tp: (offset, earliest[tp]) for tp, offset in start.items() if tp in earliest and offset < earliest[tp]}
        if not lost:
            return start
        (topic, partition), (wanted, first) = sorted(lost.items())[0]
        message = (f"{what}: offsets {wanted}..{first - 1} of {topic}-{partition} are gone (retention or deleted "
                   f"records){f' and {len(lost) - 1} more partitions lost data' if len(lost) > 1 else ''}")
        data_lost(self.options.fail_on_data_loss, message, "skip what was lost")
        return {**start, **{tp: first for tp, (_, first) in lost.items()}}


def apportion(sizes: Mapping[K, int], amount: int) -> dict[K, int]:
    """``amount`` shared in proportion to ``sizes`` in whole numbers that add up to exactly ``amount``.

    Shares are rounded down and the remainder handed out one at a time to
    the largest fractions (the largest remainder method).
    """
    total = sum(sizes.values())
    shares = {tp: size * amount / total for tp, size in sizes.items()}
    taken = {tp: int(share) for tp, share in shares.items()}
    for tp in sorted(shares, key=lambda tp: (taken[tp] - shares[tp], tp))[:amount - sum(taken.values())]:
        taken[tp] += 1
    return taken


def _split(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` pieces of equal size (give or take one)."""
    bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
    return [OffsetRange(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:])]


def offset_ranges(start: Offsets, end: Offsets, min_partitions: int | None,
                  max_records: int | None = None) -> list[OffsetRange]:
    """One range per partition with records, split as Spark's Kafka source splits them.

    First (maxRecordsPerPartition) every range larger than ``max_records``
    is cut into the fewest pieces of equal size that hold at most
    ``max_records`` each. Then, while there are fewer than ``min_partitions``
    pieces, each gets a share of ``min_partitions`` in proportion to its
    size, at least one piece and never an empty one, so there are at least
    ``min_partitions`` pieces whenever there are that many records.
    """
    ranges = [OffsetRange(t, p, start[(t, p)], end[(t, p)]) for t, p in sorted(end)
              if (t, p) in start and end[(t, p)] > start[(t, p)]]
    if max_records:
        ranges = [piece for r in ranges for piece in _split(r, -(-r.size // max_records))]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    shares = apportion({i: r.size for i, r in enumerate(ranges)}, min_partitions)
    return [piece for i, r in enumerate(ranges) for piece in _split(r, max(1, min(r.size, shares[i])))]


def rate_limit(start: Offsets, end: Offsets, limit: int) -> Offsets:
    """``end`` moved back so that at most ``limit`` offsets lie between ``start`` and it, shared in proportion to what each partition has.

    Shares add up to exactly ``limit`` (Spark's own rounding can overshoot by
    one per partition), so a micro-batch never exceeds maxOffsetsPerTrigger.
    """
    sizes = {tp: max(0, end[tp] - start.get(tp, end[tp])) for tp in end}
    if sum(sizes.values()) <= limit:
        return dict(end)
    taken = apportion(sizes, limit)
    return {tp: start.get(tp, end[tp]) + taken[tp] if sizes[tp] else end[tp] for tp in end}
