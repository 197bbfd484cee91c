"""The node's HTTP listener: metrics and health checks, and who may read them on a secured node."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from kio.schema.errors import ErrorCode

from josef import scram
from josef.config import ConfigError
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.protocol.api_keys import ApiKey
from josef.server.http import authentication
from josef.testing import RawClient, broker_overrides

QUICK_START_PORT = 9644
ACL_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def get(port: int, path: str, user: str | None = None, password: str = "") -> tuple[int, bytes, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def add_scram_user(client: RawClient, name: str, password: str) -> None:
    salt = scram.random_salt()
    salted = scram.salted_password(scram.SCRAM_SHA_512, password, salt, 4096)
    answer = client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": [], "upsertions": [
        {"name": name, "mechanism": scram.SCRAM_SHA_512.type, "iterations": 4096, "salt": salt,
         "salted_password": salted}]})
    assert answer.results[0].error_code == ErrorCode.none


def test_an_open_node_serves_metrics_and_health_to_anyone(tmp_path):
    with BrokerThread(broker_overrides(tmp_path, **{"http.listeners": "http://127.0.0.1:0"})) as broker:
        port = broker.broker.http.bound[0][1]
        status, body, headers = get(port, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert b"kafka_server_replicamanager_partitioncount " in body
        status, body, _ = get(port, "/health/ready")
        assert status == 200 and json.loads(body)["ready"] is True
        assert get(port, "/health/live")[0] == 200


def test_a_secured_node_asks_scram_credentials_and_the_right_to_describe_the_cluster(tmp_path):
    overrides = broker_overrides(tmp_path, **{"http.listeners": "http://127.0.0.1:0",
                                              "authorizer.class.name": ACL_AUTHORIZER,
                                              "super.users": "User:ANONYMOUS;User:admin"})
    with BrokerThread(overrides) as broker:
        port = broker.broker.http.bound[0][1]
        client = RawClient(broker.port)
        add_scram_user(client, "admin", "admin-secret")
        add_scram_user(client, "alice", "alice-secret")
        client.close()
        status, _, headers = get(port, "/metrics")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert get(port, "/metrics", "admin", "wrong")[0] == 401
        assert get(port, "/metrics", "nobody", "admin-secret")[0] == 401
        assert get(port, "/metrics", "alice", "alice-secret")[0] == 403  # no ACL lets her describe the cluster
        status, body, _ = get(port, "/metrics", "admin", "admin-secret")
        assert status == 200 and b"kafka_server_replicamanager_leadercount" in body
        assert get(port, "/metrics", "admin", "admin-secret")[0] == 200  # (the cached check)
        assert get(port, "/health/ready")[0] == 200  # probes need no credentials


def test_no_authentication_is_refused_on_a_secured_node(tmp_path):
    config = load_config(None, {"log.dirs": str(tmp_path), "http.listeners": "http://127.0.0.1:0",
                                "authorizer.class.name": ACL_AUTHORIZER})
    assert authentication(config) == "basic"
    with pytest.raises(ConfigError, match="http.authentication=none would open"):
        authentication(load_config(None, {"log.dirs": str(tmp_path), "authorizer.class.name": ACL_AUTHORIZER,
                                          "http.authentication": "none"}))
    with pytest.raises(ConfigError, match="mtls needs https:// listeners"):
        authentication(load_config(None, {"log.dirs": str(tmp_path), "http.listeners": "http://127.0.0.1:0",
                                          "http.authentication": "mtls"}))
    assert authentication(load_config(None, {"log.dirs": str(tmp_path)})) == "none"


def test_mutual_tls_names_the_principal_from_the_client_certificate(tmp_path):
    from josef.testing.tls import TlsFiles

    files = TlsFiles.create(tmp_path / "tls")
    overrides = broker_overrides(tmp_path / "data", **{
        "http.listeners": "https://127.0.0.1:0", "http.authentication": "mtls",
        **files.broker_properties("HTTP"), "listener.name.http.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*),.*$/$1/,DEFAULT",
        "authorizer.class.name": ACL_AUTHORIZER, "super.users": "User:admin"})
    with BrokerThread(overrides) as broker:
        url = f"https://127.0.0.1:{broker.broker.http.bound[0][1]}/metrics"
        with urllib.request.urlopen(url, context=files.client_context(files.client("admin")), timeout=10) as answer:
            assert answer.status == 200 and b"kafka_server_replicamanager_partitioncount" in answer.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, context=files.client_context(files.client("mallory")), timeout=10)
        assert refused.value.code == 403
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no certificate: TLS refuses it
            urllib.request.urlopen(url, context=files.client_context(), timeout=10)


def test_the_quick_start_serves_metrics_on_9644(tmp_path):
    """`josef server start` without a properties file, as the README's quick start runs it (Kafka's port made free)."""
    node = subprocess.Popen([sys.executable, "-m", "josef", "server", "start", "--override",
                             "listeners=PLAINTEXT://127.0.0.1:0", "--override", f"log.dirs={tmp_path}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert node.stdout is not None
        lines = []
        for line in node.stdout:
            lines.append(line)
            if " ready on " in line:
                break
        assert any("HTTP listener (metrics, health) on http://127.0.0.1:9644" in line for line in lines), lines
        status, body, _ = get(QUICK_START_PORT, "/metrics")
        assert status == 200 and b"kafka_server_brokertopicmetrics_messagesin_total" in body
        assert json.loads(get(QUICK_START_PORT, "/health/ready")[1])["ready"] is True
    finally:
        node.kill()
        node.wait(30)
