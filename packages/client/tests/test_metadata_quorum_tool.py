"""``josef metadata-quorum describe`` against a small in-test server that answers with kio responses.

The server speaks the real framing (josef's request-header parser and
response encoder) on a real socket, in its own thread and event loop, and
answers ApiVersions, DescribeCluster and DescribeQuorum from what each test
gives it; it records what it was asked.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from typing import Any, Callable

import pytest
from click.testing import CliRunner
from kio.schema.errors import ErrorCode as E

from josef.cli import build_cli
from josef.metadata.records import uuid_to_text
from josef.protocol.api_keys import ApiKey
from fake_server import FakeKafkaServer
from josef_client.commands.metadata_quorum import QuorumInfo, Replica, metadata_quorum, replication_lines

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"
DIRS = {i: uuid.UUID(int=0x1000 + i) for i in range(1, 5)}
NOW = 1_700_000_000_000

Handler = Callable[[int, Any], dict[str, Any]]


class QuorumServer(FakeKafkaServer):
    """A Kafka server that answers the APIs of ``handlers``."""

    def __init__(self, handlers: dict[int, Handler]) -> None:
        self.handlers = handlers
        super().__init__()

    def answer(self, key: int, version: int, body: Any) -> dict[str, Any]:
        return self.handlers[key](version, body)


def api_versions(keys: dict[int, tuple[int, int]]) -> Handler:
    def answer(version: int, body: Any) -> dict[str, Any]:
        return {"error_code": E.none, "throttle_time": 0,
                "api_keys": [{"api_key": k, "min_version": low, "max_version": high} for k, (low, high) in keys.items()]}
    return answer


def describe_cluster(controller_id: int, nodes: dict[int, int]) -> Handler:
    def answer(version: int, body: Any) -> dict[str, Any]:
        endpoint_type = getattr(body, "endpoint_type", 1)
        return {"throttle_time": 0, "error_code": E.none, "error_message": None, "endpoint_type": endpoint_type,
                "cluster_id": CLUSTER_ID, "controller_id": controller_id,
                "brokers": [{"broker_id": i, "host": "127.0.0.1", "port": port, "rack": None, "is_fenced": False}
                            for i, port in nodes.items()],
                "cluster_authorized_operations": -2147483648}
    return answer


def replica(node_id: int, leo: int, fetch: int = -1, caught_up: int = -1, directory: bool = True) -> dict[str, Any]:
    return {"replica_id": node_id, "replica_directory_id": DIRS[node_id] if directory else None,
            "log_end_offset": leo, "last_fetch_timestamp": fetch, "last_caught_up_timestamp": caught_up}


def quorum(**changes: Any) -> dict[str, Any]:
    partition = {"partition_index": 0, "error_code": E.none, "error_message": None, "leader_id": 1, "leader_epoch": 4,
                 "high_watermark": 218,
                 "current_voters": [replica(1, 220, -1, NOW), replica(2, 220, NOW - 5, NOW - 5),
                                    replica(3, 200, NOW - 30, NOW - 700)],
                 "observers": [replica(4, 219, NOW - 10, NOW - 10, directory=False)]}
    top = {"error_code": E.none, "error_message": None,
           "nodes": [{"node_id": i, "listeners": [{"name": "CONTROLLER", "host": "localhost", "port": 9092 + i}]}
                     for i in (1, 2, 3)]}
    if "partition_error_code" in changes:
        partition["error_code"] = changes.pop("partition_error_code")
    for key, value in changes.items():
        (top if key in top else partition)[key] = value
    return {**top, "topics": [{"topic_name": "__cluster_metadata", "partitions": [partition]}]}


def describe_quorum(answer: dict[str, Any]) -> Handler:
    return lambda version, body: answer


@pytest.fixture
def servers():
    started: list[QuorumServer] = []

    def make(quorum_answer: dict[str, Any] | None = None, *, controller_id: int = 1,
             cluster_nodes: dict[int, int] | None = None, keys: tuple[int, ...] = (18, 60, 55)) -> QuorumServer:
        handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: api_versions({k: (0, {18: 4, 60: 2, 55: 2}[k]) for k in keys}),
            ApiKey.DESCRIBE_CLUSTER: describe_cluster(controller_id, cluster_nodes or {}),
            ApiKey.DESCRIBE_QUORUM: describe_quorum(quorum_answer or quorum()),
        }
        server = QuorumServer(handlers)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()


def tool(*args: str):
    result = CliRunner().invoke(metadata_quorum, list(args))
    assert "Traceback" not in result.output + result.stderr
    return result


def one_line_error(result, pattern: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert result.stdout == ""


def test_the_command_is_registered_on_josef():
    assert "metadata-quorum" in build_cli().commands


def test_status_prints_kafkas_summary(servers):
    server = servers()
    result = tool("--bootstrap-server", server.address, "describe", "--status")
    assert result.exit_code == 0, result.stderr
    d = {i: uuid_to_text(u) for i, u in DIRS.items()}
    assert result.stdout.splitlines() == [
        f"ClusterId:              {CLUSTER_ID}",
        "LeaderId:               1",
        "LeaderEpoch:            4",
        "HighWatermark:          218",
        "MaxFollowerLag:         20",
        "MaxFollowerLagTimeMs:   700",
        "CurrentVoters:          ["
        f'{{"id": 1, "directoryId": "{d[1]}", "endpoints": ["CONTROLLER://localhost:9093"]}}, '
        f'{{"id": 2, "directoryId": "{d[2]}", "endpoints": ["CONTROLLER://localhost:9094"]}}, '
        f'{{"id": 3, "directoryId": "{d[3]}", "endpoints": ["CONTROLLER://localhost:9095"]}}]',
        'CurrentObservers:       [{"id": 4}]',
    ]
    (version, body), = server.asked(ApiKey.DESCRIBE_QUORUM)
    assert version == 2
    assert [(t.topic_name, [p.partition_index for p in t.partitions]) for t in body.topics] == [("__cluster_metadata", [0])]
    (_, cluster), = server.asked(ApiKey.DESCRIBE_CLUSTER)
    assert cluster.endpoint_type == 1  # brokers, for --bootstrap-server


def test_a_caught_up_quorum_has_no_lag(servers):
    server = servers(quorum(current_voters=[replica(1, 50, -1, NOW)], observers=[], nodes=[]))
    lines = tool("--bootstrap-server", server.address, "describe", "--status").stdout.splitlines()
    assert lines[4:] == ["MaxFollowerLag:         0", "MaxFollowerLagTimeMs:   0",
                         f'CurrentVoters:          [{{"id": 1, "directoryId": "{uuid_to_text(DIRS[1])}"}}]',
                         "CurrentObservers:       []"]


def test_replication_prints_kafkas_table(servers):
    server = servers()
    result = tool("--bootstrap-server", server.address, "describe", "--replication")
    assert result.exit_code == 0, result.stderr
    d = {i: uuid_to_text(u) for i, u in DIRS.items()}
    zero = "AAAAAAAAAAAAAAAAAAAAAA"
    assert result.stdout.splitlines() == [
        "NodeId\tDirectoryId           \tLogEndOffset\tLag\tLastFetchTimestamp\tLastCaughtUpTimestamp\tStatus  \t",
        f"1     \t{d[1]}\t220         \t0  \t-1                \t{NOW}        \tLeader  \t",
        f"2     \t{d[2]}\t220         \t0  \t{NOW - 5}     \t{NOW - 5}        \tFollower\t",
        f"3     \t{d[3]}\t200         \t20 \t{NOW - 30}     \t{NOW - 700}        \tFollower\t",
        f"4     \t{zero}\t219         \t1  \t{NOW - 10}     \t{NOW - 10}        \tObserver\t",
    ]


def test_human_readable_replication_says_how_long_ago(servers):
    now = int(time.time() * 1000)
    server = servers(quorum(current_voters=[replica(1, 10, -1, now - 1000)], observers=[replica(4, 9, now - 60000, -1)]))
    result = tool("--bootstrap-server", server.address, "describe", "--replication", "--human-readable")
    assert result.exit_code == 0, result.stderr
    leader, observer = result.stdout.splitlines()[1:]
    assert re.fullmatch(r"1\s*\t\S+\s*\t10\s*\t0\s*\t-1\s*\t\d+ ms ago\s*\tLeader\s*\t", leader), leader
    assert int(re.search(r"(\d+) ms ago", leader).group(1)) >= 1000
    assert re.fullmatch(r"4\s*\t\S+\s*\t9\s*\t1\s*\t\d+ ms ago\s*\t-1\s*\tObserver\s*\t", observer), observer
    assert int(re.search(r"(\d+) ms ago", observer).group(1)) >= 60000


def test_replication_lines_with_a_fixed_clock():
    info = QuorumInfo(2, 1, 5, [Replica(1, None, 5, NOW - 20, NOW - 20), Replica(2, None, 7, -1, NOW)], [])
    lines = replication_lines(info, human_readable=True, now_ms=NOW)
    assert [line.split("\t")[0].strip() for line in lines] == ["NodeId", "2", "1"]  # the leader first
    assert [line.split("\t")[3:6] for line in lines[1:]] == [
        ["0  ", "-1                ", "0 ms ago             "], ["2  ", "20 ms ago         ", "20 ms ago            "]]


def test_bootstrap_controller_asks_the_active_controller(servers):
    active = servers()
    other = servers(quorum(error_code=E.not_leader_or_follower))
    other.handlers[ApiKey.DESCRIBE_CLUSTER] = describe_cluster(3, {2: other.port, 3: active.port})
    result = tool("--bootstrap-controller", other.address, "describe", "--status")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"ClusterId:              {CLUSTER_ID}\nLeaderId:               1\n")
    (_, cluster), = other.asked(ApiKey.DESCRIBE_CLUSTER)
    assert cluster.endpoint_type == 2  # controllers, for --bootstrap-controller
    assert other.asked(ApiKey.DESCRIBE_QUORUM) == []
    assert len(active.asked(ApiKey.DESCRIBE_QUORUM)) == 1


def closed_port() -> int:
    """A port nothing listens on: bound, then closed without listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_next_address_is_tried_when_one_refuses(servers):
    server = servers()
    result = tool("--bootstrap-server", f"127.0.0.1:{closed_port()},{server.address}", "describe", "--replication")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("NodeId\t")


def test_connection_refused_is_one_line():
    dead = closed_port()
    result = tool("--bootstrap-server", f"127.0.0.1:{dead}", "describe", "--status")
    one_line_error(result, rf"cannot connect to 127\.0\.0\.1:{dead}")


@pytest.mark.parametrize("answer, pattern", [
    (quorum(error_code=E.cluster_authorization_failed, error_message="not allowed"),
     r"^Error: CLUSTER_AUTHORIZATION_FAILED \(31\): not allowed$"),
    (quorum(partition_error_code=E.not_leader_or_follower),
     r"NOT_LEADER_OR_FOLLOWER \(6\): DescribeQuorum of __cluster_metadata-0 failed"),
    (quorum(leader_id=-1), r"no leader among its voters now \(leader id -1, epoch 4\)"),
])
def test_error_answers_are_one_line(servers, answer, pattern):
    server = servers(answer)
    one_line_error(tool("--bootstrap-server", server.address, "describe", "--status"), pattern)


def test_a_server_without_describe_quorum(servers):
    server = servers(keys=(18, 60))
    one_line_error(tool("--bootstrap-server", server.address, "describe", "--replication"),
                   r"does not support describe_quorum")


@pytest.mark.parametrize("args, pattern", [
    (["describe", "--status"], "exactly one of --bootstrap-server or --bootstrap-controller"),
    (["--bootstrap-server", "a:1", "--bootstrap-controller", "b:2", "describe", "--status"], "exactly one of"),
    (["--bootstrap-server", "a:1", "describe"], "One of --status or --replication must be specified"),
    (["--bootstrap-server", "a:1", "describe", "--status", "--replication"], "Only one of --status or --replication"),
    (["--bootstrap-server", "a:1", "describe", "--status", "--human-readable"], "only supported along with --replication"),
    (["--bootstrap-server", "nohostport", "describe", "--status"], "invalid address 'nohostport'"),
    (["--bootstrap-server", "a:1", "--command-config", "/no/such/file", "describe", "--status"], "does not exist"),
])
def test_bad_flags_are_one_line(args, pattern):
    one_line_error(tool(*args), pattern)


def test_command_config_is_read(servers, tmp_path):
    server = servers()
    config = tmp_path / "admin.properties"
    config.write_text("client.id=quorum-check\nrequest.timeout.ms=5000\n")
    result = tool("--bootstrap-server", server.address, "--command-config", str(config), "describe", "--status")
    assert result.exit_code == 0, result.stderr
    assert server.client_ids == {"quorum-check"}
