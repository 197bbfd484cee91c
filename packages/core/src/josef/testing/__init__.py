"""The pytest plugin: a real josef broker for your tests, with no Docker and no JVM.

Installed with josef (entry point ``pytest11``). Use the ``josef_broker``
fixture; it starts a broker in a background thread of the test process on a
free port of 127.0.0.1 with storage in the test's temporary directory, and
stops it after the test::

    def test_orders(josef_broker):
        producer = confluent_kafka.Producer({"bootstrap.servers": josef_broker.bootstrap_servers})

Mark a test with ``@pytest.mark.josef_config(key="value", ...)`` (dots as in
Kafka: ``**{"num.partitions": "3"}``) to change the broker's configuration.

Clusters of real processes
--------------------------

The ``josef_cluster`` fixture starts :class:`josef.node.cluster.JosefCluster` s:
N josef nodes as separate ``python -m josef server start`` processes on free
ports of 127.0.0.1, combined or in dedicated roles, formatted with one cluster
id. Everything it started is stopped by PID after the test, and a failing
test's report carries the tail of every node's log::

    def test_failover(josef_cluster):
        cluster = josef_cluster(controllers=3, brokers=3, **{"num.partitions": "6"})
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers})
        ...
        cluster.node(4).kill()          # kill -9 broker 4 by its PID
        cluster.node(4).restart()       # same ports, same log directory

With ``faults=True`` every node runs in its own network namespace and
``cluster.faults`` (:class:`josef.testing.faults.Faults`) partitions, slows
and drops links between nodes while clients keep reaching them, and kills,
freezes, restarts nodes or fills their disks (``disk_mb=64``); it needs root
and skips the test, saying why, elsewhere::

    def test_isolated_leader(josef_cluster):
        cluster = josef_cluster(combined=3, faults=True)
        cluster.faults.partition([leader])    # from every other node, both ways
        ...
        cluster.faults.heal()

:class:`~josef.node.cluster.JosefCluster`, :class:`~josef.node.cluster.NodeProcess` and
:func:`~josef.node.cluster.free_ports` are importable from here too.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Iterator

import pytest
from kio.schema.errors import ErrorCode

from josef.node.cluster import JosefCluster, NodeProcess, free_ports
from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import decode_response, encode_request
from josef.node.runner import BrokerThread

__all__ = ["JosefCluster", "NodeProcess", "RawClient", "broker_overrides", "eventually", "free_ports", "josef_broker",
           "josef_cluster"]


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "the condition") -> Any:
    """Poll ``check`` every 50 ms until it returns a true value, which is returned.

    For state of other processes (Metadata, DescribeQuorum answers) that
    gives no event to wait on; raises AssertionError naming ``what`` after
    ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


class ManualClock:
    """Coordinators' time under a test's control: ``monkeypatch.setattr(josef.coordinator.clock, "now_ms", clock)``.

    Tests move ``now`` forward (session expiry, offset retention,
    transaction timeouts) instead of sleeping.
    """

    def __init__(self, now: int = 1_800_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "josef_config(**overrides): server.properties overrides for josef_broker")


def broker_overrides(data_dir: Path, **extra: str) -> dict[str, str]:
    """A single-node broker on a free port of 127.0.0.1, storing under ``data_dir``."""
    return {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(data_dir), **extra}


@pytest.fixture
def josef_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    extra: dict[str, str] = {}
    for marker in reversed(list(request.node.iter_markers("josef_config"))):
        extra.update({k: str(v) for k, v in marker.kwargs.items()})
    broker = BrokerThread(broker_overrides(tmp_path_factory.mktemp("josef"), **extra))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


class RawClient:
    """Any Kafka API at any version over a real socket, for tests of what a broker answers.

    Requests are dicts turned into kio types by the builder the broker's
    handlers use (fields a version lacks are dropped), so one body serves every
    version. ``send``/``receive`` split a call for requests that park.
    """

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30, client_id: str = "raw") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.client_id = client_id.encode()
        self.correlation = 0
        self._pending: list[tuple[int, int, int]] = []

    def send(self, key: int, version: int, body: dict[str, Any]) -> None:
        self.correlation += 1
        self.sock.sendall(encode_request(key, version, self.correlation, self.client_id, body))
        if not (key == 0 and body.get("acks") == 0):  # acks=0 produce gets no response
            self._pending.append((key, version, self.correlation))

    def receive(self) -> Any:
        key, version, correlation = self._pending.pop(0)
        size = struct.unpack(">i", self._read(4))[0]
        frame = self._read(size)
        answered, response = decode_response(key, version, frame)
        assert answered == correlation, "responses came out of order"
        return response

    def _read(self, size: int) -> bytes:
        """Exactly ``size`` bytes: a socket with a timeout may return less even with MSG_WAITALL (a large Fetch)."""
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(left)
            if not chunk:
                raise ConnectionError(f"the broker closed the connection {size - left} bytes into a {size}-byte read")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        """Send and wait for the answer; None for an acks=0 produce."""
        self.send(key, version, body)
        if key == 0 and body.get("acks") == 0:
            return None
        return self.receive()

    def list_offset(self, topic: str, timestamp: int, partition: int = 0) -> int:
        """The offset ListOffsets answers for one partition: ``timestamp`` -1 latest, -2 earliest, -4 earliest local
        (tiered storage: where the broker's disk starts), -5 latest tiered, -6 earliest pending upload, or a time
        in ms. Ask the partition's leader.

        A leader opens a partition it was just given in a worker thread and
        answers NOT_LEADER_OR_FOLLOWER until then; that is retried for up to
        30 s, as real clients retry it."""
        deadline = time.monotonic() + 30
        while True:
            answer = self.call(ApiKey.LIST_OFFSETS, 11, {"replica_id": -1, "isolation_level": 0, "timeout": 30_000,
                                                         "topics": [{"name": topic, "partitions": [
                                                             {"partition_index": partition, "current_leader_epoch": -1,
                                                              "timestamp": timestamp}]}]})
            result = answer.topics[0].partitions[0]
            if result.error_code != ErrorCode.not_leader_or_follower or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert result.error_code == 0, f"ListOffsets {topic}-{partition} at {timestamp}: {result.error_code!r}"
        return result.offset

    def closed_by_broker(self, timeout: float = 10) -> bool:
        """Whether the broker closes the connection (end of stream or a reset) within ``timeout``, rather than
        answering: how a refused client (failed authentication, an oversized frame) is told."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


_CLUSTERS = pytest.StashKey[list[JosefCluster]]()


@pytest.fixture
def josef_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., JosefCluster]]:
    """A factory of started :class:`JosefCluster` s: ``josef_cluster(combined=3)``, ``josef_cluster(controllers=3, brokers=3, **overrides)``.

    Keyword arguments with dots are properties for every node
    (``**{"num.partitions": "3"}``); ``node_overrides={id: {...}}`` and the
    other :class:`JosefCluster` options are passed through. ``faults=True``
    puts the nodes on a fault-harness network (``latency=True`` adds delay
    proxies, ``disk_mb`` a tmpfs log directory per node), or skips the test
    where that cannot run. Every process is stopped by PID after the test, and
    every namespace and mount removed; when the test fails, its report has a
    section with the tail of every node's log.
    """
    clusters = request.node.stash.setdefault(_CLUSTERS, [])

    def make(combined: int = 0, controllers: int = 0, brokers: int = 0, *, start: bool = True,
             node_overrides: Mapping[int, Mapping[str, str | None]] | None = None,
             cluster_options: Mapping[str, Any] | None = None, faults: bool = False, latency: bool = False,
             disk_mb: int | None = None, **overrides: str | None) -> JosefCluster:
        options = dict(cluster_options or {})
        if faults:
            from josef.testing.faults import Network, unavailable

            reason = unavailable()
            if reason is not None:
                pytest.skip(f"the fault harness cannot run here: {reason}")
            options.update(network=Network(latency=latency), disk_mb=disk_mb)
        cluster = JosefCluster(tmp_path_factory.mktemp("josef-cluster"), combined=combined, controllers=controllers,
                               brokers=brokers, overrides=overrides, node_overrides=node_overrides, **options)
        clusters.append(cluster)
        return cluster.start() if start else cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            if cluster.faults is not None:
                cluster.faults.heal_all()  # so that every node can shut down cleanly
            cluster.stop()
            if cluster.faults is not None:
                cluster.faults.close()
            elif cluster.network is not None:
                cluster.network.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    clusters: Iterable[JosefCluster] = item.stash.get(_CLUSTERS, [])
    if report.failed and call.when in ("setup", "call"):
        for number, cluster in enumerate(clusters, 1):
            report.sections.append((f"josef cluster {number} logs ({cluster.cluster_id})", cluster.logs()))
    return report
