"""Group members in processes of their own, for tests that must kill one with SIGKILL by its PID.

Run as a script, this module is the worker: a confluent-kafka consumer that
subscribes, reports on stdout (JSON lines) its assignment whenever it changes
and every record it consumes, commits each record's offset, and closes when
told so on stdin. Tests wait on those reports with deadlines, never on sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

TOPIC_PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000
DEADLINE_S = 60


class Worker:
    """A consumer process; ``events`` collects what it reports."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, settings: dict[str, Any]) -> None:
        self.name = name
        config = {"bootstrap": bootstrap, "group": group, "topic": topic, "settings": settings}
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.assignment: set[int] = set()
        self.records: list[tuple[int, int, str]] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.stderr.append(line)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def drain(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event["event"] == "assignment":
                self.assignment = set(event["partitions"])
            elif event["event"] == "record":
                self.records.append((event["partition"], event["offset"], event["value"]))

    def close(self) -> None:
        """A clean close: the consumer leaves the group (heartbeat with epoch -1) and the process exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=30) == 0, "".join(self.stderr)
        self.drain()

    def kill(self) -> None:
        """SIGKILL: no goodbye, the broker finds out when the session times out."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.drain()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def wait_until(workers: list[Worker], condition, what: str, timeout_s: float = DEADLINE_S) -> float:
    """Poll the workers' reports until ``condition()`` holds; returns how long it took."""
    started = time.monotonic()
    while True:
        for worker in workers:
            worker.drain()
        if condition():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            details = {w.name: (sorted(w.assignment), len(w.records), "".join(w.stderr[-5:])) for w in workers}
            raise AssertionError(f"timed out waiting for {what}: {details}")
        time.sleep(0.05)


def produce(bootstrap: str, topic: str, start: int, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % TOPIC_PARTITIONS)
    assert producer.flush(30) == 0


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)], timeout=10)}
    finally:
        consumer.close()


def share_and_take_over(bootstrap: str, group: str, topic: str, settings: dict[str, Any], departure: str,
                        sticky: bool) -> None:
    """Three members share six partitions two each and read every record; one closes or is killed
    (``departure``), the other two take its partitions and read the rest, committing to the end.

    ``sticky``: the survivors must keep the partitions they had (cooperative and KIP-848 assignors).
    """
    workers = [Worker(f"w{i}", bootstrap, group, topic, settings) for i in range(3)]
    try:
        def balanced(members: list[Worker], each: int) -> bool:
            sets = [w.assignment for w in members]
            return all(len(s) == each for s in sets) and set().union(*sets) == set(range(TOPIC_PARTITIONS))

        wait_until(workers, lambda: balanced(workers, 2), "two partitions each")

        produce(bootstrap, topic, 0, 300)

        def seen(members: list[Worker]) -> set[str]:
            return {value for w in members for _, _, value in w.records}

        wait_until(workers, lambda: len(seen(workers)) == 300, "the first 300 records")

        leaver, survivors = workers[0], workers[1:]
        before = {w.name: set(w.assignment) for w in survivors}
        (leaver.close if departure == "close" else leaver.kill)()
        took = wait_until(survivors, lambda: balanced(survivors, 3), "the leaver's partitions to be taken over")
        # A clean leave rebalances at once; a killed member is noticed when its session expires.
        assert took < SESSION_TIMEOUT_MS / 1000 + 15, took
        if sticky:
            assert all(before[w.name] <= w.assignment for w in survivors)  # nobody lost a partition it had

        produce(bootstrap, topic, 300, 300)
        wait_until(workers, lambda: len(seen(workers)) == 600, "every record")
        assert seen(workers) == {f"v{i}" for i in range(600)}
        late = {v for w in survivors for p, _, v in w.records if int(v[1:]) >= 300}
        assert late == {f"v{i}" for i in range(300, 600)}  # the second half went to the survivors

        ends = {p: 100 for p in range(TOPIC_PARTITIONS)}
        deadline = time.monotonic() + DEADLINE_S
        while committed(bootstrap, group, topic) != ends:
            assert time.monotonic() < deadline, committed(bootstrap, group, topic)
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.stop()


def consume_committing(consumer: Any, want: int) -> list[str]:
    """Poll a confluent-kafka consumer until ``want`` records came, committing each as it goes."""
    got: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} records arrived"
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        got.append(message.value().decode())
        consumer.commit(message=message, asynchronous=False)
    return got


# The worker ------------------------------------------------------------------------------


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _worker(config: dict[str, Any]) -> None:
    from confluent_kafka import Consumer, KafkaException

    consumer = Consumer({
        "bootstrap.servers": config["bootstrap"],
        "group.id": config["group"],
        **config["settings"],
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
        "topic.metadata.refresh.interval.ms": 2000,
    })
    consumer.subscribe([config["topic"]])
    closing = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                closing.set()
                return

    threading.Thread(target=read_stdin, daemon=True).start()
    assignment: list[int] = []
    while not closing.is_set():
        message = consumer.poll(0.1)
        current = sorted(tp.partition for tp in consumer.assignment())
        if current != assignment:
            assignment = current
            _emit(event="assignment", partitions=current)
        if message is None or message.error():
            continue
        _emit(event="record", partition=message.partition(), offset=message.offset(),
              value=message.value().decode())
        try:
            consumer.commit(message=message, asynchronous=False)
        except KafkaException:
            pass  # a rebalance is under way: the record may come again to its next owner
    consumer.close()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
