"""A real Apache ZooKeeper for tests: Debian's ``zookeeper`` package on free ports of 127.0.0.1, and pytest fixtures.

Installed as a pytest plugin with the package (entry point ``pytest11``), so
any test suite that has ``josef-metadata-zk`` gets two fixtures:

- ``zookeeper``: one :class:`ZooKeeperEnsemble` of a single server per test
  session (a JVM takes seconds to start), running until the session ends;
- ``zk_connect``: a ``zookeeper.connect`` string with a fresh chroot of it
  for one test, so tests never see each other's znodes.

A test may stop a server by PID (:meth:`ZooKeeperServer.stop`, SIGTERM then
SIGKILL; :meth:`ZooKeeperServer.kill`), pause it (SIGSTOP/SIGCONT) and start
it again on the same port and data directory: what it acknowledged survives.
:class:`ZooKeeperEnsemble` ``(servers=3)`` runs a replicated ensemble.

The server is ``org.apache.zookeeper.server.quorum.QuorumPeerMain`` from
``/usr/share/java/zookeeper.jar`` (``apt-get install zookeeper``; override
with ``$JOSEF_ZOOKEEPER_CLASSPATH``), run by ``java`` from PATH, each with a
generated ``zoo.cfg`` bound to 127.0.0.1, the admin server off, and the
four-letter words ``srvr``, ``ruok`` and ``mntr`` allowed: a server counts as
started once ``srvr`` answers with its mode.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cryptography.hazmat.primitives import serialization
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from josef.testing import free_ports
from josef_metadata_zk.znodes import split_connect

if TYPE_CHECKING:  # josef.testing.tls needs trustme, which only TLS tests install
    from josef.testing.tls import TlsFiles

__all__ = ["ZooKeeperEnsemble", "ZooKeeperServer", "ZooKeeperUnavailable", "classpath", "four_letter_word",
           "fresh_chroot", "read_znode", "zk_connect", "zookeeper"]

CLASSPATH_ENV = "JOSEF_ZOOKEEPER_CLASSPATH"
DEBIAN_JAR = Path("/usr/share/java/zookeeper.jar")
DEBIAN_EXTRAS = tuple(Path("/usr/share/java") / jar for jar in ("netty-codec.jar", "slf4j-log4j12.jar", "log4j-1.2.jar"))
#: How long a server may take to answer ``srvr`` with a mode (an ensemble must also elect its leader).
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
#: ZooKeeper's tick: sessions may last from 2 to 20 ticks, so 200 ms allows sessions of 0.4-4 s in fault tests.
TICK_MS = 200
LOG4J = "log4j.rootLogger=WARN, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n" \
        "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n" \
        "log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1}: %m%n\n"


class ZooKeeperUnavailable(RuntimeError):
    """No ZooKeeper server here: no ``java`` on PATH, or no ZooKeeper jar (``apt-get install zookeeper``)."""


def classpath() -> str:
    """The server's class path: ``$JOSEF_ZOOKEEPER_CLASSPATH``, else Debian's jar (which names its dependencies) with
    what its manifest leaves out: Netty's codec (TLS) and log4j's binding for slf4j (the server's log)."""
    if os.environ.get(CLASSPATH_ENV):
        return os.environ[CLASSPATH_ENV]
    if not shutil.which("java"):
        raise ZooKeeperUnavailable("no java on PATH (Debian: apt-get install openjdk-17-jre-headless zookeeper)")
    if not DEBIAN_JAR.exists():
        raise ZooKeeperUnavailable(f"no {DEBIAN_JAR} (Debian: apt-get install zookeeper; or set {CLASSPATH_ENV})")
    return ":".join(str(jar) for jar in (DEBIAN_JAR, *DEBIAN_EXTRAS) if jar.exists())


def four_letter_word(port: int, word: str = "srvr", timeout: float = 2.0) -> str:
    """A four-letter-word command's answer from the server on ``port``; '' when it does not answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def fresh_chroot(connect: str) -> str:
    """``connect`` (``host:port,...``) with a chroot nobody used yet: nodes given it share nothing with any other."""
    return f"{connect}/josef-test-{uuid.uuid4().hex[:12]}"


def read_znode(connect: str, path: str) -> bytes | None:
    """The data of znode ``path`` under the chroot of ``connect`` (a ``zookeeper.connect`` value); None when absent.

    A session of its own, closed before returning: what a Kafka operator's ``zookeeper-shell get`` shows.
    """
    hosts, chroot = split_connect(connect)
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)
    try:
        return zk.get(chroot + path)[0]
    except NoNodeError:
        return None
    finally:
        zk.stop()
        zk.close()


class ZooKeeperServer:
    """One ZooKeeper server process; ``peers`` (id -> (quorum port, election port)) makes it an ensemble member."""

    def __init__(self, directory: Path, myid: int, client_port: int,
                 peers: dict[int, tuple[int, int]] | None = None, max_session_ms: int | None = None,
                 tls: TlsFiles | None = None) -> None:
        self.directory = directory
        #: With ``tls``, a ``secureClientPort`` too, whose certificate ``tls``'s CA signed; client certificates that CA
        #: signed authenticate their sessions (ZooKeeper's x509 provider). The plain port stays, for four-letter words.
        self.tls = tls
        self.secure_port = free_ports(1)[0] if tls is not None else None
        #: ``maxSessionTimeout``: the longest session a client may ask for (ZooKeeper's default, 20 ticks, when None).
        self.max_session_ms = max_session_ms
        self.myid = myid
        self.client_port = client_port
        self.peers = peers or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def secure_connect(self) -> str:
        assert self.secure_port is not None, "started without tls"
        return f"127.0.0.1:{self.secure_port}"

    def _write_config(self) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [f"tickTime={TICK_MS}", "initLimit=50", "syncLimit=25", f"dataDir={data}",
                 f"clientPort={self.client_port}", "clientPortAddress=127.0.0.1", "admin.enableServer=false",
                 "4lw.commands.whitelist=srvr,ruok,mntr", "maxClientCnxns=0", "autopurge.purgeInterval=0"]
        if self.max_session_ms is not None:
            lines.append(f"maxSessionTimeout={self.max_session_ms}")
        if self.tls is not None:
            store = self.directory / "server.pem"
            _write_pkcs8_store(self.tls, store)
            lines += [f"secureClientPort={self.secure_port}", "secureClientPortAddress=127.0.0.1",
                      "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                      f"ssl.keyStore.location={store}", "ssl.keyStore.type=PEM",
                      f"ssl.trustStore.location={self.tls.ca_pem}", "ssl.trustStore.type=PEM", "ssl.clientAuth=want"]
        if self.peers:
            (data / "myid").write_text(f"{self.myid}\n")
            lines += [f"server.{i}=127.0.0.1:{quorum}:{election}" for i, (quorum, election) in sorted(self.peers.items())]
        config = self.directory / "zoo.cfg"
        config.write_text("\n".join(lines) + "\n")
        (self.directory / "log4j.properties").write_text(LOG4J)
        return config

    def start(self) -> ZooKeeperServer:
        """Start the process (not waiting for it to serve: see :meth:`wait_serving`)."""
        if self.proc is not None:
            raise RuntimeError(f"ZooKeeper server {self.myid} is already running (pid {self.proc.pid})")
        config = self._write_config()
        self._log = open(self.directory / "zookeeper.log", "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", f"{self.directory}:{classpath()}",
             f"-Dlog4j.configuration=file:{self.directory / 'log4j.properties'}",
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(config)],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower`` once it serves; None while it does not."""
        for line in four_letter_word(self.client_port).splitlines():
            if line.startswith("Mode: "):
                return line.split(": ", 1)[1].strip()
        return None

    def wait_serving(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while self.mode() is None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper server {self.myid} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ZooKeeper server {self.myid} did not serve within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        path = self.directory / "zookeeper.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; by PID."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._ended()

    def kill(self) -> None:
        """``kill -9``."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self._ended()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def _ended(self) -> None:
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def _write_pkcs8_store(tls: TlsFiles, path: Path) -> None:
    """A server certificate for 127.0.0.1 and its key in one PEM file, the key in PKCS#8: the only PEM key Java reads."""
    leaf = tls.ca.issue_cert("127.0.0.1", "localhost", common_name="zookeeper")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), None)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()) + b"".join(b.bytes() for b in leaf.cert_chain_pems))
    path.chmod(0o600)


class ZooKeeperEnsemble:
    """``servers`` ZooKeeper servers in ``directory`` on free ports of 127.0.0.1: one standalone, or a replicated ensemble."""

    def __init__(self, directory: Path, servers: int = 1, max_session_ms: int | None = None,
                 tls: TlsFiles | None = None) -> None:
        ports = free_ports(3 * servers)
        peers = {i + 1: (ports[servers + 2 * i], ports[servers + 2 * i + 1]) for i in range(servers)} if servers > 1 else {}
        self.servers = [ZooKeeperServer(directory / f"zk{i + 1}", i + 1, ports[i], peers, max_session_ms, tls)
                        for i in range(servers)]

    @property
    def connect(self) -> str:
        """``host:port,...`` of every server, as ``zookeeper.connect`` names an ensemble."""
        return ",".join(s.connect for s in self.servers)

    @property
    def secure_connect(self) -> str:
        """``host:port,...`` of every server's TLS port (an ensemble started with ``tls``)."""
        return ",".join(s.secure_connect for s in self.servers)

    def start(self) -> ZooKeeperEnsemble:
        for server in self.servers:
            server.start()
        try:
            for server in self.servers:
                server.wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperEnsemble]:
    """One standalone ZooKeeper server for the test session; skips the test where none can run (fails on CI)."""
    try:
        classpath()
    except ZooKeeperUnavailable as exc:
        if os.environ.get("CI"):  # CI installs it (.ci/run): a missing server there is a broken setup, not a skip
            raise
        pytest.skip(str(exc))
    with tempfile.TemporaryDirectory(prefix="josef-zookeeper-") as tmp, ZooKeeperEnsemble(Path(tmp)) as ensemble:
        yield ensemble


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperEnsemble) -> str:
    """``zookeeper.connect`` with a chroot of its own for this test (created by whoever connects first)."""
    for server in zookeeper.servers:
        if server.proc is None:  # a test stopped it: the next one gets it back
            server.start()
        server.wait_serving()
    return fresh_chroot(zookeeper.connect)
