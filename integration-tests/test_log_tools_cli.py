"""``josef log-dirs describe`` against a broker process, then ``josef dump-log`` over its files once it stopped.

Records, a consumer group's commits and a committed transaction are made by
Kafka's own client (librdkafka), so the files dumped are what a real
workload leaves: user data with a transaction marker, ``__consumer_offsets``
and ``__transaction_state``, read with Kafka's decoder flags.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.storage

TOPIC = "dumped"
GROUP = "dumpers"
TXN_ID = "dump-tx"
TIMEOUT_S = 120
#: TransactionStatus of CompleteCommit in __transaction_state.
COMPLETE_COMMIT = 4


def josef(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True,
                            timeout=TIMEOUT_S, check=False)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def workload(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    plain = Producer({"bootstrap.servers": bootstrap, "compression.type": "gzip", "linger.ms": 50})
    for i in range(5):
        plain.produce(TOPIC, key=f"k{i}".encode(), value=f"plain-{i}".encode(), headers=[("h", b"1")])
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": TXN_ID})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(TOPIC, key=b"t", value=b"in-a-transaction")
    txn.commit_transaction(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    seen = 0
    while seen < 6:
        message = consumer.poll(30)
        assert message is not None, f"only {seen} records consumed"
        if message.error() is None:
            seen += 1
    consumer.commit(asynchronous=False)
    assert consumer.committed([TopicPartition(TOPIC, 0)], 30)[0].offset == 6  # after the last record consumed
    consumer.close()


def logs_of(data_dir: Path, topic: str) -> list[Path]:
    """The non-empty segments of every partition of ``topic``."""
    return [p for p in sorted(data_dir.glob(f"{topic}-*/*.log")) if p.stat().st_size > 0]


def test_log_dirs_then_dump_log(broker):
    bootstrap = broker.bootstrap_servers
    workload(bootstrap)

    described = josef("log-dirs", "describe", "--bootstrap-server", bootstrap, "--topic-list", TOPIC)
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    assert lines[0] == "Querying brokers for log directories information"
    match = re.fullmatch(r"Received log directory information from brokers (\d+)", lines[1])
    assert match, lines[1]
    answer = json.loads(lines[2])
    assert list(answer) == ["brokers", "version"] and answer["version"] == 1
    [entry] = answer["brokers"]
    assert entry["broker"] == int(match.group(1))
    [log_dir] = entry["logDirs"]
    assert list(log_dir) == ["partitions", "error", "logDir"]
    assert Path(log_dir["logDir"]) == broker.data_dir and log_dir["error"] is None
    [partition] = log_dir["partitions"]  # only the listed topic
    assert list(partition) == ["partition", "size", "offsetLag", "isFuture"]
    assert partition["partition"] == f"{TOPIC}-0" and partition["offsetLag"] == 0 and partition["isFuture"] is False

    assert broker.stop() == 0
    data_dir = broker.data_dir
    [segment] = logs_of(data_dir, TOPIC)
    assert segment.stat().st_size == partition["size"]  # log-dirs reported the bytes on disk

    dumped = josef("dump-log", "--print-data-log", "--files", str(segment))
    assert dumped.returncode == 0, dumped.stderr
    lines = dumped.stdout.splitlines()
    assert lines[:2] == [f"Dumping {segment}", "Log starting offset: 0"]
    batches = [line for line in lines if line.startswith("baseOffset: ")]
    assert len(batches) == 3, lines
    assert "count: 5 " in batches[0] and "compresscodec: gzip" in batches[0] and batches[0].endswith("isvalid: true")
    assert "isTransactional: true isControl: false" in batches[1] and "baseSequence: 0" in batches[1]
    assert "isTransactional: true isControl: true" in batches[2]
    records = [line for line in lines if line.startswith("| offset: ")]
    assert records[0].startswith("| offset: 0 CreateTime: ") and "headerKeys: [h]" in records[0]
    assert records[0].endswith(" key: k0 payload: plain-0")
    assert records[5].endswith(" key: t payload: in-a-transaction")
    assert re.search(r" endTxnMarker: COMMIT coordinatorEpoch: \d+$", records[6]), records[6]

    stem = segment.with_suffix("")
    files = [stem.with_suffix(s) for s in (".index", ".timeindex", ".snapshot") if stem.with_suffix(s).exists()]
    snapshots = sorted(segment.parent.glob("*.snapshot"))
    indexes = josef("dump-log", "--files", ",".join(map(str, files + snapshots)))
    assert indexes.returncode == 0 and indexes.stderr == "", indexes.stderr
    assert indexes.stdout.count("Dumping ") == len(files + snapshots)
    if snapshots:  # written at a clean shutdown: the transactional producer is in it, its transaction closed
        assert re.search(r"^producerId: \d+ producerEpoch: \d+ coordinatorEpoch: \d+ "
                         r"currentTxnFirstOffset: OptionalLong.empty lastTimestamp: \d+ firstSequence: 0 ",
                         indexes.stdout, re.M), indexes.stdout

    offsets = josef("dump-log", "--offsets-decoder", "--files", ",".join(map(str, logs_of(data_dir, "__consumer_offsets"))))
    assert offsets.returncode == 0, offsets.stderr
    commit_key = f'key: {{"type":"1","data":{{"group":"{GROUP}","topic":"{TOPIC}","partition":0}}}}'
    commits = [line for line in offsets.stdout.splitlines() if commit_key in line]
    assert commits, offsets.stdout
    assert re.search(r' payload: \{"version":"3","data":\{"offset":6,"leaderEpoch":-?\d+,"metadata":"",'
                     r'"commitTimestamp":\d+\}\}$', commits[-1]), commits[-1]
    groups = [line for line in offsets.stdout.splitlines() if f'key: {{"type":"2","data":{{"group":"{GROUP}"}}}}' in line]
    assert groups and any('"protocolType":"consumer"' in line and '"subscription":{"topics":["dumped"]' in line
                          for line in groups), groups

    txns = josef("dump-log", "--transaction-log-decoder",
                 "--files", ",".join(map(str, logs_of(data_dir, "__transaction_state"))))
    assert txns.returncode == 0, txns.stderr
    states = [line for line in txns.stdout.splitlines()
              if f'key: {{"type":"0","data":{{"transactionalId":"{TXN_ID}"}}}}' in line]
    assert any(f'"transactionStatus":{COMPLETE_COMMIT},' in line for line in states), states
    assert any(f'"transactionPartitions":[{{"topic":"{TOPIC}","partitionIds":[0]}}]' in line for line in states), states
