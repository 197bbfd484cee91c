"""Where josef keeps metadata in ZooKeeper, and the znodes Kafka 3.x defined that it writes as Kafka did.

Paths are relative to the chroot of ``zookeeper.connect``
(``127.0.0.1:2181/josef``), created when missing as Kafka created it.

Kafka's znodes: ``/controller`` (ephemeral, the active controller's JSON),
``/controller_epoch`` (the controller epoch, a decimal string, bumped with a
version check at every election), ``/cluster/id``, ``/brokers/ids/<id>``
(ephemeral: each running broker's registration, in Kafka 3.x's JSON). josef's own:
``/josef/metadata/log`` holds the metadata log as persistent sequential
znodes, one per commit (:mod:`josef_metadata_zk.commits`); a commit larger
than a znode may hold has its bytes in ``/josef/metadata/parts``;
``/josef/metadata/snapshot`` is the latest snapshot of the metadata image;
``/josef/migration`` is there while the cluster migrates to KRaft.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import attrs

from josef.metadata.image import BrokerImage
from josef.metadata.records import Endpoint

CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
BROKER_IDS = "/brokers/ids"
METADATA_LOG = "/josef/metadata/log"
METADATA_PARTS = "/josef/metadata/parts"
METADATA_SNAPSHOT = "/josef/metadata/snapshot"
#: There while the cluster migrates to KRaft (josef_metadata_zk.migration): no ZooKeeper-mode node is elected then.
MIGRATION = "/josef/migration"
#: Prefix of a commit's sequential znode name: ``commit-0000000042``.
COMMIT_PREFIX = "commit-"


def split_connect(connect: str) -> tuple[str, str]:
    """``("host:port,...", "/chroot")`` of a ``zookeeper.connect`` value; the chroot is "" when there is none."""
    hosts, slash, chroot = connect.partition("/")
    chroot = f"/{chroot}".rstrip("/") if slash else ""
    if not hosts or any(not part.rpartition(":")[2].isdigit() for part in hosts.split(",")):
        raise ValueError(f"zookeeper.connect must be host:port[,host:port...][/chroot], not {connect!r}")
    return hosts, chroot


@attrs.frozen
class ControllerZNode:
    """What ``/controller`` says: who the active controller is, and where brokers reach it."""

    node_id: int
    #: ``(host, port)`` of the controller's controller listener; None when it has none (reached in-process only).
    endpoint: tuple[str, int] | None


def controller_json(node_id: int, endpoints: Sequence[Endpoint] = ()) -> bytes:
    """``/controller``'s data as a Kafka 3.x ZooKeeper-mode controller writes it (version 1, ``brokerid``), with
    its controller listeners under ``endpoints``: a Kafka 3.x controller was reached on its broker listener, which
    /brokers/ids names; josef's controller APIs are on the controller listener, and the field is where brokers
    find it in the same read that names the controller. Kafka's tools read ``brokerid`` and ignore the rest."""
    data: dict[str, object] = {"version": 1, "brokerid": node_id, "timestamp": str(int(time.time() * 1000))}
    if endpoints:
        data["endpoints"] = [f"{e.name}://{e.host}:{e.port}" for e in endpoints]
    return json.dumps(data).encode()


def controller_of(data: bytes) -> ControllerZNode:
    decoded = json.loads(data)
    endpoint = None
    for url in decoded.get("endpoints", [])[:1]:
        host, _, port = url.partition("://")[2].rpartition(":")
        endpoint = (host.strip("[]"), int(port))
    return ControllerZNode(int(decoded["brokerid"]), endpoint)


def broker_json(broker: BrokerImage) -> bytes:
    """``/brokers/ids/<id>``'s data as a Kafka 3.x broker registers it (version 5), from its registration in the
    metadata image: every listener and its security protocol, rack, supported features. ``host`` and ``port`` are
    the PLAINTEXT listener's, as clients that read ZooKeeper expect, or null and -1 without one."""
    plaintext = next((e for e in broker.endpoints if e.security_protocol == "PLAINTEXT"), None)
    data: dict[str, object] = {
        "version": 5, "jmx_port": -1, "timestamp": str(int(time.time() * 1000)),
        "listener_security_protocol_map": {e.name: e.security_protocol for e in broker.endpoints},
        "endpoints": [f"{e.name}://{e.host}:{e.port}" for e in broker.endpoints],
        "host": plaintext.host if plaintext else None, "port": plaintext.port if plaintext else -1,
        "features": {name: {"min_version": low, "max_version": high} for name, (low, high) in sorted(broker.features.items())},
    }
    if broker.rack is not None:
        data["rack"] = broker.rack
    return json.dumps(data).encode()


def cluster_id_json(cluster_id: str) -> bytes:
    return json.dumps({"version": "1", "id": cluster_id}).encode()


def cluster_id_of(data: bytes) -> str:
    return str(json.loads(data)["id"])


def commit_sequence(name: str) -> int:
    """The sequence number ZooKeeper gave a commit znode: where it stands in the log."""
    if not name.startswith(COMMIT_PREFIX) or not name[len(COMMIT_PREFIX):].isdigit():
        raise ValueError(f"{METADATA_LOG}/{name} is not a commit znode")
    return int(name[len(COMMIT_PREFIX):])
