"""The README's secured node, run as written: its server.properties, its format and admin commands, its client settings.

Only what cannot be copied is replaced: the ports (free ones), the log
directory and the certificate files (a test CA's). If the README's example
stops working, this test says so.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer
from round_trips import first_error, poll_values

from josef.node.cluster import free_ports
from josef.testing import eventually
from josef.testing.tls import TlsFiles

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str) -> str:
    text = README.read_text()
    start = text.index(f"<!-- {name}:begin -->")
    end = text.index(f"<!-- {name}:end -->")
    return re.search(r"```properties\n(.*?)```", text[start:end], re.S).group(1)


def commands(after: str) -> list[list[str]]:
    """The ``$ josef ...`` commands of the first console block after ``after``, continuation lines joined."""
    text = README.read_text()
    console = re.search(r"```console\n(.*?)```", text[text.index(after):], re.S).group(1)
    return [shlex.split(c.replace("\\\n", " ")) for c in re.findall(r"^\$ (josef .*?)(?=^\$ |\Z)", console, re.S | re.M)]


def localize(text: str, tls: TlsFiles, data: Path, ports: dict[int, int]) -> str:
    text = text.replace("/etc/josef/broker.pem", str(tls.broker_pem)).replace("/etc/josef/ca.pem", str(tls.ca_pem))
    text = text.replace("/var/lib/josef", str(data))
    for readme_port, port in ports.items():
        text = text.replace(f"localhost:{readme_port}", f"localhost:{port}")
    return text


def josef(*args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"josef {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_readme_s_secured_node_works_as_written(tmp_path):
    tls = TlsFiles.create(tmp_path / "tls")
    client_port, controller_port = free_ports(2, "127.0.0.1")
    ports = {9094: client_port, 9093: controller_port}
    properties = tmp_path / "server.properties"
    properties.write_text(localize(block("secured-properties"), tls, tmp_path / "data", ports))
    admin_properties = tmp_path / "admin.properties"
    admin_properties.write_text(localize(block("admin-properties"), tls, tmp_path / "data", ports))

    [format_command, start_command] = commands("The SCRAM users the brokers and the first admin log in as")
    assert format_command[:3] == ["josef", "storage", "format"] and start_command[:3] == ["josef", "server", "start"]
    cluster_id = josef("storage", "random-uuid").strip()
    format_args = [cluster_id if a == "$(josef storage random-uuid)" else a for a in format_command[1:]]
    josef(*[str(properties) if a == "server.properties" else a for a in format_args])
    log = tmp_path / "node.log"
    with log.open("w") as out:  # a file, not a pipe: nobody has to keep reading it
        node = subprocess.Popen([sys.executable, "-m", "josef", "server", "start", str(properties)],
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        eventually(lambda: " ready on " in log.read_text() or node.poll() is not None, what="the node ready")
        assert node.poll() is None, log.read_text()
        for command in commands("The admin then adds users and their ACLs"):
            args = [str(admin_properties) if a == "admin.properties" else
                    a.replace("localhost:9094", f"localhost:{client_port}") for a in command[1:]]
            josef(*args)

        alice = {"bootstrap.servers": f"localhost:{client_port}", "security.protocol": "SASL_SSL",
                 "ssl.ca.location": str(tls.ca_pem), "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
                 "sasl.password": "alice-secret"}
        assert '"sasl.username": "alice", "sasl.password": "alice-secret"' in README.read_text()
        producer = Producer({**alice, "acks": "all"})
        failures: list[KafkaError] = []
        for i in range(20):
            producer.produce("orders", f"o{i}".encode(), on_delivery=lambda err, msg: err and failures.append(err))
        assert producer.flush(30) == 0 and failures == []
        consumer = Consumer({**alice, "group.id": "billing", "auto.offset.reset": "earliest"})
        consumer.subscribe(["orders"])
        try:
            seen = set(poll_values(consumer, 20))
        finally:
            consumer.close()
        assert seen == {f"o{i}".encode() for i in range(20)}
        # Another group is not in alice's ACLs: the authorizer refuses it.
        other = Consumer({**alice, "group.id": "someone-elses"})
        other.subscribe(["orders"])
        try:
            assert first_error(other) == KafkaError.GROUP_AUTHORIZATION_FAILED
        finally:
            other.close()
    finally:
        node.terminate()
        node.wait(timeout=60)
