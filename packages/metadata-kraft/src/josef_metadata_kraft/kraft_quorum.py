"""The KRaft metadata quorum: the Raft core driven over josef's network and storage.

:class:`KRaftQuorum` is what the broker sees (:class:`josef.metadata.quorum.MetadataQuorum`).
It owns one :class:`~josef_metadata_kraft.raft.RaftNode` and is its driver:
inbound Raft requests arrive through the controller listener's dispatcher
(:meth:`apis`), outbound ones go over :class:`josef.protocol.connection.Connection`
to the voters of ``controller.quorum.voters``, and a loop runs the node's
timers. Committed batches are decoded into metadata records for the node's
listener; every ``metadata.log.max.record.bytes.between.snapshots`` bytes of
committed log, a snapshot of the listener's image is written and the log
behind it trimmed.

Voters are the nodes with the controller role named in
``controller.quorum.voters``; brokers are observers that only fetch. A
dynamic quorum (KIP-853) sets ``controller.quorum.bootstrap.servers``
instead: the voters are then the latest VotersRecord of the metadata log
(from the bootstrap snapshot ``josef storage format --standalone`` or
``--initial-controllers`` wrote), and change through AddRaftVoter and
RemoveRaftVoter, served on the controller listener. With no
voters configured, the node is a single voter reachable only in-process (the
default single-node broker): no controller listener is needed and a record
commits as soon as it is on disk.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Iterator, Mapping, Sequence

import anyio
import anyio.abc
import anyio.to_thread
from kio.schema.errors import ErrorCode
from prometheus_client.core import GaugeMetricFamily, Metric

from josef.config import Config, ConfigError
from josef.log import LogConfig, LogStorage
from josef.metadata.meta_properties import log_dirs, read
from josef.metadata.quorum import MetadataListener, NotControllerError
from josef.metadata.records import MetadataRecord, UnknownRecordError, decode, encode, uuid_from_text
from josef.protocol.api_keys import ApiKey
from josef.protocol.connection import Connection
from josef.protocol.errors import KafkaConnectionError, KafkaTimeoutError, UnsupportedVersionError
from josef.protocol.records import iter_records
from josef.protocol.sasl_client import (
    SaslAuthenticationFailed,
    outbound_sasl,
    refused_by_controller,
    unauthorized_by_controller,
)
from josef.protocol.tls import outbound_context
from josef.protocol.topic_partition import TopicPartition
from josef.server.dispatch import Handler, RequestContext
from josef_metadata_kraft.dynamic_quorum import bootstrap_servers, controller_endpoints, parse_host_port
from josef_metadata_kraft.metadata_log import MetadataLog
from josef_metadata_kraft.raft import (
    CommittedBatch,
    FileQuorumStateStore,
    LeaderChanged,
    NotLeaderError,
    OffsetAndEpoch,
    Outbound,
    RaftConfig,
    RaftNode,
    Role,
    SnapshotLoaded,
)
from josef_metadata_kraft.raft import messages
from josef_metadata_kraft.snapshots import snapshot_records

log = logging.getLogger(__name__)

METADATA_PARTITION = TopicPartition("__cluster_metadata", 0)
#: Records per append from which they are encoded in a worker thread rather than on the event loop.
ENCODE_IN_THREAD = 500
#: Appends the commit-latency metrics are computed over.
COMMIT_LATENCY_SAMPLES = 128
#: The metadata log keeps everything until a snapshot covers it: retention never deletes it.
METADATA_LOG_CONFIG = LogConfig(segment_bytes=64 * 1024 * 1024, retention_ms=-1, retention_bytes=-1)
#: The Raft APIs and the versions the core speaks: Kafka 4.x's newest between voters, every DescribeQuorum for tools.
RAFT_APIS = {ApiKey.VOTE: (2, 2), ApiKey.BEGIN_QUORUM_EPOCH: (1, 1), ApiKey.END_QUORUM_EPOCH: (1, 1),
             ApiKey.FETCH: (17, 17), ApiKey.FETCH_SNAPSHOT: (1, 1), ApiKey.DESCRIBE_QUORUM: (0, 2),
             ApiKey.ADD_RAFT_VOTER: (0, 1), ApiKey.REMOVE_RAFT_VOTER: (0, 0), ApiKey.UPDATE_RAFT_VOTER: (0, 0)}


def parse_voters(items: Sequence[str]) -> dict[int, tuple[str, int]]:
    """``controller.quorum.voters``: ``id@host:port`` items into ``{id: (host, port)}``."""
    voters = {}
    for item in items:
        node, sep, address = item.partition("@")
        if not sep or not node.isdigit():
            raise ConfigError(f"invalid value {item!r} for configuration controller.quorum.voters: not ID@HOST:PORT")
        voters[int(node)] = parse_host_port(address, "controller.quorum.voters")
    return voters


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _source(request: Any) -> int:
    """The node an inbound Raft request comes from, where the request says."""
    state = getattr(request, "replica_state", None)
    if state is not None:
        return int(state.replica_id)
    return int(getattr(request, "replica_id", -1))


class _Answer:
    """A deferred response (a Fetch long poll) the driver hands over when the node releases it."""

    def __init__(self) -> None:
        self.ready = anyio.Event()
        self.response: Any = None


class KRaftQuorum:
    def __init__(self, config: Config, log_storage: LogStorage) -> None:
        self._config = config
        self._storage = log_storage
        self._node_id: int = config["node.id"]
        roles = config["process.roles"]
        voters = parse_voters(config["controller.quorum.voters"] or [])
        self._bootstrap = bootstrap_servers(config)
        self._in_process = not voters and not self._bootstrap
        if not voters and self._bootstrap:
            pass  # a dynamic quorum: the voters come from the metadata log
        elif self._in_process:
            if "controller" not in roles:
                raise ConfigError("a broker-only node needs controller.quorum.voters to find its controllers")
            voters = {self._node_id: ("", -1)}
        elif "controller" in roles and self._node_id not in voters:
            raise ConfigError(f"node.id {self._node_id} has the controller role but controller.quorum.voters "
                              f"names only {sorted(voters)}")
        elif "controller" not in roles and self._node_id in voters:
            raise ConfigError(f"controller.quorum.voters names node {self._node_id}, whose process.roles "
                              f"({','.join(roles)}) has no controller")
        self._voters = voters
        directory = log_dirs(config)[0]
        props = read(directory)
        if props is None:
            raise ConfigError(f"log directory {directory} is not formatted")
        self._cluster_id = props.cluster_id
        self._directory_id = uuid_from_text(props.directory_id) if props.directory_id else None
        self._local_endpoints: tuple[tuple[str, str, int], ...] = ()
        if "controller" in roles and not self._in_process:
            try:
                self._local_endpoints = controller_endpoints(config)
            except ConfigError:
                pass  # no fixed controller port: nothing to announce
        self._raft_config = RaftConfig.from_properties(
            {key: config[key] for key in RaftConfig.KEYS if key in config.definition},
            listener_name=(config["controller.listener.names"] or ["CONTROLLER"])[0])
        self._snapshot_bytes: int = config["metadata.log.max.record.bytes.between.snapshots"]
        #: TLS towards the other voters when the controller listener is SSL (josef.protocol.tls).
        self._ssl = outbound_context(config, self._raft_config.listener_name)
        self._sasl = outbound_sasl(config, self._raft_config.listener_name, "sasl.mechanism.controller.protocol")
        self._node: RaftNode | None = None
        self._local_snapshot: OffsetAndEpoch | None = None
        self._log: MetadataLog | None = None
        self._listener: MetadataListener | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = anyio.Event()
        self._wake = anyio.Event()
        self._leader_id = -1
        self._delivered = -1
        self._since_snapshot = 0
        #: A snapshot is being encoded and written in a worker thread (:meth:`_write_snapshot`).
        self._snapshotting = False
        self._snapshot_done = anyio.Event()
        self._snapshot_done.set()
        #: Records of this node's big appends, delivered as they are when committed, by (epoch, last offset) of their batch.
        self._decoded: dict[tuple[int, int], list[MetadataRecord]] = {}
        #: Committed events not delivered yet (:meth:`_deliver`), and whether the first is being decoded.
        self._undelivered: collections.deque[Any] = collections.deque()
        self._decoding = False
        self._deferred: dict[int, _Answer] = {}
        self._commits = anyio.Event()
        self._connections: dict[int, Connection] = {}
        self._connecting: dict[int, anyio.Lock] = {}
        #: How long this node's last appends as leader took to commit, in ms (Kafka's commit-latency-avg/max).
        self._commit_latencies: collections.deque[float] = collections.deque(maxlen=COMMIT_LATENCY_SAMPLES)

    # MetadataQuorum --------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def controller_id(self) -> int:
        return self._leader_id

    def controllers(self) -> Mapping[int, tuple[str, int]]:
        if self._in_process:
            return {}
        return dict(self._node.voters) if self._node is not None else dict(self._voters)

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        if self._in_process:
            return None
        return self._node.endpoint(node_id) if self._node is not None else self._voters.get(node_id)

    def apis(self) -> Sequence[tuple[int, Handler, int, int]]:
        return [(key, self._handle, low, high) for key, (low, high) in RAFT_APIS.items()]

    async def start(self, listener: MetadataListener, tg: anyio.abc.TaskGroup) -> None:
        self._listener = listener
        self._log = MetadataLog(self._storage.open(METADATA_PARTITION, METADATA_LOG_CONFIG))
        self._local_snapshot = self._log.latest_snapshot_id()
        store = FileQuorumStateStore(self._log.dir / "quorum-state", tuple(self._voters))
        self._node = RaftNode(self._node_id, self._voters, self._log, store, cluster_id=self._cluster_id,
                              config=self._raft_config, now_ms=_wall_ms(), bootstrap_servers=self._bootstrap,
                              directory_id=self._directory_id, local_endpoints=self._local_endpoints)
        self._tg = tg
        self._started.set()
        self._pump()
        tg.start_soon(self._run)
        if self._in_process:
            # A lone voter elects itself at once: start returns with everything committed delivered.
            while self._leader_id != self._node_id:
                await self._commits.wait()

    async def append(self, records: Sequence[MetadataRecord]) -> int:
        node = self._node
        if node is None or self._leader_id != self._node_id:
            raise NotControllerError(f"node {self._node_id} is not the active controller (the leader is "
                                     f"{self._leader_id})")
        if len(records) >= ENCODE_IN_THREAD:
            # A topic of thousands of partitions: encoding its records took tens of ms of the event loop.
            # The controller appends one operation at a time, so nothing overtakes this append meanwhile.
            # The commit delivers these same (immutable) records instead of decoding the batch again.
            payloads, decoded = await anyio.to_thread.run_sync(_encode_all, records), list(records)
            node = self._node
            if node is None or self._leader_id != self._node_id:
                raise NotControllerError(f"node {self._node_id} lost the leadership while encoding records")
        else:
            payloads, decoded = _encode_all(records), None
        appended_at = time.monotonic()
        try:
            offset = node.append(payloads, _wall_ms(), timestamp_ms=_wall_ms())
        except NotLeaderError as exc:
            raise NotControllerError(str(exc)) from None
        if decoded is not None:
            self._decoded[(node.epoch, offset)] = decoded
        # A lone voter commits what it flushed: deliver now rather than on the driver's next turn.
        self._pump()
        self._wake.set()
        while self._delivered < offset:
            if self._leader_id != self._node_id:
                raise NotControllerError(f"node {self._node_id} lost the leadership before offset {offset} committed")
            await self._commits.wait()
        self._commit_latencies.append((time.monotonic() - appended_at) * 1000)
        return offset

    def collect(self) -> Iterator[Metric]:
        """Kafka's raft-metrics as Strimzi's JMX rules name them (``kafka_server_raftmetrics_current_leader``...)."""
        node = self._node
        if node is None:
            return
        hw = node.high_watermark
        latencies = self._commit_latencies
        for name, doc, value in (
            ("current_leader", "The quorum's leader as this node knows it (-1: none).", self._leader_id),
            ("current_epoch", "The quorum's epoch as this node knows it.", node.epoch),
            ("current_vote", "The voter this node voted for in the current epoch (-1: none).",
             -1 if node.voted_id is None else node.voted_id),
            ("high_watermark", "The metadata log's high watermark (-1: not known yet).", -1 if hw is None else hw),
            ("log_end_offset", "The end offset of this node's metadata log.", node.log.end_offset),
            ("commit_latency_avg", f"Average ms from this leader's append to its commit, over the last "
                                   f"{COMMIT_LATENCY_SAMPLES} appends.", sum(latencies) / len(latencies) if latencies
             else float("nan")),
            ("commit_latency_max", f"Largest ms from this leader's append to its commit, over the last "
                                   f"{COMMIT_LATENCY_SAMPLES} appends.", max(latencies, default=float("nan"))),
        ):
            yield GaugeMetricFamily(f"kafka_server_raftmetrics_{name}", doc, value=value)
        state = GaugeMetricFamily("kafka_server_raftmetrics_current_state", "This node's role in the quorum: 1 "
                                  "for the current one (Kafka's current-state).", labels=["current_state"])
        state.add_metric([self._state_name(node)], 1)
        yield state

    def _state_name(self, node: RaftNode) -> str:
        """Kafka's current-state: leader, candidate, voted, follower, unattached, observer, resigned, prospective."""
        if not node.is_voter and node.role is not Role.LEADER:
            return "observer"
        return node.role.value

    async def close(self) -> None:
        for node_id in list(self._connections):
            await self._drop(node_id)
        if self._node is not None and self._node.role is Role.LEADER and not self._in_process:
            self._node.resign(_wall_ms())
        self._node = None

    # The driver ---------------------------------------------------------------------

    async def _run(self) -> None:
        while self._node is not None:
            self._pump()
            node = self._node
            if node is None:
                return
            delay = max(0.0, (node.next_poll_ms - _wall_ms()) / 1000)
            with anyio.move_on_after(delay):
                await self._wake.wait()
            self._wake = anyio.Event()

    def _pump(self) -> None:
        """Run the node's timers, send what it wants sent, deliver what it committed."""
        node = self._node
        assert node is not None and self._tg is not None
        for out in node.poll(_wall_ms()):
            self._dispatch(out)
        while events := node.drain_events():
            self._undelivered.extend(events)
        self._deliver()

    def _deliver(self) -> None:
        """Deliver the committed events in order, up to the next big batch: its records are decoded in a worker thread.

        A broker that learns of 2,000 leadership changes in one batch
        decoded them on the event loop (tens of ms) before applying them.
        """
        delivered = False
        while self._undelivered and not self._decoding:
            event = self._undelivered[0]
            if self._tg is not None and self._decode_in_thread(event):
                self._decoding = True
                self._tg.start_soon(self._decode_then_deliver, event)
                break
            self._undelivered.popleft()
            self._apply(event)
            delivered = True
        if delivered:
            self._delivered_some()

    def _delivered_some(self) -> None:
        self._commits.set()
        self._commits = anyio.Event()
        self._maybe_snapshot()

    def _decode_in_thread(self, event: Any) -> bool:
        if isinstance(event, SnapshotLoaded):
            return True
        return (isinstance(event, CommittedBatch) and not event.is_control
                and event.last_offset - event.base_offset + 1 >= ENCODE_IN_THREAD
                and (event.epoch, event.last_offset) not in self._decoded)

    async def _decode_then_deliver(self, event: Any) -> None:
        try:
            if isinstance(event, SnapshotLoaded):
                records = await anyio.to_thread.run_sync(snapshot_records, event.data)
            else:
                records = await anyio.to_thread.run_sync(
                    lambda: [self._decode(r.value, r.offset) for r in iter_records(event.data)])
        finally:
            self._decoding = False
        if not self._undelivered or self._undelivered[0] is not event or self._node is None:
            return  # closed meanwhile
        self._undelivered.popleft()
        self._apply(event, records)
        self._delivered_some()
        self._deliver()

    def _dispatch(self, out: Outbound) -> None:
        if out.request is not None:
            answer = self._deferred.pop(id(out.request), None)
            if answer is not None:
                answer.response = out.message
                answer.ready.set()
            return
        assert self._tg is not None
        self._tg.start_soon(self._send, out.destination, out.message)

    def _apply(self, event: Any, decoded: list[MetadataRecord] | None = None) -> None:
        """Deliver one event to the listener; ``decoded`` are its records when decoded already."""
        listener = self._listener
        assert listener is not None
        if isinstance(event, CommittedBatch):
            if decoded is None and self._decoded:
                decoded = self._decoded.pop((event.epoch, event.last_offset), None)
            if self._decoded:  # batches appended in an epoch that lost them: never delivered
                self._decoded = {k: v for k, v in self._decoded.items() if k[1] > event.last_offset}
            if not event.is_control:
                if decoded is not None and len(decoded) == event.last_offset - event.base_offset + 1:
                    records = decoded
                else:
                    records = [self._decode(r.value, r.offset) for r in iter_records(event.data)]
                listener.on_commit(event.last_offset, records)
            self._delivered = event.last_offset
            self._since_snapshot += len(event.data)
        elif isinstance(event, SnapshotLoaded):
            records = snapshot_records(event.data) if decoded is None else decoded
            origin = "local" if event.snapshot_id == self._local_snapshot else "fetched from the leader"
            log.info("metadata snapshot %d-%d (%d records, %s) loaded", event.snapshot_id.offset,
                     event.snapshot_id.epoch, len(records), origin)
            listener.on_snapshot(event.snapshot_id.offset - 1, records)
            self._delivered = event.snapshot_id.offset - 1
            self._since_snapshot = 0
        elif isinstance(event, LeaderChanged):
            leader = -1 if event.leader_id is None else event.leader_id
            if leader != self._leader_id:
                log.info("metadata quorum leader is now %s in epoch %d%s", leader if leader >= 0 else "unknown",
                         event.epoch, " (this node)" if leader == self._node_id else "")
            self._leader_id = leader

    def _decode(self, value: bytes | None, offset: int) -> MetadataRecord:
        try:
            return decode(value or b"")
        except UnknownRecordError as exc:
            hint = ""
            if (value or b"").startswith(b"{"):
                hint = ("; it is a JSON record of a josef release older than Kafka's record format, which this "
                        "release cannot read: format the log directories again")
            assert self._log is not None
            raise ConfigError(f"metadata log {self._log.dir}, offset {offset}: {exc}{hint}") from None

    def _maybe_snapshot(self) -> None:
        """Every ``metadata.log.max.record.bytes.between.snapshots`` committed bytes, snapshot the image (one at a time)."""
        if (self._since_snapshot < self._snapshot_bytes or self._node is None or self._listener is None
                or self._snapshotting or self._tg is None):
            return
        self._since_snapshot = 0
        self._snapshotting = True
        self._snapshot_done = anyio.Event()
        self._tg.start_soon(self._write_snapshot, self._node, self._listener.current_image(), self._delivered + 1)

    async def _write_snapshot(self, node: RaftNode, image: Any, end_offset: int) -> None:
        """Encode and write the snapshot in a worker thread, then make it known and trim the log, on the loop.

        Encoding an image of 100,000 partitions and writing it (fsyncs
        included) stopped the event loop for seconds. The image is immutable
        (a commit makes a new one), so the thread reads it while the loop
        goes on; the raft node and the log's bookkeeping stay on the loop.
        """
        try:
            assert self._log is not None
            metadata_log = self._log
            snapshot_id, control = node.plan_snapshot(end_offset)
            if metadata_log.snapshot_size(snapshot_id) is not None:
                return
            started = time.monotonic()
            now = _wall_ms()

            def build_and_write() -> int:
                data = messages.snapshot_bytes(snapshot_id, _encode_all(list(image.records())), now, control=control)
                metadata_log.write_snapshot_file(snapshot_id, data)
                return len(data)

            size = await anyio.to_thread.run_sync(build_and_write)
            if self._node is not node:
                return  # closed meanwhile: the file is whole, the next start finds it
            metadata_log.add_snapshot(snapshot_id)
            metadata_log.delete_before_snapshot(snapshot_id)
            log.info("metadata snapshot %d-%d written (%d bytes in %.2f s, in a worker thread)", snapshot_id.offset,
                     snapshot_id.epoch, size, time.monotonic() - started)
        finally:
            self._snapshotting = False
            self._snapshot_done.set()

    async def snapshot_written(self) -> None:
        """Wait until the snapshot being written, if any, is (tests; a snapshot is written in a worker thread)."""
        await self._snapshot_done.wait()

    async def _handle(self, ctx: RequestContext, request: Any) -> Any:
        await self._started.wait()
        node = self._node
        if node is None:
            raise NotControllerError("the metadata quorum is closed")
        response = node.handle_request(_source(request), request, _wall_ms())
        self._wake.set()
        if response is not None:
            if self._in_process and ctx.api_key == ApiKey.DESCRIBE_QUORUM:
                return self._with_own_listeners(response)
            return response
        answer = self._deferred[id(request)] = _Answer()
        await answer.ready.wait()
        return answer.response

    def _with_own_listeners(self, response: Any) -> Any:
        """A DescribeQuorum answer of the in-process voter, naming where it can be reached.

        Kafka names each voter's controller listeners (DescribeQuorum v2's
        nodes). The in-process voter has none: its endpoint is a placeholder
        (no host, port -1), which no Listener entry can hold. What reaches it
        is the node's own client listeners, as its registration in the image
        advertises them, with the ports they are bound to (port 0 in
        ``listeners`` picks one): those are named instead. Before the node
        registered, the answer names no node rather than a wrong one.
        """
        if not isinstance(response, messages.dq_resp.DescribeQuorumResponse) or response.nodes \
                or self._listener is None:
            return response  # (only v2 has nodes)
        registration = self._listener.current_image().brokers.get(self._node_id)
        if registration is None or any(p.error_code != ErrorCode.none for t in response.topics for p in t.partitions):
            return response
        return messages.with_nodes(response, {self._node_id: [(e.name, e.host, e.port) for e in registration.endpoints]})

    async def _send(self, destination: int, request: Any) -> None:
        try:
            conn = await self._connection(destination)
            response = await conn.request(type(request).__api_key__, request, version=type(request).__version__)
        except (KafkaConnectionError, KafkaTimeoutError, UnsupportedVersionError, OSError) as exc:
            log.debug("raft request to %d failed: %s", destination, exc)
            await self._drop(destination)
            if self._node is not None:
                self._node.handle_send_failure(destination, request, _wall_ms())
        except SaslAuthenticationFailed as exc:
            # The credentials are this node's configuration: no retry mends them, so stop saying why.
            assert self._sasl is not None
            raise refused_by_controller(self._node_id, destination, self._raft_config.listener_name, self._sasl,
                                        exc) from None
        else:
            if getattr(response, "error_code", None) == ErrorCode.inconsistent_cluster_id:
                raise ConfigError(f"controller {destination} answered INCONSISTENT_CLUSTER_ID: this node was "
                                  f"formatted for cluster {self._cluster_id}, which is not the quorum's")
            if getattr(response, "error_code", None) == ErrorCode.cluster_authorization_failed:
                raise unauthorized_by_controller(destination, self._sasl)
            if self._node is not None:
                self._node.handle_response(destination, request, response, _wall_ms())
        self._wake.set()

    async def _connection(self, node_id: int) -> Connection:
        lock = self._connecting.setdefault(node_id, anyio.Lock())
        async with lock:
            conn = self._connections.get(node_id)
            if conn is None or conn.closed:
                address = self._node.endpoint(node_id) if self._node is not None else None
                if address is None:
                    raise KafkaConnectionError(f"no known endpoint for node {node_id}")
                host, port = address
                conn = self._connections[node_id] = await Connection.open(
                    host, port, client_id=f"raft-{self._node_id}",
                    request_timeout_ms=self._raft_config.request_timeout_ms,
                    connect_timeout_ms=self._raft_config.request_timeout_ms, ssl_context=self._ssl,
                    sasl=self._sasl)
            return conn

    async def _drop(self, node_id: int) -> None:
        conn = self._connections.pop(node_id, None)
        if conn is not None:
            await conn.close()


def _encode_all(records: Sequence[MetadataRecord]) -> list[bytes]:
    return [encode(r) for r in records]

