"""What one request costs the broker: Produce and Fetch over a raw socket, broker CPU per request.

    cd /work/main && uv run python benchmarks/request_cost.py                  # every scenario, fresh broker
    cd /work/main && uv run python benchmarks/request_cost.py --only fetch --partitions 100,1000
    cd /work/main && uv run python benchmarks/request_cost.py --bootstrap 127.0.0.1:9092 --broker-pid 1234

OMB-shaped workloads (omb.py) are decided by the cost of each small request and of each
partition named in it, not by bandwidth. This script isolates that cost: one socket sends the
same request again and again, one at a time (``--depth 1``, as librdkafka's producer does at
low rates) or several in flight, and the broker's CPU seconds (/proc, all its threads) over the
loop are divided by the requests answered. Scenarios:

* **fetch N**: a Fetch v11 naming N partitions of one topic, every one caught up (fetch offset
  = high watermark, ``max_wait`` 0): the cost of a consumer's poll when nothing changed, per
  partition named (``--isolation 1`` asks as librdkafka's consumers do, read_committed);
* **produce N**: a Produce v9, acks=1, of one 1 KB batch to each of N partitions.

The client is a plain socket in this process, cheap next to the broker; figures are still
noisy on a shared 2-core machine, so compare runs made one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from typing import Any

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import encode_request
from josef.protocol.records import build_batch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import Broker, cpu_seconds_of, create_topic, machine  # noqa: E402  (the sibling benchmark's helpers)


def receive(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def loop(bootstrap: str, pids: list[int], frame: bytes, count: int, depth: int) -> dict[str, float]:
    """Send ``frame`` ``count`` times, ``depth`` in flight; requests per second and broker CPU per request."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(frame)  # a first round trip outside the measure (connection, first-use imports)
        receive(sock, struct.unpack(">i", receive(sock, 4))[0])
        cpu, start = cpu_seconds_of(pids), time.perf_counter()
        for _ in range(min(depth, count)):
            sock.sendall(frame)
        for i in range(count):
            receive(sock, struct.unpack(">i", receive(sock, 4))[0])
            if i + depth < count:
                sock.sendall(frame)
        elapsed, cpu = time.perf_counter() - start, cpu_seconds_of(pids) - cpu
    return {"requests_per_s": count / elapsed, "broker_us_per_request": cpu / count * 1e6}


def fetch_frame(topic: str, partitions: int, isolation: int) -> bytes:
    return encode_request(ApiKey.FETCH, 11, 1, b"request-cost", {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 50 << 20, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [
            {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
             "log_start_offset": -1} for p in range(partitions)]}]})


def produce_frame(topic: str, partitions: int) -> bytes:
    batch = build_batch([(None, os.urandom(1024), int(time.time() * 1000))])
    return encode_request(ApiKey.PRODUCE, 9, 1, b"request-cost", {
        "transactional_id": None, "acks": 1, "timeout": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": p, "records": batch} for p in range(partitions)]}]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="fetch,produce", help="comma-separated: fetch, produce")
    parser.add_argument("--partitions", default="1,10,100,1000", help="partition counts named per request")
    parser.add_argument("--depth", default="1,8", help="requests in flight (comma-separated)")
    parser.add_argument("--partition-visits", type=int, default=200_000,
                        help="requests per scenario are this divided by the partitions named (at least 200)")
    parser.add_argument("--isolation", type=int, choices=(0, 1), default=0,
                        help="fetch isolation level: 0 read_uncommitted, 1 read_committed (librdkafka's default)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="a running broker instead of a fresh one")
    parser.add_argument("--broker-pid", type=int, action="append", default=[], help="with --bootstrap: its PID(s)")
    parser.add_argument("--json", metavar="FILE", help="write machine, parameters and figures as JSON")
    args = parser.parse_args()
    scenarios = args.only.split(",")
    counts = [int(n) for n in args.partitions.split(",")]
    depths = [int(d) for d in args.depth.split(",")]
    results: list[dict[str, Any]] = []

    def run(bootstrap: str, pids: list[int]) -> None:
        for n in counts:
            topic = f"request-cost-{os.getpid()}-{n}"
            create_topic(bootstrap, topic, n, 60)
            requests = max(args.partition_visits // n, 200)
            for scenario in scenarios:
                frame = fetch_frame(topic, n, args.isolation) if scenario == "fetch" else produce_frame(topic, n)
                for depth in depths if scenario == "produce" else [1]:
                    figures = loop(bootstrap, pids, frame, requests, depth)
                    row = {"scenario": scenario, "partitions": n, "depth": depth, "requests": requests, **figures,
                           "broker_us_per_partition": figures["broker_us_per_request"] / n}
                    results.append(row)
                    print(f"{scenario:8} {n:5} partitions  depth {depth}  {figures['requests_per_s']:9,.0f} req/s  "
                          f"{figures['broker_us_per_request']:9,.0f} us/request  "
                          f"{row['broker_us_per_partition']:7.2f} us/partition", flush=True)

    if args.bootstrap:
        run(args.bootstrap, args.broker_pid)
    else:
        with Broker({}, start_timeout=60) as broker:
            run(broker.bootstrap, broker.pids())
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"machine": machine(), "parameters": vars(args), "results": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
