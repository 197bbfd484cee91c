"""Brokers for end-to-end tests: real ``josef server start`` processes on free ports of 127.0.0.1.

Each test starts its own broker and the fixture stops it by its PID. The
backend under test comes from ``JOSEF_TEST_METADATA``/``JOSEF_TEST_STORAGE``,
which the nox matrix sets.

A test that takes ``brokers`` (or ``brokers_factory``) runs twice: against one
broker, and against a cluster of three combined nodes whose topics, the
internal ones too, have three replicas and need two in sync, so the same
assertions check that replication keeps them true.

The nox matrix runs every test in the kraft/local cell, and in each other
cell only what that cell's backends change: a test marked ``metadata`` (its
subject is what the metadata backend serves) in the zookeeper cells, one
marked ``storage`` (what the log storage serves: producing, fetching,
offsets, compaction, transactions' markers, durability) in the tiered cells,
one marked both in the zookeeper/tiered cell. The rest would run there
exactly as in kraft/local.

With ``JOSEF_TEST_STORAGE=tiered`` the brokers have tiered storage on a
directory shared by the whole session, and every topic that may be tiered is
(``log.remote.storage.enable``), with small segments and little kept locally,
so what the tests produce is copied to remote storage and read back from
there. Of the ``storage`` tests, only those whose brokers come from these
fixtures run in that cell. Tests marked ``default_broker_config`` assert
Kafka's default configuration values and sources (``kafka-configs.sh``
output, DescribeConfigs sources), which that cell's brokers override on
purpose; it leaves them out too, and the 3-broker runs of ``brokers`` tests:
replication over tiered storage has cluster tests of its own
(test_tiered_storage.py), and CI's time is better spent on the rest.

With ``JOSEF_TEST_METADATA=zookeeper`` the session starts one Apache
ZooKeeper server (josef_metadata_zk.testing) and every broker and cluster the
tests start, through these fixtures or ``josef_cluster``, keeps its metadata
there (a chroot of its own) instead of in KRaft. A test that chooses its
quorum itself (``metadata.quorum``, ``controller.quorum.voters``,
``zookeeper.connect``) keeps its choice; one marked ``own_quorum`` (whose
every cluster chooses its quorum) would repeat kraft/local's run exactly
there, and is left out.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest
from kazoo.client import KazooClient

from josef.node.cluster import JosefCluster
from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient
from josef_metadata_zk.testing import ZooKeeperEnsemble, fresh_chroot

READY = re.compile(r"ready on PLAINTEXT://([^:,\s]+):(\d+)")
START_TIMEOUT_S = 30
#: Every node of the 3-broker runs: new and internal topics replicated three ways, acks=all needing two replicas.
REPLICATED = {"offsets.topic.replication.factor": "3", "default.replication.factor": "3", "min.insync.replicas": "2"}


#: The storage='tiered' cell's brokers: every topic tiered, 16 KiB segments of which about one stays local beyond what is
#: not copied yet, copies every 200 ms and local deletion every 500 ms. The remote directory is added per session (:func:`remote_root`).
TIERED = {
    "remote.log.storage.system.enable": "true",
    "remote.log.storage.manager.class.name": "local-dir",
    "log.remote.storage.enable": "true",
    "log.segment.bytes": "16384",
    "log.local.retention.bytes": "16384",
    "remote.log.manager.task.interval.ms": "200",
    "log.retention.check.interval.ms": "500",
    "log.retention.ms": "-1",  # tests stamp records in the past; only local copies go, by local.retention.bytes
    "log.segment.delete.delay.ms": "0",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
    "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
}


def tiered() -> bool:
    return os.environ.get("JOSEF_TEST_STORAGE", "local") == "tiered"


def on_zookeeper() -> bool:
    return os.environ.get("JOSEF_TEST_METADATA", "kraft") == "zookeeper"


REMOTE_ROOT = "JOSEF_TEST_REMOTE_ROOT"
#: ``host:port`` of the zookeeper cell's ZooKeeper server, started by the controlling process for every xdist worker.
ZOOKEEPER = "JOSEF_TEST_ZOOKEEPER"
#: The zookeeper cell's sessions: 6 s, so that a killed or paused controller is replaced within seconds (Kafka's
#: default, 18 s, would make every failover test wait that long); the server allows up to 20 s.
ZOOKEEPER_SESSION_MS = "6000"
_CHROOTS: dict[Path, str] = {}
_ENSEMBLE = pytest.StashKey[ZooKeeperEnsemble]()


def own_topics(names: Any) -> list[str]:
    """``names`` (topic names, or ``kafka-topics.sh --list`` output) without the topics the storage under test
    creates for itself: in the tiered cell ``__remote_log_metadata``, which Kafka lists too (it is not internal)."""
    if isinstance(names, str):
        names = names.splitlines()
    return [name for name in names if not (tiered() and name == "__remote_log_metadata")]


def remote_root() -> Path:
    """The remote storage directory of every broker of this session, xdist workers included (they inherit it from
    the controlling process): segment objects are named by topic id, so brokers of different tests never meet there."""
    return Path(os.environ[REMOTE_ROOT])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "default_broker_config: asserts the default broker configuration, so the "
                            "tiered cell (whose brokers override segment and retention defaults) leaves it out")
    config.addinivalue_line("markers", "own_quorum: chooses its metadata quorum itself, so a zookeeper cell would "
                            "run it exactly as kraft/local does; it runs in the kraft cells only")
    config.addinivalue_line("markers", "metadata: exercises what the metadata backend serves, so it runs in the "
                            "zookeeper cells of the backend matrix too")
    config.addinivalue_line("markers", "storage: exercises what the log storage serves, so it runs in the tiered "
                            "cells of the backend matrix too")
    if hasattr(config, "workerinput"):
        return
    if tiered():
        os.environ[REMOTE_ROOT] = tempfile.mkdtemp(prefix="josef-remote-")
    if on_zookeeper():
        directory = Path(tempfile.mkdtemp(prefix="josef-zookeeper-"))
        config.stash[_ENSEMBLE] = ensemble = ZooKeeperEnsemble(directory, max_session_ms=20_000)
        ensemble.start()
        os.environ[ZOOKEEPER] = ensemble.connect


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """In the tiered cells, how much the brokers copied to remote storage (the segments left there at the end); in the
    zookeeper cells, how many clusters kept their metadata in ZooKeeper (chroots with an elected controller's epoch)."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    if tiered():
        segments = list(remote_root().rglob("*.log"))
        terminalreporter.write_line(f"tiered storage: {len(segments)} segment(s), "
                                    f"{sum(p.stat().st_size for p in segments)} bytes, in {remote_root()} at the end")
    if on_zookeeper():
        zk = KazooClient(hosts=os.environ[ZOOKEEPER])
        zk.start(timeout=30)
        try:
            chroots = [c for c in zk.get_children("/") if zk.exists(f"/{c}/controller_epoch")]
        finally:
            zk.stop()
            zk.close()
        terminalreporter.write_line(f"zookeeper: {len(chroots)} cluster(s) kept their metadata in ZooKeeper "
                                    f"({os.environ[ZOOKEEPER]})")


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    if tiered():
        shutil.rmtree(remote_root(), ignore_errors=True)
    ensemble = config.stash.get(_ENSEMBLE, None)
    if ensemble is not None:
        ensemble.stop()
        shutil.rmtree(ensemble.servers[0].directory.parent, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Outside kraft/local, only the tests marked for every backend of the cell that is not the default; in the
    tiered cells, of those, the ones whose brokers come from these fixtures (see the module's docstring)."""
    if not tiered() and not on_zookeeper():
        return
    backend = {"broker_factory", "brokers_factory"}
    kept, other = [], []
    for item in items:
        runs = not on_zookeeper() or (item.get_closest_marker("metadata") is not None
                                      and item.get_closest_marker("own_quorum") is None)
        if tiered():
            runs = runs and item.get_closest_marker("storage") is not None \
                and backend & set(getattr(item, "fixturenames", ())) \
                and not item.get_closest_marker("default_broker_config")
            callspec = getattr(item, "callspec", None)
            if callspec is not None and callspec.params.get("brokers_factory") == "3-brokers":
                runs = False
        (kept if runs else other).append(item)
    config.hook.pytest_deselected(items=other)
    items[:] = kept


def metadata_overrides(data_dir: Path | None = None) -> dict[str, str | None]:
    """The zookeeper cell's settings of a node or cluster: a chroot of its own on the session's server (the same one
    for every process started on ``data_dir``), no KRaft voters; none in the kraft cells, which run on the default."""
    if not on_zookeeper():
        return {}
    chroot = _CHROOTS.get(data_dir) or fresh_chroot(os.environ[ZOOKEEPER])
    if data_dir is not None:
        _CHROOTS[data_dir] = chroot
    return {"metadata.quorum": "zookeeper", "zookeeper.connect": chroot, "controller.quorum.voters": None,
            "zookeeper.session.timeout.ms": ZOOKEEPER_SESSION_MS}


def storage_overrides() -> dict[str, str]:
    """The log storage under test: local, or tiered on the session's remote directory."""
    overrides = {"log.storage": "local"}
    if tiered():
        overrides.update(TIERED, **{"rsm.config.storage.root": str(remote_root())})
    return overrides


def backend_overrides() -> dict[str, str | None]:
    """The metadata quorum and log storage under test, as the nox matrix names them (None: a key left unset)."""
    return {**storage_overrides(), **metadata_overrides()}


def chooses_quorum(overrides: Mapping[str, Any]) -> bool:
    return bool({"metadata.quorum", "controller.quorum.voters", "zookeeper.connect"} & overrides.keys())


class BrokerProcess:
    """``josef server start`` in a child process; stdout+stderr kept in ``log`` for failure reports."""

    def __init__(self, data_dir: Path, **overrides: str | None) -> None:
        self.data_dir = data_dir
        backend = {**storage_overrides(), **({} if chooses_quorum(overrides) else metadata_overrides(data_dir))}
        settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "http.listeners": "http://127.0.0.1:0",
                    "log.dirs": str(data_dir), **backend, **overrides}
        self.overrides = {key: value for key, value in settings.items() if value is not None}
        self.proc: subprocess.Popen[str] | None = None
        self.port = -1
        self.log: list[str] = []
        self._logged = threading.Condition()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        args = [sys.executable, "-m", "josef", "server", "start"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc, ready), daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or self.port < 0:
            self.kill()
            raise RuntimeError("broker did not become ready:\n" + "".join(self.log[-50:]))
        return self

    def _pump(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._logged:
                self.log.append(line)
                self._logged.notify_all()
            match = READY.search(line)
            if match and not ready.is_set():
                self.port = int(match.group(2))
                ready.set()
        ready.set()  # the process ended: let start() fail with the log

    def leader_port(self, topic: str, partition: int = 0) -> int:
        """The port of the partition's leader: this broker leads every partition."""
        return self.port

    def listener_bootstrap(self, name: str) -> str:
        """``127.0.0.1:PORT`` of the listener ``name`` as the broker's ready line last gave it (after a restart too)."""
        ports = [m for line in self.log for m in re.findall(rf"\b{name}://127\.0\.0\.1:(\d+)", line)]
        assert ports, f"no {name} listener in the broker's log"
        return f"127.0.0.1:{ports[-1]}"

    def wait_for_log(self, text: str, timeout: float = 10) -> bool:
        """Whether a line containing ``text`` is logged within ``timeout`` seconds (lines are read by a thread)."""
        with self._logged:
            return self._logged.wait_for(lambda: any(text in line for line in self.log), timeout)

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code

    def kill(self) -> None:
        """``kill -9``: no shutdown at all."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    def restart(self) -> BrokerProcess:
        if self.proc is not None:
            self.stop()
        return self.start()


@pytest.fixture
def josef_cluster(josef_cluster) -> Callable[..., JosefCluster]:
    """The core's ``josef_cluster`` (josef.testing), whose clusters keep their metadata on the cell's backend unless
    the test chooses a quorum itself."""

    def make(*args: Any, node_overrides: Mapping[int, Mapping[str, str | None]] | None = None,
             **overrides: Any) -> JosefCluster:
        chosen = chooses_quorum(overrides) or any(chooses_quorum(o) for o in (node_overrides or {}).values())
        return josef_cluster(*args, node_overrides=node_overrides,
                             **{**({} if chosen else metadata_overrides()), **overrides})

    return make


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    started: list[BrokerProcess] = []

    def make(data_dir: Path | None = None, **overrides: str) -> BrokerProcess:
        broker = BrokerProcess(data_dir or tmp_path_factory.mktemp("broker"), **overrides)
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        broker.kill()
        # Shown by pytest only when the test fails.
        print(f"--- broker log ({broker.data_dir}) ---\n" + "".join(broker.log[-200:]))


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()


class ClusterBrokers:
    """A started 3-node :class:`JosefCluster` with the part of :class:`BrokerProcess` that tests of clients use."""

    def __init__(self, cluster: JosefCluster) -> None:
        self.cluster = cluster

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    def leader_port(self, topic: str, partition: int = 0, timeout: float = 30) -> int:
        """The port of the partition's leader, as the first broker's metadata names it once it has one.

        Raw requests (Produce, Fetch of stored batches) must go to the leader; right after
        CreateTopics a broker may not know the leader yet, so this waits for one. The partition
        must have three replicas: these runs are meant to check replicated partitions.
        """
        port = self.cluster.brokers[0].listener("PLAINTEXT")[1]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        client = RawClient(port)
        try:
            while True:
                answer = client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                           "allow_auto_topic_creation": False,
                                                           "include_topic_authorized_operations": False})
                found = [p for t in answer.topics for p in t.partitions if p.partition_index == partition]
                ports = {b.node_id: b.port for b in answer.brokers}
                if found and found[0].leader_id in ports:
                    assert len(found[0].replica_nodes) == 3, f"{topic}-{partition} is not replicated: {found[0]}"
                    return ports[found[0].leader_id]
                assert time.monotonic() < deadline, f"{topic}-{partition} has no leader after {timeout}s: {answer}"
                time.sleep(0.05)
        finally:
            client.close()


@pytest.fixture(params=["1-broker", "3-brokers"])
def brokers_factory(request: pytest.FixtureRequest, broker_factory, josef_cluster) -> Callable[..., Any]:
    """``make(**overrides)``: one broker process, or (second run) three combined nodes with :data:`REPLICATED`."""

    def make(**overrides: str) -> BrokerProcess | ClusterBrokers:
        if request.param == "1-broker":
            return broker_factory(**overrides)
        return ClusterBrokers(josef_cluster(combined=3, **{**storage_overrides(), **REPLICATED, **overrides}))

    return make


@pytest.fixture
def brokers(brokers_factory) -> BrokerProcess | ClusterBrokers:
    return brokers_factory()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs to fill up (ENOSPC) or remount read-only; mounting needs root, which CI has."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)
