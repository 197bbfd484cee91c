"""Listeners' security protocols: josef serves PLAINTEXT, and refuses to start on anything else."""

import subprocess
import sys

import pytest

from josef.node.broker_config import check_listeners
from josef.config import ConfigError
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.testing import RawClient, broker_overrides


@pytest.fixture
def pm():
    return get_plugin_manager(autoload=False)


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_listener_named_after_a_protocol_josef_lacks_is_refused(pm, protocol):
    config = load_config(None, {"listeners": f"PLAINTEXT://127.0.0.1:9092,{protocol}://127.0.0.1:9093"}, pm)
    with pytest.raises(ConfigError) as info:
        check_listeners(config)
    assert str(info.value) == (f"listener {protocol} ({protocol}://127.0.0.1:9093): security protocol {protocol} "
                               "is not supported yet; josef serves PLAINTEXT, SASL_PLAINTEXT only")


def test_custom_listener_mapped_to_ssl_is_refused(pm):
    config = load_config(None, {"listeners": "INTERNAL://:9094",
                                "listener.security.protocol.map": "INTERNAL:ssl,CONTROLLER:PLAINTEXT"}, pm)
    with pytest.raises(ConfigError, match=r"^listener INTERNAL \(INTERNAL://:9094\): security protocol SSL is not supported yet"):
        check_listeners(config)


def test_listener_missing_from_the_map_is_refused(pm):
    config = load_config(None, {"listeners": "EXTERNAL://:9094"}, pm)
    with pytest.raises(ConfigError) as info:
        check_listeners(config)
    assert str(info.value) == ("listener EXTERNAL (EXTERNAL://:9094): no security protocol defined for listener "
                               "EXTERNAL in listener.security.protocol.map")


@pytest.mark.parametrize(("value", "fragment"), [
    ("INTERNAL", "is not LISTENER_NAME:SECURITY_PROTOCOL"),
    ("INTERNAL:TLS", "names no security protocol"),
    ("INTERNAL:PLAINTEXT,internal:SSL", "listener internal appears twice"),
])
def test_bad_security_protocol_map(pm, value, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, {"listener.security.protocol.map": value}, pm)
    assert "listener.security.protocol.map" in str(info.value)
    assert fragment in str(info.value)


def test_default_map_is_kafkas(pm):
    config = load_config(None, {}, pm)
    assert config["listener.security.protocol.map"] == [
        "CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT", "SSL:SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT", "SASL_SSL:SASL_SSL"]
    check_listeners(config)  # PLAINTEXT://localhost:9092 is served


def test_broker_refuses_to_start(tmp_path):
    broker = BrokerThread(broker_overrides(tmp_path, listeners="SSL://127.0.0.1:0"))
    with pytest.raises(ConfigError, match="security protocol SSL is not supported yet"):
        broker.start()
    assert not any(tmp_path.iterdir()), "nothing was formatted or written"


@pytest.mark.parametrize("overrides", [
    {"listeners": "PLAINTEXT://127.0.0.1:0"},
    {"listeners": "INTERNAL://127.0.0.1:0", "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"},
], ids=["plaintext", "custom-name"])
def test_plaintext_listeners_serve(tmp_path, overrides):
    with BrokerThread(broker_overrides(tmp_path, **overrides)) as broker:
        port = broker.port
        client = RawClient(port)
        try:
            metadata = client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                         "include_topic_authorized_operations": False})
        finally:
            client.close()
    assert [(b.host, b.port) for b in metadata.brokers] == [("127.0.0.1", port)]


def test_cli_refuses_an_ssl_listener_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "josef", "server", "start",
         "--override", "listeners=SSL://127.0.0.1:0", "--override", f"log.dirs={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "Error: listener SSL (SSL://127.0.0.1:0): security protocol SSL is not supported yet; "
        "josef serves PLAINTEXT, SASL_PLAINTEXT only"]
