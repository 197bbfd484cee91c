"""Feature levels from kafka-python's admin (describe_features, update_features) against broker processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kafka.admin import KafkaAdminClient
from kafka.errors import InvalidUpdateVersionError

pytestmark = pytest.mark.metadata

MV = "metadata.version"
ELR = "eligible.leader.replicas.version"


def josef(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "josef", *args], capture_output=True, text=True, timeout=60)


def test_describe_and_update_features_survive_a_restart(broker):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, api_version=(4, 0))
    features = admin.describe_features()
    assert features[MV]["supported"] == (22, 26) and features[MV]["finalized"] == (26, 26)
    assert features["group.version"]["finalized"] == (1, 1)
    # Kafka 4.1's default for a new cluster: eligible leader replicas on.
    assert features[ELR]["supported"] == (0, 1) and features[ELR]["finalized"] == (1, 1)
    assert admin.update_features({MV: ("SAFE_DOWNGRADE", 24)}) == {MV: "OK"}
    with pytest.raises(InvalidUpdateVersionError):
        admin.update_features({MV: 27})
    admin.close()
    broker.restart()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, api_version=(4, 0))
    assert admin.describe_features()[MV]["finalized"] == (24, 24)
    admin.close()


def test_format_chooses_the_release(broker_factory, tmp_path):
    data = tmp_path / "data"
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={data}\nnode.id=1\n")
    cluster_id = josef("storage", "random-uuid").stdout.strip()
    bad = josef("storage", "format", "-t", cluster_id, "-c", str(props), "--release-version", "3.9")
    assert bad.returncode != 0 and "unknown metadata.version '3.9'" in bad.stderr
    assert not (data / "meta.properties").exists()
    done = josef("storage", "format", "-t", cluster_id, "-c", str(props), "--release-version", "4.0-IV1")
    assert done.returncode == 0, done.stderr
    broker = broker_factory(data)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, api_version=(4, 0))
    features = admin.describe_features()
    assert features[MV]["finalized"] == (23, 23)
    assert features.get(ELR, {}).get("finalized") is None  # a 4.0 release starts without eligible leader replicas
    admin.close()
