"""Faults for tests of josef clusters: partitions, lossy, slow and narrow links, frozen, killed and restarted nodes,
full and read-only disks.

Jepsen-style testing on one machine, with the kernel's own tools: each node of
a cluster runs in its own network namespace (``ip netns``), plugged by a veth
pair into a bridge that carries a private /24 chosen at random among unused
ones of ``10.199.0.0/16``. The test process stays in the root namespace and
reaches every node at the bridge, as a client on another host would; nodes
reach each other across the bridge. So a fault between nodes leaves the
clients' paths alone, which is what "a leader cut off from the controller but
still reachable by its clients" needs.

- **Partitions and loss** are nftables rules in the receiving node's namespace
  (input hook, by source address): ``partition(a, b)`` drops everything
  either way, ``partition(a, b, one_way=True)`` only what ``a`` sends to
  ``b``; ``loss(a, b, 10)`` drops 10% (``numgen random``).
- **Latency and jitter** come from a delaying proxy (:mod:`josef.testing.delay_proxy`)
  in each node's namespace, in front of its inter-broker and controller
  listeners, which the node then binds on its loopback: the kernel here has
  no netem. A network made with ``latency=True`` has them; ``slow(node, ms,
  jitter_ms)`` sets the delay of the links into that node.
- **Bandwidth** is a ``tbf`` qdisc on the node's interface (``throttle``).
- **Disks**: with ``disk_mb``, each node's log directory is a tmpfs of that
  size, so ``fill_disk`` makes the next write fail with ENOSPC, and
  ``read_only`` remounts it read-only.
- **Processes**: kill -9, SIGSTOP/SIGCONT and restarts by PID, as
  :class:`~josef.node.cluster.NodeProcess` does.

Everything is made under names unique to the harness instance and removed by
:meth:`Faults.close` (the ``josef_cluster`` fixture calls it), namespaces,
links and mounts alike; nothing is routed off the machine. It needs root and
the ``ip`` and ``nft`` commands (Debian's iproute2 and nftables):
:func:`unavailable` says why not, and the fixture skips with that reason.

:class:`Nemesis` schedules faults from a seed, so a failing run can be
replayed with the same sequence.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from josef.node.cluster import JosefCluster, NodeProcess

log = logging.getLogger(__name__)

#: The /16 whose /24s the harness takes, one per network.
SUBNETS = "10.199"
#: The ports every node uses: each node has its own address, so they never clash.
CLIENT_PORT, CONTROLLER_PORT, REPLICATION_PORT = 9092, 9093, 9094
_LOOPBACK = "127.0.0.1"
#: A 3-node cluster that replicates everything three ways (two in sync for acks=all), internal topics included,
#: with Kafka's failure-detection timeouts lowered so that a fault is noticed in seconds: what fault tests and
#: soaks run with (``josef_cluster(combined=3, faults=True, **REPLICATED_FAST)``).
REPLICATED_FAST = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "share.coordinator.state.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
    "replica.lag.time.max.ms": "3000",
    "broker.session.timeout.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    "controller.quorum.election.timeout.ms": "1000",
    "controller.quorum.fetch.timeout.ms": "2000",
    "controller.quorum.request.timeout.ms": "1500",
    "replica.socket.timeout.ms": "5000",
    "request.timeout.ms": "5000",
}


def unavailable() -> str | None:
    """Why this machine cannot run the harness (not root, no ``ip`` or ``nft``), or None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces, nftables and tmpfs mounts need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing (Debian package {package})"
    return None


def _run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, input=input, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _free_subnet() -> int:
    """A third octet of ``10.199.X.0/24`` that no interface of this machine uses yet."""
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    candidates = [n for n in range(256) if f" {SUBNETS}.{n}." not in used]
    if not candidates:
        raise RuntimeError(f"every /24 of {SUBNETS}.0.0/16 is in use")
    return random.SystemRandom().choice(candidates)


class Network:
    """A bridge with one network namespace per node; the faults between nodes are rules in those namespaces.

    Node ``n`` gets address ``10.199.X.(10+n)``; the bridge, where the test's
    clients sit, ``10.199.X.1``. With ``latency`` a delay proxy runs in each
    namespace in front of the controller and inter-broker ports.
    """

    def __init__(self, *, latency: bool = False) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"the fault harness cannot run here: {reason}")
        self.latency = latency
        self.subnet = _free_subnet()
        self.tag = f"{os.getpid() % 10000:04d}{self.subnet:02x}"
        self.bridge = f"jfb{self.tag}"
        self.gateway = f"{SUBNETS}.{self.subnet}.1"
        self._nodes: list[int] = []
        self._proxies: dict[int, subprocess.Popen[str]] = {}
        #: (from, to) -> percent of packets dropped; 100 is a partition.
        self._drops: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def __repr__(self) -> str:
        return f"<Network {SUBNETS}.{self.subnet}.0/24 nodes {self._nodes}>"

    def namespace(self, node_id: int) -> str:
        return f"josef-{self.tag}-{node_id}"

    def address(self, node_id: int) -> str:
        """Where the node listens for clients, and where other nodes reach it."""
        if not 0 <= node_id < 240:
            raise ValueError(f"node ids of a fault-harness network go from 0 to 239, not {node_id}")
        return f"{SUBNETS}.{self.subnet}.{10 + node_id}"

    def _veth(self, node_id: int) -> str:
        """The node's link into the bridge, as the machine's own namespace names it."""
        return f"jfv{self.tag}n{node_id}"

    def bind_address(self, node_id: int) -> str:
        """Where the node binds its inter-node listeners: its loopback behind the delay proxy, else its address."""
        return _LOOPBACK if self.latency else self.address(node_id)

    def add(self, node_id: int) -> None:
        """The node's namespace, its link into the bridge and its address; idempotent."""
        if node_id in self._nodes:
            return
        ns, veth = self.namespace(node_id), self._veth(node_id)
        _run("ip", "netns", "add", ns)
        self._nodes.append(node_id)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.address(node_id)}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        self._apply(node_id)
        if self.latency:
            self._start_proxy(node_id)

    def wrap(self, node_id: int, args: Sequence[str]) -> list[str]:
        """``args`` run inside the node's namespace: ``ip netns exec`` execs them, so the PID stays the command's."""
        return ["ip", "netns", "exec", self.namespace(node_id), *args]

    def _start_proxy(self, node_id: int) -> None:
        address = self.address(node_id)
        routes = [f"{port}:{_LOOPBACK}:{port}" for port in (CONTROLLER_PORT, REPLICATION_PORT)]
        proxy = subprocess.Popen(self.wrap(node_id, [sys.executable, "-m", "josef.testing.delay_proxy", address,
                                                     *routes]),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert proxy.stdout is not None
        if proxy.stdout.readline().strip() != "ready":
            proxy.kill()
            raise RuntimeError(f"the delay proxy of node {node_id} did not start")
        self._proxies[node_id] = proxy

    # Faults -------------------------------------------------------------------------------------------

    def drop(self, sources: Iterable[int], targets: Iterable[int], percent: int = 100) -> None:
        """Drop ``percent`` of the packets each of ``sources`` sends to each of ``targets`` (100: a partition)."""
        if not 0 < percent <= 100:
            raise ValueError(f"a drop rate is a percentage in 1..100, not {percent}")
        sources, targets = list(sources), list(targets)
        with self._lock:
            for source in sources:
                for target in targets:
                    if source != target:
                        self._drops[source, target] = percent
            for target in set(targets):
                self._apply(target)

    def heal(self) -> None:
        """Every packet goes through again, and links lose their delay."""
        with self._lock:
            touched = {target for _, target in self._drops}
            self._drops.clear()
            for target in touched:
                self._apply(target)
        for node_id in self._proxies:
            self.slow(node_id, 0, 0)

    def slow(self, node_id: int, delay_ms: int, jitter_ms: int = 0) -> None:
        """Delay every chunk on the links into ``node_id`` (its inter-broker and controller ports) by ``delay_ms`` ±
        ``jitter_ms``, each way: a request to it and its answer both wait."""
        proxy = self._proxies.get(node_id)
        if proxy is None:
            raise RuntimeError("latency needs a network made with latency=True (a delay proxy per node)")
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write(f"delay {delay_ms} {jitter_ms}\n")
        proxy.stdin.flush()
        proxy.stdout.readline()  # the proxy echoes the command once it applies

    def throttle(self, node_id: int, kbit_per_s: int | None) -> None:
        """Cap what ``node_id`` sends at ``kbit_per_s`` (a tbf qdisc); None lifts the cap."""
        ns = self.namespace(node_id)
        _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        if kbit_per_s is not None:
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                 f"{kbit_per_s}kbit", "burst", "32kbit", "latency", "500ms")

    def _apply(self, target: int) -> None:
        """Replace the target namespace's table with one rule per source it drops packets from, in one transaction.

        Packets are dropped where they arrive, as a real network loses them:
        the sender sees silence and timeouts, not the EPERM that a drop on
        its own output hook would give it at once.
        """
        rules = []
        for (source, dst), percent in sorted(self._drops.items()):
            if dst == target:
                sample = "" if percent >= 100 else f"numgen random mod 100 < {percent} "
                rules.append(f"    ip saddr {self.address(source)} {sample}drop")
        script = ("table inet josef_faults\ndelete table inet josef_faults\n"
                  "table inet josef_faults {\n  chain input {\n    type filter hook input priority 0; policy accept;\n"
                  + "\n".join(rules) + "\n  }\n}\n")
        _run("ip", "netns", "exec", self.namespace(target), "nft", "-f", "-", input=script)

    def close(self) -> None:
        """Remove every namespace, link and proxy this network made."""
        for proxy in self._proxies.values():
            proxy.kill()
            proxy.wait()
        self._proxies.clear()
        for node_id in self._nodes:
            # The link first: removing a namespace frees its end of the pair later, in the kernel's own time, and
            # a network made next with the same tag would find the old name still taken ("File exists").
            _run("ip", "link", "del", self._veth(node_id), check=False)
            _run("ip", "netns", "del", self.namespace(node_id), check=False)
        self._nodes.clear()
        _run("ip", "link", "del", self.bridge, check=False)


class Disks:
    """Each node's log directory on a tmpfs of its own, so one replica's disk can fill up or turn read-only."""

    def __init__(self, size_mb: int) -> None:
        self.size_mb = size_mb
        self._mounts: dict[int, Path] = {}

    def mount(self, node_id: int, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0755", "tmpfs", str(directory))
        self._mounts[node_id] = directory

    @property
    def nodes(self) -> list[int]:
        return list(self._mounts)

    def _directory(self, node_id: int) -> Path:
        try:
            return self._mounts[node_id]
        except KeyError:
            raise RuntimeError(f"node {node_id} has no disk of its own: make the cluster with disk_mb") from None

    def fill(self, node_id: int, leave_bytes: int = 0) -> None:
        """Fill the node's disk until only ``leave_bytes`` are free (0: the next write fails with ENOSPC)."""
        directory = self._directory(node_id)
        filler = directory / ".josef-faults-filler"
        with filler.open("ab") as out:
            while True:
                free = shutil.disk_usage(directory).free - leave_bytes
                if free <= 0:
                    break
                try:
                    out.write(b"\0" * min(free, 1 << 20))
                    out.flush()
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break

    def free(self, node_id: int) -> None:
        (self._directory(node_id) / ".josef-faults-filler").unlink(missing_ok=True)

    def read_only(self, node_id: int, read_only: bool = True) -> None:
        _run("mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(self._directory(node_id)))

    def close(self) -> None:
        for directory in self._mounts.values():
            _run("umount", "-l", str(directory), check=False)
        self._mounts.clear()


@attrs.frozen
class FaultEvent:
    """One fault started or ended, as the nemesis and the history record it."""

    at: float
    action: str
    nodes: tuple[int, ...]
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.action} {list(self.nodes)}{' ' + self.detail if self.detail else ''}"


class Faults:
    """The faults of one cluster: its network, its disks and its processes, with every action logged.

    ``listeners`` get each :class:`FaultEvent` (a history recorder, say).
    """

    def __init__(self, cluster: JosefCluster, network: Network, disks: Disks | None) -> None:
        self.cluster = cluster
        self.network = network
        self.disks = disks
        self.events: list[FaultEvent] = []
        self.listeners: list[Callable[[FaultEvent], None]] = []

    def _event(self, action: str, nodes: Iterable[int], detail: str = "") -> None:
        event = FaultEvent(time.time(), action, tuple(nodes), detail)
        self.events.append(event)
        log.info("fault: %s", event)
        for listener in self.listeners:
            listener(event)

    def _ids(self, nodes: Iterable[int | NodeProcess]) -> list[int]:
        return [n if isinstance(n, int) else n.node_id for n in nodes]

    # Network ----------------------------------------------------------------------------------------------

    def partition(self, side: Iterable[int | NodeProcess], other: Iterable[int | NodeProcess] | None = None, *,
                  one_way: bool = False) -> None:
        """Cut ``side`` off from ``other`` (default: every other node); ``one_way`` drops only what ``side`` sends.
        Clients still reach every node."""
        side_ids = self._ids(side)
        other_ids = (self._ids(other) if other is not None
                     else [n.node_id for n in self.cluster.nodes if n.node_id not in side_ids])
        self.network.drop(side_ids, other_ids)
        if not one_way:
            self.network.drop(other_ids, side_ids)
        self._event("partition-one-way" if one_way else "partition", side_ids, f"from {other_ids}")

    def loss(self, percent: int, nodes: Iterable[int | NodeProcess] | None = None) -> None:
        """Drop ``percent`` of the packets between any two of ``nodes`` (default: all), both ways."""
        ids = self._ids(nodes) if nodes is not None else [n.node_id for n in self.cluster.nodes]
        self.network.drop(ids, ids, percent)
        self._event("loss", ids, f"{percent}%")

    def slow(self, delay_ms: int, jitter_ms: int = 0, nodes: Iterable[int | NodeProcess] | None = None) -> None:
        """Delay the links between nodes (into each of ``nodes``, default all) by ``delay_ms`` ± ``jitter_ms``."""
        ids = self._ids(nodes) if nodes is not None else [n.node_id for n in self.cluster.nodes]
        for node_id in ids:
            self.network.slow(node_id, delay_ms, jitter_ms)
        self._event("slow", ids, f"{delay_ms}±{jitter_ms} ms")

    def heal(self) -> None:
        """End every network fault."""
        self.network.heal()
        self._event("heal", [])

    # Processes -----------------------------------------------------------------------------------------------

    def kill(self, node: int | NodeProcess) -> None:
        [node_id] = self._ids([node])
        self.cluster.node(node_id).kill()
        self._event("kill", [node_id])

    def pause(self, node: int | NodeProcess) -> None:
        [node_id] = self._ids([node])
        self.cluster.node(node_id).pause()
        self._event("pause", [node_id])

    def resume(self, node: int | NodeProcess) -> None:
        [node_id] = self._ids([node])
        self.cluster.node(node_id).resume()
        self._event("resume", [node_id])

    def start(self, node: int | NodeProcess, wait: bool = True) -> None:
        [node_id] = self._ids([node])
        self.cluster.node(node_id).start(wait=wait)
        self._event("start", [node_id])

    def restart(self, node: int | NodeProcess, wait: bool = True) -> None:
        """A clean restart (SIGTERM, then start with the same properties)."""
        [node_id] = self._ids([node])
        self.cluster.node(node_id).restart(wait=wait)
        self._event("restart", [node_id])

    # Disks ---------------------------------------------------------------------------------------------------

    def fill_disk(self, node: int | NodeProcess) -> None:
        [node_id] = self._ids([node])
        self._disks().fill(node_id)
        self._event("disk-full", [node_id])

    def free_disk(self, node: int | NodeProcess) -> None:
        [node_id] = self._ids([node])
        self._disks().free(node_id)
        self._event("disk-freed", [node_id])

    def read_only(self, node: int | NodeProcess, read_only: bool = True) -> None:
        [node_id] = self._ids([node])
        self._disks().read_only(node_id, read_only)
        self._event("disk-read-only" if read_only else "disk-writable", [node_id])

    def _disks(self) -> Disks:
        if self.disks is None:
            raise RuntimeError("disk faults need a cluster made with disk_mb (a tmpfs per log directory)")
        return self.disks

    def heal_all(self) -> None:
        """End every fault that leaves a node unable to stop cleanly: network faults, full and read-only disks."""
        self.network.heal()
        if self.disks is not None:
            for node_id in self.disks.nodes:
                self.disks.read_only(node_id, False)
                self.disks.free(node_id)

    def close(self) -> None:
        """Undo everything: network, mounts. Call after the cluster's processes are stopped."""
        self.network.close()
        if self.disks is not None:
            self.disks.close()


# What the cluster says (nemesis targets are roles, resolved when the fault starts) ---------------------------------


_QUORUM_LEADER = re.compile(r"metadata quorum leader is now (\d+) in epoch (\d+)")


def active_controller(cluster: JosefCluster) -> int:
    """The metadata quorum's leader in the highest epoch any controller has logged (-1 before any has)."""
    seen = [(int(m.group(2)), int(m.group(1))) for node in cluster.controllers for line in node.lines
            if (m := _QUORUM_LEADER.search(line))]
    return max(seen)[1] if seen else -1


def partition_states(node: NodeProcess, topic: str, timeout: float = 10) -> dict[int, tuple[int, tuple[int, ...]]]:
    """``{partition: (leader, isr)}`` of ``topic`` as broker ``node`` answers Metadata now."""
    from josef.protocol.api_keys import ApiKey
    from josef.testing import RawClient

    host, port = (node.bootstrap_server or "").rsplit(":", 1)
    client = RawClient(int(port), host=host, timeout=timeout)
    try:
        [found] = client.call(ApiKey.METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                    "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False}).topics
    finally:
        client.close()
    return {p.partition_index: (p.leader_id, tuple(sorted(p.isr_nodes))) for p in found.partitions}


def group_coordinator(node: NodeProcess, group: str, timeout: float = 10) -> int:
    """The node FindCoordinator names for ``group``, asked of broker ``node``."""
    from josef.protocol.api_keys import ApiKey
    from josef.testing import RawClient

    host, port = (node.bootstrap_server or "").rsplit(":", 1)
    client = RawClient(int(port), host=host, timeout=timeout)
    try:
        [found] = client.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators
    finally:
        client.close()
    if found.error_code != 0:
        raise RuntimeError(f"FindCoordinator for {group!r} answered error {found.error_code}: {found.error_message}")
    return found.node_id


@attrs.frozen
class Step:
    """One step of a nemesis schedule: a fault, its targets by role, how long it lasts, and the pause after it."""

    fault: str
    target: str
    duration_s: float
    rest_s: float


#: Faults the nemesis knows; each takes the chosen nodes and the faults object, and returns the undo.
NEMESIS_FAULTS: dict[str, Callable[[Faults, list[int]], Callable[[], None]]] = {
    "partition": lambda f, nodes: (f.partition(nodes), f.heal)[1],
    "partition-one-way": lambda f, nodes: (f.partition(nodes, one_way=True), f.heal)[1],
    "kill": lambda f, nodes: (f.kill(nodes[0]), lambda: f.start(nodes[0]))[1],
    "pause": lambda f, nodes: (f.pause(nodes[0]), lambda: f.resume(nodes[0]))[1],
    "restart": lambda f, nodes: (f.restart(nodes[0]), lambda: None)[1],
    "loss": lambda f, nodes: (f.loss(10), f.heal)[1],
    "slow": lambda f, nodes: (f.slow(200, 50), f.heal)[1],  # needs a network made with latency=True
}


def standard_targets(cluster: JosefCluster, topic: str) -> dict[str, Callable[[random.Random], list[int]]]:
    """Nemesis roles for ``cluster``: ``any`` node, the ``leader`` of a random partition of ``topic`` and the
    active ``controller``, each resolved when its fault starts."""

    def running_broker() -> NodeProcess:
        return next(n for n in cluster.brokers if n.running)

    def leader(rnd: random.Random) -> list[int]:
        states = partition_states(running_broker(), topic)
        led = [leader for _, (leader, _) in sorted(states.items()) if leader >= 0]
        return [rnd.choice(led)] if led else [rnd.choice(cluster.nodes).node_id]

    def controller(rnd: random.Random) -> list[int]:
        found = active_controller(cluster)
        return [found] if found >= 0 else [rnd.choice(cluster.controllers).node_id]

    return {"any": lambda rnd: [rnd.choice(cluster.nodes).node_id], "leader": leader, "controller": controller}


class Nemesis:
    """Faults on a schedule drawn from ``seed``: the same seed gives the same faults in the same order.

    ``targets`` maps a role name to a function choosing node ids at the time
    of the fault (``"leader"`` for the current leader of a partition,
    ``"controller"`` for the active controller, ``"any"`` for a random node),
    since which node leads is only known then; the role drawn is part of the
    schedule, the node it resolves to is logged. Run it in a thread with
    :meth:`run` or step by step with :meth:`schedule` and :meth:`apply`.
    """

    def __init__(self, faults: Faults, seed: int, *, kinds: Sequence[str] = tuple(NEMESIS_FAULTS),
                 targets: Mapping[str, Callable[[random.Random], list[int]]],
                 duration_s: tuple[float, float] = (3.0, 8.0), rest_s: tuple[float, float] = (3.0, 6.0)) -> None:
        unknown = set(kinds) - set(NEMESIS_FAULTS)
        if unknown:
            raise ValueError(f"unknown nemesis faults {sorted(unknown)}; known: {sorted(NEMESIS_FAULTS)}")
        self.faults = faults
        self.seed = seed
        self.kinds = list(kinds)
        self.targets = dict(targets)
        self.duration_s = duration_s
        self.rest_s = rest_s
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.steps: list[Step] = []
        self.errors: list[str] = []

    def schedule(self, count: int) -> list[Step]:
        """The next ``count`` steps, drawn from the seed."""
        steps = [Step(self._random.choice(self.kinds), self._random.choice(sorted(self.targets)),
                      round(self._random.uniform(*self.duration_s), 2), round(self._random.uniform(*self.rest_s), 2))
                 for _ in range(count)]
        self.steps += steps
        return steps

    def apply(self, step: Step) -> None:
        """Inject one step's fault, hold it for its duration (or until stopped), undo it, rest."""
        nodes = self.targets[step.target](self._random)
        undo = NEMESIS_FAULTS[step.fault](self.faults, nodes)
        try:
            self._stop.wait(step.duration_s)
        finally:
            undo()
        self._stop.wait(step.rest_s)

    def run(self, count: int) -> None:
        """Apply ``count`` scheduled steps in a background thread; :meth:`stop` ends it, healing the current fault."""
        steps = self.schedule(count)

        def loop() -> None:
            for step in steps:
                if self._stop.is_set():
                    break
                try:
                    self.apply(step)
                except Exception as exc:  # a fault that could not be injected is reported, not hidden
                    self.errors.append(f"{step}: {exc}")
                    log.exception("nemesis step %s failed", step)

        self._thread = threading.Thread(target=loop, name=f"josef-nemesis-{self.seed}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 120) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
