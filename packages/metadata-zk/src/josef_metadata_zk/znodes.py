"""Where josef keeps metadata in ZooKeeper, and the znodes Kafka 3.x defined that it writes as Kafka did.

Paths are relative to the chroot of ``zookeeper.connect``
(``127.0.0.1:2181/josef``), created when missing as Kafka created it.

Kafka's znodes: ``/controller`` (ephemeral, the active controller's JSON),
``/controller_epoch`` (the controller epoch, a decimal string, bumped with a
version check at every election), ``/cluster/id``. josef's own:
``/josef/metadata/log`` holds the metadata log as persistent sequential
znodes, one per commit (:mod:`josef_metadata_zk.commits`); a commit larger
than a znode may hold has its bytes in ``/josef/metadata/parts``.
"""

from __future__ import annotations

import json
import time

CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
METADATA_LOG = "/josef/metadata/log"
METADATA_PARTS = "/josef/metadata/parts"
#: Prefix of a commit's sequential znode name: ``commit-0000000042``.
COMMIT_PREFIX = "commit-"


def split_connect(connect: str) -> tuple[str, str]:
    """``("host:port,...", "/chroot")`` of a ``zookeeper.connect`` value; the chroot is "" when there is none."""
    hosts, slash, chroot = connect.partition("/")
    chroot = f"/{chroot}".rstrip("/") if slash else ""
    if not hosts or any(not part.rpartition(":")[2].isdigit() for part in hosts.split(",")):
        raise ValueError(f"zookeeper.connect must be host:port[,host:port...][/chroot], not {connect!r}")
    return hosts, chroot


def controller_json(node_id: int) -> bytes:
    """``/controller``'s data as a Kafka 3.x ZooKeeper-mode controller writes it."""
    return json.dumps({"version": 1, "brokerid": node_id, "timestamp": str(int(time.time() * 1000))}).encode()


def controller_id_of(data: bytes) -> int:
    return int(json.loads(data)["brokerid"])


def cluster_id_json(cluster_id: str) -> bytes:
    return json.dumps({"version": "1", "id": cluster_id}).encode()


def cluster_id_of(data: bytes) -> str:
    return str(json.loads(data)["id"])


def commit_sequence(name: str) -> int:
    """The sequence number ZooKeeper gave a commit znode: where it stands in the log."""
    if not name.startswith(COMMIT_PREFIX) or not name[len(COMMIT_PREFIX):].isdigit():
        raise ValueError(f"{METADATA_LOG}/{name} is not a commit znode")
    return int(name[len(COMMIT_PREFIX):])
