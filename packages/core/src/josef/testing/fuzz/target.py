"""The broker under fuzzing: a live process, what it holds (sockets, memory), whether it still works, its log.

A :class:`Target` is any broker process the fuzzer can reach: one it
started itself (:class:`BrokerProcess`, the single-node default of ``josef
server start``, as a user runs it) or a node of a
:class:`josef.node.cluster.JosefCluster`. Between batches of inputs the
fuzzer asks it:

- :func:`alive`: the process still runs;
- :func:`health_problem`: it answers ApiVersions, and a record produced to
  its own topic is fetched back;
- :func:`sockets`: the connections its listener holds (from
  ``/proc/<pid>/fd`` and ``/proc/<pid>/net/tcp``): once the fuzzer closed
  its connections, none may stay half-closed (CLOSE_WAIT: the client closed,
  the broker did not), and no socket may be left that no table knows (a
  reset connection whose descriptor was never closed);
- :func:`rss`: its resident memory;
- :meth:`Target.new_log_lines`: what it logged since the last call, which
  the fuzzer searches for errors and tracebacks.

:func:`reset_state` undoes what fuzzed admin requests leave behind (quotas,
dynamic broker configs, ACLs, topics, groups, SCRAM users), so a long run
measures leaks rather than the state the fuzzer asked for.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import attrs

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request
from josef.protocol.records import build_batch
from josef.testing.fuzz.requests import FUZZ_TOPICS

#: The topic the health check produces to and fetches from (never among the names the fuzzer draws).
HEALTH_TOPIC = "fuzz-health-check"
#: How long the health check retries a produce its leader refuses as not leading yet.
LEADER_WAIT_S = 10.0
_READY = re.compile(r"ready on PLAINTEXT://([^:,\s]+):(\d+)")
_INTERNAL = frozenset({"__consumer_offsets", "__transaction_state", "__cluster_metadata", HEALTH_TOPIC, *FUZZ_TOPICS})


class Listener(Protocol):
    """Where a broker listens."""

    host: str
    port: int


class Target(Listener, Protocol):
    """A broker process listening there."""

    @property
    def pid(self) -> int: ...

    def new_log_lines(self) -> list[str]:
        """What the broker logged since the last call."""


class BrokerProcess:
    """``python -m josef server start`` with the embedded single-node default, on 127.0.0.1, logging to a file.

    Only the listener (``port`` of 127.0.0.1, by default a free one) and the
    log directory are set; everything else is the default a user gets.
    ``extra`` adds ``--override`` s. Stopped by its PID. Its address space
    is capped at ``memory_limit`` bytes: a broker that an input makes
    allocate without bound then fails on its own (a finding) rather than
    taking the machine's memory from everything else on it.
    """

    def __init__(self, directory: Path, port: int = 0, extra: dict[str, str] | None = None,
                 start_timeout: float = 60, memory_limit: int | None = 8 << 30) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host, self.port = "127.0.0.1", port
        self.log_path = self.directory / "broker.log"
        overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{port}", "http.listeners": "http://127.0.0.1:0",
                     "log.dirs": str(self.directory / "data"),
                     **(extra or {})}
        args = [sys.executable, "-m", "josef", "server", "start"]
        for key, value in overrides.items():
            args += ["--override", f"{key}={value}"]
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.directory,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                                     preexec_fn=None if memory_limit is None else _limit_memory(memory_limit))
        self._running: RunningBroker | None = None
        deadline = time.monotonic() + start_timeout
        while not (ready := _READY.search(self.log_path.read_text(encoding="utf-8", errors="replace"))):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the broker did not start; its log:\n{self.log_path.read_text()[-5000:]}")
            time.sleep(0.1)  # a process's log file gives no event to wait on
        self.port = int(ready.group(2))  # the bound one, when ``port`` was 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def new_log_lines(self) -> list[str]:
        return self.running().new_log_lines() if self._running is None else self._running.new_log_lines()

    def running(self) -> RunningBroker:
        """This broker as a :class:`RunningBroker`, which another process (a second fuzzer) can be given."""
        if self._running is None:
            self._running = RunningBroker(self.host, self.port, self.pid, self.log_path)
        return self._running

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@attrs.define
class RunningBroker:
    """A broker process by its address, PID and log file: a :class:`Target` that can be pickled to another process."""

    host: str
    port: int
    pid: int
    log_path: Path
    _read_at: int = 0

    def new_log_lines(self) -> list[str]:
        with open(self.log_path, "rb") as log:
            log.seek(self._read_at)
            data = log.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._read_at += end
        return data[:end].decode("utf-8", errors="replace").splitlines()

    def from_now(self) -> RunningBroker:
        """The same broker, its log read from what it writes next."""
        return RunningBroker(self.host, self.port, self.pid, self.log_path, self.log_path.stat().st_size)


def cap_memory(pid: int, limit: int = 8 << 30) -> None:
    """Cap the address space of a running broker process (a cluster's node) at ``limit`` bytes, as
    :class:`BrokerProcess` caps its own: a runaway allocation fails that broker, not the machine."""
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def _limit_memory(limit: int) -> Callable[[], None]:
    def limit_memory() -> None:  # in the child, before it runs python
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit_memory


class ClusterNode:
    """A node of a :class:`josef.node.cluster.JosefCluster` as a :class:`Target`, at one of its listeners."""

    def __init__(self, node: Any, listener: str = "PLAINTEXT") -> None:
        self.node = node
        self.host, self.port = node.listener(listener)
        if self.port == 0:
            self.port = node.bound_port
        self._read = len(node.lines)

    @property
    def pid(self) -> int:
        return self.node.pid

    def new_log_lines(self) -> list[str]:
        lines = self.node.lines[self._read:]
        self._read += len(lines)
        return list(lines)


def alive(target: Target) -> bool:
    try:
        with open(f"/proc/{target.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def rss(target: Target) -> int:
    """Resident memory of the process, in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{target.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


_STATES = {"01": "ESTABLISHED", "08": "CLOSE_WAIT", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "0B": "CLOSING",
           "09": "LAST_ACK", "06": "TIME_WAIT", "07": "CLOSE", "0A": "LISTEN"}


@attrs.frozen
class Sockets:
    """What a process holds: its connections on the listener's port, and sockets no table knows any more."""

    #: ``state remote-port`` of each connection on the listener's port (the listening socket excepted).
    listener: list[str]
    #: Socket descriptors in no TCP, UDP or Unix table: a connection reset under the broker, whose descriptor
    #: it never closed.
    orphans: int

    def closed_by_peer(self) -> list[str]:
        """Connections whose client closed its end and the broker did not: a leak, once things settle."""
        return [c for c in self.listener if c.startswith("CLOSE_WAIT")]


def sockets(target: Target) -> Sockets:
    """The sockets of the process, from ``/proc/<pid>/fd`` and its network tables."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{target.pid}/fd"):
            try:
                link = os.readlink(f"/proc/{target.pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except FileNotFoundError:
        return Sockets([], 0)
    listener = []
    known = set()
    for table in ("tcp", "tcp6", "udp", "udp6", "unix"):
        try:
            with open(f"/proc/{target.pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if table == "unix":
                        known.add(parts[6])
                        continue
                    local, remote, state, inode = parts[1], parts[2], parts[3], parts[9]
                    known.add(inode)
                    if inode in inodes and int(local.rsplit(":", 1)[1], 16) == target.port and state != "0A":
                        listener.append(f"{_STATES.get(state, state)} {int(remote.rsplit(':', 1)[1], 16)}")
        except FileNotFoundError:
            continue
    return Sockets(listener, len(inodes - known))


# --------------------------------------------------------------------------- a small blocking client


class Client:
    """Requests as dicts over one socket, answers as kio objects: the fuzzer's own, well-behaved traffic."""

    def __init__(self, target: Listener, timeout: float = 30) -> None:
        self.sock = socket.create_connection((target.host, target.port), timeout=timeout)
        self.correlation = 0

    def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation += 1
        self.sock.sendall(encode_request(key, version, self.correlation, b"fuzz-control", body))
        size = struct.unpack(">i", _exactly(self.sock, 4))[0]
        correlation, response = decode_response(key, version, _exactly(self.sock, size))
        if correlation != self.correlation:
            raise AssertionError(f"answer {correlation} to request {self.correlation}")
        return response

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exactly(sock: socket.socket, n: int) -> bytes:
    parts = []
    left = n
    while left:
        chunk = sock.recv(min(left, 1 << 20))  # (MSG_WAITALL returns short on a socket with a timeout)
        if not chunk:
            raise ConnectionError(f"connection closed after {n - left} of {n} bytes")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def api_versions(target: Target) -> dict[int, tuple[int, int]]:
    """What the broker answers: api key -> (lowest, highest version), from ApiVersions."""
    with Client(target) as client:
        response = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "josef-fuzz",
                                                        "client_software_version": "1"})
    if response.error_code != ErrorCode.none:
        raise AssertionError(f"ApiVersions answered {response.error_code.name}")
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


def create_topics(target: Target, names: Iterable[str], partitions: int = 2, replicas: int = 1) -> None:
    """Create ``names`` (existing ones are left), and wait until each partition's leader knows it leads it.

    ``target`` learning of a leader is not enough in a cluster: the leader, another node, may not have read the
    topic's records yet and would refuse a Produce with UNKNOWN_TOPIC_OR_PARTITION.
    """
    names = list(names)
    with Client(target) as client:
        topics = [{"name": n, "num_partitions": partitions, "replication_factor": replicas, "assignments": [],
                   "configs": [{"name": "min.insync.replicas", "value": "1"}]} for n in names]
        response = client.call(ApiKey.CREATE_TOPICS, 7, {"topics": topics, "timeout": 30_000, "validate_only": False})
        for topic in response.topics:
            if topic.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
                raise AssertionError(f"cannot create {topic.name}: {topic.error_code.name}")
    deadline = time.monotonic() + 60
    while (waiting := _not_led(target, names)) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"topics {names} are not led: {waiting}")
        time.sleep(0.05)  # no event says a leader was elected in another process


def _metadata(target: Listener, names: list[str]) -> Any:
    with Client(target) as client:
        return client.call(ApiKey.METADATA, 12, {"topics": [{"name": n, "topic_id": None} for n in names],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})


def _not_led(target: Listener, names: list[str]) -> str | None:
    """None when ``target`` names a leader for every partition of ``names`` and each leader names itself; else
    the first partition still waiting."""
    metadata = _metadata(target, names)
    leaders: dict[int, list[tuple[str, int]]] = {}
    for topic in metadata.topics:
        if topic.error_code != ErrorCode.none or not topic.partitions:
            return f"{topic.name}: {topic.error_code.name}, {len(topic.partitions)} partitions"
        for partition in topic.partitions:
            if partition.leader_id < 0:
                return f"{topic.name}-{partition.partition_index}: no leader"
            leaders.setdefault(partition.leader_id, []).append((topic.name, partition.partition_index))
    addresses = {b.node_id: _Address(b.host, b.port) for b in metadata.brokers}
    for node_id, led in leaders.items():
        if node_id not in addresses:
            return f"leader {node_id} is not among the brokers"
        seen = {(t.name, p.partition_index): p.leader_id for t in _metadata(addresses[node_id], names).topics
                for p in t.partitions}
        for name, index in led:
            if seen.get((name, index)) != node_id:
                return f"{name}-{index}: node {node_id} does not know yet that it leads it"
    return None


def health_problem(target: Target) -> str | None:
    """None when the broker answers ApiVersions and fetches back a record it acknowledged; else what failed."""
    try:
        api_versions(target)
    except Exception as exc:
        return f"ApiVersions failed: {exc!r}"
    value = uuid.uuid4().bytes
    try:
        # A leader named by the metadata may still be opening the partition (NOT_LEADER_OR_FOLLOWER meanwhile):
        # retried for a while, as clients retry it; a broker that stays so is unhealthy.
        deadline = time.monotonic() + LEADER_WAIT_S
        while True:
            leader = _leader(target, HEALTH_TOPIC)
            if leader is None:
                return f"{HEALTH_TOPIC} has no leader"
            with Client(leader, timeout=30) as client:
                produced = client.call(ApiKey.PRODUCE, 9, {"acks": -1, "timeout": 30_000, "transactional_id": None,
                                                           "topic_data": [{"name": HEALTH_TOPIC, "partition_data": [
                                                               {"index": 0, "records": build_batch(
                                                                   [(None, value, int(time.time() * 1000))])}]}]})
            answer = produced.responses[0].partition_responses[0]
            if answer.error_code != ErrorCode.not_leader_or_follower or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if answer.error_code != ErrorCode.none:
            return f"Produce answered {answer.error_code.name}"
        with Client(leader, timeout=30) as client:
            fetched = client.call(ApiKey.FETCH, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": HEALTH_TOPIC, "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": answer.base_offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
            partition = fetched.responses[0].partitions[0]
            if partition.error_code != ErrorCode.none:
                return f"Fetch answered {partition.error_code.name}"
            if value not in bytes(partition.records or b""):
                return f"Fetch at offset {answer.base_offset} did not return the record produced there"
    except Exception as exc:
        return f"produce/fetch round trip failed: {exc!r}"
    return None


@attrs.frozen
class _Address:
    host: str
    port: int


def _leader(target: Listener, topic: str) -> Listener | None:
    """Where partition 0 of ``topic`` is led, as ``target``'s Metadata says (another node of a cluster)."""
    metadata = _metadata(target, [topic])
    partition = next((p for t in metadata.topics for p in t.partitions if p.partition_index == 0), None)
    broker = next((b for b in metadata.brokers if partition is not None and b.node_id == partition.leader_id), None)
    return None if broker is None else _Address(broker.host, broker.port)


def reset_quotas(target: Listener) -> None:
    """Remove every client quota: fuzzed ones can mute a client's connection for days (a throttle of a large
    request under a quota of a byte a second), which holds back the fuzzer, not the broker."""
    with Client(target) as client:
        quotas = client.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, {"components": [], "strict": False})
        if quotas.entries:
            client.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [
                {"entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity],
                 "ops": [{"key": v.key, "value": 0.0, "remove": True} for v in entry.values]}
                for entry in quotas.entries]})


def reset_state(target: Target, node_id: int = 1) -> None:
    """Undo what fuzzed admin requests left: quotas, dynamic broker configs, ACLs, topics, groups, SCRAM users."""
    reset_quotas(target)
    with Client(target) as client:
        for name in ("", str(node_id)):
            described = client.call(ApiKey.DESCRIBE_CONFIGS, 4, {
                "resources": [{"resource_type": 4, "resource_name": name, "configuration_keys": None}],
                "include_synonyms": False, "include_documentation": False})
            dynamic = [c.name for r in described.results for c in r.configs if c.config_source in (1, 5)]
            if dynamic:
                client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
                    {"resource_type": 4, "resource_name": name,
                     "configs": [{"name": c, "config_operation": 1, "value": None} for c in dynamic]}]})
        client.call(ApiKey.DELETE_ACLS, 3, {"filters": [{
            "resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
            "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]})
        metadata = client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False})
        extra = [t.name for t in metadata.topics if t.name not in _INTERNAL]
        if extra:
            client.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": n, "topic_id": None} for n in extra],
                                                  "timeout": 30_000})
        groups = client.call(ApiKey.LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
        if groups.groups:
            client.call(ApiKey.DELETE_GROUPS, 2, {"groups_names": [g.group_id for g in groups.groups]})
        users = client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})
        deletions = [{"name": r.user, "mechanism": info.mechanism} for r in users.results for info in r.credential_infos]
        if deletions:
            client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": deletions, "upsertions": []})
    create_topics(target, [HEALTH_TOPIC], partitions=1)
    create_topics(target, FUZZ_TOPICS)
