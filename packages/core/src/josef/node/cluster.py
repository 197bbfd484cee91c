"""Clusters of josef node processes on one host, configured as a Kafka KRaft cluster is.

:class:`JosefCluster` starts N josef nodes as separate ``python -m josef
server start`` processes on one host, from Kafka-style properties: combined
nodes (``process.roles=broker,controller``) or dedicated controllers and
brokers, each with its own ``server.properties``, log directory and ports,
formatted with one cluster id. :class:`NodeProcess` is one such node, signalled
by its PID only.

Two users share this module, which is why it is not in the pytest plugin: the
``josef_cluster`` fixture of :mod:`josef.testing`, and ``josef cluster
start`` (:func:`run_in_foreground`), a local cluster for development::

    with JosefCluster(Path("/tmp/c"), combined=3) as cluster:
        print(cluster.bootstrap_servers, cluster.controller_bootstrap)

Node ids are given in order from 1: combined nodes, then controllers, then
brokers. A node is ready when it logs ``ready on PLAINTEXT://HOST:PORT``
(broker roles) or ``josef controller ID ready on CONTROLLER://`` (dedicated
controllers); readiness is waited for on the log, never by sleeping.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from josef.testing.faults import Faults, Network

#: How long a node may take to log that it is ready, and to stop after SIGTERM, by default.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
#: The listener names the harness writes; Kafka's own defaults.
BROKER_LISTENER = "PLAINTEXT"
CONTROLLER_LISTENER = "CONTROLLER"
_BROKER_READY = re.compile(r"ready on PLAINTEXT://([^:,\s]+):(\d+)")

_ports_given: set[int] = set()
_ports_lock = threading.Lock()


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out for ``bind(0)`` and outgoing connections (Linux), or 0 if unknown."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _port_slice(low: int, high: int) -> tuple[int, int]:
    """This process's part of ``[low, high)``: all of it, or one of N+1 parts in a run of N pytest-xdist workers
    (the controlling process, which starts shared servers, has the first)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not worker.startswith("gw") or count <= 0 or high <= low:
        return low, high
    index = int(worker[2:]) + 1
    size = (high - low) // (count + 1)
    return low + index * size, low + (index + 1) * size


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports of ``host`` that were free a moment ago, and stay likely to be free.

    Nodes keep their ports across restarts, so a port must not be taken while
    its node is down. The kernel gives ports of its ephemeral range to every
    ``bind(0)`` and outgoing connection of every process (parallel test
    workers' clients included), so ports are drawn at random below that range,
    where only callers of this function look, and checked by binding. Where
    the range is unknown, ``bind(0)`` picks them. A port this process already
    handed out is not given twice, and parallel test workers (pytest-xdist's
    ``PYTEST_XDIST_WORKER``) draw from disjoint slices of that range, so a
    port free only while its node is down for a restart is not handed to
    another worker's cluster.
    """
    low, floor = _port_slice(10_000, _ephemeral_floor())
    ports: list[int] = []
    with _ports_lock:
        for _ in range(n * 50 + 100):
            if len(ports) == n:
                break
            candidate = random.randrange(low, floor) if floor > low + 1000 else 0
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, candidate))
                except OSError:
                    continue
                port = sock.getsockname()[1]
            if port not in _ports_given and port not in ports:
                ports.append(port)
        if len(ports) < n:
            raise RuntimeError(f"could not find {n} free ports on {host}")
        _ports_given.update(ports)
    return ports


#: Every node process started here and not yet reaped: killed by PID if the interpreter exits first.
_live: set[NodeProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for node in list(_live):
        node.kill()


class NodeProcess:
    """One josef node as a child process: ``python -m josef server start server.properties``.

    The process's stdout and stderr are read by a thread into :attr:`lines`
    and appended to :attr:`log_path` (so a person can ``tail -f`` a node);
    :meth:`wait_for_log` and readiness wait on a condition the thread
    notifies, never by polling or sleeping. Signals go to the node's PID only,
    and the node runs in its own session so that a Ctrl-C in the terminal
    reaches the process that started it, which stops the nodes in order.
    """

    def __init__(self, node_id: int, roles: Sequence[str], properties: Mapping[str, str], directory: Path, *,
                 log_level: str = "INFO", env: Mapping[str, str] | None = None,
                 start_timeout: float = START_TIMEOUT_S, wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.node_id = node_id
        self.roles = tuple(roles)
        self.properties = dict(properties)
        self.directory = Path(directory)
        self.log_level = log_level
        self.env = dict(env) if env is not None else None
        self.start_timeout = start_timeout
        #: Turns the node's command into the one started (``ip netns exec NS ...`` on a fault-harness network).
        self.wrap = wrap
        #: Every line the node printed, over all its starts.
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        #: The port of the PLAINTEXT listener, as the node logged it when ready (-1 before).
        self.bound_port = -1
        self._since = 0  # index in lines where the current process's output starts
        self._ended = False
        self._paused = False
        self._terminating = False
        self._pump: threading.Thread | None = None
        self._changed = threading.Condition()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<NodeProcess {self.node_id} {','.join(self.roles)} {state}>"

    # Identity ---------------------------------------------------------------------------------------

    @property
    def is_broker(self) -> bool:
        return "broker" in self.roles

    @property
    def is_controller(self) -> bool:
        return "controller" in self.roles

    @property
    def properties_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        """The node's output, over all its starts."""
        return self.directory / "server.log"

    @property
    def log_dirs(self) -> list[Path]:
        return [Path(d) for d in self.properties.get("log.dirs", "").split(",") if d]

    def listener(self, name: str) -> tuple[str, int] | None:
        """``(host, port)`` of listener ``name`` in this node's ``listeners``."""
        for item in self.properties.get("listeners", "").split(","):
            listener, sep, address = item.strip().partition("://")
            if sep and listener.upper() == name.upper():
                host, _, port = address.rpartition(":")
                return host, int(port)
        return None

    @property
    def bootstrap_server(self) -> str | None:
        """``HOST:PORT`` of the PLAINTEXT listener (None for a dedicated controller)."""
        found = self.listener(BROKER_LISTENER)
        return f"{found[0]}:{found[1]}" if found else None

    @property
    def controller_address(self) -> str | None:
        """``HOST:PORT`` where other nodes reach this controller: its entry in ``controller.quorum.voters``."""
        for voter in self.properties.get("controller.quorum.voters", "").split(","):
            node_id, sep, address = voter.strip().partition("@")
            if sep and node_id == str(self.node_id):
                return address
        found = self.listener(CONTROLLER_LISTENER) if self.is_controller else None
        return f"{found[0]}:{found[1]}" if found else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # Output -----------------------------------------------------------------------------------------

    @property
    def log(self) -> str:
        """Everything the node printed, over all its starts."""
        with self._changed:
            return "".join(self.lines)

    def tail(self, n: int = 50) -> str:
        with self._changed:
            return "".join(self.lines[-n:])

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with self.log_path.open("a", encoding="utf-8") as log_file:
            for line in proc.stdout:
                log_file.write(line)
                log_file.flush()
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        with self._changed:
            if proc is self.proc:
                self._ended = True
            self._changed.notify_all()

    def _wait_for(self, match: Callable[[str], Any], timeout: float) -> Any:
        """The first truthy ``match(line)`` over the current process's lines, waiting up to ``timeout``; None if none."""
        deadline = time.monotonic() + timeout
        with self._changed:
            pos = self._since
            while True:
                while pos < len(self.lines):
                    found = match(self.lines[pos])
                    pos += 1
                    if found:
                        return found
                remaining = deadline - time.monotonic()
                if self._ended or remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def wait_for_log(self, text: str | re.Pattern[str], timeout: float = 10) -> bool:
        """Whether the running process logs a line containing ``text`` (or matching the pattern) within ``timeout`` s.

        Looks at the current process's lines only (since the last start), and
        answers False at once when the process has ended without printing it.
        """
        if isinstance(text, re.Pattern):
            return self._wait_for(text.search, timeout) is not None
        return self._wait_for(lambda line: text in line, timeout) is not None

    # Lifecycle --------------------------------------------------------------------------------------

    def write_properties(self) -> Path:
        """Write ``server.properties`` (``key=value`` lines, as given) into the node's directory."""
        self.directory.mkdir(parents=True, exist_ok=True)
        text = "".join(f"{key}={value}\n" for key, value in self.properties.items())
        self.properties_path.write_text(text, encoding="utf-8")
        return self.properties_path

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start(self, wait: bool = True) -> NodeProcess:
        """Start the process (and, with ``wait``, return once it is ready). Starting a running node is an error."""
        if self.running:
            raise RuntimeError(f"node {self.node_id} is already running (pid {self.pid})")
        self.write_properties()
        args = [sys.executable, "-m", "josef", "server", "start", str(self.properties_path),
                "--log-level", self.log_level]
        if self.wrap is not None:
            args = self.wrap(args)
        with self._changed:
            self._since = len(self.lines)
            self._ended = False
            self._paused = self._terminating = False
            self.bound_port = -1
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         cwd=self.directory, env=self._environment(), start_new_session=True)
        _live.add(self)
        self._pump = threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                                      name=f"josef-node-{self.node_id}-log")
        self._pump.start()
        if wait:
            self.wait_ready()
        return self

    def _ready_line(self, line: str) -> bool:
        if self.is_broker:
            match = _BROKER_READY.search(line)
            if match:
                self.bound_port = int(match.group(2))
            return match is not None
        return f"josef controller {self.node_id} ready on {CONTROLLER_LISTENER}://" in line

    def wait_ready(self, timeout: float | None = None) -> NodeProcess:
        """Wait until the node logs that it is ready; on a timeout or an early exit, kill it and raise with its log."""
        if self._wait_for(self._ready_line, self.start_timeout if timeout is None else timeout):
            return self
        exited = None
        if self.proc is not None:
            try:  # output ended: the process is exiting, and its status comes a moment after its pipe closes
                exited = self.proc.wait(timeout=10) if self._ended else self.proc.poll()
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        why = f"exited with status {exited}" if exited is not None else "did not become ready in time"
        raise RuntimeError(f"josef node {self.node_id} ({','.join(self.roles)}) {why}; its log ends:\n{self.tail(60)}")

    def _reap(self, timeout: float) -> int | None:
        assert self.proc is not None
        code = self.proc.wait(timeout=timeout)
        if self._pump is not None:
            self._pump.join(timeout=10)  # the pipe closes with the process: the last lines are in
        self.proc, self._pump, self._paused, self._terminating = None, None, False, False
        _live.discard(self)
        return code

    def terminate(self) -> None:
        """Send SIGTERM once (a clean shutdown) without waiting; a paused node is continued so it can act on it."""
        if self.proc is None or self._terminating or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        self._terminating = True  # a second TERM could land after the broker's handler is gone and cut its shutdown short
        if self._paused:
            os.kill(self.proc.pid, signal.SIGCONT)
            self._paused = False

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (a clean shutdown) and wait; SIGKILL if it has not exited after ``timeout`` s. Returns the exit status."""
        if self.proc is None:
            return None
        self.terminate()
        try:
            return self._reap(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def wait(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """Wait for the process to exit by itself (no signal) and reap it: its exit status; TimeoutExpired if it does not."""
        if self.proc is None:
            return None
        return self._reap(timeout)

    def kill(self) -> int | None:
        """``kill -9`` by PID: no shutdown at all. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self._reap(STOP_TIMEOUT_S)

    def pause(self) -> None:
        """SIGSTOP: the node freezes (no heartbeats, no answers) with its sockets open, like a long GC pause."""
        assert self.running, f"node {self.node_id} is not running"
        os.kill(self.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.running, f"node {self.node_id} is not running"
        os.kill(self.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        self._paused = False

    def restart(self, wait: bool = True) -> NodeProcess:
        """Stop cleanly if running, then start again with the same properties: same ports, same log directories."""
        self.stop()
        return self.start(wait=wait)


class JosefCluster:
    """A josef cluster of separate processes on one host, configured as a Kafka KRaft cluster is.

    ``combined`` nodes run ``process.roles=broker,controller``; ``controllers``
    and ``brokers`` run one role each. Ids go from ``first_node_id`` in that
    order. Each node listens on free ports of ``host``, or on consecutive
    ports from ``base_port`` when given (``PLAINTEXT://`` for broker roles,
    ``CONTROLLER://`` for controller roles, in node order), names every controller in ``controller.quorum.voters`` and keeps
    its log directory under ``base_dir/node-<id>/``. ``overrides`` apply to
    every node and ``node_overrides[id]`` to one node, over the generated
    keys; an override of None removes a key. ``format_args`` go to every ``josef
    storage format`` (``("--add-scram", "SCRAM-SHA-512=[name=admin,password=...]")``).
    :meth:`add_broker` adds a broker to the running cluster.

    With a ``network`` (:class:`josef.testing.faults.Network`) each node runs
    in its own network namespace at its own address, on the same ports
    (clients on ``PLAINTEXT``, other brokers on ``REPLICATION``, controllers
    on ``CONTROLLER``), and ``disk_mb`` puts each node's log directory on a
    tmpfs of that size; :attr:`faults` then injects faults into the cluster.

    :meth:`start` formats each node's storage with one cluster id (``josef
    storage format``), starts every process and waits until each is ready.
    Construction starts nothing and writes nothing.
    """

    def __init__(self, base_dir: Path, *, combined: int = 0, controllers: int = 0, brokers: int = 0,
                 overrides: Mapping[str, str | None] | None = None,
                 node_overrides: Mapping[int, Mapping[str, str | None]] | None = None,
                 cluster_id: str | None = None, host: str = "127.0.0.1", first_node_id: int = 1,
                 log_level: str = "INFO", env: Mapping[str, str] | None = None,
                 start_timeout: float = START_TIMEOUT_S, base_port: int | None = None,
                 format_args: Sequence[str] = (), network: Network | None = None,
                 disk_mb: int | None = None) -> None:
        if min(combined, controllers, brokers) < 0:
            raise ValueError("node counts cannot be negative")
        if combined + controllers == 0:
            raise ValueError("a cluster needs at least one controller: give combined= or controllers=")
        self.base_dir = Path(base_dir)
        self.host = host
        self.cluster_id = cluster_id
        self.start_timeout = start_timeout
        self.format_args = tuple(format_args)
        self.network = network
        self._disk_mb = disk_mb
        #: Faults of a cluster on a fault-harness network (None without one).
        self.faults: Faults | None = None
        if disk_mb is not None and network is None:
            raise ValueError("disk_mb needs a network: disk faults are part of the fault harness")
        self._overrides = dict(overrides or {})
        self._node_options = {"log_level": log_level, "env": env, "start_timeout": start_timeout}
        layout = ([("broker", "controller")] * combined + [("controller",)] * controllers + [("broker",)] * brokers)
        ids = list(range(first_node_id, first_node_id + len(layout)))
        unknown = set(node_overrides or {}) - set(ids)
        if unknown:
            raise ValueError(f"node_overrides names nodes {sorted(unknown)}; this cluster's nodes are {ids}")
        count = sum(len(roles) for roles in layout)
        listeners = {}
        if network is None:
            ports = iter(free_ports(count, host) if base_port is None else range(base_port, base_port + count))
            for node_id, roles in zip(ids, layout):
                names = ([BROKER_LISTENER] if "broker" in roles else []) + (
                    [CONTROLLER_LISTENER] if "controller" in roles else [])
                listeners[node_id] = {name: next(ports) for name in names}
        else:
            from josef.testing import faults

            ports = {BROKER_LISTENER: faults.CLIENT_PORT, CONTROLLER_LISTENER: faults.CONTROLLER_PORT}
            listeners = {node_id: {name: ports[name] for name in (
                [BROKER_LISTENER] if "broker" in roles else []) + ([CONTROLLER_LISTENER] if "controller" in roles else [])}
                for node_id, roles in zip(ids, layout)}
        self._voters = ",".join(f"{node_id}@{self._host(node_id)}:{l[CONTROLLER_LISTENER]}"
                                for node_id, l in listeners.items() if CONTROLLER_LISTENER in l)
        self.nodes: list[NodeProcess] = [
            self._node(node_id, roles, listeners[node_id], (node_overrides or {}).get(node_id, {}))
            for node_id, roles in zip(ids, layout)]

    def _host(self, node_id: int) -> str:
        """The address node ``node_id`` is reached at: :attr:`host`, or its own on a fault-harness network."""
        return self.host if self.network is None else self.network.address(node_id)

    def _node(self, node_id: int, roles: Sequence[str], listeners: Mapping[str, int],
              node_overrides: Mapping[str, str | None]) -> NodeProcess:
        properties: dict[str, str | None] = {
            "node.id": str(node_id),
            "process.roles": ",".join(roles),
            "listeners": ",".join(f"{name}://{self.host}:{port}" for name, port in listeners.items()),
            "controller.listener.names": CONTROLLER_LISTENER,
            "controller.quorum.voters": self._voters,
            "listener.security.protocol.map": f"{BROKER_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT",
            "log.dirs": str(self.base_dir / f"node-{node_id}" / "data"),
        }
        wrap = None
        if self.network is not None:
            properties.update(self._network_properties(node_id, listeners))
            wrap = lambda args, node_id=node_id: self.network.wrap(node_id, args)  # noqa: E731
        properties.update({**self._overrides, **node_overrides})
        return NodeProcess(node_id, roles, {k: v for k, v in properties.items() if v is not None},
                           self.base_dir / f"node-{node_id}", wrap=wrap, **self._node_options)

    def _network_properties(self, node_id: int, listeners: Mapping[str, int]) -> dict[str, str]:
        """A node on a fault-harness network: clients on its address; other nodes through its inter-node listeners,
        bound where the network says (behind a delay proxy on its loopback, or on its address)."""
        from josef.testing.faults import REPLICATION_PORT

        assert self.network is not None
        address, bind = self.network.address(node_id), self.network.bind_address(node_id)
        bound = {}
        if BROKER_LISTENER in listeners:
            bound[BROKER_LISTENER] = f"{address}:{listeners[BROKER_LISTENER]}"
            bound["REPLICATION"] = f"{bind}:{REPLICATION_PORT}"
        if CONTROLLER_LISTENER in listeners:
            bound[CONTROLLER_LISTENER] = f"{bind}:{listeners[CONTROLLER_LISTENER]}"
        properties = {
            "listeners": ",".join(f"{name}://{where}" for name, where in bound.items()),
            "listener.security.protocol.map": ",".join(
                f"{name}:PLAINTEXT" for name in (BROKER_LISTENER, "REPLICATION", CONTROLLER_LISTENER)),
        }
        if BROKER_LISTENER in listeners:
            properties["advertised.listeners"] = (f"{BROKER_LISTENER}://{address}:{listeners[BROKER_LISTENER]},"
                                                  f"REPLICATION://{address}:{REPLICATION_PORT}")
            properties["inter.broker.listener.name"] = "REPLICATION"
        return properties

    def add_broker(self, overrides: Mapping[str, str | None] | None = None, *, node_id: int | None = None,
                   start: bool = True, wait: bool = True) -> NodeProcess:
        """A broker joining the started cluster: the next node id (unless given), a free port, the cluster's
        properties with ``overrides`` over them, its storage formatted with the cluster's id; started (and, with
        ``wait``, ready) unless ``start`` is false. It is one of :attr:`nodes` from then on, stopped with the rest.
        """
        if self.cluster_id is None:
            raise RuntimeError("add a broker to a formatted cluster: start() it first")
        node_id = max(n.node_id for n in self.nodes) + 1 if node_id is None else node_id
        if any(n.node_id == node_id for n in self.nodes):
            raise ValueError(f"node {node_id} is already in this cluster")
        if self.network is None:
            [port] = free_ports(1, self.host)
        else:
            from josef.testing.faults import CLIENT_PORT as port

            self.network.add(node_id)
        node = self._node(node_id, ("broker",), {BROKER_LISTENER: port}, overrides or {})
        self._mount_disk(node)
        self.nodes.append(node)
        self._finish(self._josef("storage", "format", "-t", self.cluster_id, "-c", str(node.write_properties()),
                                 "-g", *self.format_args), f"josef storage format of node {node_id}")
        return node.start(wait=wait) if start else node

    def __repr__(self) -> str:
        return f"<JosefCluster {self.cluster_id or '(unformatted)'} nodes {[n.node_id for n in self.nodes]}>"

    # Looking up nodes -------------------------------------------------------------------------------

    @property
    def brokers(self) -> list[NodeProcess]:
        """Nodes with the broker role (combined nodes included)."""
        return [n for n in self.nodes if n.is_broker]

    @property
    def controllers(self) -> list[NodeProcess]:
        """Nodes with the controller role (combined nodes included)."""
        return [n for n in self.nodes if n.is_controller]

    def node(self, node_id: int) -> NodeProcess:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in this cluster (nodes {[n.node_id for n in self.nodes]})")

    __getitem__ = node

    @property
    def bootstrap_servers(self) -> str:
        """``HOST:PORT,...`` of the brokers' PLAINTEXT listeners, for clients."""
        return ",".join(n.bootstrap_server for n in self.brokers if n.bootstrap_server)

    @property
    def controller_bootstrap(self) -> str:
        """``HOST:PORT,...`` of the controllers' CONTROLLER listeners (``--bootstrap-controller``)."""
        return ",".join(n.controller_address for n in self.controllers if n.controller_address)

    @property
    def voters(self) -> str:
        """``controller.quorum.voters`` as every node has it."""
        return self.nodes[0].properties.get("controller.quorum.voters", "")

    # Lifecycle --------------------------------------------------------------------------------------

    def write_properties(self) -> list[Path]:
        """Write every node's ``server.properties``; returns their paths."""
        return [node.write_properties() for node in self.nodes]

    def _josef(self, *args: str, timeout: float = 120) -> subprocess.Popen[str]:
        env = dict(os.environ if self.nodes[0].env is None else self.nodes[0].env)
        return subprocess.Popen([sys.executable, "-m", "josef", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)

    @staticmethod
    def _finish(proc: subprocess.Popen[str], what: str, timeout: float = 120) -> str:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"{what} did not finish in {timeout:.0f}s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed with status {proc.returncode}:\n{out}")
        return out

    def format(self) -> str:
        """Format every node's log directories with one cluster id (a new one unless given); returns the id."""
        if self.cluster_id is None:
            self.cluster_id = self._finish(self._josef("storage", "random-uuid"), "josef storage random-uuid").strip()
        paths = self.write_properties()
        running = [(self._josef("storage", "format", "-t", self.cluster_id, "-c", str(path), "-g", *self.format_args),
                    node)
                   for path, node in zip(paths, self.nodes)]
        for proc, node in running:
            self._finish(proc, f"josef storage format of node {node.node_id}")
        return self.cluster_id

    def _mount_disk(self, node: NodeProcess) -> None:
        if self.faults is not None and self.faults.disks is not None:
            for directory in node.log_dirs:
                self.faults.disks.mount(node.node_id, directory)

    def _attach_faults(self) -> None:
        """Namespaces for the nodes and (with ``disk_mb``) their tmpfs disks, before anything is written there."""
        from josef.testing.faults import Disks, Faults

        assert self.network is not None
        self.faults = Faults(self, self.network, Disks(self._disk_mb) if self._disk_mb is not None else None)
        for node in self.nodes:
            self.network.add(node.node_id)
            self._mount_disk(node)

    def start(self, wait: bool = True) -> JosefCluster:
        """Format, start every node, and (with ``wait``) return once all are ready; on failure stop them all."""
        try:
            if self.network is not None and self.faults is None:
                self._attach_faults()
            self.format()
            for node in self.nodes:
                if not node.running:
                    node.start(wait=False)
            if wait:
                self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float | None = None) -> JosefCluster:
        """Wait until every node has logged that it is ready (all started together: a quorum needs its voters up)."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        for node in self.nodes:
            node.wait_ready(max(0.0, deadline - time.monotonic()))
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> dict[int, int | None]:
        """Stop every process this cluster started, by PID: SIGTERM, brokers before controllers; SIGKILL after ``timeout``.

        Returns each node's exit status (None for a node that was not started
        or already reaped): 0 for a clean shutdown, -9 for one that had to be killed.
        """
        statuses: dict[int, int | None] = {}
        brokers_only = [n for n in self.nodes if not n.is_controller]
        for group in (brokers_only, [n for n in self.nodes if n.is_controller]):
            for node in group:
                node.terminate()
            deadline = time.monotonic() + timeout
            for node in group:
                statuses[node.node_id] = node.stop(max(0.1, deadline - time.monotonic()))
        return statuses

    def kill(self) -> None:
        """SIGKILL every running node."""
        for node in self.nodes:
            node.kill()

    def logs(self, lines: int = 50) -> str:
        """The last ``lines`` lines of every node's log, each under a header naming the node."""
        return "".join(f"--- josef node {n.node_id} ({','.join(n.roles)}), {n.directory} ---\n{n.tail(lines)}"
                       for n in self.nodes)

    def __enter__(self) -> JosefCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# A local cluster in the foreground (josef cluster start) --------------------------------------------------


def describe(cluster: JosefCluster) -> list[str]:
    """One line per node (id, roles, pid, listeners, log file), then the addresses clients and tools need.

    The ``bootstrap servers:`` line comes last: a script that waits for it has every node line already.
    """
    lines = [f"josef cluster {cluster.cluster_id}: {len(cluster.nodes)} nodes under {cluster.base_dir}"]
    for node in cluster.nodes:
        lines.append(f"node {node.node_id}  {','.join(node.roles):<17}  pid {node.pid}  "
                     f"{node.properties['listeners']}  log {node.log_path}")
    lines.append(f"controller quorum voters: {cluster.voters}")
    lines.append(f"bootstrap servers: {cluster.bootstrap_servers}")
    return lines


def run_in_foreground(cluster: JosefCluster, echo: Callable[[str], None]) -> int:
    """Start ``cluster``, print it, wait for SIGINT or SIGTERM, stop every node by PID; the exit status.

    0 when every node that was running at the end stopped cleanly, 1 when one
    did not (a non-zero status, or killed after the grace period) or start-up
    was interrupted. During start-up SIGTERM raises KeyboardInterrupt as
    Ctrl-C does, so :meth:`JosefCluster.start` stops what it started; while
    the nodes stop, more signals are ignored so the stop always completes.
    """
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cluster.start()
    except KeyboardInterrupt:
        echo("interrupted while starting; every node started is stopped")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    try:
        with _signals_to_pipe(signal.SIGINT, signal.SIGTERM, signal.SIGCHLD) as signals:
            for line in describe(cluster):
                echo(line)
            echo("Ctrl-C or SIGTERM stops the cluster")
            signum = _wait_for_stop_signal(cluster, signals, echo)
            echo(f"received {signum.name}, stopping every node with SIGTERM, brokers before controllers")
            running = {node.node_id for node in cluster.nodes if node.running}
            statuses = cluster.stop()
    except BaseException:
        cluster.stop()
        raise
    unclean = {node_id: status for node_id, status in statuses.items() if node_id in running and status != 0}
    for node_id, status in sorted(unclean.items()):
        echo(f"node {node_id} did not stop cleanly: exit status {status}")
    echo("stopped" if not unclean else "stopped, not cleanly")
    return 1 if unclean else 0


@contextlib.contextmanager
def _signals_to_pipe(*signums: int) -> Iterator[int]:
    """Catch ``signums`` and write their numbers to a pipe; yields the pipe's read end.

    CPython may run the C-level handler on any thread (here, the log pumps),
    and only the wakeup-fd write is sure to wake a main thread blocked in
    ``select``. The Python-level handlers do nothing: the pipe carries it all.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = {signum: signal.signal(signum, lambda *_: None) for signum in signums}
    previous_fd = signal.set_wakeup_fd(write_fd)
    try:
        yield read_fd
    finally:
        signal.set_wakeup_fd(previous_fd)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(read_fd)
        os.close(write_fd)


def _wait_for_stop_signal(cluster: JosefCluster, signals: int, echo: Callable[[str], None]) -> signal.Signals:
    """Block until SIGINT or SIGTERM arrives on ``signals``; report each node that exits meanwhile (SIGCHLD).

    A node may exit because it crashed or because the developer killed it to
    try a failover; the others keep running either way.
    """
    reported: set[int] = set()
    while True:
        select.select([signals], [], [])
        for signum in os.read(signals, 64):
            if signum in (signal.SIGINT, signal.SIGTERM):
                return signal.Signals(signum)
        for node in cluster.nodes:
            if node.node_id not in reported and node.proc is not None and node.proc.poll() is not None:
                reported.add(node.node_id)
                echo(f"node {node.node_id} (pid {node.pid}) exited with status {node.proc.returncode}; "
                     f"the others keep running. Its log ends:\n{node.tail(20).rstrip()}")
