"""josef's client over TLS (security.protocol=SSL with Kafka's ssl.* keys): a group consumer and a producer against
a broker whose SSL listener requires client certificates, and the configuration errors a client meets at once."""

import pytest

from josef.config import ConfigError
from josef.node.runner import BrokerThread
from josef.protocol.errors import KafkaError
from josef.testing import broker_overrides
from josef.testing.tls import TlsFiles
from josef_client.admin import Admin, NewTopic
from josef_client.consumer import Consumer
from josef_client.producer import Producer


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return TlsFiles.create(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def broker(tls, tmp_path_factory):
    # ODD's certificate names another host than the one clients connect to.
    tls.write_broker_stores(tls.directory / "odd.pem", hosts=("broker.example",))
    broker = BrokerThread(broker_overrides(tmp_path_factory.mktemp("data"), **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,ODD://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,ODD:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT", **tls.broker_properties(), "ssl.client.auth": "required",
        "listener.name.odd.ssl.keystore.location": str(tls.directory / "odd.pem")}))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def bootstrap(broker, listener: str) -> str:
    return f"127.0.0.1:{next(b.port for b in broker.broker.bound if b.name == listener)}"


@pytest.fixture(scope="module")
def ssl_bootstrap(broker):
    return bootstrap(broker, "SSL")


def test_produce_and_consume_in_a_group_over_mutual_tls(tls, ssl_bootstrap):
    settings = {"bootstrap.servers": ssl_bootstrap, **tls.client_properties(tls.client("josef-client"))}
    admin = Admin(settings)
    try:
        admin.create_topics([NewTopic("client-tls", 2, 1)])
    finally:
        admin.close()
    producer = Producer(settings)
    try:
        for i in range(30):
            producer.send("client-tls", f"v{i}".encode())
        producer.flush(30)
    finally:
        producer.close()
    consumer = Consumer({**settings, "group.id": "client-tls", "auto.offset.reset": "earliest"})
    seen: list[bytes] = []
    try:
        consumer.subscribe(["client-tls"])
        for _ in range(100):
            for records in consumer.poll(timeout_ms=200).values():
                seen += [r.value for r in records]
            if len(seen) >= 30:
                break
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(30))


def list_topics(settings: dict) -> set[str]:
    admin = Admin(settings)  # it connects when made
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def test_a_client_without_the_certificate_the_listener_requires_cannot_connect(tls, ssl_bootstrap):
    with pytest.raises(KafkaError, match="closed"):
        list_topics({"bootstrap.servers": ssl_bootstrap, "request.timeout.ms": 5000, **tls.client_properties()})


def test_host_names_are_checked_unless_endpoint_identification_is_off(tls, broker):
    settings = {"bootstrap.servers": bootstrap(broker, "ODD"), "request.timeout.ms": 5000,
                **tls.client_properties(tls.client("josef-client"))}
    with pytest.raises(KafkaError, match="TLS handshake failed: CERTIFICATE_VERIFY_FAILED"):
        list_topics(settings)
    assert isinstance(list_topics({**settings, "ssl.endpoint.identification.algorithm": ""}), set)


def test_stores_a_client_cannot_read_fail_when_it_is_made(tls):
    with pytest.raises(ConfigError, match="ssl.truststore.type is JKS"):
        Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL",
                  "ssl.truststore.location": str(tls.ca_pem)})
    with pytest.raises(ConfigError, match="sasl.mechanism GSSAPI is not supported"):
        Producer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL"})
