"""The fault harness (josef.testing.faults) on real namespaces, links, nftables rules, proxies and tmpfs mounts.

Each test probes with real sockets from inside the namespaces; the cluster-level use is in integration-tests/faults.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from josef.testing import RawClient, faults
from josef.testing.faults import Disks, Nemesis, Network

pytestmark = pytest.mark.skipif(faults.unavailable() is not None, reason=f"fault harness: {faults.unavailable()}")

#: A TCP server in a namespace: accepts and echoes, printing "up" once listening.
ECHO = """
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind((sys.argv[1], int(sys.argv[2])))
def serve(c):
    while d := c.recv(65536): c.sendall(d)
    c.close()
def datagrams():
    while True:
        d, peer = udp.recvfrom(100); udp.sendto(d, peer)
threading.Thread(target=datagrams, daemon=True).start()
print("up", flush=True)
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
#: From inside a namespace: connect to HOST PORT and echo a byte; prints the round trip in ms or "unreachable".
PROBE = """
import socket, sys, time
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    s.settimeout(float(sys.argv[3])); t = time.monotonic(); s.sendall(b"x"); assert s.recv(1) == b"x"
    print(round((time.monotonic() - t) * 1000))
except OSError:
    print("unreachable")
"""
#: From inside a namespace: COUNT datagrams to HOST PORT; prints how many came back.
DATAGRAMS = """
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(0.05); got = 0
for i in range(int(sys.argv[3])):
    u.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    try:
        u.recvfrom(10); got += 1
    except OSError:
        pass
print(got)
"""


@pytest.fixture
def network(request):
    net = Network(latency=getattr(request, "param", False))
    servers = []
    try:
        for node_id in (1, 2, 3):
            net.add(node_id)
            host = net.bind_address(node_id)
            for port in ([faults.REPLICATION_PORT] if net.latency else [faults.CLIENT_PORT]):
                server = subprocess.Popen(net.wrap(node_id, [sys.executable, "-c", ECHO, host, str(port)]),
                                          stdout=subprocess.PIPE, text=True)
                servers.append(server)
                assert server.stdout.readline().strip() == "up"
        yield net
    finally:
        for server in servers:
            server.kill()
            server.wait()
        net.close()


def probe(net: Network, source: int | None, target: int, port: int = faults.CLIENT_PORT, timeout: float = 1.0) -> str:
    args = [sys.executable, "-c", PROBE, net.address(target), str(port), str(timeout)]
    return subprocess.run(args if source is None else net.wrap(source, args), capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_partition_cuts_nodes_apart_both_ways_while_clients_reach_every_node(network):
    assert probe(network, 1, 2) != "unreachable"
    network.drop([1], [2, 3])
    network.drop([2, 3], [1])
    assert probe(network, 1, 2) == "unreachable"
    assert probe(network, 2, 1) == "unreachable"
    assert probe(network, 2, 3) != "unreachable"
    assert probe(network, None, 1) != "unreachable"  # the test process, a client, is not cut off
    network.heal()
    assert probe(network, 1, 2) != "unreachable"
    assert probe(network, 2, 1) != "unreachable"


def test_a_one_way_partition_drops_only_what_one_side_sends(network):
    network.drop([1], [2])
    assert probe(network, 1, 2) == "unreachable"
    # 2 -> 1: 1's answers to 2 are what is dropped, so the connection cannot complete either
    assert probe(network, 2, 1) == "unreachable"
    assert probe(network, 1, 3) != "unreachable"
    network.heal()
    assert probe(network, 1, 2) != "unreachable"


def test_loss_drops_about_the_share_of_packets_asked(network):
    network.drop([1], [2], 50)
    args = [sys.executable, "-c", DATAGRAMS, network.address(2), str(faults.CLIENT_PORT), "200"]
    got = int(subprocess.run(network.wrap(1, args), capture_output=True, text=True, check=True).stdout)
    assert 50 < got < 150  # 100 expected; binomial(200, 0.5) stays in this band but for 1 run in 10^12
    network.heal()
    got = int(subprocess.run(network.wrap(1, args), capture_output=True, text=True, check=True).stdout)
    assert got == 200


@pytest.mark.parametrize("network", [True], indirect=True)
def test_latency_delays_the_links_into_a_node_and_heals(network):
    fast = int(probe(network, 1, 2, faults.REPLICATION_PORT))
    network.slow(2, 150, 0)
    slow = int(probe(network, 1, 2, faults.REPLICATION_PORT))
    assert slow >= 300  # 150 ms each way
    assert int(probe(network, 1, 3, faults.REPLICATION_PORT)) < 150  # other links keep their speed
    network.heal()
    assert int(probe(network, 1, 2, faults.REPLICATION_PORT)) < 150
    assert fast < 150


def test_throttle_caps_bandwidth(network):
    network.throttle(1, 800)  # 100 kB/s
    send = ("import socket, sys, time; s = socket.create_connection((sys.argv[1], int(sys.argv[2])));"
            "t = time.monotonic(); s.sendall(b'x' * 300_000); s.shutdown(socket.SHUT_WR);"
            "n = 0\nwhile d := s.recv(65536): n += len(d)\nprint(time.monotonic() - t)")
    args = [sys.executable, "-c", send, network.address(2), str(faults.CLIENT_PORT)]
    took = float(subprocess.run(network.wrap(1, args), capture_output=True, text=True, check=True, timeout=60).stdout)
    assert took > 2  # 300 kB at 100 kB/s
    network.throttle(1, None)
    took = float(subprocess.run(network.wrap(1, args), capture_output=True, text=True, check=True, timeout=60).stdout)
    assert took < 1


def test_close_leaves_no_namespace_or_link_behind():
    net = Network()
    net.add(1)
    namespace, bridge = net.namespace(1), net.bridge
    net.close()
    assert namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0


def test_disks_fill_up_and_turn_read_only(tmp_path: Path):
    disks = Disks(4)
    directory = tmp_path / "log"
    disks.mount(1, directory)
    try:
        (directory / "a").write_bytes(b"x" * 1000)
        disks.fill(1)
        with pytest.raises(OSError) as full:
            with (directory / "b").open("wb") as out:
                out.write(b"y" * 100_000)
                out.flush()
        assert full.value.errno == errno.ENOSPC
        disks.free(1)
        (directory / "b").write_bytes(b"y" * 100_000)
        disks.read_only(1)
        with pytest.raises(OSError) as read_only:
            (directory / "c").write_bytes(b"z")
        assert read_only.value.errno == errno.EROFS
        assert (directory / "a").read_bytes() == b"x" * 1000  # reads go on
        disks.read_only(1, False)
        (directory / "c").write_bytes(b"z")
    finally:
        disks.close()
    assert not any(line.split()[1] == str(directory) for line in Path("/proc/mounts").read_text().splitlines())


class _Recorder:
    """A stand-in for Faults that records calls (the nemesis is tested alone here)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, tuple(sorted(kwargs.items()))))


def test_the_nemesis_replays_the_same_faults_from_the_same_seed():
    def run(seed: int) -> list:
        recorder = _Recorder()
        nemesis = Nemesis(recorder, seed, targets={"any": lambda rnd: [rnd.choice([1, 2, 3])]},
                          duration_s=(0, 0.01), rest_s=(0, 0.01))
        for step in nemesis.schedule(12):
            nemesis.apply(step)
        return recorder.calls

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert {name for name, _, _ in run(7)} >= {"heal"}


def test_the_nemesis_refuses_unknown_faults():
    with pytest.raises(ValueError, match="unknown nemesis faults"):
        Nemesis(_Recorder(), 1, kinds=["meteor"], targets={})


def test_a_cluster_on_the_harness_network_serves_clients_at_its_nodes_addresses(josef_cluster):
    cluster = josef_cluster(combined=1, faults=True, disk_mb=32)
    node = cluster.nodes[0]
    assert node.bootstrap_server == f"{cluster.network.address(1)}:{faults.CLIENT_PORT}"
    client = RawClient(faults.CLIENT_PORT, host=cluster.network.address(1))
    try:
        assert client.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
    finally:
        client.close()
    mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    assert mounts[str(node.log_dirs[0])] == "tmpfs"
    cluster.faults.fill_disk(1)
    assert str(cluster.faults.events[-1]) == "disk-full [1]"
