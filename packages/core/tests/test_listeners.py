"""Listeners' security protocols: every one of Kafka's is served, and one that cannot work stops start-up."""

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


NO_KEY_STORE = ("a TLS listener needs a key store (ssl.keystore.location, or ssl.keystore.certificate.chain and "
                "ssl.keystore.key with ssl.keystore.type=PEM)")


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL"])
def test_a_tls_listener_without_a_key_store_is_refused(pm, protocol):
    config = load_config(None, {"listeners": f"PLAINTEXT://127.0.0.1:9092,{protocol}://127.0.0.1:9093",
                                "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_ssl.plain.sasl.jaas.config":
                                'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b";'}, pm)
    with pytest.raises(ConfigError) as info:
        check_listeners(config)
    assert str(info.value) == f"listener {protocol}: {NO_KEY_STORE}"


def test_custom_listener_mapped_to_ssl_needs_a_key_store_too(pm):
    config = load_config(None, {"listeners": "INTERNAL://:9094",
                                "listener.security.protocol.map": "INTERNAL:ssl,CONTROLLER:PLAINTEXT"}, pm)
    with pytest.raises(ConfigError, match=r"^listener INTERNAL: a TLS listener needs a key store"):
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
    with pytest.raises(ConfigError, match="a TLS listener needs a key store"):
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


def test_cli_refuses_an_ssl_listener_without_a_key_store_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "josef", "server", "start",
         "--override", "listeners=SSL://127.0.0.1:0", "--override", f"log.dirs={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert result.stderr.splitlines() == [f"Error: listener SSL: {NO_KEY_STORE}"]
