"""The partitions this broker hosts, kept in step with the metadata image.

The replica manager is the only place that creates, updates and removes
:class:`josef.replication.partition.Partition` objects: it reacts to metadata deltas
(become leader, become follower, update ISR, delete a topic, new topic
configs) and offers the produce and fetch operations the API handlers call,
with their waiting (acks=all, long-poll fetch) done through the purgatory.

It also runs what replication needs on this broker: the replica fetchers of
the partitions it follows (:mod:`josef.replication.replica_fetcher`), the ISR changes of
the partitions it leads (AlterPartition to the controller, KIP-497: shrink
when a follower lags past ``replica.lag.time.max.ms``, expand when one
catches up), and the high-watermark checkpoint every
``replica.high.watermark.checkpoint.interval.ms``. It keeps the replication
throttles (:mod:`josef.replication.replication_quota`) in step with the broker's rates
and the topics' throttled replicas.

It tells the controller which log directory holds each of its replicas
(AssignReplicasToDirs, KIP-858, Kafka's AssignmentsManager) whenever the
metadata says otherwise: after a replica is created, moved, or reassigned.
When a log directory fails (:meth:`josef.log.LogStorage.offline_dirs`,
Kafka's LogDirFailureHandler) its partitions go offline here: they stop
fetching and are never followed again (their logs answer KAFKA_STORAGE_ERROR),
and the broker's next heartbeat names the directory, so the controller takes
exactly those replicas out of leadership and the ISR. With every log
directory, or the metadata log's, gone the broker stops, as Kafka's does.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import attrs
from kio.schema.errors import ErrorCode

from josef.metadata import meta_properties
from josef.config import Config
from josef.log import LogConfig, LogDirError, LogStorage, remote_storage_enabled
from josef.metadata.features import ELIGIBLE_LEADER_REPLICAS_VERSION
from josef.metadata.image import (
    MIGRATING_DIR,
    RECOVERED,
    RECOVERING,
    UNASSIGNED_DIR,
    MetadataDelta,
    MetadataImage,
    PartitionImage,
)
from josef.metadata.records import TOPIC_RESOURCE, uuid_from_text, uuid_to_text
from josef.replication.partition import FollowerState, Partition
from josef.protocol.api_keys import ApiKey
from josef.protocol.topic_partition import TopicPartition
from josef.replication.purgatory import Purgatory
from josef.replication.replica_fetcher import ReplicaFetchers
from josef.replication.replication_quota import ReplicationQuota

if TYPE_CHECKING:
    from josef.node.broker import Broker

log = logging.getLogger(__name__)

#: Partitions that live in log storage but are not topics (a quorum's own log).
INTERNAL_LOGS = frozenset({"__cluster_metadata"})
#: How often the storage is asked whether a log directory failed (a cheap, in-memory question).
LOG_DIR_CHECK_INTERVAL_S = 0.1
#: The purgatory key ``(LOG_END, tp)``: the log end of ``tp`` moved (what followers wait for; ``tp`` alone is its high watermark).
LOG_END = "log-end"
#: Storage operations (log openings and deletions) per worker-thread call: each call's results are installed
#: on the event loop in one go, so this bounds that step (about 50 µs a partition).
STORAGE_OPS_PER_CALL = 100


@attrs.frozen
class OpenLog:
    """Open (or create) a partition's log; ``token`` tells whether it is still wanted when it is done."""

    tp: TopicPartition
    token: object
    topic_id: str
    config: dict[str, Any]


@attrs.frozen
class DeleteLog:
    """Delete a partition's log; ``known``: it was hosted or being opened (else only if the storage holds it)."""

    tp: TopicPartition
    known: bool


@attrs.frozen
class OpenedLog:
    """An :class:`OpenLog` done: its Partition, or the error that took its directory offline."""

    request: OpenLog
    partition: Partition | LogDirError


class ReplicaManager:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.broker_id: int = broker.node_id
        self.config: Config = broker.config
        self.storage: LogStorage = broker.storage
        self.partitions: dict[TopicPartition, Partition] = {}
        self.purgatory = Purgatory()
        #: Plugins' callbacks on partition state changes (josef.led_partitions.LedPartitions.watch).
        self._watchers: list[Callable[[TopicPartition], None]] = []
        #: The high watermark each partition's waiters were last woken for.
        self._announced_high_watermarks: dict[TopicPartition, int] = {}
        window = (self.config["replication.quota.window.num"], self.config["replication.quota.window.size.seconds"])
        #: What this broker serves to throttled followers, and what it fetches for throttled partitions.
        self.leader_quota = ReplicationQuota(self.broker_id, *window)
        self.follower_quota = ReplicationQuota(self.broker_id, *window)
        self._apply_quota_rates()
        self.fetchers = ReplicaFetchers(self.broker_id, self.config, self._endpoint_of, lambda: broker.lifecycle.epoch,
                                        self.appended, broker.inter_broker_listener, self.follower_quota,
                                        broker.topic_metrics)
        self._high_watermarks: dict[TopicPartition, int] = {}
        #: ISR changes of partitions this broker leads that the controller accepted (Kafka's IsrShrinks/ExpandsPerSec).
        self.isr_shrinks = self.isr_expands = 0
        self._tg: anyio.abc.TaskGroup | None = None
        #: Log directories known to have failed, and the hosted partitions whose logs were in them.
        self.offline_dirs: frozenset[str] = frozenset()
        self.offline: set[TopicPartition] = set()
        #: ``directory.id`` of each log directory, by path; and the replicas whose directory the metadata does not show yet.
        self._directory_ids: dict[str, str] = {}
        self._unassigned: dict[TopicPartition, str] = {}
        self._assigning = anyio.Event()
        #: Partitions whose logs a worker thread is opening, with the token of that opening (see :meth:`apply_delta`).
        self._opening: dict[TopicPartition, object] = {}
        #: Log openings and deletions for the worker thread, in the order the metadata asked for them.
        self._storage_ops: list[OpenLog | DeleteLog] = []
        self._storage_wake = anyio.Event()
        self._storage_settled = anyio.Event()
        self._storage_settled.set()

    def get(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    def topic_config(self, image: MetadataImage, topic: str) -> dict[str, Any]:
        overrides = self.config.definition.parse_topic_configs(image.config(TOPIC_RESOURCE, topic))
        config = self.config.topic_config(overrides)
        config["remote.storage.enable"] = remote_storage_enabled(
            topic, overrides.get("remote.storage.enable"), config["remote.storage.enable"], config["cleanup.policy"])
        return config

    # Metadata ---------------------------------------------------------------

    def _endpoint_of(self, broker_id: int) -> tuple[str, int] | None:
        broker = self.broker.image.brokers.get(broker_id)
        endpoint = broker.endpoint(self.fetchers.listener) if broker is not None else None
        return (endpoint.host, endpoint.port) if endpoint is not None else None

    def load(self, image: MetadataImage) -> None:
        """At start-up: open every partition the image gives this broker; delete stray logs of deleted topics."""
        self._high_watermarks = self.storage.high_watermarks()
        self._directory_ids = meta_properties.directory_ids(self.config)
        hosted = set()
        for topic in image.topics.values():
            for index, state in topic.partitions.items():
                if self.broker_id in state.replicas:
                    hosted.add(TopicPartition(topic.name, index))
        for tp in self.storage.stored():
            if tp not in hosted and tp.topic not in INTERNAL_LOGS:
                log.info("deleting stray log %s: its topic no longer exists", tp)
                self.storage.delete(tp)
        for topic in image.topics.values():
            self._apply_throttled_replicas(topic.name, self.topic_config(image, topic.name))
        self.apply_delta(MetadataDelta(changed_partitions=tuple((tp.topic, tp.partition) for tp in sorted(hosted))), image)
        self.storage.startup()

    def apply_delta(self, delta: MetadataDelta, image: MetadataImage) -> None:
        """Bring the hosted partitions in step with ``image`` after ``delta``.

        Once the replica manager runs, logs are opened and deleted in a worker
        thread (:meth:`run_storage_ops`), as Kafka does them outside its
        network threads: creating a log makes its directory and files, and a
        topic of thousands of partitions otherwise stopped the event loop for
        seconds. The operations run in the order the metadata asked for them,
        so a deleted topic's directory is renamed away before a re-created
        topic of the same name opens its log. A partition whose log is being
        opened is not hosted yet: requests for it get NOT_LEADER_OR_FOLLOWER,
        which clients retry, and it takes the image's state of the moment it
        is installed. At start-up (:meth:`load`, before the broker serves)
        everything happens here, at once.
        """
        strict = image.features.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0) >= 1
        if ELIGIBLE_LEADER_REPLICAS_VERSION in delta.changed_features:
            for partition in self.partitions.values():
                partition.strict_min_isr = strict
        configs: dict[str, dict[str, Any]] = {}  # each topic's config, parsed once per delta rather than per partition
        for topic in delta.deleted_topics:
            self._apply_throttled_replicas(topic.name, {})
            for index in topic.partitions:
                self._remove(TopicPartition(topic.name, index))
        for name, index in delta.changed_partitions:
            topic = image.topics.get(name)
            if topic is None:
                continue
            state = topic.partitions[index]
            tp = TopicPartition(name, index)
            if self.broker_id not in state.replicas:
                self._remove(tp)
                continue
            if tp in self._opening:
                continue  # it takes the image's state once its log is open
            partition = self.partitions.get(tp)
            if partition is None:
                if tp in self.offline or not self._usable_dir(state.directory_of(self.broker_id)):
                    self.offline.add(tp)  # its log is on a failed disk: it must not start afresh elsewhere
                    continue
                if name not in configs:
                    configs[name] = self.topic_config(image, name)
                if self._tg is not None:
                    token = self._opening[tp] = object()
                    self._queue_storage(OpenLog(tp, token, topic.topic_id, configs[name]))
                    continue
                try:
                    partition = self._new_partition(tp, topic.topic_id, configs[name])
                except LogDirError as exc:
                    log.error("partition %s is offline: %s", tp, exc)
                    self.offline.add(tp)
                    continue
                self._install(partition, state, strict)
            else:
                self._follow_state(partition, state, partition.update_state(state))
        for resource_type, name in delta.changed_configs:
            if resource_type == TOPIC_RESOURCE and name in image.topics:
                config = configs.get(name) or self.topic_config(image, name)
                self._apply_throttled_replicas(name, config)
                for partition in self._partitions_of(name):
                    partition.update_config(config)

    def _new_partition(self, tp: TopicPartition, topic_id: str, config: dict[str, Any]) -> Partition:
        """Open (or create) ``tp``'s log and build its Partition (which reads its producer state): blocking work."""
        log_ = self.storage.open(tp, LogConfig.from_topic_config(config))
        return Partition(tp, topic_id, self.broker_id, log_, config, self._high_watermarks.get(tp))

    def _install(self, partition: Partition, state: PartitionImage, strict: bool) -> None:
        """Host a new partition in ``state``."""
        self.partitions[partition.tp] = partition
        partition.strict_min_isr = strict
        partition.update_state(state)
        self._follow_state(partition, state, True)

    def _follow_state(self, partition: Partition, state: PartitionImage, new_term: bool) -> None:
        """What follows a hosted partition's new state: directory assignment, fetching or leading, waking its waiters."""
        tp = partition.tp
        self._check_directory(partition, state)
        if tp in self.offline:
            pass  # its log cannot be written: it neither follows nor reports ISR changes
        elif partition.is_leader:
            self.fetchers.stop_following(tp)
            if partition.recovering:  # elected uncleanly: our log is the partition's now, say so (KIP-704)
                self._propose_isr(partition, partition.isr)
        elif new_term:
            self.fetchers.follow(partition)
        self._wake_all(tp)

    # Opening and deleting logs in a worker thread ---------------------------------

    def _queue_storage(self, op: OpenLog | DeleteLog) -> None:
        self._storage_ops.append(op)
        self._storage_wake.set()
        if self._storage_settled.is_set():
            self._storage_settled = anyio.Event()

    async def storage_settled(self) -> None:
        """Wait until every log opening and deletion asked for so far is done (and the opened partitions hosted)."""
        await self._storage_settled.wait()

    async def run_storage_ops(self) -> None:
        """Open and delete logs in a worker thread, in order, :data:`STORAGE_OPS_PER_CALL` at a time; host what opened."""
        while True:
            if not self._storage_ops:
                self._storage_settled.set()
                await self._storage_wake.wait()
                self._storage_wake = anyio.Event()
                continue
            batch = self._storage_ops[:STORAGE_OPS_PER_CALL]
            del self._storage_ops[:STORAGE_OPS_PER_CALL]
            opened = await anyio.to_thread.run_sync(self._run_storage_ops, batch)
            # Stopping meanwhile: the fetchers and coordinators are gone, so nothing is installed (storage closes the logs).
            await anyio.lowlevel.checkpoint_if_cancelled()
            self._install_opened(opened)

    def _run_storage_ops(self, batch: list[OpenLog | DeleteLog]) -> list[OpenedLog]:
        """In a worker thread: each operation in turn; the openings' Partitions (or LogDirErrors)."""
        opened: list[OpenedLog] = []
        stored: set[TopicPartition] | None = None  # what the storage holds, read once if a deletion asks
        for op in batch:
            if isinstance(op, OpenLog):
                try:
                    opened.append(OpenedLog(op, self._new_partition(op.tp, op.topic_id, op.config)))
                except LogDirError as exc:
                    opened.append(OpenedLog(op, exc))
                if stored is not None:
                    stored.add(op.tp)
                continue
            if not op.known:  # not hosted here: delete only a log the storage holds (of an offline partition, say)
                if stored is None:
                    stored = set(self.storage.stored())
                if op.tp not in stored:
                    continue
            if stored is not None:
                stored.discard(op.tp)
            try:
                self.storage.delete(op.tp)
            except LogDirError as exc:  # its directory is offline now: check_log_dirs tells the controller
                log.error("deleting the log of %s failed: %s", op.tp, exc)
        return opened

    def _install_opened(self, opened: list[OpenedLog]) -> None:
        """On the event loop: host the partitions whose logs opened, in the image's state of now.

        An opening whose partition was removed meanwhile (its token is gone)
        is dropped: the removal queued the deletion of its log after it.
        """
        image = self.broker.image
        strict = image.features.get(ELIGIBLE_LEADER_REPLICAS_VERSION, 0) >= 1
        configs: dict[str, dict[str, Any]] = {}
        installed = False
        for done in opened:
            tp, partition, config = done.request.tp, done.partition, done.request.config
            if self._opening.get(tp) is not done.request.token:
                continue
            del self._opening[tp]
            if isinstance(partition, LogDirError):
                log.error("partition %s is offline: %s", tp, partition)
                self.offline.add(tp)
                continue
            topic = image.topics.get(tp.topic)
            state = topic.partitions.get(tp.partition) if topic is not None else None
            if state is None or topic.topic_id != partition.topic_id or self.broker_id not in state.replicas:
                continue  # cannot happen: a removal takes the token; left for the next start's stray-log check
            if tp.topic not in configs:
                configs[tp.topic] = self.topic_config(image, tp.topic)
            if configs[tp.topic] != config:
                partition.update_config(configs[tp.topic])
            self._install(partition, state, strict)
            installed = True
        if installed:
            self.broker.partitions_installed()

    def _apply_throttled_replicas(self, topic: str, topic_config: dict[str, Any]) -> None:
        """A topic's throttled replicas, kept for every topic: a move may throttle a partition before we host it."""
        self.leader_quota.mark_throttled(topic, topic_config.get("leader.replication.throttled.replicas", []))
        self.follower_quota.mark_throttled(topic, topic_config.get("follower.replication.throttled.replicas", []))

    def _apply_quota_rates(self) -> None:
        self.leader_quota.bound = self.config["leader.replication.throttled.rate"]
        self.follower_quota.bound = self.config["follower.replication.throttled.rate"]

    def apply_broker_config(self, config: Config, image: MetadataImage) -> None:
        """Dynamic broker defaults changed: every topic's effective settings may have, and the throttle rates."""
        self.config = config
        self.storage.update_config(config)
        self._apply_quota_rates()
        for name in {tp.topic for tp in self.partitions}:
            topic_config = self.topic_config(image, name)
            for partition in self._partitions_of(name):
                partition.update_config(topic_config)

    def _partitions_of(self, topic: str) -> Iterable[Partition]:
        return [p for tp, p in self.partitions.items() if tp.topic == topic]

    def _remove(self, tp: TopicPartition) -> None:
        """Stop hosting ``tp`` and delete its log: in the worker thread once running (after any opening of it)."""
        self.fetchers.stop_following(tp)
        self.offline.discard(tp)
        self._unassigned.pop(tp, None)
        known = (self.partitions.pop(tp, None) is not None) | (self._opening.pop(tp, None) is not None)
        if self._tg is not None:
            self._queue_storage(DeleteLog(tp, known))
            if known:
                self._wake_all(tp)
        elif known or tp in self.storage.stored():
            self.storage.delete(tp)
            self._wake_all(tp)

    # Waiting ----------------------------------------------------------------

    async def wait_for_data(self, tps: Iterable[TopicPartition], timeout_ms: int, *,
                            followers: bool = False) -> set[TopicPartition]:
        """Wait until one of ``tps`` has something new for its readers; the partitions that do (none on timeout).

        Consumers see up to the high watermark, so they wake when it moves;
        followers read to the log end and wake on every append. Both wake
        when the partition's leadership or state changes.
        """
        if not followers:
            return await self.purgatory.wait(tps, timeout_ms / 1000)  # type: ignore[return-value]
        keys = {(LOG_END, tp): tp for tp in tps}
        return {keys[key] for key in await self.purgatory.wait(keys, timeout_ms / 1000)}

    def appended(self, tp: TopicPartition) -> None:
        """Wake followers of ``tp`` after an append, and its consumers and acks=all producers if its high watermark moved."""
        self.purgatory.notify((LOG_END, tp))
        partition = self.partitions.get(tp)
        if partition is not None:
            self._high_watermark_moved(partition)

    def _high_watermark_moved(self, partition: Partition) -> None:
        """Wake what waits on ``partition``'s high watermark, unless it is where they last heard it was."""
        high_watermark = partition.high_watermark
        if self._announced_high_watermarks.get(partition.tp) != high_watermark:
            self._announced_high_watermarks[partition.tp] = high_watermark
            self.purgatory.notify(partition.tp)

    def _wake_all(self, tp: TopicPartition) -> None:
        """Wake every fetch and acks=all produce waiting on ``tp``, and tell the watchers: its leadership or state
        changed."""
        self._announced_high_watermarks.pop(tp, None)
        self.purgatory.notify(tp)
        self.purgatory.notify((LOG_END, tp))
        for watcher in tuple(self._watchers):
            try:
                watcher(tp)
            except Exception:
                log.exception("a watcher of partition state changes failed on %s", tp)

    def watch(self, watcher: Callable[[TopicPartition], None]) -> Callable[[], None]:
        """Call ``watcher(tp)`` after every change of a hosted partition's state; returns the unwatch function."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher) if watcher in self._watchers else None

    # Leading: followers' fetches and the ISR -------------------------------------

    def follower_fetched(self, partition: Partition, replica_id: int, offset: int) -> None:
        """A follower fetched: move the high watermark (waking acks=all producers) and let it into the ISR if it caught up."""
        if partition.follower_fetched(replica_id, offset):
            self._high_watermark_moved(partition)
        joining = partition.isr_to_expand(self._isr_eligible)
        if joining is not None:
            self._propose_isr(partition, joining)

    def preferred_read_replica(self, partition: Partition, client_rack: str, fetch_offset: int) -> int:
        """Kafka's RackAwareReplicaSelector (KIP-392): an in-sync replica in the consumer's rack, or -1 for the leader.

        Only replicas that already hold ``fetch_offset`` are candidates; the
        leader wins when it is in the rack too, and among followers the one
        with the longest log.
        """
        if not client_rack or self.config["replica.selector.class"] is None or not partition.is_leader:
            return -1
        brokers = self.broker.image.brokers
        same_rack = [b for b in partition.isr if b in brokers and brokers[b].rack == client_rack
                     and (b == self.broker_id or partition.followers.get(b, FollowerState()).log_end_offset >= fetch_offset)]
        if not same_rack or self.broker_id in same_rack:
            return -1
        return max(same_rack, key=lambda b: partition.followers[b].log_end_offset)

    def _isr_eligible(self, broker_id: int) -> bool:
        """A broker may join an ISR only while registered, unfenced and not shutting down (KIP-841)."""
        broker = self.broker.image.brokers.get(broker_id)
        return broker is not None and not broker.fenced and not broker.in_controlled_shutdown

    async def run_isr_shrinking(self) -> None:
        """Every half of replica.lag.time.max.ms, drop lagging followers from the ISRs this broker leads."""
        max_lag = self.config["replica.lag.time.max.ms"]
        while True:
            await anyio.sleep(max_lag / 2000)
            self._report_recovered()
            for partition in list(self.partitions.values()):
                shrunk = partition.isr_to_shrink(max_lag)
                if shrunk is not None:
                    log.info("shrinking the ISR of %s from %s to %s: followers lag more than %d ms", partition.tp,
                             list(partition.isr), list(shrunk), max_lag)
                    self._propose_isr(partition, shrunk)

    def _propose_isr(self, partition: Partition, isr: tuple[int, ...]) -> None:
        if self._tg is None:  # still loading: _report_recovered and the ISR checks propose again once running
            return
        partition.pending_isr = isr
        self._tg.start_soon(self._alter_partition, partition, isr, partition.leader_epoch, partition.partition_epoch)

    def _report_recovered(self) -> None:
        """Tell the controller that uncleanly elected leaders recovered (KIP-704): at start, then at each ISR check until it agrees."""
        for partition in self.partitions.values():
            if partition.is_leader and partition.recovering and partition.pending_isr is None:
                self._propose_isr(partition, partition.isr)

    async def _alter_partition(self, partition: Partition, isr: tuple[int, ...], leader_epoch: int,
                               partition_epoch: int) -> None:
        """Send an ISR change to the controller and apply its answer (Kafka's AlterPartitionManager)."""
        image = self.broker.image
        body = {"broker_id": self.broker_id, "broker_epoch": self.broker.lifecycle.epoch, "topics": [{
            "topic_id": uuid_from_text(partition.topic_id), "partitions": [{
                "partition_index": partition.tp.partition, "leader_epoch": leader_epoch, "partition_epoch": partition_epoch,
                "new_isr_with_epochs": [{"broker_id": b, "broker_epoch": image.brokers[b].epoch if b in image.brokers else -1}
                                        for b in isr],
                "leader_recovery_state": RECOVERED}]}]}
        try:
            response = await self.broker.channel.call(ApiKey.ALTER_PARTITION, body)
        except Exception as exc:  # no controller, or one that cannot answer: try again at the next check
            log.warning("AlterPartition for %s failed: %s", partition.tp, exc)
            code, result = ErrorCode.request_timed_out, None
        else:
            code = response.error_code
            result = response.topics[0].partitions[0] if code == ErrorCode.none else None
            if result is not None:
                code = result.error_code
        if partition.pending_isr != isr or partition.partition_epoch != partition_epoch:
            return  # the metadata moved on meanwhile
        partition.pending_isr = None
        if code != ErrorCode.none or result is None:
            log.info("the controller refused the ISR %s for %s: %s", list(isr), partition.tp, code.name)
            return
        before = len(partition.isr)
        partition.isr_committed(tuple(result.isr), result.leader_epoch, result.partition_epoch,
                                result.leader_recovery_state == RECOVERING)
        if len(partition.isr) < before:
            self.isr_shrinks += 1
        elif len(partition.isr) > before:
            self.isr_expands += 1
        self._wake_all(partition.tp)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The broker's replication duties, until cancelled: fetchers, ISR checks, checkpoints, retention."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.run_storage_ops)
            await tg.start(self.fetchers.run)
            self._report_recovered()
            tg.start_soon(self.run_isr_shrinking)
            tg.start_soon(self.run_high_watermark_checkpoints)
            tg.start_soon(self.run_housekeeping)
            tg.start_soon(self.run_producer_expiration)
            tg.start_soon(self.run_log_dir_checks)
            tg.start_soon(self.run_directory_assignments)
            task_status.started()

    async def run_high_watermark_checkpoints(self) -> None:
        interval = self.config["replica.high.watermark.checkpoint.interval.ms"] / 1000
        while True:
            await anyio.sleep(interval)
            await anyio.to_thread.run_sync(self.checkpoint_high_watermarks)

    def checkpoint_high_watermarks(self) -> None:
        try:
            self.storage.checkpoint_high_watermarks({tp: p.high_watermark for tp, p in list(self.partitions.items())})
        except LogDirError as exc:
            log.error("checkpointing high watermarks failed: %s", exc)

    # Log directories ----------------------------------------------------------

    async def run_log_dir_checks(self) -> None:
        while True:
            self.check_log_dirs()
            await anyio.sleep(LOG_DIR_CHECK_INTERVAL_S)

    def check_log_dirs(self) -> None:
        """Take the partitions of newly failed log directories offline and tell the controller.

        Raises :class:`LogDirError` when every log directory, or the
        metadata log's, failed: the broker cannot go on (Kafka halts).
        """
        failed = frozenset(self.storage.offline_dirs())
        if failed == self.offline_dirs:
            return
        self.offline_dirs = failed
        for tp, partition in self.partitions.items():
            if tp not in self.offline and str(partition.log.dir.parent) in failed:
                log.error("partition %s is offline: its log directory %s failed", tp, partition.log.dir.parent)
                self.offline.add(tp)
                self.fetchers.stop_following(tp)
                self._wake_all(tp)
                topic = self.broker.image.topics.get(tp.topic)
                if topic is not None and tp.partition in topic.partitions:
                    # Unassigned in the metadata: saying where it was lets the controller take it offline too.
                    self._check_directory(partition, topic.partitions[tp.partition])
        configured = [os.path.abspath(d) for d in meta_properties.log_dirs(self.config)]
        if set(configured) <= failed or configured[0] in failed:
            # Kafka halts here; raising out of the replica manager's task stops the broker with this error.
            what = "every log directory" if set(configured) <= failed else "the metadata log directory"
            log.critical("stopping broker %d: %s failed", self.broker_id, what)
            raise LogDirError(f"broker {self.broker_id} stops: {what} failed ({', '.join(sorted(failed))})")
        self.broker.lifecycle.report_offline_dirs()

    async def move_log(self, partition: Partition, log_dir: str) -> None:
        """Move a hosted partition's log into ``log_dir`` (AlterReplicaLogDirs), copying in a worker thread.

        The partition keeps its :class:`josef.log.Log`: the storage switches
        it to the new directory under the log's own lock (the contract of
        :meth:`josef.log.LogStorage.move`), so appends and fetches from the
        event loop wait for the switch and never reach the old directory.
        """
        await anyio.to_thread.run_sync(self.storage.move, partition.tp, log_dir)
        topic = self.broker.image.topics.get(partition.tp.topic)
        if topic is not None and partition.tp.partition in topic.partitions:
            self._check_directory(partition, topic.partitions[partition.tp.partition])

    def _usable_dir(self, directory: str) -> bool:
        """Whether a replica the metadata places in ``directory`` may be opened here: unassigned, or one of our working dirs.

        A replica assigned to a directory that failed, or that this broker
        could not even read at start, stays offline rather than start empty
        in another directory (KIP-858).
        """
        if directory in (UNASSIGNED_DIR, MIGRATING_DIR):
            return True
        failed = self.storage.offline_dirs()
        return any(i == directory and path not in failed for path, i in self._directory_ids.items())

    def _check_directory(self, partition: Partition, state: PartitionImage) -> None:
        """Queue an AssignReplicasToDirs for ``partition`` when the metadata has its replica elsewhere (or nowhere)."""
        directory = self._directory_ids.get(str(partition.log.dir.parent))
        if directory is None or state.directory_of(self.broker_id) == directory:
            self._unassigned.pop(partition.tp, None)
            return
        if self._unassigned.get(partition.tp) != directory:
            self._unassigned[partition.tp] = directory
            self._assigning.set()

    async def run_directory_assignments(self) -> None:
        """Send the queued directory assignments, in one request, whenever there are new ones; retry after failures.

        An assignment leaves the queue when the metadata shows it (in
        :meth:`apply_delta`) or when the controller refuses it for good.
        """
        backoff = self.config["replica.fetch.backoff.ms"] / 1000
        while True:
            await self._assigning.wait()
            self._assigning = anyio.Event()
            batch = dict(self._unassigned)
            if not batch:
                continue
            by_dir: dict[str, dict[str, list[int]]] = {}
            topic_ids = {}
            for tp, directory in batch.items():
                partition = self.partitions.get(tp)
                if partition is None:
                    continue
                topic_ids[partition.topic_id] = tp.topic
                by_dir.setdefault(directory, {}).setdefault(partition.topic_id, []).append(tp.partition)
            body = {"broker_id": self.broker_id, "broker_epoch": self.broker.lifecycle.epoch, "directories": [
                {"id_": uuid_from_text(d), "topics": [{"topic_id": uuid_from_text(t), "partitions": [
                    {"partition_index": p} for p in parts]} for t, parts in topics.items()]}
                for d, topics in by_dir.items()]}
            try:
                response = await self.broker.channel.call(ApiKey.ASSIGN_REPLICAS_TO_DIRS, body)
                code = response.error_code
            except Exception as exc:  # no controller now: try again
                log.warning("AssignReplicasToDirs failed: %s", exc)
                code = ErrorCode.request_timed_out
            else:
                for d in response.directories:
                    for t in d.topics:
                        for p in t.partitions:
                            tp = TopicPartition(topic_ids.get(uuid_to_text(t.topic_id), ""), p.partition_index)
                            if p.error_code != ErrorCode.none and self._unassigned.get(tp) == batch.get(tp):
                                log.info("the controller refused to assign %s to a directory: %s", tp,
                                         p.error_code.name)
                                self._unassigned.pop(tp, None)
            if code != ErrorCode.none:
                await anyio.sleep(backoff)
                self._assigning.set()

    # Housekeeping -------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        """Apply retention every ``log.retention.check.interval.ms``, in worker threads (deleting files blocks)."""
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await anyio.sleep(interval)
            await self.apply_retention()

    async def run_producer_expiration(self) -> None:
        """Kafka's PeriodicProducerExpirationCheck, every ``producer.id.expiration.check.interval.ms``: first at
        start, for the producers the logs' snapshots kept that expired while the broker was down."""
        while True:
            await self.expire_producers(int(time.time() * 1000))
            await anyio.sleep(self.config["producer.id.expiration.check.interval.ms"] / 1000)

    async def expire_producers(self, now_ms: int) -> int:
        """Forget the producers silent for ``producer.id.expiration.ms`` (dynamic) in every hosted partition; how many.

        A scan of each partition's producers, on the event loop, yielding
        between partitions.
        """
        expiration_ms = self.config["producer.id.expiration.ms"]
        expired = 0
        for partition in list(self.partitions.values()):
            gone = partition.producers.remove_expired(now_ms, expiration_ms)
            if gone:
                log.debug("%s: producers %s expired", partition.tp, gone)
                expired += len(gone)
            await anyio.lowlevel.checkpoint()
        return expired

    async def apply_retention(self) -> int:
        now = int(time.time() * 1000)
        deleted = 0
        for tp, partition in list(self.partitions.items()):
            if tp in self.offline:
                continue
            try:
                deleted += await anyio.to_thread.run_sync(partition.log.apply_retention, now)
            except LogDirError as exc:
                log.error("retention of %s failed: %s", partition.tp, exc)
        return deleted

    def close(self) -> None:
        self.checkpoint_high_watermarks()
        self.partitions.clear()
        self.storage.close(self.broker.lifecycle.epoch)

