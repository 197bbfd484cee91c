"""Exactly-once writes: a read_committed consumer sees every row once across task retries, zombies, kills and re-runs.

The writer functions are driven directly for the fencing cases (a zombie
attempt that is still running when its retry starts) and for the re-runs of
a named batch write (``writeId``) after a failed job; Spark drivers in their
own processes (``exactly_once_driver.py``) for a task that fails half-way and
is retried, for a named batch write whose driver is killed with SIGKILL
half-way and which is run again, and for a streaming query whose driver, or
whose executor (``local-cluster`` mode: executors are JVMs of their own),
is killed with SIGKILL in the middle of a micro-batch.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyspark
import pytest
from conftest import create_topic, produce

from josef.testing import eventually
from josef_client import Admin, Consumer, OffsetAndMetadata, ProducerFencedError, TopicPartition
from josef_spark.options import write_options
from josef_spark.progress import Outcome
from josef_spark.writer import (
    BatchWriter,
    RerunMismatchError,
    Written,
    fence_failed_tasks,
    transactional_id,
    write_exactly_once,
)

TIMEOUT_S = 180
DRIVER = Path(__file__).with_name("exactly_once_driver.py")


def read(broker, topic: str, partitions: int, isolation: str = "read_committed") -> list[bytes]:
    """Every value from the start to the end (the LSO for read_committed)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer({"bootstrap.servers": broker.bootstrap_servers, "isolation.level": isolation,
                   "auto.offset.reset": "earliest", "enable.auto.commit": False}) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        values: list[bytes] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            values += [r.value for batch in consumer.poll(timeout_ms=1000).values() for r in batch]
    return values


def arrow(values: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": values})


def options(broker, topic: str, **extra: str):
    return write_options({"kafka.bootstrap.servers": broker.bootstrap_servers, "topic": topic, **extra})


# The writer, driven directly ---------------------------------------------------------------------


class Zombie:
    """An attempt writing partition ``partition`` of batch 7 that stalls after 50 of its 100 rows until released."""

    def __init__(self, opts, partition: int) -> None:
        self.rows = [f"{i}" for i in range(100)]
        self.halfway, self.resume = threading.Event(), threading.Event()
        self.outcome: queue.Queue[BaseException | Written] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(opts, partition))
        self.thread.start()
        assert self.halfway.wait(TIMEOUT_S)

    def _stalling(self):
        yield arrow(self.rows[:50])
        self.halfway.set()
        self.resume.wait(TIMEOUT_S)
        yield arrow(self.rows[50:])

    def _run(self, opts, partition: int) -> None:
        try:
            self.outcome.put(write_exactly_once(opts, self._stalling(), write_id="q", partition=partition, batch_id=7))
        except BaseException as exc:
            self.outcome.put(exc)

    def finish(self) -> BaseException | Written:
        self.resume.set()
        self.thread.join(TIMEOUT_S)
        return self.outcome.get_nowait()


def test_a_retry_fences_the_zombie_attempt_still_writing(josef_broker):
    create_topic(josef_broker, "fenced", 1)
    opts = options(josef_broker, "fenced")
    zombie = Zombie(opts, 0)
    eventually(lambda: len(read(josef_broker, "fenced", 1, "read_uncommitted")) == 50, TIMEOUT_S, "the zombie's rows")
    retry = write_exactly_once(opts, [arrow(zombie.rows)], write_id="q", partition=0, batch_id=7)
    assert retry == Written(100, 0, "q", topic="fenced")
    assert isinstance(zombie.finish(), ProducerFencedError)
    eventually(lambda: read(josef_broker, "fenced", 1) == [r.encode() for r in zombie.rows], TIMEOUT_S, "the retry's rows")
    assert len(read(josef_broker, "fenced", 1, "read_uncommitted")) == 150  # the zombie's half stays, aborted


def test_abort_on_the_driver_ends_the_failed_tasks_transactions(josef_broker):
    create_topic(josef_broker, "abandoned", 1)
    opts = options(josef_broker, "abandoned")
    zombie = Zombie(opts, 1)
    tp = {TopicPartition("abandoned", 0): "latest"}
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        eventually(lambda: admin.list_offsets(tp)[TopicPartition("abandoned", 0)].offset == 50, TIMEOUT_S, "its rows")
        assert admin.list_offsets(tp, read_committed=True)[TopicPartition("abandoned", 0)].offset == 0  # held back
        fence_failed_tasks(opts, [Written(3, 0, "q"), None])  # partition 0 finished, partition 1 did not
        # The abort marker follows the fence: the last stable offset passes the zombie's rows.
        eventually(lambda: admin.list_offsets(tp, read_committed=True)[TopicPartition("abandoned", 0)].offset == 51,
                   TIMEOUT_S, "the abort marker")
    assert isinstance(zombie.finish(), ProducerFencedError)
    assert read(josef_broker, "abandoned", 1) == []


def test_a_partition_committed_by_an_earlier_attempt_is_not_written_again(josef_broker):
    create_topic(josef_broker, "once", 2)
    opts = options(josef_broker, "once")
    batch = [arrow(["a", "b", "c"])]
    assert write_exactly_once(opts, batch, write_id="q", partition=3, batch_id=0) == Written(3, 3, "q", topic="once")
    assert write_exactly_once(opts, batch, write_id="q", partition=3, batch_id=0) == Written(0, 3, "q", True, "once")
    assert write_exactly_once(opts, [arrow(["d"])], write_id="q", partition=3, batch_id=1) == Written(1, 3, "q",
                                                                                                      topic="once")
    assert write_exactly_once(opts, batch, write_id="q", partition=3, batch_id=0).skipped  # an old batch replayed
    assert write_exactly_once(opts, batch, write_id="other", partition=3, batch_id=0).records == 3
    assert write_exactly_once(opts, [arrow([])], write_id="q", partition=4, batch_id=0) == Written(0, 4, "q")
    eventually(lambda: sorted(read(josef_broker, "once", 2)) == [b"a", b"a", b"b", b"b", b"c", b"c", b"d"], TIMEOUT_S,
               "the committed rows")
    # The progress is a consumer group's committed offset: batch id + 1, in partition 0 of the topic written.
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        progress = admin.list_consumer_group_offsets(transactional_id(opts, "q", 3))
    assert {tp: om.offset for tp, om in progress.items()} == {TopicPartition("once", 0): 2}


def test_a_named_write_run_again_after_a_failed_job_writes_each_row_once(josef_broker):
    """writeId: a re-run skips the partitions committed before, refuses other partitions, and a complete write
    is not written again. The tasks and the driver's commit and abort are called as Spark calls them."""
    create_topic(josef_broker, "nightly", 2)
    opts = options(josef_broker, "nightly", writeId="2026-11-27")
    parts = [[f"{p}.{i}" for i in range(10)] for p in range(4)]

    failed = BatchWriter(opts)  # tasks 0 and 1 commit, 2 and 3 fail: the job fails, Spark calls abort()
    assert failed.earlier is None
    done = [failed.write_partition([arrow(parts[p])], p) for p in (0, 1)]
    assert done[0] == Written(10, 0, "2026-11-27", topic="nightly")
    failed.abort([*done, None, None])
    assert BatchWriter(opts).earlier == Outcome(4, complete=False)

    other = BatchWriter(opts)  # the input partitioned another way: refused before writing, or at the commit
    with pytest.raises(RerunMismatchError, match="failed earlier with 4 partitions, and this run has partition 4"):
        other.write_partition([arrow(["x"])], 4)
    with pytest.raises(RerunMismatchError, match=r"committed this partition with other rows \(rows=10 digest="):
        other.write_partition([arrow(parts[0][:5])], 0)
    with pytest.raises(RerunMismatchError, match="this run had 3: the rows of partitions 3 to 3"):
        other.commit([Written(0, p, "2026-11-27", True, "nightly") for p in range(3)])

    rerun = BatchWriter(opts)  # the same input: the committed partitions are skipped, in any row order
    messages = [rerun.write_partition([arrow(parts[0][::-1])], 0), rerun.write_partition([arrow(parts[1])], 1),
                rerun.write_partition([arrow(parts[2])], 2), rerun.write_partition([arrow(parts[3])], 3)]
    assert [(m.records, m.skipped) for m in messages] == [(0, True), (0, True), (10, False), (10, False)]
    rerun.commit(messages)

    complete = BatchWriter(opts)  # a complete write is not written again, whatever the run has
    assert complete.earlier == Outcome(4, complete=True)
    assert complete.write_partition([arrow(["y"])], 7) == Written(0, 7, "2026-11-27", skipped=True)
    eventually(lambda: sorted(read(josef_broker, "nightly", 2)) == sorted(v.encode() for p in parts for v in p),
               TIMEOUT_S, "every row once")


# Spark drivers in their own processes ------------------------------------------------------------


class Driver:
    """``exactly_once_driver.py`` in a child process; its JVM's pid once the session is up."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, str(DRIVER), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=DRIVER.parent,
                                     env=None if env is None else {**os.environ, **env})
        self.output: list[str] = []
        self.jvm_pid: queue.Queue[int] = queue.Queue()
        self.jvm: int | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("JVM_PID "):
                self.jvm = int(line.split()[1])
                self.jvm_pid.put(self.jvm)

    def wait(self) -> int:
        try:
            return self.proc.wait(TIMEOUT_S)
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill a driver still running (a test that failed): its executors, its JVM, then its Python process."""
        if self.proc.poll() is None:
            for pid in [] if self.jvm is None else [*executors(self.jvm), self.jvm]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # it ended meanwhile
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def log(self) -> str:
        return "".join(self.output[-60:])


@pytest.fixture
def drivers():
    started: list[Driver] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Driver:
        driver = Driver(*args, env=env)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.stop()


def running(driver: Driver) -> None:
    """A driver that ended before the moment a test waits for fails the test, with its log."""
    if driver.proc.poll() is not None:
        raise AssertionError(f"the driver ended ({driver.proc.returncode}) before its write was under way:\n{driver.log()}")


def ongoing(admin: Admin) -> list[str]:
    """The transactional ids of josef-spark's tasks whose transaction is open with partitions in it."""
    return [t.transactional_id for ts in admin.list_transactions().values() for t in ts
            if t.transactional_id.startswith("josef-spark-") and t.state == "Ongoing"]


def mid_batch(broker, topic: str, partitions: int, committed_below: int, driver: Driver) -> bool:
    """Whether a write is under way after its first commit, before ``committed_below`` rows are committed.

    Some rows are committed, and a writer's transaction is open with records
    in the log (read_uncommitted is ahead of read_committed).
    """
    running(driver)
    with Admin({"bootstrap.servers": broker.bootstrap_servers}) as admin:
        writing = ongoing(admin)
        tps = {TopicPartition(topic, p): "latest" for p in range(partitions)}
        high = admin.list_offsets(tps)
        stable = admin.list_offsets(tps, read_committed=True)
    committed = sum(stable[tp].offset for tp in tps)
    return bool(writing) and 0 < committed < committed_below and any(high[tp].offset > stable[tp].offset for tp in tps)


def test_a_streaming_query_killed_mid_batch_and_restarted_writes_every_row_once(josef_broker, drivers, tmp_path):
    create_topic(josef_broker, "events", 2)
    create_topic(josef_broker, "copied", 2)
    values = [f"{i}".encode() for i in range(8000)]  # four micro-batches
    produce(josef_broker, "events", values, keys=[f"k{i}".encode() for i in range(8000)])
    checkpoint = str(tmp_path / "checkpoint")
    bootstrap = josef_broker.bootstrap_servers

    first = drivers("stream", bootstrap, "events", "copied", checkpoint, "running")
    jvm = first.jvm_pid.get(timeout=TIMEOUT_S)
    eventually(lambda: mid_batch(josef_broker, "copied", 2, len(values) // 2, first), TIMEOUT_S,
               "the second micro-batch with its transactions open")
    os.kill(jvm, signal.SIGKILL)  # the Spark driver, in the middle of a batch
    assert first.wait() != 0, first.log()
    assert len(read(josef_broker, "copied", 2)) <= len(values) // 2  # the later batches are not written

    second = drivers("stream", bootstrap, "events", "copied", checkpoint, "available-now")
    assert second.wait() == 0, second.log()
    # Every row, none twice (the markers of the last batch may still be on their way). The killed batch's open
    # transactions were aborted by the restart's fencing, or committed by a Python worker that had all its rows and
    # outlived the JVM, and then skipped by the restart: either way, once.
    eventually(lambda: sorted(read(josef_broker, "copied", 2), key=int) == values, TIMEOUT_S, "every row committed")


def test_a_task_that_fails_half_way_is_retried_with_its_transactional_id_and_writes_once(josef_broker, drivers):
    create_topic(josef_broker, "retried", 2)
    driver = drivers("failing-batch", josef_broker.bootstrap_servers, "retried")
    assert driver.wait() == 0, driver.log()
    want = sorted(f"{i}".encode() for i in range(2000))
    eventually(lambda: sorted(read(josef_broker, "retried", 2)) == want, TIMEOUT_S, "every row committed")
    # One transactional id per partition for all attempts: the retry of partition 1 bumped its epoch.
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        ids = sorted(t.transactional_id for ts in admin.list_transactions().values() for t in ts)
        epochs = {i[-1]: d.producer_epoch for i, d in admin.describe_transactions(ids).items()}
    assert len(ids) == 2 and ids[0].startswith("josef-spark-") and ids[0][:-1] == ids[1][:-1]
    assert epochs["1"] > epochs["0"]  # the same transactions otherwise (one each, committed)


def spark_home(tmp_path: Path) -> Path:
    """A SPARK_HOME of links to pyspark's own files, for a ``local-cluster`` driver.

    Its workers keep their work directories (the executors' logs) under
    SPARK_HOME: this way they are in the test's directory, not in the
    installed pyspark.
    """
    home = tmp_path / "spark-home"
    home.mkdir()
    for entry in Path(pyspark.__file__).parent.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return home


def executors(jvm: int) -> dict[int, str]:
    """The executor JVMs of a ``local-cluster`` driver (children of its JVM that run CoarseGrainedExecutorBackend).

    Their pids, with their executor ids.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if ppid == jvm and b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args:
                found[int(entry.name)] = args[args.index(b"--executor-id") + 1].decode()
        except (OSError, ValueError, IndexError):
            continue  # not a process, or one that ended meanwhile
    return found


def executor_running(home: Path, partition: int) -> str | None:
    """The id of the executor whose log (``work/{app}/{executor}/stderr``) shows partition ``partition``'s task start."""
    for log in home.glob("work/*/*/stderr"):
        if re.search(rf"Running task {partition}\.0 in stage \d+\.0 \(TID \d+\)", log.read_text(errors="replace")):
            return log.parent.name
    return None


def test_a_streaming_query_whose_executor_is_killed_mid_batch_writes_every_row_once(josef_broker, drivers, tmp_path):
    """Two executors run the micro-batch's two tasks; partition 0's first attempt stops half-way with its transaction
    open (``stalled-stream``), and its executor is killed. The task runs again on the other executor (Spark's
    standalone worker also starts a new one), fencing the killed attempt's transaction; the query then ends."""
    create_topic(josef_broker, "clicks", 2)
    create_topic(josef_broker, "clicks-copy", 2)
    values = [f"{i}:".encode() + b"." * 1000 for i in range(2000)]  # a batch of 100 rows is more than a buffer
    produce(josef_broker, "clicks", values, keys=[f"k{i}".encode() for i in range(2000)])
    home = spark_home(tmp_path)
    driver = drivers("stalled-stream", josef_broker.bootstrap_servers, "clicks", "clicks-copy",
                     str(tmp_path / "checkpoint"), env={"SPARK_HOME": str(home)})
    jvm = driver.jvm_pid.get(timeout=TIMEOUT_S)
    with Admin({"bootstrap.servers": josef_broker.bootstrap_servers}) as admin:
        eventually(lambda: running(driver) or any(t.endswith("-0") for t in ongoing(admin)), TIMEOUT_S,
                   "partition 0's task stopped with its transaction open")
    executor_id = executor_running(home, 0)
    (pid,) = [pid for pid, found in executors(jvm).items() if found == executor_id]
    os.kill(pid, signal.SIGKILL)
    assert driver.wait() == 0, driver.log()
    assert f"Lost executor {executor_id} " in "".join(driver.output)  # Spark saw it go, and ran its task again
    eventually(lambda: sorted(read(josef_broker, "clicks-copy", 2), key=lambda v: int(v.split(b":")[0])) == values,
               TIMEOUT_S, "every row committed")
    assert len(read(josef_broker, "clicks-copy", 2, "read_uncommitted")) > len(values)  # the killed attempt's, aborted


def test_a_task_whose_input_fails_upstream_is_not_committed_with_the_rows_it_got(josef_broker, drivers):
    """Spark shuts the writer's input down when a UDF before it fails: the rows that came are not committed as the
    partition's (the next attempt would skip the rest), but aborted, and the next attempt writes them all."""
    create_topic(josef_broker, "padded", 2)
    driver = drivers("upstream-failing-batch", josef_broker.bootstrap_servers, "padded")
    assert driver.wait() == 0, driver.log()
    want = [f"{i}:".encode() + b"." * 1000 for i in range(2000)]
    eventually(lambda: sorted(read(josef_broker, "padded", 2), key=lambda v: int(v.split(b":")[0])) == want,
               TIMEOUT_S, "every row once")
    assert len(read(josef_broker, "padded", 2, "read_uncommitted")) > len(want)  # the first attempt's, aborted


def test_a_named_batch_write_whose_driver_is_killed_half_way_writes_the_rest_when_run_again(josef_broker, drivers):
    """writeId: the driver is killed while partition 3's task is stopped half-way, after two other partitions were
    committed. Then a run that fails half-way (partition 3 has a bad row) writes what it can;
    the next run writes the rest, skipping what the earlier runs committed; the run after it writes nothing."""
    create_topic(josef_broker, "daily", 2)
    bootstrap = josef_broker.bootstrap_servers
    first = drivers("named-batch", bootstrap, "daily", "day-1", "stall")
    jvm = first.jvm_pid.get(timeout=TIMEOUT_S)
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        eventually(lambda: running(first) or any(t.endswith("-day-1-3") for t in ongoing(admin)), TIMEOUT_S,
                   "partition 3's task stopped with its transaction open")
        # Two tasks had finished, so committed, when partition 3's started (two run at a time).
        done = [p for p in range(3) if admin.list_consumer_group_offsets(f"josef-spark-day-1-{p}")]
    assert len(done) >= 2, done
    os.kill(jvm, signal.SIGKILL)
    assert first.wait() != 0, first.log()

    second = drivers("named-batch", bootstrap, "daily", "day-1", "fail,ok,ok")
    assert second.wait() == 0, second.log()
    outcomes = [line.split()[0] for line in second.output if line.startswith(("FAILED", "WRITTEN"))]
    assert outcomes == ["FAILED", "WRITTEN", "WRITTEN"], second.log()
    assert "a row has a null topic" in "".join(second.output)
    want = [f"{i}:".encode() + b"." * 1000 for i in range(4000)]
    eventually(lambda: sorted(read(josef_broker, "daily", 2), key=lambda v: int(v.split(b":")[0])) == want,
               TIMEOUT_S, "every row once")
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        outcome = admin.list_consumer_group_offsets("josef-spark-day-1-write")
    assert outcome == {TopicPartition("daily", 0): OffsetAndMetadata(4, "complete")}
