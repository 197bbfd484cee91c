"""``josef cluster start``: a local cluster run as a developer runs it, used by a real client, stopped by SIGTERM."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60
NODE_LINE = re.compile(r"^node (\d+)\s+(\S+)\s+pid (\d+)\s+(\S+)\s+log (\S+)$")


class ClusterCommand:
    """``python -m josef cluster start ...`` as a child process; its output lines go to a queue as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "josef", "cluster", "start", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        """The first line starting with ``prefix``; fails with the output so far if the command ends or times out."""
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no {prefix!r} line within {timeout}s; output:\n" + "\n".join(self.output))
            if line is None:
                pytest.fail(f"the command exited ({self.proc.wait()}) before printing {prefix!r}; output:\n"
                            + "\n".join(self.output))
            self.output.append(line)
            if line.startswith(prefix):
                return line

    def node_pids(self) -> dict[int, int]:
        """node id -> pid, from the node lines printed before the bootstrap line."""
        return {int(m.group(1)): int(m.group(3)) for m in map(NODE_LINE.match, self.output) if m}

    def rest_of_output(self) -> str:
        """Every line after those already read, once the command has exited."""
        lines = []
        while (line := self._lines.get(timeout=10)) is not None:
            lines.append(line)
        self.output += lines
        return "\n".join(lines)


def is_josef_process(pid: int) -> bool:
    """Whether ``pid`` is alive (a zombie counts as gone) and still a josef process, not a reused PID."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and b"josef" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture
def cluster_command() -> Iterator[Callable[..., ClusterCommand]]:
    """Starts commands; after the test, SIGKILLs by PID any command or node a failed test left running."""
    started: list[ClusterCommand] = []

    def make(*args: str) -> ClusterCommand:
        command = ClusterCommand(*args)
        started.append(command)
        return command

    yield make
    for command in started:
        if command.proc.poll() is None:
            command.proc.kill()
            command.proc.wait(timeout=STOP_TIMEOUT_S)
        for pid in command.node_pids().values():
            if is_josef_process(pid):
                os.kill(pid, signal.SIGKILL)


def test_cluster_start_serves_clients_and_stops_on_sigterm(cluster_command, tmp_path: Path) -> None:
    command = cluster_command("--nodes", "3", "--dir", str(tmp_path / "cluster"))
    bootstrap = command.wait_for_line("bootstrap servers: ", START_TIMEOUT_S).removeprefix("bootstrap servers: ")
    pids = command.node_pids()
    assert sorted(pids) == [1, 2, 3], command.output
    assert all(is_josef_process(pid) for pid in pids.values())
    roles = {int(m.group(1)): m.group(2) for m in map(NODE_LINE.match, command.output) if m}
    assert set(roles.values()) == {"broker,controller"}
    assert len(bootstrap.split(",")) == 3

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("local-cluster", 3, 1)])["local-cluster"].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    delivered = []
    producer.produce("local-cluster", b"hello", key=b"k", partition=2,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(30) == 0
    assert delivered == [(None, 0)]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "local-cluster-test",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("local-cluster", 2, 0)])
    message = consumer.poll(30)
    consumer.close()
    assert message is not None and message.error() is None
    assert (message.key(), message.value(), message.offset()) == (b"k", b"hello", 0)

    command.proc.send_signal(signal.SIGTERM)
    assert command.proc.wait(timeout=STOP_TIMEOUT_S) == 0, command.rest_of_output()
    tail = command.rest_of_output()
    assert "received SIGTERM" in tail and tail.endswith("stopped"), tail
    assert [pid for pid in pids.values() if is_josef_process(pid)] == []
    assert (tmp_path / "cluster" / "node-1" / "server.log").read_text().count("ready on PLAINTEXT://") == 1


def test_cluster_start_with_dedicated_controllers(cluster_command, tmp_path: Path) -> None:
    command = cluster_command("--nodes", "1", "--controllers", "1", "--dir", str(tmp_path / "cluster"),
                              "--override", "num.partitions=4")
    command.wait_for_line("bootstrap servers: ", START_TIMEOUT_S)
    nodes = {int(m.group(1)): (m.group(2), m.group(4)) for m in map(NODE_LINE.match, command.output) if m}
    assert [roles for roles, _ in nodes.values()] == ["controller", "broker"]
    assert nodes[1][1].startswith("CONTROLLER://") and nodes[2][1].startswith("PLAINTEXT://")
    properties = (tmp_path / "cluster" / "node-2" / "server.properties").read_text().splitlines()
    assert "num.partitions=4" in properties and "process.roles=broker" in properties
    command.proc.send_signal(signal.SIGINT)
    assert command.proc.wait(timeout=STOP_TIMEOUT_S) == 0, command.rest_of_output()
    assert [pid for pid in command.node_pids().values() if is_josef_process(pid)] == []


def test_cluster_start_refuses_a_used_directory(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "node-1").mkdir()
    result = subprocess.run([sys.executable, "-m", "josef", "cluster", "start", "--dir", str(tmp_path / "old")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "is not empty" in result.stderr
    assert list((tmp_path / "old").iterdir()) == [tmp_path / "old" / "node-1"]
