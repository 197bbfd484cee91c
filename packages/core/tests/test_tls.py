"""TLS on SSL and SASL_SSL listeners: handshakes, client certificates and their principals, key stores, reloads,
bad clients, and fetches that go through TLS instead of sendfile.

One broker serves every test of the module, with one listener per case:
SSL (PEM files, client certificates requested, mapping rules), MTLS (a
PKCS12 store and ``ssl.client.auth=required``, both per listener), INLINE
(inline PEM), RELOAD (its own key store, reloaded by a test) and SASL_SSL.
"""

import logging
import shutil
import socket
import ssl
import time

import pytest
from kio.schema.errors import ErrorCode

from josef.config import ConfigError
from josef.node.broker_config import check_listeners
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import encode_request
from josef.protocol.records import build_batch, iter_batches, iter_records
from josef.server.tls import PrincipalMappingError, SslPrincipalMapper
from josef.testing import RawClient, eventually
from josef.testing.tls import PASSWORD, TlsFiles, TlsRawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_alice="alice-secret";')
RULES = "RULE:^CN=([^,]+),OU=eng,.*$/$1/L,DEFAULT"
IDLE_MS = 3000  # also the TLS handshake deadline (the shorter of it and 10 s)


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return TlsFiles.create(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def broker(tls, tmp_path_factory):
    reload_pem = tls.directory / "reload.pem"
    shutil.copy(tls.broker_pem, reload_pem)
    thread = BrokerThread({
        "listeners": ",".join(f"{n}://127.0.0.1:0" for n in ("PLAINTEXT", "SSL", "MTLS", "INLINE", "RELOAD", "SASL_SSL")),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,INLINE:SSL,RELOAD:SSL,"
                                          "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(tmp_path_factory.mktemp("data")),
        "connections.max.idle.ms": str(IDLE_MS),
        **tls.broker_properties(),
        "ssl.client.auth": "requested",
        "ssl.principal.mapping.rules": RULES,
        **tls.broker_properties("MTLS", store="PKCS12"),
        "listener.name.mtls.ssl.client.auth": "required",
        **tls.broker_properties("INLINE", store="INLINE"),
        "listener.name.reload.ssl.keystore.location": str(reload_pem),
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
    })
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def port(broker, name: str) -> int:
    return next(b.port for b in broker.broker.bound if b.name == name)


def sessions(caplog) -> list[str]:
    return [r.getMessage().split(" from ")[0] + " on " + r.getMessage().split(" on ")[1].split(",")[0]
            for r in caplog.records if r.getMessage().startswith("connection User:")]


def api_versions(client: RawClient) -> ErrorCode:
    return client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "tls-test",
                                                "client_software_version": "1"}).error_code


# Kafka's SslPrincipalMapper, with Kafka's own examples (SslPrincipalMapperTest) --------------------------------


def test_principal_mapping_rules_map_as_kafka_s_do():
    mapper = SslPrincipalMapper(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT"]))
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    assert SslPrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT").name(
        "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"
    with pytest.raises(LookupError, match="No rules apply to CN=x"):
        SslPrincipalMapper("RULE:^CN=y$/y/").name("CN=x")
    # A back reference to a group the pattern lacks is literal text; $12 with one group is $1 and "2".
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$1@$4/").name("CN=a") == "a@$4"
    assert SslPrincipalMapper("RULE:^CN=(.*)$/$12/").name("CN=a") == "a2"


@pytest.mark.parametrize("rules", [
    "DEFAULT", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/", "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U", "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/"])
def test_kafka_s_valid_rules_are_read(rules):
    SslPrincipalMapper(rules)


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U", "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L", "RULE:^CN=(.*?),OU=ServiceUsers.*$/U", "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU"])
def test_kafka_s_invalid_rules_are_refused(rules):
    with pytest.raises(PrincipalMappingError, match="Invalid rule"):
        SslPrincipalMapper(rules)


@pytest.mark.parametrize("expected, rules", [
    ("[]", ""), ("[DEFAULT]", "DEFAULT"), ("[RULE:/]", "RULE://"), ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"), ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "), ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    ("[]", ",   , , ,      , , ,   "), ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
    ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
    ("[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_rules_are_split_as_kafka_splits_them(expected, rules):
    assert str(SslPrincipalMapper(rules)) == expected


# Configuration ----------------------------------------------------------------------------------------------------


def check(tls, **overrides):
    check_listeners(load_config(None, {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", **overrides}))


def test_stores_josef_cannot_use_stop_start_up_saying_why_without_secrets(tls, tmp_path):
    with pytest.raises(ConfigError, match="ssl.keystore.type is JKS .* convert the store to PKCS12"):
        check(tls, **{"ssl.keystore.location": str(tls.broker_p12)})
    with pytest.raises(ConfigError, match="needs a key store"):
        check(tls)
    with pytest.raises(ConfigError, match="ssl.keystore.password is wrong") as refused:
        check(tls, **{**tls.broker_properties(store="PKCS12"), "ssl.keystore.password": "hunter2",
                      "ssl.key.password": "hunter3"})
    assert "hunter" not in str(refused.value) and PASSWORD not in str(refused.value)
    with pytest.raises(ConfigError, match="cannot read ssl.keystore.location"):
        check(tls, **{**tls.broker_properties(), "ssl.keystore.location": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match="Invalid rule"):
        check(tls, **{**tls.broker_properties(), "ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/X/"})


def test_brokers_talk_ssl_or_sasl_ssl_to_each_other_with_credentials_of_their_own(tls):
    check(tls, **tls.broker_properties(), **{"inter.broker.listener.name": "SSL"})
    check(tls, **tls.broker_properties(), **{"security.inter.broker.protocol": "SSL"})
    sasl_ssl = {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0", "inter.broker.listener.name": "SASL_SSL",
                "sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS}
    with pytest.raises(ConfigError, match="cannot authenticate to each other with GSSAPI"):
        check(tls, **tls.broker_properties(), **sasl_ssl)
    check(tls, **tls.broker_properties(), **sasl_ssl, **{"sasl.mechanism.inter.broker.protocol": "PLAIN"})


# Handshakes and principals ----------------------------------------------------------------------------------------


def test_a_client_certificate_names_the_principal_through_the_mapping_rules(broker, tls, caplog):
    caplog.set_level(logging.DEBUG, logger="josef.server.apis.api_versions")
    for client, context in [("alice", tls.client_context(tls.client("Alice"))),
                            ("bob", tls.client_context(tls.client("Bob", unit="ops"))),
                            ("none", tls.client_context())]:
        conn = TlsRawClient(port(broker, "SSL"), context)
        try:
            assert api_versions(conn) == ErrorCode.none
        finally:
            conn.close()
    assert sessions(caplog) == ["connection User:alice on SSL (SSL)",  # RULE: CN of OU=eng, lower case
                                "connection User:CN=Bob,OU=ops,O=acme on SSL (SSL)",  # DEFAULT: the RFC 2253 subject
                                "connection User:ANONYMOUS on SSL (SSL)"]


def test_required_client_auth_refuses_a_client_without_a_certificate(broker, tls, caplog):
    caplog.set_level(logging.INFO, logger="josef.server.network")
    with pytest.raises((ssl.SSLError, OSError)):
        conn = TlsRawClient(port(broker, "MTLS"), tls.client_context())
        try:
            api_versions(conn)  # TLS 1.3: the client's handshake ends before the server checks its certificate
        finally:
            conn.close()
    eventually(lambda: any("TLS handshake failed" in r.getMessage() for r in caplog.records), timeout=10,
               what="the refusal logged")
    with_certificate = TlsRawClient(port(broker, "MTLS"), tls.client_context(tls.client("Alice")))
    try:
        assert api_versions(with_certificate) == ErrorCode.none  # the PKCS12 key store serves
    finally:
        with_certificate.close()


def test_an_inline_pem_key_store_serves(broker, tls):
    conn = TlsRawClient(port(broker, "INLINE"), tls.client_context())
    try:
        assert api_versions(conn) == ErrorCode.none
        assert conn.sock.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        conn.close()


def test_sasl_ssl_authenticates_with_sasl_over_tls(broker, tls, caplog):
    caplog.set_level(logging.DEBUG, logger="josef.server.apis.api_versions")
    conn = TlsRawClient(port(broker, "SASL_SSL"), tls.client_context(tls.client("Alice")))
    try:
        assert conn.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
        answer = conn.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\x00alice\x00alice-secret"})
        assert answer.error_code == ErrorCode.none
        assert api_versions(conn) == ErrorCode.none
        metadata = conn.call(ApiKey.METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                   "include_topic_authorized_operations": False})
        assert metadata.brokers  # authenticated: more than ApiVersions and SASL is answered
    finally:
        conn.close()
    # The principal is SASL's, not the certificate's (which would map to User:alice too: hence no CN=...).
    assert sessions(caplog) == ["connection User:alice on SASL_SSL (SASL_SSL)"]


# Bad clients ------------------------------------------------------------------------------------------------------


def test_wrong_clients_are_closed_with_one_line_and_the_broker_serves_on(broker, tls, caplog):
    caplog.set_level(logging.INFO, logger="josef.server.network")
    plain = socket.create_connection(("127.0.0.1", port(broker, "SSL")), timeout=30)
    try:
        plain.sendall(encode_request(ApiKey.API_VERSIONS, 3, 1, b"plain", {"client_software_name": "plain",
                                                                          "client_software_version": "1"}))
        assert _closed(plain)
    finally:
        plain.close()
    with pytest.raises((ssl.SSLError, OSError)):
        TlsRawClient(port(broker, "PLAINTEXT"), tls.client_context(), timeout=30)
    logged = eventually(lambda: (found := [r for r in caplog.records if r.name == "josef.server.network"])
                        and len(found) >= 2 and found, timeout=10, what="both refusals logged")
    assert len(logged) == 2  # one line each
    assert any("TLS handshake failed" in r.getMessage() for r in logged)
    assert any("a TLS handshake? this listener is not TLS" in r.getMessage() for r in logged)
    assert all(r.exc_info is None and "BEGIN" not in r.getMessage() for r in logged)
    for name, client in [("PLAINTEXT", lambda p: RawClient(p)), ("SSL", lambda p: TlsRawClient(p, tls.client_context()))]:
        conn = client(port(broker, name))
        try:
            assert api_versions(conn) == ErrorCode.none
        finally:
            conn.close()


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (reads until end of stream; a reset counts)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_handshake_that_never_completes_is_closed_at_the_deadline(broker, caplog):
    caplog.set_level(logging.INFO, logger="josef.server.network")
    silent = socket.create_connection(("127.0.0.1", port(broker, "SSL")), timeout=30)
    started = time.monotonic()
    try:
        assert silent.recv(1) == b""  # the broker closes it: no byte ever comes
    finally:
        silent.close()
    assert IDLE_MS / 1000 - 0.5 <= time.monotonic() - started < 20
    assert any(f"no TLS handshake within {IDLE_MS // 1000} s" in r.getMessage() for r in caplog.records)


# Reloads ----------------------------------------------------------------------------------------------------------


def served_certificate(broker, tls) -> bytes:
    conn = TlsRawClient(port(broker, "RELOAD"), tls.client_context())
    try:
        return conn.sock.getpeercert(binary_form=True)
    finally:
        conn.close()


def alter_broker_config(broker, name: str, value: str) -> None:
    client = RawClient(broker.port)
    try:
        answer = client.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
            {"resource_type": 4, "resource_name": "1", "configs": [
                {"name": name, "config_operation": 0, "value": value}]}]})
    finally:
        client.close()
    assert [r.error_code for r in answer.responses] == [ErrorCode.none], answer


def test_a_dynamic_key_store_update_serves_new_connections_and_keeps_open_ones(broker, tls):
    before = served_certificate(broker, tls)
    open_one = TlsRawClient(port(broker, "RELOAD"), tls.client_context())
    try:
        # A new file named by the update, as kafka-configs --alter --add-config listener.name.<l>.ssl.keystore.location=...
        tls.write_broker_stores(tls.directory / "reload-2.pem", common_name="broker-2")
        alter_broker_config(broker, "listener.name.reload.ssl.keystore.location", str(tls.directory / "reload-2.pem"))
        second = eventually(lambda: (c := served_certificate(broker, tls)) != before and c, timeout=10,
                            what="the new certificate served")
        # The same name again, its file rewritten in place: Kafka's controller writes the record anyway, and it reloads.
        tls.write_broker_stores(tls.directory / "reload-2.pem", common_name="broker-3")
        alter_broker_config(broker, "listener.name.reload.ssl.keystore.location", str(tls.directory / "reload-2.pem"))
        eventually(lambda: served_certificate(broker, tls) not in (before, second), timeout=10,
                   what="the rewritten certificate served")
        assert api_versions(open_one) == ErrorCode.none  # the open connection goes on with its certificate
        assert open_one.sock.getpeercert(binary_form=True) == before
    finally:
        open_one.close()
    # A key store that cannot be used is refused by the broker, which keeps serving the current one.
    alter_broker_config(broker, "listener.name.reload.ssl.keystore.location", str(tls.directory / "missing.pem"))
    assert served_certificate(broker, tls) not in (before, second)


# Fetch through TLS ------------------------------------------------------------------------------------------------


def test_a_fetch_over_tls_returns_the_produced_bytes(broker, tls):
    conn = TlsRawClient(port(broker, "SSL"), tls.client_context())
    try:
        created = conn.call(ApiKey.CREATE_TOPICS, 7, {"timeout": 10000, "validate_only": False, "topics": [
            {"name": "tls-fetch", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}]})
        assert created.topics[0].error_code == ErrorCode.none
        values = [bytes([n]) * 300_000 + n.to_bytes(4, "big") for n in range(12)]  # 3.6 MB: several slices
        for first in range(0, len(values), 2):

            def produce(first=first):
                answer = conn.call(ApiKey.PRODUCE, 9, {"transactional_id": None, "acks": 1, "timeout": 10000,
                                                       "topic_data": [{"name": "tls-fetch", "partition_data": [
                    {"index": 0, "records": build_batch([(None, v, 1000) for v in values[first:first + 2]])}]}]})
                return answer.responses[0].partition_responses[0].error_code == ErrorCode.none

            eventually(produce, timeout=10, what="the new partition's leader to take records")
        answer = conn.call(ApiKey.FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 16 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "tls-fetch", "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                              "fetch_offset": 0, "log_start_offset": -1,
                                                              "partition_max_bytes": 16 << 20}]}]})
    finally:
        conn.close()
    partition = answer.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none
    assert len(partition.records) > 3 << 20
    records = bytes(partition.records)
    assert [r.value for pos, _ in iter_batches(records) for r in iter_records(_batch_at(records, pos))] == values


def _batch_at(records: bytes, pos: int) -> bytes:
    length = int.from_bytes(records[pos + 8:pos + 12], "big")
    return records[pos:pos + 12 + length]
