"""``josef metadata-quorum``: Kafka's ``kafka-metadata-quorum.sh describe --status|--replication``.

Sends DescribeQuorum (``__cluster_metadata`` partition 0) to the server
given with ``--bootstrap-server`` (a broker, which forwards it to the active
controller) or ``--bootstrap-controller`` (a controller: the active one is
found with DescribeCluster and asked directly), and prints what Kafka's tool
prints::

    $ josef metadata-quorum --bootstrap-controller localhost:9093 describe --status
    ClusterId:              MkU3OEVBNTcwNTJENDM2Qk
    LeaderId:               1
    LeaderEpoch:            4
    HighWatermark:          218
    MaxFollowerLag:         0
    MaxFollowerLagTimeMs:   0
    CurrentVoters:          [{"id": 1, "directoryId": "sQzaRakTRfO34ll8xi1N0g", "endpoints": ["CONTROLLER://localhost:9093"]}]
    CurrentObservers:       [{"id": 2, "directoryId": "b8Hd7K-6RAaaVDMvU3OJTQ"}]

    $ josef metadata-quorum --bootstrap-server localhost:9092 describe --replication
    NodeId	DirectoryId           	LogEndOffset	Lag	LastFetchTimestamp	LastCaughtUpTimestamp	Status  	...

(Kafka pads each column and ends every cell with a tab.) A server that
cannot be reached or answers an error code gives one ``Error:`` line and
exit status 1.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import click

from josef_client.commands.common import Group, command_config_option, read_properties, run, tab_table

METADATA_TOPIC = "__cluster_metadata"
ZERO_UUID_TEXT = "AAAAAAAAAAAAAAAAAAAAAA"
#: DescribeCluster endpoint types (KIP-919).
BROKER_ENDPOINTS, CONTROLLER_ENDPOINTS = 1, 2
_LABEL_WIDTH = 24


@dataclass
class Replica:
    replica_id: int
    directory_id: uuid.UUID | None
    log_end_offset: int
    last_fetch_timestamp: int  # -1: unknown
    last_caught_up_timestamp: int  # -1: unknown


@dataclass
class QuorumInfo:
    leader_id: int
    leader_epoch: int
    high_watermark: int
    voters: list[Replica]
    observers: list[Replica]
    #: Each node's endpoints as ``LISTENER://host:port`` (DescribeQuorum v2 and later).
    endpoints: dict[int, list[str]] = field(default_factory=dict)

    @property
    def leader(self) -> Replica:
        for voter in self.voters:
            if voter.replica_id == self.leader_id:
                return voter
        raise click.ClickException(f"the metadata quorum has no leader among its voters now (leader id "
                                   f"{self.leader_id}, epoch {self.leader_epoch}); try again in a moment")


# Talking to the server -----------------------------------------------------------------------------


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6 addresses)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.ClickException(f"invalid address {text.strip()!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


async def _connect(addresses: Sequence[tuple[str, int]], client_id: str, timeout_ms: int) -> Any:
    from josef.protocol.connection import Connection
    from josef.protocol.errors import KafkaConnectionError

    failures = []
    for host, port in addresses:
        try:
            return await Connection.open(host, port, client_id=client_id, request_timeout_ms=timeout_ms,
                                         connect_timeout_ms=min(timeout_ms, 10000))
        except KafkaConnectionError as exc:
            failures.append(exc.message)
    raise KafkaConnectionError("; ".join(failures))


async def _describe_cluster(conn: Any, endpoint_type: int) -> Any:
    from kio.schema.errors import ErrorCode

    from josef.protocol.api_keys import ApiKey
    from josef.protocol.errors import KafkaError

    response = await conn.request(ApiKey.DESCRIBE_CLUSTER, {
        "include_cluster_authorized_operations": False, "endpoint_type": endpoint_type,
        "include_fenced_brokers": False})
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, response.error_message or "DescribeCluster failed")
    return response


def _replica(state: Any) -> Replica:
    directory = getattr(state, "replica_directory_id", None)
    if directory is not None and directory.int == 0:
        directory = None
    return Replica(int(state.replica_id), directory, int(state.log_end_offset),
                   int(getattr(state, "last_fetch_timestamp", -1)), int(getattr(state, "last_caught_up_timestamp", -1)))


def _endpoint(name: str, host: str, port: int) -> str:
    return f"{name}://{'[' + host + ']' if ':' in host else host}:{port}"


async def describe_quorum(addresses: Sequence[tuple[str, int]], *, controller: bool, want_cluster_id: bool,
                          client_id: str = "josef-metadata-quorum",
                          timeout_ms: int = 30000) -> tuple[str | None, QuorumInfo]:
    """The cluster id (when asked for) and the quorum as DescribeQuorum describes it."""
    from josef.protocol.api_keys import ApiKey
    from josef.protocol.errors import UnsupportedVersionError

    conn = await _connect(addresses, client_id, timeout_ms)
    try:
        cluster_id = None
        if controller:
            # Ask the active controller: DescribeCluster on a controller names it.
            cluster = await _describe_cluster(conn, CONTROLLER_ENDPOINTS)
            cluster_id = cluster.cluster_id
            active = next((n for n in cluster.brokers if n.broker_id == cluster.controller_id), None)
            if active is not None and (active.host, active.port) != (conn.host, conn.port):
                await conn.close()
                conn = await _connect([(active.host, active.port)], client_id, timeout_ms)
        elif want_cluster_id:
            try:
                cluster_id = (await _describe_cluster(conn, BROKER_ENDPOINTS)).cluster_id
            except UnsupportedVersionError:
                cluster_id = (await conn.request(ApiKey.METADATA, {"topics": [], "allow_auto_topic_creation": False,
                                                                    "include_topic_authorized_operations": False})).cluster_id
        response = await conn.request(ApiKey.DESCRIBE_QUORUM, {"topics": [
            {"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]})
    finally:
        await conn.close()
    partition = metadata_partition(response)
    endpoints = {int(node.node_id): [_endpoint(l.name, l.host, l.port) for l in node.listeners]
                 for node in getattr(response, "nodes", ())}
    return cluster_id, QuorumInfo(int(partition.leader_id), int(partition.leader_epoch), int(partition.high_watermark),
                                  [_replica(v) for v in partition.current_voters],
                                  [_replica(o) for o in partition.observers], endpoints)


def metadata_partition(response: Any) -> Any:
    """The ``__cluster_metadata-0`` entry of a DescribeQuorum response; KafkaError for any error it carries."""
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, getattr(response, "error_message", None) or "DescribeQuorum failed")
    partition = next((p for t in response.topics if t.topic_name == METADATA_TOPIC for p in t.partitions
                      if p.partition_index == 0), None)
    if partition is None:
        raise KafkaError(ErrorCode.unknown_server_error, f"the DescribeQuorum answer has no {METADATA_TOPIC}-0")
    if partition.error_code != ErrorCode.none:
        raise KafkaError(partition.error_code, getattr(partition, "error_message", None) or
                         f"DescribeQuorum of {METADATA_TOPIC}-0 failed")
    return partition


# Output ------------------------------------------------------------------------------------------


def _uuid_text(value: uuid.UUID | None) -> str:
    if value is None:
        return ZERO_UUID_TEXT
    from josef.metadata.records import uuid_to_text

    return uuid_to_text(value)


def _node(replica: Replica, endpoints: list[str]) -> str:
    """One voter or observer as Kafka's tool prints it: the directory and endpoints only when known."""
    text = f'{{"id": {replica.replica_id}'
    if replica.directory_id is not None:
        text += f', "directoryId": "{_uuid_text(replica.directory_id)}"'
    if endpoints:
        text += ', "endpoints": [' + ", ".join(f'"{e}"' for e in endpoints) + "]"
    return text + "}"


def status_lines(cluster_id: str | None, info: QuorumInfo) -> list[str]:
    leader = info.leader
    lagging = min(info.voters, key=lambda v: v.log_end_offset)
    if lagging is leader:
        lag_time = 0
    elif leader.last_caught_up_timestamp != -1 and lagging.last_caught_up_timestamp != -1:
        lag_time = leader.last_caught_up_timestamp - lagging.last_caught_up_timestamp
    else:
        lag_time = -1
    voters = "[" + ", ".join(_node(v, info.endpoints.get(v.replica_id, [])) for v in info.voters) + "]"
    observers = "[" + ", ".join(_node(o, info.endpoints.get(o.replica_id, [])) for o in info.observers) + "]"
    rows = [("ClusterId:", cluster_id), ("LeaderId:", info.leader_id), ("LeaderEpoch:", info.leader_epoch),
            ("HighWatermark:", info.high_watermark), ("MaxFollowerLag:", leader.log_end_offset - lagging.log_end_offset),
            ("MaxFollowerLagTimeMs:", lag_time), ("CurrentVoters:", voters), ("CurrentObservers:", observers)]
    return [f"{label:<{_LABEL_WIDTH}}{value}" for label, value in rows]


def _timestamp(value: int, human_readable: bool, now_ms: int) -> str:
    if value == -1:
        return "-1"
    if human_readable:
        return f"{max(0, now_ms - value)} ms ago"
    return str(value)


def replication_lines(info: QuorumInfo, human_readable: bool = False, now_ms: int | None = None) -> list[str]:
    """Kafka's table (:func:`~josef_client.commands.common.tab_table`)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    leader = info.leader
    groups = [([leader], "Leader"), ([v for v in info.voters if v.replica_id != info.leader_id], "Follower"),
              (info.observers, "Observer")]
    headers = ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status"]
    rows = [[str(r.replica_id), _uuid_text(r.directory_id), str(r.log_end_offset),
             str(leader.log_end_offset - r.log_end_offset), _timestamp(r.last_fetch_timestamp, human_readable, now),
             _timestamp(r.last_caught_up_timestamp, human_readable, now), status]
            for replicas, status in groups for r in replicas]
    return tab_table(headers, rows)


# The command -------------------------------------------------------------------------------------


@click.group("metadata-quorum", cls=Group)
@click.option("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
              help="The broker(s) to connect to (they forward DescribeQuorum to the active controller).")
@click.option("--bootstrap-controller", metavar="HOST:PORT[,HOST:PORT]",
              help="The controller(s) to connect to.")
@command_config_option
@click.pass_context
def metadata_quorum(ctx: click.Context, bootstrap_server: str | None, bootstrap_controller: str | None,
                    command_config: Path | None) -> None:
    """Describe the KRaft metadata quorum, as kafka-metadata-quorum.sh does."""
    ctx.obj = (bootstrap_server, bootstrap_controller, command_config)


@metadata_quorum.command("describe")
@click.option("--status", is_flag=True, help="A short summary of the quorum's status.")
@click.option("--replication", is_flag=True, help="How far each voter and observer has replicated the metadata log.")
@click.option("--human-readable", is_flag=True, help="With --replication: timestamps as how long ago.")
@click.pass_obj
def describe(obj: tuple[str | None, str | None, Path | None], status: bool, replication: bool,
             human_readable: bool) -> None:
    """Describe the quorum: --status or --replication."""
    bootstrap_server, bootstrap_controller, command_config = obj
    if bool(bootstrap_server) == bool(bootstrap_controller):
        raise click.ClickException("give exactly one of --bootstrap-server or --bootstrap-controller")
    if status and replication:
        raise click.ClickException("Only one of --status or --replication should be specified with describe sub-command")
    if not status and not replication:
        raise click.ClickException("One of --status or --replication must be specified with describe sub-command")
    if status and human_readable:
        raise click.ClickException("The option --human-readable is only supported along with --replication")
    addresses = [parse_address(a) for a in (bootstrap_server or bootstrap_controller or "").split(",") if a.strip()]
    if not addresses:
        raise click.ClickException("no address given to connect to")
    config = read_properties(command_config)
    try:
        timeout_ms = int(config.get("request.timeout.ms", "30000"))
    except ValueError:
        raise click.ClickException(f"request.timeout.ms must be a number, got {config['request.timeout.ms']!r}") from None
    cluster_id, info = run(describe_quorum(addresses, controller=bootstrap_controller is not None, want_cluster_id=status,
                                           client_id=config.get("client.id", "josef-metadata-quorum"),
                                           timeout_ms=timeout_ms))
    lines = status_lines(cluster_id, info) if status else replication_lines(info, human_readable)
    click.echo("\n".join(lines))


# Changing the voters (KIP-853) -------------------------------------------------------------------


def _controller_properties(path: Path | None, fallback: Path | None) -> dict[str, str]:
    chosen = path or fallback
    if chosen is None:
        raise click.ClickException("add-controller needs --command-config: the new controller's server.properties")
    return read_properties(chosen)


def _directory_text_to_uuid(text: str) -> uuid.UUID:
    import base64

    try:
        value = uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))
    except (ValueError, TypeError):
        raise click.ClickException(f"{text!r} is not a directory id (22 characters of base64)") from None
    if len(text) != 22:
        raise click.ClickException(f"{text!r} is not a directory id (22 characters of base64)")
    return value


def new_controller(props: dict[str, str]) -> tuple[str, int, uuid.UUID, list[tuple[str, str, int]]]:
    """``(cluster id, node id, directory id, [(listener, host, port)])`` of the controller a properties file describes.

    The ids come from ``meta.properties`` of its metadata log directory (the first of ``log.dirs``),
    written by ``josef storage format``; the endpoints from its controller listeners
    (``advertised.listeners`` before ``listeners``).
    """
    if "controller" not in [r.strip() for r in props.get("process.roles", "").split(",")]:
        raise click.ClickException("the --command-config file does not describe a controller (process.roles)")
    directory = props.get("metadata.log.dir") or (props.get("log.dirs") or props.get("log.dir", "")).split(",")[0]
    if not directory:
        raise click.ClickException("the --command-config file names no log directory (log.dirs)")
    meta = read_properties(Path(directory.strip()) / "meta.properties") if (
        Path(directory.strip()) / "meta.properties").exists() else {}
    if "directory.id" not in meta or "cluster.id" not in meta:
        raise click.ClickException(f"{directory}/meta.properties has no directory.id: format the new controller "
                                   "with josef storage format --no-initial-controllers")
    node_id = int(props.get("node.id", meta.get("node.id", "-1")))
    names = [n.strip() for n in props.get("controller.listener.names", "CONTROLLER").split(",") if n.strip()]
    endpoints: dict[str, tuple[str, str, int]] = {}
    for key in ("advertised.listeners", "listeners"):
        for item in props.get(key, "").split(","):
            name, sep, address = item.strip().partition("://")
            if sep and name in names and name not in endpoints:
                host, port = parse_address(address)
                endpoints[name] = (name, host or "localhost", port)
    if not endpoints:
        raise click.ClickException(f"the --command-config file has no controller listener ({','.join(names)})")
    return meta["cluster.id"], node_id, _directory_text_to_uuid(meta["directory.id"]), list(endpoints.values())


async def _active_controller(addresses: Sequence[tuple[str, int]], client_id: str, timeout_ms: int) -> Any:
    conn = await _connect(addresses, client_id, timeout_ms)
    cluster = await _describe_cluster(conn, CONTROLLER_ENDPOINTS)
    active = next((n for n in cluster.brokers if n.broker_id == cluster.controller_id), None)
    if active is not None and (active.host, active.port) != (conn.host, conn.port):
        await conn.close()
        conn = await _connect([(active.host, active.port)], client_id, timeout_ms)
    return conn


async def change_voters(addresses: Sequence[tuple[str, int]], request: Any, *, client_id: str,
                        timeout_ms: int) -> None:
    """Send AddRaftVoter or RemoveRaftVoter to the active controller; raise on an error code."""
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    conn = await _active_controller(addresses, client_id, timeout_ms)
    try:
        response = await conn.request(type(request).__api_key__, request, version=type(request).__version__)
    finally:
        await conn.close()
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, response.error_message or response.error_code.name.upper())


def _voter_command_setup(obj: tuple[str | None, str | None, Path | None]) -> tuple[list[tuple[str, int]], dict[str, str]]:
    bootstrap_server, bootstrap_controller, command_config = obj
    if bootstrap_server or not bootstrap_controller:
        raise click.ClickException("changing the controllers needs --bootstrap-controller (as kafka-metadata-quorum.sh)")
    addresses = [parse_address(a) for a in bootstrap_controller.split(",") if a.strip()]
    return addresses, read_properties(command_config)


@metadata_quorum.command("add-controller")
@command_config_option
@click.pass_obj
def add_controller(obj: tuple[str | None, str | None, Path | None], command_config: Path | None) -> None:
    """Add the controller its --command-config (server.properties) describes to the voters (KIP-853)."""
    import datetime

    from kio.schema.add_raft_voter.v0.request import AddRaftVoterRequest, Listener

    addresses, _ = _voter_command_setup(obj)
    props = _controller_properties(command_config, obj[2])
    cluster_id, node_id, directory_id, endpoints = new_controller(props)
    timeout_ms = int(props.get("request.timeout.ms", "30000"))
    request = AddRaftVoterRequest(cluster_id=cluster_id, timeout=datetime.timedelta(milliseconds=timeout_ms),
                                  voter_id=node_id, voter_directory_id=directory_id,  # type: ignore[arg-type]
                                  listeners=tuple(Listener(name=n, host=h, port=p)  # type: ignore[arg-type]
                                                  for n, h, p in endpoints))
    run(change_voters(addresses, request, client_id="josef-metadata-quorum", timeout_ms=timeout_ms + 5000))
    click.echo(f"Added controller {node_id} with directory id {_uuid_text(directory_id)} and endpoints: "
               + ", ".join(_endpoint(n, h, p) for n, h, p in endpoints))


@metadata_quorum.command("remove-controller")
@click.option("--controller-id", type=int, required=True, help="The id of the controller to remove.")
@click.option("--controller-directory-id", required=True, help="The directory id of the controller to remove.")
@click.pass_obj
def remove_controller(obj: tuple[str | None, str | None, Path | None], controller_id: int,
                      controller_directory_id: str) -> None:
    """Remove a controller from the voters (KIP-853)."""
    from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest

    addresses, config = _voter_command_setup(obj)
    directory_id = _directory_text_to_uuid(controller_directory_id)
    timeout_ms = int(config.get("request.timeout.ms", "30000"))
    request = RemoveRaftVoterRequest(cluster_id=None, voter_id=controller_id,  # type: ignore[arg-type]
                                     voter_directory_id=directory_id)
    run(change_voters(addresses, request, client_id="josef-metadata-quorum", timeout_ms=timeout_ms))
    click.echo(f"Removed controller {controller_id} with directory id {controller_directory_id}")
