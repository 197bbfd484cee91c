"""How long the broker's event loop stops answering while it creates and deletes thousands of partitions.

    cd /work/main && uv run python benchmarks/loop_stall.py                 # 2,000 partitions
    cd /work/main && uv run python benchmarks/loop_stall.py --partitions 500

One event loop answers every client of a node, so anything that runs on it for long (file
creation and fsyncs for new partitions, deleting their directories, a snapshot) delays every
request of every client by as long. A probe thread sends ApiVersions over its own connection
every ``--interval-ms`` and records each round trip; the longest round trip in a phase is the
loop's longest stall then, within one interval. Phases on a fresh default broker:

* **idle**: nothing else happens;
* **create**: CreateTopics of ``--partitions`` partitions (each becomes a leader here: log
  directories, segment and index files, leader-epoch checkpoints), until every leader is known;
* **delete**: DeleteTopics of that topic, until the broker no longer lists it.

Goal (issue 20): the longest stall at most 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time

from confluent_kafka.admin import AdminClient

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import encode_request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import Broker, create_topic, machine  # noqa: E402  (the sibling benchmark's helpers)
from request_cost import receive  # noqa: E402


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
            self.sock.sendall(self.frame)
            receive(self.sock, struct.unpack(">i", receive(self.sock, 4))[0])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=2000, help="partitions created, then deleted")
    parser.add_argument("--interval-ms", type=float, default=5, help="time between probes")
    parser.add_argument("--idle-seconds", type=float, default=2, help="length of the idle phase")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    args = parser.parse_args()
    with Broker({}, start_timeout=60) as broker:
        probe = Probe(broker.bootstrap, args.interval_ms / 1000)
        probe.start()
        time.sleep(args.idle_seconds)
        probe.mark("create")
        start = time.perf_counter()
        create_topic(broker.bootstrap, "stall", args.partitions, 300)
        created_s = time.perf_counter() - start
        probe.mark("delete")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        start = time.perf_counter()
        admin.delete_topics(["stall"])["stall"].result(300)
        while "stall" in admin.list_topics(timeout=30).topics:
            time.sleep(0.05)
        deleted_s = time.perf_counter() - start
        probe.mark("after")
        time.sleep(1)
        probe.stop()
    figures = {phase: summary(samples) for phase, samples in probe.samples.items()}
    print(f"event-loop stalls, {args.partitions} partitions, a probe every {args.interval_ms:g} ms "
          f"(create took {created_s:.1f} s, delete {deleted_s:.1f} s):")
    for phase, row in figures.items():
        flag = "" if row["max_ms"] <= 50 else "  (goal <= 50 ms: MISS)"
        print(f"  {phase:7} {row['probes']:6,} probes  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
              f"max {row['max_ms']:8.1f} ms{flag}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine(), "parameters": vars(args), "created_s": created_s,
                       "deleted_s": deleted_s, "phases": figures}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
