"""kcat (librdkafka's command-line client) lists, produces and consumes."""

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.storage

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.fixture
def kcat():
    assert KCAT, "kcat is required: apt-get install kcat"
    return KCAT


def run(*args, input=None):
    return subprocess.run(args, input=input, capture_output=True, text=True, timeout=60, check=True)


def test_metadata_produce_consume(broker, kcat):
    lines = "".join(f"key{i}:value{i}\n" for i in range(500))
    run(kcat, "-b", broker.bootstrap_servers, "-P", "-t", "kcat-topic", "-K:", "-z", "lz4", input=lines)
    metadata = run(kcat, "-b", broker.bootstrap_servers, "-L").stdout
    assert "1 brokers:" in metadata
    assert f"127.0.0.1:{broker.port}" in metadata
    assert 'topic "kcat-topic" with 1 partitions' in metadata
    consumed = run(kcat, "-b", broker.bootstrap_servers, "-C", "-t", "kcat-topic", "-o", "beginning", "-e",
                   "-f", "%k=%s@%o\n").stdout
    assert consumed.splitlines() == [f"key{i}=value{i}@{i}" for i in range(500)]


def test_json_metadata_lists_created_topics(broker, kcat):
    run(kcat, "-b", broker.bootstrap_servers, "-P", "-t", "a", input="x\n")
    run(kcat, "-b", broker.bootstrap_servers, "-P", "-t", "b", input="y\n")
    doc = json.loads(run(kcat, "-b", broker.bootstrap_servers, "-L", "-J").stdout)
    assert {t["topic"] for t in doc["topics"]} >= {"a", "b"}
    assert [(b["id"], b["name"]) for b in doc["brokers"]] == [(1, f"127.0.0.1:{broker.port}")]
