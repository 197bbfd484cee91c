"""KRaft metadata benchmark: records committed per second, election time, start-up from a large snapshot.

    cd /work/main && uv run python benchmarks/metadata_quorum.py                 # all three
    cd /work/main && uv run python benchmarks/metadata_quorum.py --partitions 20000 --elections 3

* **commit**: metadata records per second through a single voter (in-process, fsync per commit), in
  commits of 1 and of 100 records, and through a 3-voter quorum of real processes (CreateTopics of
  one-partition topics, 3 records each, sent to a broker and forwarded to the active controller).
* **election**: SIGKILL of the active controller of 3 controller processes, then the time until a
  surviving controller answers DescribeQuorum as leader (median and max over ``--elections`` runs).
* **snapshot start**: a snapshot holding ``--partitions`` partitions (100 per topic) is written,
  then the time for a node's quorum to load it into the metadata image.

Figures depend on the machine: compare runs on the same one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from josef.metadata.meta_properties import check
from josef.metadata.image import MetadataImage
from josef.metadata.records import PartitionRecord, TopicRecord
from josef.plugins import collect, get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.node.server_properties import load_config
from josef.testing import JosefCluster, RawClient
from josef_metadata_kraft.kraft_quorum import METADATA_LOG_CONFIG, METADATA_PARTITION, KRaftQuorum
from josef_metadata_kraft.metadata_log import MetadataLog
from josef_metadata_kraft.raft import OffsetAndEpoch
from josef_metadata_kraft.snapshots import build_snapshot


class Image:
    """The smallest metadata listener: it keeps the image."""

    def __init__(self) -> None:
        self.current = MetadataImage()

    def on_commit(self, offset, records):  # type: ignore[no-untyped-def]
        self.current, _ = self.current.apply(offset, records)

    def on_snapshot(self, offset, records):  # type: ignore[no-untyped-def]
        self.current, _ = MetadataImage().apply(offset, records)

    def current_image(self) -> MetadataImage:
        return self.current


def _storage(config):  # type: ignore[no-untyped-def]
    return collect(get_plugin_manager(), "register_log_storage", "log storage").get("local")(config)


def single_voter_commits(directory: Path, commits: int, per_commit: int) -> float:
    config = load_config(None, {"log.dirs": str(directory)})
    check(config, auto_format=True)

    async def run() -> float:
        storage = _storage(config)
        quorum = KRaftQuorum(config, storage)
        async with anyio.create_task_group() as tg:
            await quorum.start(Image(), tg)
            started = time.perf_counter()
            for i in range(commits):
                await quorum.append([TopicRecord(name=f"t{i}-{j}", topic_id=uuid.uuid4()) for j in range(per_commit)])
            elapsed = time.perf_counter() - started
            tg.cancel_scope.cancel()
        await quorum.close()
        storage.close()
        return commits * per_commit / elapsed

    return anyio.run(run)


def cluster_commits(directory: Path, topics: int) -> float:
    with JosefCluster(directory, controllers=3, brokers=1) as cluster:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        started = time.perf_counter()
        futures = admin.create_topics([NewTopic(f"bench-{i}", 1, 1) for i in range(topics)], operation_timeout=60)
        for future in futures.values():
            future.result(120)
        elapsed = time.perf_counter() - started
    # Each topic is a TopicRecord and a PartitionRecord, each CreateTopics a commit of both.
    return topics * 2 / elapsed


def kraft_leader(nodes) -> int | None:  # type: ignore[no-untyped-def]
    """The node among ``nodes`` that answers DescribeQuorum as the leader (None: none does)."""
    for node in nodes:
        host, port = node.listener("CONTROLLER")
        try:
            client = RawClient(port, host, timeout=2)
            answer = client.call(ApiKey.DESCRIBE_QUORUM, 2, {"topics": [
                {"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]})
            client.close()
        except OSError:
            continue
        partition = answer.topics[0].partitions[0]
        if partition.error_code == ErrorCode.none and partition.leader_id == node.node_id:
            return node.node_id
    return None


def election_times(directory: Path, runs: int) -> list[float]:
    times = []
    with JosefCluster(directory, controllers=3, brokers=0) as cluster:
        cluster.start()
        for _ in range(runs):
            leader = None
            while leader is None:
                leader = kraft_leader(cluster.controllers)
            killed_at = time.monotonic()
            cluster.node(leader).kill()
            survivors = [n for n in cluster.controllers if n.node_id != leader]
            while kraft_leader(survivors) is None:
                time.sleep(0.01)
            times.append(time.monotonic() - killed_at)
            cluster.node(leader).restart()
    return times


def snapshot_start(directory: Path, partitions: int) -> tuple[float, int]:
    config = load_config(None, {"log.dirs": str(directory)})
    check(config, auto_format=True)
    records = []
    for t in range(partitions // 100):
        topic_id = uuid.uuid4()
        records.append(TopicRecord(name=f"topic-{t}", topic_id=topic_id))
        records += [PartitionRecord(partition_id=p, topic_id=topic_id, replicas=(1, 2, 3), isr=(1, 2, 3), leader=1,
                                    leader_epoch=0, partition_epoch=0) for p in range(100)]
    image, _ = MetadataImage().apply(len(records) - 1, records)
    storage = _storage(config)
    log = MetadataLog(storage.open(METADATA_PARTITION, METADATA_LOG_CONFIG))
    snapshot_id = OffsetAndEpoch(len(records), 1)
    data = build_snapshot(image, snapshot_id)
    log.install_snapshot(snapshot_id, data)
    storage.close()

    async def run() -> float:
        storage = _storage(config)
        quorum = KRaftQuorum(config, storage)
        listener = Image()
        async with anyio.create_task_group() as tg:
            started = time.perf_counter()
            await quorum.start(listener, tg)
            elapsed = time.perf_counter() - started
            assert sum(len(t.partitions) for t in listener.current.topics.values()) == partitions
            tg.cancel_scope.cancel()
        await quorum.close()
        storage.close()
        return elapsed

    return anyio.run(run), len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--topics", type=int, default=300)
    parser.add_argument("--elections", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        for per_commit in (1, 100):
            rate = single_voter_commits(base / f"single-{per_commit}", args.commits, per_commit)
            print(f"single voter, {per_commit} record(s) per commit: {rate:,.0f} records/s")
        print(f"3 voters + 1 broker, CreateTopics: {cluster_commits(base / 'cluster', args.topics):,.0f} records/s")
        times = election_times(base / "election", args.elections)
        print(f"election after SIGKILL of the leader: median {statistics.median(times) * 1000:.0f} ms, "
              f"max {max(times) * 1000:.0f} ms over {len(times)} runs (default timeouts)")
        elapsed, size = snapshot_start(base / "snapshot", args.partitions)
        print(f"start from a snapshot of {args.partitions:,} partitions ({size / 1e6:.1f} MB): {elapsed:.2f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
