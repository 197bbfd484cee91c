"""Who is on a connection: the session every request carries (listener, protocol, address, software, principal)."""

import logging

import pytest
from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.security import ANONYMOUS, KafkaPrincipal, Session
from josef.testing import RawClient


def test_principals_read_and_print_as_kafka_names_them():
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    assert KafkaPrincipal.parse("User:CN=alice,O=acme") == KafkaPrincipal("User", "CN=alice,O=acme")
    with pytest.raises(ValueError, match="not a principal"):
        KafkaPrincipal.parse("alice")


def test_a_plaintext_connection_is_anonymous_and_learns_its_client_software(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef.server.apis.api_versions")
    client = RawClient(josef_broker.port)
    try:
        answer = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "identity-test",
                                                      "client_software_version": "1.2.3"})
        local_port = client.sock.getsockname()[1]
    finally:
        client.close()
    assert answer.error_code == ErrorCode.none and answer.api_keys
    sessions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("connection User:")]
    assert sessions == [f"connection User:ANONYMOUS from 127.0.0.1:{local_port} on PLAINTEXT (PLAINTEXT), "
                        "identity-test 1.2.3"]


@pytest.mark.parametrize("name, version", [("", "1"), ("has space", "1"), ("ok", "-1"), ("ok", "1.")])
def test_client_software_outside_kip_511_s_pattern_is_an_invalid_request(josef_broker, name, version):
    client = RawClient(josef_broker.port)
    try:
        answer = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": name, "client_software_version": version})
    finally:
        client.close()
    assert (answer.error_code, answer.api_keys) == (ErrorCode.invalid_request, ())


def test_a_session_says_who_and_where_in_one_line():
    session = Session("EXTERNAL", "SASL_SSL", "10.0.0.7", 51000, KafkaPrincipal("User", "alice"), "librdkafka", "2.16.0")
    assert str(session) == "User:alice from 10.0.0.7:51000 on EXTERNAL (SASL_SSL), librdkafka 2.16.0"
