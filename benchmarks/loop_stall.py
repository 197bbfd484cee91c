"""How long a node's event loop stops answering while it creates, deletes or moves thousands of partitions.

    cd /work/main && uv run python benchmarks/loop_stall.py                        # create-delete, 2,000 partitions
    cd /work/main && uv run python benchmarks/loop_stall.py --partitions 500
    cd /work/main && uv run python benchmarks/loop_stall.py --scenario leadership  # 2,000 leaders move
    cd /work/main && uv run python benchmarks/loop_stall.py --scenario snapshot    # 100,000-partition snapshots
    cd /work/main && uv run python benchmarks/loop_stall.py --scenario controller-failover

One event loop answers every client of a node, so anything that runs on it for long (file
creation and fsyncs for new partitions, deleting their directories, a snapshot) delays every
request of every client by as long. A probe thread sends ApiVersions over its own connection
every ``--interval-ms`` and records each round trip; the longest round trip in a phase is the
loop's longest stall then, within one interval. Scenarios (``--scenario``):

* **create-delete** (a fresh default broker): *create* is a CreateTopics of ``--partitions``
  partitions (each becomes a leader here: log directories, segment and index files), until the
  broker hosts every one (DescribeLogDirs lists it); *delete* is DeleteTopics of that topic, until
  the broker hosts none and no live directory of it is left.
* **leadership** (a controller and two brokers, separate processes): ``--partitions`` partitions
  with replicas on both brokers, the first one leading all; *leadership* is a clean stop of that
  broker (its controlled shutdown moves every leader), probed on the broker that gains them,
  until its metadata names it leader of all.
* **snapshot** (a controller-only node and a stand-in broker: this process registers and
  heartbeats as broker 2, so the controller places replicas without any broker opening a log):
  topics of ``--topic-partitions`` (500) partitions up to ``--partitions`` (100,000 by default here) are
  created, probed on the controller, with ``metadata.log.max.record.bytes.between.snapshots`` at
  ``--snapshot-bytes``, so the controller writes snapshots of ever larger images meanwhile; the
  node's log says when each was written.
* **controller-failover** (three controllers and a broker hosting ``--partitions`` partitions):
  *failover* is a kill -9 of the active controller, probed on the broker, until another
  controller is elected (the others' logs say so) and two more seconds have passed.

Goal (issue 20): the longest stall at most 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import struct
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from confluent_kafka.admin import AdminClient, NewTopic

from josef.node.cluster import JosefCluster
from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import encode_request
from josef.testing import RawClient

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import Broker, machine  # noqa: E402  (the sibling benchmark's helpers)
from request_cost import receive  # noqa: E402

GOAL_MS = 50
METADATA = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


class Probe(threading.Thread):
    """ApiVersions round trips every ``interval`` seconds; ``mark(phase)`` starts a new phase."""

    def __init__(self, bootstrap: str, interval: float) -> None:
        super().__init__(daemon=True)
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.interval = interval
        self.frame = encode_request(ApiKey.API_VERSIONS, 3, 1, b"loop-stall",
                                    {"client_software_name": "loop-stall", "client_software_version": "1"})
        self.phase = "idle"
        self.samples: dict[str, list[float]] = {}
        self.stopping = threading.Event()

    def mark(self, phase: str) -> None:
        self.phase = phase

    def run(self) -> None:
        while not self.stopping.is_set():
            start = time.perf_counter()
            try:
                self.sock.sendall(self.frame)
                receive(self.sock, struct.unpack(">i", receive(self.sock, 4))[0])
            except OSError:
                return  # the node stopped: the phases so far stand
            self.samples.setdefault(self.phase, []).append(time.perf_counter() - start)
            time.sleep(max(self.interval - (time.perf_counter() - start), 0))

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        self.sock.close()


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"probes": len(ordered), "p50_ms": ordered[len(ordered) // 2] * 1000,
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, "max_ms": ordered[-1] * 1000}


def wait_until(what: str, done: Callable[[], bool], timeout: float, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting until {what}")
        time.sleep(every)


def hosted(client: RawClient, topic: str) -> int:
    """How many partitions of ``topic`` the broker hosts (DescribeLogDirs lists hosted partitions only)."""
    answer = client.call(ApiKey.DESCRIBE_LOG_DIRS, 2, {"topics": None})
    return sum(len(t.partitions) for r in answer.results for t in r.topics if t.name == topic)


def led_by(client: RawClient, topic: str, node_id: int) -> int:
    answer = client.call(ApiKey.METADATA, 12, METADATA)
    return sum(p.leader_id == node_id for t in answer.topics if t.name == topic for p in t.partitions)


def port_of(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


LEADER_LINE = re.compile(r"metadata quorum leader is now (\d+) in epoch (\d+)")


def quorum_leader(controllers: list[Any]) -> int:
    """The active controller: the leader of the newest epoch the other controllers logged (-1: none yet)."""
    seen = [(int(epoch), int(leader)) for node in controllers for leader, epoch in LEADER_LINE.findall(node.log)]
    return max(seen)[1] if seen else -1


# Scenarios: each returns the probe (stopped) and notes to print -----------------------------------


def create_delete(args: argparse.Namespace) -> tuple[Probe, dict[str, Any]]:
    notes: dict[str, Any] = {}
    with Broker({}, start_timeout=60) as broker:
        client = RawClient(port_of(broker.bootstrap), timeout=120)
        probe = Probe(broker.bootstrap, args.interval_ms / 1000)
        probe.start()
        time.sleep(args.idle_seconds)
        probe.mark("create")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        start = time.perf_counter()
        admin.create_topics([NewTopic("stall", args.partitions, 1)], operation_timeout=300,
                            request_timeout=310)["stall"].result(320)
        wait_until("every partition is hosted", lambda: hosted(client, "stall") == args.partitions, 300)
        notes["create_s"] = time.perf_counter() - start
        probe.mark("delete")
        start = time.perf_counter()
        admin.delete_topics(["stall"])["stall"].result(300)
        live = re.compile(r"stall-\d+$")
        wait_until("no partition is hosted and no live directory is left",
                   lambda: hosted(client, "stall") == 0 and not any(live.match(p) for p in os.listdir(broker.data_dir)),
                   300)
        notes["delete_s"] = time.perf_counter() - start
        probe.mark("after")
        time.sleep(1)
        probe.stop()
        client.sock.close()
    return probe, notes


def cluster(scratch: str, **kwargs: Any) -> JosefCluster:
    os.sync()
    return JosefCluster(Path(scratch), start_timeout=120, **kwargs).start()


def leadership(args: argparse.Namespace) -> tuple[Probe, dict[str, Any]]:
    notes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="josef-stall-") as scratch:
        nodes = cluster(scratch, controllers=1, brokers=2)
        try:
            first, second = nodes.brokers
            gaining = RawClient(second.listener("PLAINTEXT")[1], timeout=300)  # type: ignore[index]
            answer = gaining.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 300_000, "validate_only": False, "topics": [
                {"name": "stall", "num_partitions": -1, "replication_factor": -1, "configs": [], "assignments": [
                    {"partition_index": i, "broker_ids": [first.node_id, second.node_id]}
                    for i in range(args.partitions)]}]})
            if answer.topics[0].error_code != 0:
                raise SystemExit(f"CreateTopics failed: {answer.topics[0].error_code!r}")
            wait_until("the second broker hosts every partition", lambda: hosted(gaining, "stall") == args.partitions,
                       600, 0.2)
            wait_until("the first broker leads every partition",
                       lambda: led_by(gaining, "stall", first.node_id) == args.partitions, 300, 0.2)
            probe = Probe(second.bootstrap_server, args.interval_ms / 1000)  # type: ignore[arg-type]
            probe.start()
            time.sleep(args.idle_seconds)
            probe.mark("leadership")
            start = time.perf_counter()
            stopper = threading.Thread(target=first.stop, daemon=True)
            stopper.start()
            wait_until("the second broker leads every partition",
                       lambda: led_by(gaining, "stall", second.node_id) == args.partitions, 300, 0.02)
            notes["moved_s"] = time.perf_counter() - start
            probe.mark("after")
            time.sleep(1)
            stopper.join(120)
            probe.stop()
            gaining.sock.close()
        finally:
            nodes.stop()
    return probe, notes


def features(versions: Any) -> dict[str, tuple[int, int]]:
    """What a broker must support to register: every feature the node supports, and at least each finalized level."""
    found = {f.name: (f.min_version, f.max_version) for f in versions.supported_features}
    for f in versions.finalized_features:
        low, high = found.get(f.name, (f.max_version_level, f.max_version_level))
        found[f.name] = (min(low, f.max_version_level), max(high, f.max_version_level))
    return found


class StandInBroker(threading.Thread):
    """Broker ``node_id`` as far as the controller knows: registered, heartbeating, caught up, unfenced."""

    def __init__(self, port: int, node_id: int, cluster_id: str) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port, timeout=60)
        versions = self.client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "loop-stall",
                                                             "client_software_version": "1"})
        answer = self.client.call(ApiKey.BROKER_REGISTRATION, 3, {
            "broker_id": node_id, "cluster_id": cluster_id, "incarnation_id": uuid.uuid4(),
            "listeners": [{"name": "PLAINTEXT", "host": "127.0.0.1", "port": 9, "security_protocol": 0}],
            "features": [{"name": name, "min_supported_version": low, "max_supported_version": high}
                         for name, (low, high) in features(versions).items()],
            "rack": None, "is_migrating_zk_broker": False, "log_dirs": [uuid.uuid4()], "previous_broker_epoch": -1})
        if answer.error_code != 0:
            raise SystemExit(f"the stand-in broker could not register: {answer.error_code!r}")
        self.node_id, self.epoch = node_id, answer.broker_epoch
        self.unfenced = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            answer = self.client.call(ApiKey.BROKER_HEARTBEAT, 1, {
                "broker_id": self.node_id, "broker_epoch": self.epoch, "current_metadata_offset": 2 ** 62,
                "want_fence": False, "want_shut_down": False, "offline_log_dirs": []})
            if answer.error_code == 0 and not answer.is_fenced:
                self.unfenced.set()
            self.stopping.wait(0.5)


def snapshot(args: argparse.Namespace) -> tuple[Probe, dict[str, Any]]:
    notes: dict[str, Any] = {}
    overrides = {"metadata.log.max.record.bytes.between.snapshots": str(args.snapshot_bytes)}
    with tempfile.TemporaryDirectory(prefix="josef-stall-") as scratch:
        nodes = cluster(scratch, controllers=1, overrides=overrides)
        try:
            controller = nodes.controllers[0]
            port = controller.listener("CONTROLLER")[1]  # type: ignore[index]
            stand_in = StandInBroker(port, 2, nodes.cluster_id or "")
            stand_in.start()
            wait_until("the stand-in broker is unfenced", stand_in.unfenced.is_set, 30)
            admin = RawClient(port, timeout=300)
            probe = Probe(f"127.0.0.1:{port}", args.interval_ms / 1000)
            probe.start()
            time.sleep(args.idle_seconds)
            probe.mark("create")
            start = time.perf_counter()
            made = 0
            while made < args.partitions:
                count = min(args.topic_partitions, args.partitions - made)
                answer = admin.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 300_000, "validate_only": False, "topics": [
                    {"name": f"stall-{made}", "num_partitions": count, "replication_factor": 1, "assignments": [],
                     "configs": []}]})
                if answer.topics[0].error_code != 0:
                    raise SystemExit(f"CreateTopics failed: {answer.topics[0].error_code!r} "
                                     f"{answer.topics[0].error_message}")
                made += count
            notes["create_s"] = time.perf_counter() - start
            probe.mark("after")
            time.sleep(2)
            probe.stop()
            stand_in.stopping.set()
            stand_in.join(10)
            written = re.findall(r"metadata snapshot (\d+)-\d+ written(.*)", controller.log)
            notes["snapshots"] = [f"at offset {offset}{rest}" for offset, rest in written]
            admin.sock.close()
        finally:
            nodes.stop()
    return probe, notes


def controller_failover(args: argparse.Namespace) -> tuple[Probe, dict[str, Any]]:
    notes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="josef-stall-") as scratch:
        nodes = cluster(scratch, controllers=3, brokers=1)
        try:
            broker = nodes.brokers[0]
            client = RawClient(broker.listener("PLAINTEXT")[1], timeout=120)  # type: ignore[index]
            if args.partitions:
                admin = AdminClient({"bootstrap.servers": nodes.bootstrap_servers})
                admin.create_topics([NewTopic("stall", args.partitions, 1)], operation_timeout=300,
                                    request_timeout=310)["stall"].result(320)
                wait_until("the broker hosts every partition", lambda: hosted(client, "stall") == args.partitions,
                           300, 0.2)
            active = quorum_leader(nodes.controllers)
            probe = Probe(broker.bootstrap_server, args.interval_ms / 1000)  # type: ignore[arg-type]
            probe.start()
            time.sleep(args.idle_seconds)
            probe.mark("failover")
            start = time.perf_counter()
            nodes.node(active).kill()
            wait_until("another controller is elected",
                       lambda: quorum_leader([n for n in nodes.controllers if n.node_id != active]) not in (active, -1),
                       120, 0.02)
            notes["new_controller_s"] = time.perf_counter() - start
            time.sleep(2)  # the broker finds the new controller and heartbeats to it
            probe.mark("after")
            time.sleep(1)
            probe.stop()
            client.sock.close()
        finally:
            nodes.stop()
    return probe, notes


SCENARIOS = {"create-delete": create_delete, "leadership": leadership, "snapshot": snapshot,
             "controller-failover": controller_failover}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=SCENARIOS, default="create-delete")
    parser.add_argument("--partitions", type=int, help="partitions created (default 2,000; 100,000 for snapshot)")
    parser.add_argument("--topic-partitions", type=int, default=500, help="snapshot: partitions per topic")
    parser.add_argument("--snapshot-bytes", type=int, default=1024 * 1024,
                        help="snapshot: metadata.log.max.record.bytes.between.snapshots")
    parser.add_argument("--interval-ms", type=float, default=5, help="time between probes")
    parser.add_argument("--idle-seconds", type=float, default=2, help="length of the idle phase")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    args = parser.parse_args()
    if args.partitions is None:
        args.partitions = 100_000 if args.scenario == "snapshot" else 2000
    probe, notes = SCENARIOS[args.scenario](args)
    figures = {phase: summary(samples) for phase, samples in probe.samples.items()}
    print(f"event-loop stalls, {args.scenario}, {args.partitions:,} partitions, a probe every {args.interval_ms:g} ms "
          f"({', '.join(f'{k} {v:.1f}' for k, v in notes.items() if isinstance(v, float))}):")
    for phase, row in figures.items():
        flag = "" if row["max_ms"] <= GOAL_MS else f"  (goal <= {GOAL_MS} ms: MISS)"
        print(f"  {phase:10} {row['probes']:6,} probes  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
              f"max {row['max_ms']:8.1f} ms{flag}")
    for line in notes.get("snapshots", []):
        print(f"  snapshot written {line}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine(), "parameters": vars(args), "notes": notes, "phases": figures}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
