"""Controller failover on KRaft and on ZooKeeper, same machine, same run: how long metadata changes stop when the
active controller is killed.

Three combined nodes (``josef server start`` processes) per backend; ``--runs`` times: find the active controller,
SIGKILL it by PID, then measure

* **elected**: until another node is the active controller (KRaft: a surviving controller answers DescribeQuorum
  as leader; ZooKeeper: ``/controller`` names another node), and
* **metadata**: until a CreateTopics sent to a surviving broker succeeds (the end-to-end figure a client sees),

then restart the killed node and wait until it is ready. The KRaft cell runs with Kafka's default timeouts
(``controller.quorum.election.timeout.ms`` 1000, ``controller.quorum.fetch.timeout.ms`` 2000); the ZooKeeper cells
with Kafka 3.x's default ``zookeeper.session.timeout.ms`` (18000), and with ``--zk-session-ms`` (6000): a killed
controller's ZooKeeper session has to expire before ``/controller`` is free, so its timeout bounds the failover.
ZooKeeper itself is Debian's (``apt-get install zookeeper``), started on a free port.

    cd /work/main && uv run python benchmarks/controller_failover.py             # 10 runs per cell
    cd /work/main && uv run python benchmarks/controller_failover.py --runs 3 --skip-default-session
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from josef_metadata_zk.testing import ZooKeeperEnsemble, read_znode

from josef.testing import JosefCluster

sys.path.insert(0, os.path.dirname(__file__))
from metadata_quorum import kraft_leader  # noqa: E402


def zk_leader(connect: str) -> int | None:
    data = read_znode(connect, "/controller")
    return json.loads(data)["brokerid"] if data else None


def create_topic(bootstrap: str, name: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=2, request_timeout=3)[name].result(4)
        return True
    except Exception:  # noqa: BLE001 - no controller yet: asked again
        return False


def failovers(cluster: JosefCluster, leader: Callable[[list], int | None], runs: int) -> tuple[list[float], list[float]]:
    elected, metadata = [], []
    for run in range(runs):
        current = None
        while current is None:
            current = leader(cluster.nodes)
            time.sleep(0.01)
        victim = cluster.node(current)
        survivors = [n for n in cluster.nodes if n is not victim]
        bootstrap = ",".join(n.bootstrap_server for n in survivors)
        killed_at = time.monotonic()
        victim.kill()
        while leader(survivors) in (None, current):
            time.sleep(0.01)
        elected.append(time.monotonic() - killed_at)
        while not create_topic(bootstrap, f"after-failover-{run}"):
            time.sleep(0.01)
        metadata.append(time.monotonic() - killed_at)
        victim.restart()
        print(f"  run {run + 1}: elected after {elected[-1]:.2f} s, CreateTopics answered after {metadata[-1]:.2f} s",
              flush=True)
    return elected, metadata


def report(name: str, elected: list[float], metadata: list[float]) -> None:
    print(f"{name}: elected median {statistics.median(elected):.2f} s (max {max(elected):.2f}), CreateTopics "
          f"median {statistics.median(metadata):.2f} s (max {max(metadata):.2f}) over {len(elected)} runs", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--zk-session-ms", type=int, default=6000)
    parser.add_argument("--skip-default-session", action="store_true",
                        help="leave out the ZooKeeper cell with Kafka's default 18 s session")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="josef-failover-") as scratch:
        base = Path(scratch)
        print("KRaft (3 combined nodes, default timeouts)", flush=True)
        with JosefCluster(base / "kraft", combined=3) as cluster:
            cluster.start()
            report("KRaft", *failovers(cluster, kraft_leader, args.runs))
        sessions = [args.zk_session_ms] + ([] if args.skip_default_session else [18000])
        # The tests' servers tick every 200 ms, which caps sessions at 4 s: let the nodes have the sessions they ask for.
        with ZooKeeperEnsemble(base / "zookeeper", max_session_ms=60_000) as ensemble:
            for session_ms in sessions:
                connect = f"{ensemble.connect}/failover-{session_ms}"
                print(f"ZooKeeper (3 combined nodes, zookeeper.session.timeout.ms={session_ms})", flush=True)
                overrides = {"metadata.quorum": "zookeeper", "zookeeper.connect": connect,
                             "controller.quorum.voters": None, "zookeeper.session.timeout.ms": str(session_ms)}
                with JosefCluster(base / f"zk-{session_ms}", combined=3, overrides=overrides) as cluster:
                    cluster.start()
                    report(f"ZooKeeper, {session_ms} ms session",
                           *failovers(cluster, lambda nodes, c=connect: zk_leader(c), args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
