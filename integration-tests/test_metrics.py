"""A 3-node cluster's /metrics and health checks, read as Prometheus and a Kubernetes probe read them.

Producing and consuming moves Kafka's BrokerTopicMetrics by exactly what
was written and read (summed over the brokers, as a dashboard sums them);
a killed broker makes under-replicated and offline partitions show on the
others and go once it is back; the restarted broker's ``/health/ready``
says 503 until it has caught up and is unfenced.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from josef.node.cluster import free_ports

REPO = Path(__file__).resolve().parent.parent
METRICS_DOC = REPO / "docs" / "metrics.md"
DASHBOARD = REPO / "examples" / "grafana" / "josef-overview.json"
RECORDS = 2000
LAGGING = 50
VALUE = b"v" * 100
TIMEOUT_S = 60


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a node's /metrics, by (name, sorted labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that have ``labels`` (among others: every version of a request)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= set(have)
               and ("topic" in labels or not any(k == "topic" for k, _ in have)))


def total(ports, name: str, **labels: str) -> float:
    return sum(value(scrape(p), name, **labels) for p in ports)


def ready(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def eventually(check, what: str, timeout: float = TIMEOUT_S, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(every)


def test_counters_move_by_what_was_produced_and_a_dead_broker_shows(josef_cluster):
    ports = dict(zip((1, 2, 3), free_ports(3)))
    cluster = josef_cluster(combined=3, node_overrides={
        n: {"http.listeners": f"http://127.0.0.1:{port}"} for n, port in ports.items()},
        **{"replica.lag.time.max.ms": "2000", "broker.session.timeout.ms": "3000",
           "broker.heartbeat.interval.ms": "200"})
    b = cluster.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=b, request_timeout_ms=30000)
    admin.create_topics([NewTopic("metered", 3, 3, topic_configs={"min.insync.replicas": "2"}),
                         NewTopic("single", -1, -1, replica_assignments={0: [3]})])
    admin.close()
    # Client telemetry (KIP-714): every client pushes its metrics each second; the workspace installs the receiver.
    subprocess.run([sys.executable, "-m", "josef", "client-metrics", "--bootstrap-server", b, "--alter", "--name",
                    "everything", "--metrics", "*", "--interval", "1000"], check=True, timeout=TIMEOUT_S)
    everyone = list(ports.values())
    before = {m: total(everyone, f"kafka_server_brokertopicmetrics_{m}_total", topic="metered")
              for m in ("messagesin", "bytesin", "bytesout", "replicationbytesin")}
    produce_requests = total(everyone, "kafka_network_requestmetrics_requests_total", request="Produce")

    producer = Producer({"bootstrap.servers": b, "acks": "all", "linger.ms": 5, "client.id": "metered-producer"})
    for i in range(RECORDS):
        producer.produce("metered", VALUE, key=str(i).encode())
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": b, "group.id": "readers", "auto.offset.reset": "earliest"})
    consumer.subscribe(["metered"])
    read = 0
    deadline = time.monotonic() + TIMEOUT_S
    while read < RECORDS and time.monotonic() < deadline:
        read += sum(1 for m in consumer.consume(500, 1) if m.error() is None)
    consumer.close()
    assert read == RECORDS

    assert total(everyone, "kafka_network_requestmetrics_requests_total", request="Produce") > produce_requests
    # More records than the group has read: its coordinator reports the lag (kafka-exporter's names).
    for i in range(LAGGING):
        producer.produce("metered", VALUE)
    assert producer.flush(TIMEOUT_S) == 0
    eventually(lambda: total(everyone, "kafka_consumergroup_lag_sum", consumergroup="readers",
                             topic="metered") == LAGGING, f"the group's lag is {LAGGING}")
    after = {m: total(everyone, f"kafka_server_brokertopicmetrics_{m}_total", topic="metered") for m in before}
    moved = {m: after[m] - before[m] for m in before}
    assert moved["messagesin"] == RECORDS + LAGGING
    assert moved["bytesin"] > (RECORDS + LAGGING) * len(VALUE)
    assert moved["bytesout"] >= moved["bytesin"] * RECORDS / (RECORDS + LAGGING)  # every batch read was read once
    assert moved["replicationbytesin"] == 2 * moved["bytesin"]  # two followers copied every batch
    eventually(lambda: any(name.startswith("org_apache_kafka_producer_") and ("client_id", "metered-producer") in labels
                           for p in everyone for name, labels in scrape(p)),
               "the producer's pushed metrics are on some broker's /metrics")
    one = scrape(ports[1])
    assert value(one, "kafka_network_requestmetrics_totaltimems_count", request="Produce") > 0
    assert value(one, "kafka_network_requestmetrics_totaltimems", request="Produce", quantile="0.99") > 0
    assert value(one, "kafka_controller_kafkacontroller_globaltopiccount") >= 2
    assert sum(value(scrape(p), "kafka_controller_kafkacontroller_activecontrollercount") for p in everyone) == 1
    assert all(value(scrape(p), "kafka_server_replicamanager_underreplicatedpartitions") == 0 for p in everyone)
    exported = _families(ports[1]) | _families(ports[2]) | _families(ports[3])
    undocumented = {f for f in exported if f.startswith(("kafka_", "josef_")) and f"`{f}`" not in METRICS_DOC.read_text()}
    assert not undocumented, f"docs/metrics.md does not list {sorted(undocumented)}"
    dashboard = json.loads(DASHBOARD.read_text())
    used = {re.sub(r"_(count|sum)$", "", name) for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\b((?:kafka|process)_[a-z0-9_]+)", target["expr"])}
    assert used and not used - exported, f"the example dashboard uses names no node exports: {sorted(used - exported)}"

    # A broker dies: the others lead its partitions, under-replicated; its single-replica partition is offline.
    node3 = cluster.node(3)
    offset_when_killed = ready(ports[1])[1]["metadata_offset"]
    node3.kill()
    survivors = [ports[1], ports[2]]
    eventually(lambda: total(survivors, "kafka_server_replicamanager_underreplicatedpartitions") >= 3,
               "the survivors report metered's 3 partitions under-replicated")
    eventually(lambda: all(value(scrape(p), "kafka_controller_kafkacontroller_offlinepartitionscount") == 1
                           for p in survivors), "the controllers report single-0 offline")

    # It comes back: not ready until it has caught up and is unfenced, then the counts fall back to 0.
    node3.start(wait=False)
    answers = []
    eventually(lambda: _probe(ports[3], answers), "the restarted broker says it is ready", timeout=90, every=0.01)
    assert any(status == 503 for status, _ in answers), answers
    assert all(facts["fenced"] or not facts["started"] for status, facts in answers if status == 503)
    assert answers[-1][1]["metadata_offset"] >= offset_when_killed
    eventually(lambda: total(everyone, "kafka_server_replicamanager_underreplicatedpartitions") == 0,
               "every partition is fully replicated again")
    eventually(lambda: all(value(scrape(p), "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
                           for p in everyone), "single-0 has a leader again")
    assert total(everyone, "kafka_server_replicamanager_isrexpands_total") >= 3


def _families(port: int) -> set[str]:
    """The names a node's /metrics exports, as Prometheus queries them (a counter with its _total)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {s.name if family.type != "summary" else family.name
            for family in text_string_to_metric_families(text) for s in family.samples}


def _probe(port: int, answers: list) -> bool:
    """One readiness probe of a starting node (refused connections are not answers); True once ready."""
    try:
        status, facts = ready(port)
    except (urllib.error.URLError, ConnectionError):
        return False
    answers.append((status, facts))
    return status == 200
