"""A consume-transform-produce application in a process of its own, for tests that SIGKILL it by PID.

Run as a script, this module is the worker: a confluent-kafka consumer
(``read_committed``, no auto commit) in group ``GROUP`` reads the input
topic; for each poll it begins a transaction, produces every record's value
upper-cased to the output topic, adds the consumed offsets with
``send_offsets_to_transaction`` and commits. It prints one JSON line per
committed transaction (``{"committed": n}``) so tests can wait for progress,
and runs until killed or told to stop on stdin.

The transactional id stays the same across restarts: a restarted worker
fences its killed predecessor (InitProducerId aborts the open transaction)
and resumes from the offsets committed with the last committed transaction,
which is what makes the output exactly once.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any

GROUP = "ctp"
TRANSACTIONAL_ID = "ctp-worker"


class TransformWorker:
    """One worker process; :meth:`committed` counts the transactions it reported."""

    def __init__(self, bootstrap: str, source: str, sink: str, batch: int = 10) -> None:
        config = {"bootstrap": bootstrap, "source": source, "sink": sink, "batch": batch}
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(config)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()  # type: ignore[arg-type]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def wait_for_commits(self, count: int, timeout: float = 60) -> None:
        """Block until the worker reported ``count`` more committed transactions."""
        for _ in range(count):
            try:
                self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"worker committed nothing for {timeout}s; stderr: {''.join(self.stderr[-30:])}")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def _run(config: dict[str, Any]) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer

    consumer = Consumer({"bootstrap.servers": config["bootstrap"], "group.id": GROUP, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         # Static membership: a restarted worker takes its killed predecessor's place at once.
                         "group.instance.id": "ctp-worker-0",
                         "fetch.queue.backoff.ms": 10})
    producer = Producer({"bootstrap.servers": config["bootstrap"], "transactional.id": TRANSACTIONAL_ID,
                         "transaction.timeout.ms": 10000, "linger.ms": 5})
    producer.init_transactions(60)
    consumer.subscribe([config["source"]])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        messages = [m for m in consumer.consume(config["batch"], timeout=0.2) if m.error() is None]
        if not messages:
            continue
        producer.begin_transaction()
        for message in messages:
            producer.produce(config["sink"], message.value().upper(), key=message.key(), partition=message.partition())
        try:
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            producer.abort_transaction(60)
            _rewind(consumer)
            continue
        print(json.dumps({"committed": len(messages)}), flush=True)
    consumer.close()


def _rewind(consumer: Any) -> None:
    """After an abort, read again from the last committed offsets (what a restart would do)."""
    from confluent_kafka import TopicPartition

    assignment = consumer.assignment()
    for tp in consumer.committed(assignment, timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
