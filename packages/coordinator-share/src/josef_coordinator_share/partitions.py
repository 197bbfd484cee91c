"""The share partitions of one broker (Kafka's SharePartitionManager): windows loaded from the share coordinator,
fed from the led partitions' logs, their acknowledgements persisted, their locks expired.

A share partition exists on the leader of its topic partition only, loaded on
first use from the share coordinator (:class:`~josef_coordinator_share.persister.Persister`,
announcing this leader's epoch so that a deposed leader's writes are fenced).
A window never initialized starts where the group's ``share.auto.offset.reset``
says (latest by default). When the partition's state changes on this broker
(leadership moved, a new leader epoch, deletion) the window is dropped with
its locks: the next leader reads what was persisted and delivers again what
was acquired and not acknowledged.

Every change is written to the share coordinator before it is answered,
acquisitions included (as AVAILABLE with their delivery count: a lock does
not outlive its leader, a delivery count does, so a record that crashes its
consumers is archived after the limit even across leader changes); a failed
write rolls the window back. Each window has a lock held across a change and
its write, so its writes reach the coordinator in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from kio.schema.errors import ErrorCode

from josef.led_partitions import PartitionUnavailable
from josef.metadata.records import GROUP_RESOURCE, uuid_from_text
from josef.protocol.records import CONTROL_BIT, TRANSACTIONAL_BIT, iter_batches
from josef.protocol.topic_partition import TopicPartition
from josef_coordinator_share.configs import reset_duration_ms
from josef_coordinator_share.persister import Persister, PersisterError
from josef_coordinator_share.sessions import ShareSessionCache
from josef_coordinator_share.share_partition import Acquired, BatchInfo, SharePartition, ShareError, Span
from josef_coordinator_share.state import ShareKey

if TYPE_CHECKING:
    from josef.services import BrokerServices
    from josef_coordinator_share.coordinator import ShareCoordinator

log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@attrs.define
class Window:
    """A loaded share partition: its window, and what its writes to the coordinator carry."""

    key: ShareKey
    tp: TopicPartition
    partition: SharePartition
    leader_epoch: int
    state_epoch: int
    lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    dropped: bool = False
    #: Records whose acquisition lock expired (Kafka's AcquisitionLockTimeoutPerSec of the share partition).
    lock_timeouts: int = 0


@attrs.frozen
class FetchedPartition:
    """One partition's part of a ShareFetch answer."""

    records: bytes = b""
    acquired: tuple[Acquired, ...] = ()
    error: ErrorCode = ErrorCode.none
    message: str | None = None


class SharePartitionManager:
    """Every share partition this broker leads, by (group, topic partition)."""

    def __init__(self, services: BrokerServices, coordinator: ShareCoordinator) -> None:
        self.services = services
        self.coordinator = coordinator
        self.counters = coordinator.counters
        self.persister = Persister(services, coordinator)
        self.sessions = ShareSessionCache()
        self.windows: dict[tuple[str, TopicPartition], Window] = {}
        self._loading: dict[tuple[str, TopicPartition], anyio.Lock] = {}
        self._unwatch = None
        self._expiry = anyio.Event()
        self._expiring = False

    # Loading and dropping ---------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._unwatch is None:
            self._unwatch = self.services.partitions.watch(self._changed)
        if not self._expiring:
            self._expiring = True
            self.services.spawn(self._expire_locks)

    def _changed(self, tp: TopicPartition) -> None:
        """A partition's state changed here: drop its windows unless this broker still leads it in that epoch."""
        try:
            epoch = self.services.partitions.state(tp).leader_epoch
        except PartitionUnavailable:
            epoch = None
        for (group, window_tp), window in list(self.windows.items()):
            if window_tp == tp and window.leader_epoch != epoch:
                window.dropped = True
                del self.windows[group, tp]
                log.info("share partition %s of group %s dropped: leadership changed", tp, group)

    async def window(self, group: str, tp: TopicPartition) -> Window:
        """The loaded window of ``group`` on ``tp``, loading it first; :class:`ShareError` with the partition's
        error when this broker does not lead it or the coordinator cannot be read."""
        self._start()
        state = self._led(tp)
        window = self.windows.get((group, tp))
        if window is not None and window.leader_epoch == state.leader_epoch:
            return window
        lock = self._loading.setdefault((group, tp), anyio.Lock())
        async with lock:
            window = self.windows.get((group, tp))
            if window is not None and window.leader_epoch == self._led(tp).leader_epoch:
                return window
            started = time.monotonic()
            window = await self._load(group, tp)
            self.counters.loaded((time.monotonic() - started) * 1000)
            self.windows[group, tp] = window
            return window

    def _led(self, tp: TopicPartition):
        try:
            return self.services.partitions.state(tp)
        except PartitionUnavailable as exc:
            raise ShareError(exc.code, exc.message) from exc

    async def _load(self, group: str, tp: TopicPartition) -> Window:
        topic = self.services.image.topics.get(tp.topic)
        if topic is None:
            raise ShareError(ErrorCode.unknown_topic_or_partition, f"{tp} does not exist")
        state = self._led(tp)
        key = ShareKey(group, uuid_from_text(topic.topic_id), tp.partition)
        settings = self.coordinator.settings()
        try:
            persisted = await self.persister.read(key, state.leader_epoch)
        except PersisterError as exc:
            raise ShareError(exc.code, f"reading the state of {tp} for {group}: {exc.message}") from exc
        partition = SharePartition(max(persisted.start_offset, 0), persisted.batches,
                                   delivery_count_limit=settings.delivery_count_limit,
                                   max_in_flight=settings.max_record_locks,
                                   read_committed=self._read_committed(group))
        window = Window(key, tp, partition, state.leader_epoch, persisted.state_epoch)
        if persisted.start_offset < 0:  # never initialized: where share.auto.offset.reset says, persisted
            partition.move_start(await self._reset_offset(group, tp))
            await self._write(window, ())
        elif persisted.start_offset < state.log_start_offset:
            partition.move_start(state.log_start_offset)
        log.info("share partition %s of group %s loaded at start offset %d (state epoch %d)", tp, group,
                 partition.start, persisted.state_epoch)
        return window

    def group_config(self, group: str) -> dict[str, Any]:
        """The group's configs (GROUP config resource over the brokers' defaults), by group-level name."""
        return self.services.config.group_config(self.services.image.config(GROUP_RESOURCE, group))

    def _read_committed(self, group: str) -> bool:
        return self.group_config(group)["share.isolation.level"] == "read_committed"

    def lock_duration_ms(self, group: str) -> int:
        """``share.record.lock.duration.ms`` of the group, within the brokers' min and max."""
        config = self.services.config
        return min(max(self.group_config(group)["share.record.lock.duration.ms"],
                       config["group.share.min.record.lock.duration.ms"]),
                   config["group.share.max.record.lock.duration.ms"])

    async def _reset_offset(self, group: str, tp: TopicPartition) -> int:
        """Where ``share.auto.offset.reset`` starts a share partition without state: latest (the high
        watermark), earliest (the log start), or the first record of ``by_duration`` ago."""
        reset = self.group_config(group)["share.auto.offset.reset"]
        state = self._led(tp)
        if reset.lower() == "earliest":
            return state.log_start_offset
        duration = reset_duration_ms(reset)
        if duration is None:
            return state.high_watermark
        try:
            return await self.services.partitions.offset_for_timestamp(tp, int(time.time() * 1000) - duration)
        except PartitionUnavailable as exc:
            raise ShareError(exc.code, exc.message) from exc

    # Fetching ---------------------------------------------------------------------------------------------

    async def fetch(self, group: str, member_id: str, requests: Sequence[tuple[TopicPartition, int]],
                    max_records: int, max_wait_ms: int, *, strict: bool = False) -> dict[TopicPartition, FetchedPartition]:
        """Acquire records of ``requests`` ((partition, max bytes)) for ``member_id``, at most ``max_records`` in
        each (``strict``: never more, splitting batches); when none could be acquired, wait for new data up to
        ``max_wait_ms`` and try again."""
        deadline = now_ms() + max(max_wait_ms, 0)
        while True:
            answers = {tp: await self._fetch_one(group, member_id, tp, max_bytes, max_records, strict)
                       for tp, max_bytes in requests}
            remaining = deadline - now_ms()
            if remaining <= 0 or any(a.acquired or a.error != ErrorCode.none for a in answers.values()):
                for tp, answer in answers.items():
                    self.counters.requested(tp.topic, fetch=True, failed=answer.error != ErrorCode.none)
                return answers
            await self.services.partitions.wait_for_data([tp for tp, _ in requests], remaining)

    async def _fetch_one(self, group: str, member_id: str, tp: TopicPartition, max_bytes: int,
                         max_records: int, strict: bool) -> FetchedPartition:
        try:
            window = await self.window(group, tp)
        except ShareError as exc:
            return FetchedPartition(error=exc.code, message=exc.message)
        partition = window.partition
        if max_bytes <= 0 or not partition.can_acquire():
            return FetchedPartition()
        async with window.lock:
            if window.dropped:
                return FetchedPartition(error=ErrorCode.not_leader_or_follower, message=f"{tp} moved")
            offset = partition.next_fetch_offset()
            try:
                read = await self.services.partitions.read(tp, offset, max_bytes,
                                                           read_committed=partition.read_committed)
            except PartitionUnavailable as exc:
                if exc.code == ErrorCode.offset_out_of_range:  # the log start passed the window: move with it
                    partition.move_start(self.services.partitions.state(tp).log_start_offset)
                    await self._write(window, ())
                    return FetchedPartition()
                return FetchedPartition(error=exc.code, message=exc.message)
            headers = [(pos, header) for pos, header in iter_batches(read.records)]
            batches = [BatchInfo(h.base_offset, h.last_offset, h.producer_id, bool(h.attributes & TRANSACTIONAL_BIT),
                                 bool(h.attributes & CONTROL_BIT)) for _, h in headers]
            deadline = now_ms() + self.lock_duration_ms(group)
            partition.read_committed = self._read_committed(group)
            saved = partition.snapshot()
            acquired = partition.acquire(member_id, batches, [(a.producer_id, a.first_offset) for a in read.aborted],
                                         max_records, deadline, strict=strict)
            if not acquired and partition.start == saved.start:
                return FetchedPartition()
            try:  # the delivery counts, so that a new leader counts on from them (and archived aborted records)
                await self._write(window, [s for s in partition.spans if s.first <= acquired[-1].last]
                                  if acquired else [])
            except ShareError as exc:
                partition.restore(saved)
                return FetchedPartition(error=exc.code, message=exc.message)
            self._expiry.set()
            if not acquired:
                return FetchedPartition()
            # Only the batches holding acquired offsets go out, whole, as the log has them.
            last = acquired[-1].last
            end = next((pos for pos, h in headers if h.base_offset > last), len(read.records))
            return FetchedPartition(read.records[:end], tuple(acquired))

    # Acknowledging ----------------------------------------------------------------------------------------

    async def acknowledge(self, group: str, member_id: str, tp: TopicPartition,
                          batches: Sequence[tuple[int, int, Sequence[int]]]) -> tuple[ErrorCode, str | None]:
        """Apply and persist ``member_id``'s acknowledgements of ``tp``; the partition's error (NONE when done)."""
        tally = [0] * len(self.counters.acknowledged)
        code, message = await self._acknowledge(group, member_id, tp, batches, tally)
        self.counters.requested(tp.topic, fetch=False, failed=code != ErrorCode.none)
        if code == ErrorCode.none:
            for ack, records in enumerate(tally):
                self.counters.acknowledged[ack] += records
        return code, message

    async def _acknowledge(self, group: str, member_id: str, tp: TopicPartition,
                           batches: Sequence[tuple[int, int, Sequence[int]]], tally: list[int],
                           ) -> tuple[ErrorCode, str | None]:
        try:
            window = await self.window(group, tp)
        except ShareError as exc:
            return exc.code, exc.message
        async with window.lock:
            if window.dropped:
                return ErrorCode.not_leader_or_follower, f"{tp} moved"
            saved = window.partition.snapshot()
            try:
                changed = window.partition.acknowledge(member_id, batches, now_ms() + self.lock_duration_ms(group),
                                                       tally)
                await self._write(window, changed)
            except ShareError as exc:
                window.partition.restore(saved)
                return exc.code, exc.message
            self._expiry.set()
        return ErrorCode.none, None

    async def release(self, group: str, member_id: str, tps: Sequence[TopicPartition]) -> None:
        """Release what ``member_id`` holds of ``tps`` (its share session closed)."""
        for tp in tps:
            window = self.windows.get((group, tp))
            if window is None:
                continue
            async with window.lock:
                if window.dropped:
                    continue
                saved = window.partition.snapshot()
                changed = window.partition.release_member(member_id)
                if changed:
                    try:
                        await self._write(window, changed)
                    except ShareError:
                        window.partition.restore(saved)

    async def _write(self, window: Window, changed: Sequence[Span]) -> None:
        """Persist the window's start and the spans ``changed``; ShareError when the coordinator refuses."""
        try:
            await self.persister.write(window.key, window.state_epoch, window.leader_epoch, window.partition.start,
                                       tuple(s.persisted() for s in changed))
        except PersisterError as exc:
            raise ShareError(exc.code, f"persisting {window.tp}: {exc.message}") from exc

    # Lock expiry ------------------------------------------------------------------------------------------

    async def _expire_locks(self) -> None:
        """Release acquisitions whose lock expired, as soon as the earliest one does."""
        while True:
            deadlines = [d for w in self.windows.values() if (d := w.partition.next_deadline()) is not None]
            self._expiry = anyio.Event()
            wait_s = (min(deadlines) - now_ms()) / 1000 if deadlines else 60.0
            if wait_s > 0:
                with anyio.move_on_after(wait_s):
                    await self._expiry.wait()
                continue
            now = now_ms()
            for window in list(self.windows.values()):
                deadline = window.partition.next_deadline()
                if deadline is None or deadline > now:
                    continue
                async with window.lock:
                    if window.dropped:
                        continue
                    saved = window.partition.snapshot()
                    changed = window.partition.expire_locks(now)
                    try:
                        await self._write(window, changed)
                        window.lock_timeouts += sum(s.last - s.first + 1 for s in changed)
                    except ShareError as exc:
                        window.partition.restore(saved)
                        log.warning("releasing expired locks of %s: %s; trying again", window.tp, exc.message)
                        await anyio.sleep(0.1)
