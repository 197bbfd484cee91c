"""``josef zookeeper-shell`` against a real ZooKeeper server: the reads of Kafka's zookeeper-shell.sh, in its output."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner, Result
from kazoo.client import KazooClient

from josef.cli import build_cli
from josef.testing import free_ports
from josef.testing.tls import TlsFiles
from josef_metadata_zk.testing import ZooKeeperEnsemble
from josef_metadata_zk.znodes import split_connect


def shell(connect: str, *command: str, stdin: str | None = None, options: tuple[str, ...] = ()) -> Result:
    """``josef zookeeper-shell``, in-process through the ``josef`` command the plugins build."""
    return CliRunner().invoke(build_cli(), ["zookeeper-shell", *options, connect, *command], input=stdin)


def test_ls_get_and_stat_show_what_kafka_s_shell_shows(zk_connect):
    hosts, chroot = split_connect(zk_connect)
    zk = KazooClient(hosts=hosts)
    zk.start(timeout=30)
    try:
        zk.create(chroot + "/brokers/ids/1", b'{"version":5}', makepath=True)
        zk.create(chroot + "/brokers/ids/2", b'{"version":5}')
        zk.create(chroot + "/controller", json.dumps({"version": 1, "brokerid": 2}).encode(), ephemeral=True)
        owner = zk.client_id[0]

        listed = subprocess.run([sys.executable, "-m", "josef", "zookeeper-shell", zk_connect, "ls", "/brokers/ids"],
                                capture_output=True, text=True, timeout=60)  # once as a user runs it
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines() == [f"Connecting to {zk_connect}", "[1, 2]"]
        assert shell(zk_connect, "get", "/controller").stdout.splitlines()[-1] == '{"version": 1, "brokerid": 2}'
        stat = dict(line.split(" = ", 1) for line in shell(zk_connect, "stat", "/controller").stdout.splitlines()[1:])
        assert stat["ephemeralOwner"] == f"{owner:#x}" and stat["numChildren"] == "0" and stat["dataVersion"] == "0"
        tree = shell(zk_connect, "ls", "-R", "/brokers").stdout.splitlines()[1:]
        assert tree == ["/brokers", "/brokers/ids", "/brokers/ids/1", "/brokers/ids/2"]
        assert shell(zk_connect, "get", "/nothing").stdout.splitlines()[-1] == "Node does not exist: /nothing"
        piped = shell(zk_connect, stdin="ls /\nget /brokers/ids/1\n")
        assert piped.stdout.splitlines()[1:] == ["[brokers, controller]", '{"version":5}']
        refused = shell(zk_connect, "delete", "/controller")
        assert refused.exit_code != 0 and "unknown command delete" in refused.output
    finally:
        zk.stop()
        zk.close()


def test_an_unreachable_server_is_a_clear_error():
    [port] = free_ports(1)
    failed = shell(f"127.0.0.1:{port}", "ls", "/", options=("--timeout", "1"))
    assert failed.exit_code != 0 and f"cannot reach ZooKeeper at 127.0.0.1:{port} within 1 s" in failed.output


def test_over_tls_with_kafka_s_zk_tls_config_file(tmp_path):
    tls = TlsFiles.create(tmp_path / "tls")
    config = tmp_path / "zk-tls.properties"
    config.write_text("zookeeper.clientCnxnSocket=org.apache.zookeeper.ClientCnxnSocketNetty\n"
                      f"zookeeper.ssl.client.enable=true\nzookeeper.ssl.truststore.type=PEM\n"
                      f"zookeeper.ssl.truststore.location={tls.ca_pem}\n")
    with ZooKeeperEnsemble(tmp_path / "zookeeper", tls=tls) as ensemble:
        listed = shell(ensemble.secure_connect, "-zk-tls-config-file", str(config), "ls", "/")
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.splitlines() == [f"Connecting to {ensemble.secure_connect}", "[zookeeper]"]
        plain = shell(ensemble.secure_connect, "ls", "/", options=("--timeout", "2"))  # no TLS: no answer
        assert plain.exit_code != 0 and "cannot reach ZooKeeper" in plain.output
    missing = shell("127.0.0.1:2181", "-zk-tls-config-file", str(tmp_path / "absent.properties"), "ls", "/")
    assert missing.exit_code != 0 and "cannot read" in missing.output
