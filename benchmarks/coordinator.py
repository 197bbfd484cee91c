"""Group coordinator benchmark: offset commits per second from many concurrent members on one coordinator partition.

    cd /work/main && uv run python benchmarks/coordinator.py                      # 3 combined nodes, 64 members, 20 s
    cd /work/main && uv run python benchmarks/coordinator.py --nodes 1 --members 16 --seconds 5 --json out.json

A fresh cluster of ``--nodes`` combined josef processes (``josef.node.cluster.JosefCluster``,
free ports of 127.0.0.1) with ``__consumer_offsets`` of one partition, replicated
to every node (``min.insync.replicas`` 2 with 3 nodes), so every group lives on one
coordinator shard. ``--members`` threads, each with its own connection to the
coordinator, commit the offset of their own partition of one topic in a loop
(OffsetCommit v9, a "simple" group per member, as admin tools and consumers
that assign partitions themselves commit), each waiting for its answer before
the next commit, for ``--seconds``. Reported: commits/s, the latency of a commit
(p50, p99), and how many records went into each record batch of
``__consumer_offsets`` (the runtime batches writes that arrive together).

To compare with another josef, run this file with that tree first on the path:
``PYTHONPATH=/tree/packages/core/src:/tree/packages/coordinator-group/src:... uv run python benchmarks/coordinator.py``
(the node processes inherit the environment).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from josef.node.cluster import JosefCluster
from josef.protocol.api_keys import ApiKey
from josef.protocol.records import iter_batches
from josef.testing import RawClient

OFFSETS = "__consumer_offsets"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def wait_for(what: str, check, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout}s")
        time.sleep(0.2)


def connect(node) -> RawClient:
    return RawClient(node.listener("PLAINTEXT")[1], timeout=60, client_id="bench")


def commit_body(group: str, partition: int, offset: int) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "retention_time": -1, "topics": [{"name": "orders", "partitions": [
                {"partition_index": partition, "committed_offset": offset, "committed_leader_epoch": 0,
                 "committed_metadata": "", "commit_timestamp": -1}]}]}


def setup(cluster: JosefCluster, members: int) -> Any:
    """Create the topic and the offsets partition; the coordinator's node."""
    admin = connect(cluster.brokers[0])
    created = admin.call(ApiKey.CREATE_TOPICS, 7, {"topics": [{
        "name": "orders", "num_partitions": members, "replication_factor": 1, "assignments": [], "configs": []}],
        "timeout": 30000, "validate_only": False})
    assert created.topics[0].error_code == ErrorCode.none, created
    found = wait_for("a group coordinator", lambda: (a := admin.call(
        ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["bench"]}).coordinators[0])
        .error_code == ErrorCode.none and a)
    admin.close()
    coordinator = cluster.node(found.node_id)
    client = connect(coordinator)
    replicas = len(cluster.brokers)

    def offsets_ready() -> bool:
        answer = client.call(ApiKey.METADATA, 12, {"topics": [{"name": OFFSETS, "topic_id": None}],
                                                   "allow_auto_topic_creation": False,
                                                   "include_topic_authorized_operations": False})
        partitions = answer.topics[0].partitions if answer.topics else ()
        return bool(partitions) and len(partitions[0].isr_nodes) == replicas
    wait_for("the offsets partition in sync", offsets_ready)
    # The first commit waits for the shard to load.
    wait_for("the coordinator loaded", lambda: client.call(ApiKey.OFFSET_COMMIT, 9, commit_body("warm", 0, 0))
             .topics[0].partitions[0].error_code == ErrorCode.none)
    client.close()
    return coordinator


def run(coordinator: Any, members: int, seconds: float) -> dict[str, Any]:
    latencies: list[list[float]] = [[] for _ in range(members)]
    errors: list[str] = []
    start = threading.Barrier(members + 1)
    stop = time.monotonic() + seconds + 1e9  # set for real once every thread is connected

    def member(index: int) -> None:
        client = connect(coordinator)
        offset = 0
        try:
            start.wait()
            while time.monotonic() < stop:
                offset += 1
                began = time.perf_counter()
                answer = client.call(ApiKey.OFFSET_COMMIT, 9, commit_body(f"member-{index}", index, offset))
                latencies[index].append(time.perf_counter() - began)
                code = answer.topics[0].partitions[0].error_code
                if code != ErrorCode.none:
                    errors.append(f"member {index}: {code.name}")
                    return
        finally:
            client.close()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    stop = began + seconds
    for thread in threads:
        thread.join(seconds + 120)
    elapsed = time.monotonic() - began
    if errors:
        raise RuntimeError(f"commits failed: {errors[:5]}")
    every = sorted(x for per in latencies for x in per)
    return {"commits": len(every), "seconds": round(elapsed, 2), "commits_per_s": round(len(every) / elapsed, 1),
            "latency_p50_ms": round(every[len(every) // 2] * 1000, 2),
            "latency_p99_ms": round(every[int(len(every) * 0.99)] * 1000, 2)}


def batch_sizes(coordinator: Any) -> dict[str, Any]:
    """Records per record batch of ``__consumer_offsets``-0, read back from the coordinator."""
    client = connect(coordinator)
    counts: list[int] = []
    offset = 0
    try:
        while True:
            answer = client.call(ApiKey.FETCH, 12, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 64 << 10, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": OFFSETS, "partitions": [{
                    "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
                    "log_start_offset": -1, "partition_max_bytes": 64 << 10}]}]})
            data = bytes(answer.responses[0].partitions[0].records or b"")
            batches = list(iter_batches(data))
            if not batches:
                break
            for _, header in batches:
                if not header.is_control:
                    counts.append(header.last_offset - header.base_offset + 1)
                offset = header.last_offset + 1
    finally:
        client.close()
    return {"batches": len(counts), "records_per_batch_mean": round(statistics.mean(counts), 2) if counts else 0,
            "records_per_batch_max": max(counts, default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="combined josef nodes (the offsets partition's replicas)")
    parser.add_argument("--members", type=int, default=64, help="concurrent committers")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--linger-ms", type=int, default=None, help="group.coordinator.append.linger.ms (default: josef's)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    overrides = {
        "offsets.topic.num.partitions": "1",
        "offsets.topic.replication.factor": str(args.nodes),
        "min.insync.replicas": str(min(2, args.nodes)),
        "auto.leader.rebalance.enable": "false",
    }
    if args.linger_ms is not None:
        overrides["group.coordinator.append.linger.ms"] = str(args.linger_ms)
    with tempfile.TemporaryDirectory(prefix="josef-bench-coordinator-") as scratch:
        cluster = JosefCluster(Path(scratch), combined=args.nodes, overrides=overrides)
        cluster.start()
        try:
            progress(f"{args.nodes} node(s) ready; {args.members} members commit for {args.seconds}s")
            coordinator = setup(cluster, args.members)
            figures = run(coordinator, args.members, args.seconds)
            figures.update(batch_sizes(coordinator))
        finally:
            cluster.stop()
    import josef

    figures.update(nodes=args.nodes, members=args.members, josef=os.path.dirname(josef.__file__))
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
