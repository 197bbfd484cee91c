"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512: RFC 7677's exchange, Kafka's refusals, and credentials in the metadata log."""

import base64
import hashlib
import hmac
import logging

import pytest
from kio.schema.errors import ErrorCode

from josef import scram
from josef.config import ConfigError
from josef.metadata import bootstrap
from josef.metadata.image import MetadataImage
from josef.metadata.records import RemoveUserScramCredentialRecord, decode, encode
from josef.node.broker_config import check_listeners
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.protocol.api_keys import ApiKey
from josef.security import KafkaPrincipal
from josef.server.sasl import SaslAuthenticationError
from josef.server.scram import ScramServer, invalid_credentials
from josef.testing import RawClient, broker_overrides

SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
SCRAM_CONFIG = {
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
}
SCRAM = pytest.mark.josef_config(**SCRAM_CONFIG)
SHA256_FAILED = invalid_credentials("SCRAM-SHA-256")
PASSWORD = "alice-secret"

# RFC 7677, section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_server() -> ScramServer:
    algorithm = scram.SCRAM_SHA_256
    credential = scram.credential(algorithm, RFC_SALT, scram.salted_password(algorithm, "pencil", RFC_SALT, 4096), 4096)
    return ScramServer(algorithm, lambda user, a: credential if (user, a) == ("user", algorithm) else None,
                       nonce=lambda: RFC_SERVER_NONCE)


def test_rfc_7677_exchange_gives_the_rfc_s_server_messages():
    server = rfc_server()
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.principal == KafkaPrincipal("User", "user")
    with pytest.raises(SaslAuthenticationError):  # nothing after the end
        server.evaluate(RFC_CLIENT_FINAL)


@pytest.mark.parametrize("first, final, message, reason", [
    (RFC_CLIENT_FIRST, RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"), SHA256_FAILED, "invalid client proof"),
    (b"p=tls-unique,,n=user,r=rOprNGfwEbeRWgbNEkqO", None, SHA256_FAILED, "channel binding"),
    (b"n,,n=user", None, SHA256_FAILED, "malformed client-first"),
    (b"n,,n=us=er,r=abc", None, SHA256_FAILED, "malformed client-first"),
    (RFC_CLIENT_FIRST, RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), SHA256_FAILED, "channel binding"),
    (RFC_CLIENT_FIRST, RFC_CLIENT_FINAL.replace(b"hNlF$k0", b"hNlF$k1"), SHA256_FAILED, "invalid nonce"),
    (RFC_CLIENT_FIRST, RFC_CLIENT_FINAL[:40], SHA256_FAILED, "malformed client-final"),
    (RFC_CLIENT_FIRST, RFC_CLIENT_FIRST, SHA256_FAILED, "malformed client-final"),
    (b"n,a=admin,n=user,r=abc", None, "Authentication failed: Client requested an authorization id that is "
                                      "different from username", "authorization id"),
    # A delegation token on a server without tokens (or an unknown one) fails like a wrong password.
    (RFC_CLIENT_FIRST + b",tokenauth=true", RFC_CLIENT_FINAL, SHA256_FAILED, "invalid client proof"),
])
def test_every_refusal_ends_the_exchange_saying_nothing_of_the_credentials(first, final, message, reason):
    server = rfc_server()
    with pytest.raises(SaslAuthenticationError) as refused:
        server.evaluate(first)
        server.evaluate(final)
    assert (str(refused.value), reason in refused.value.reason) == (message, True)
    assert not server.complete and server.principal is None
    with pytest.raises(SaslAuthenticationError):
        server.evaluate(RFC_CLIENT_FINAL)


def test_an_unknown_user_gets_a_plausible_server_first_and_fails_like_a_wrong_password():
    server = rfc_server()
    unknown = server.evaluate(b"n,,n=mallory,r=rOprNGfwEbeRWgbNEkqO").decode()
    nonce, salt, iterations = (part.split("=", 1)[1] for part in unknown.split(","))
    assert nonce == "rOprNGfwEbeRWgbNEkqO" + RFC_SERVER_NONCE and base64.b64decode(salt) and iterations == "4096"
    again = rfc_server().evaluate(b"n,,n=mallory,r=rOprNGfwEbeRWgbNEkqO").decode()
    assert again == unknown  # the same fake salt each time: retries do not tell an unknown user apart
    with pytest.raises(SaslAuthenticationError) as refused:
        server.evaluate(RFC_CLIENT_FINAL)
    assert str(refused.value) == SHA256_FAILED


@pytest.mark.parametrize("overrides, error", [
    ({"sasl.enabled.mechanisms": "SCRAM-SHA-512"},
     "SCRAM-SHA-512 needs listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"),
    ({"sasl.enabled.mechanisms": "SCRAM-SHA-256", "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="hunter2";'},
     "SCRAM-SHA-256 needs org.apache.kafka.common.security.scram.ScramLoginModule"),
    ({"sasl.enabled.mechanisms": "GSSAPI"},
     "SASL mechanism GSSAPI is not supported yet; josef offers PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"),
])
def test_a_scram_listener_needs_kafka_s_login_module(overrides, error):
    config = load_config(None, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0", **overrides})
    with pytest.raises(ConfigError, match=error) as refused:
        check_listeners(config)
    assert "hunter2" not in str(refused.value)
    check_listeners(load_config(None, SCRAM_CONFIG))


def test_credentials_are_records_of_the_image_and_its_snapshot():
    record = bootstrap.scram_record('SCRAM-SHA-512=[name=alice,iterations=8192,salt="N3E=",password=pw]')
    assert (record.name, record.mechanism, record.salt, record.iterations) == ("alice", 2, b"7q", 8192)
    expected = scram.credential(scram.SCRAM_SHA_512, b"7q", scram.salted_password(scram.SCRAM_SHA_512, "pw", b"7q", 8192), 8192)
    assert (record.stored_key, record.server_key) == (expected.stored_key, expected.server_key)
    assert decode(encode(record)) == record and "pw" not in repr(record) and record.stored_key.hex() not in repr(record)
    image, _ = MetadataImage().apply(1, [record])
    assert image.scram_credentials == {("alice", 2): expected}
    rebuilt, _ = MetadataImage().apply(2, list(image.records()))
    assert rebuilt.scram_credentials == image.scram_credentials
    removed, _ = image.apply(3, [RemoveUserScramCredentialRecord(name="alice", mechanism=2)])
    assert removed.scram_credentials == {}


@pytest.mark.parametrize("argument, error", [
    ("SCRAM-SHA-1=[name=a,password=hunter2]", "The add-scram mechanism SCRAM-SHA-1 is not supported."),
    ("SCRAM-SHA-256=name=a,password=hunter2", "Expected configuration string to start with ["),
    ("SCRAM-SHA-256=[password=hunter2]", "You must supply 'name' to add-scram"),
    ("SCRAM-SHA-256=[name=a]", "You must supply one of 'password' or 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=a,saltedpassword=\"YCE=\"]", "You must supply 'salt' with 'saltedpassword' to add-scram"),
    ("SCRAM-SHA-256=[name=a,password=hunter2,iterations=100]",
     "The 'iterations' value must be >= 4096 for add-scram using SCRAM_SHA_256"),
    ("SCRAM-SHA-256=[name=a,password=hunter2,colour=red]", "Unknown SCRAM configurations: colour"),
])
def test_add_scram_is_read_as_kafka_s_storage_tool_reads_it(argument, error):
    with pytest.raises(ConfigError) as refused:
        bootstrap.scram_record(argument)
    assert str(refused.value) == error


# Against a broker ---------------------------------------------------------------------------------


class ScramClient:
    """The client side of one SCRAM exchange, as the RFC computes it."""

    def __init__(self, algorithm: scram.ScramAlgorithm, user: str, password: str, nonce: str = "cl1entN0nce") -> None:
        self.algorithm, self.password = algorithm, password
        self.first_bare = f"n={user},r={nonce}"

    def first(self) -> bytes:
        return b"n,," + self.first_bare.encode()

    def final(self, server_first: bytes, nonce: str | None = None) -> bytes:
        fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
        salted = scram.salted_password(self.algorithm, self.password, base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = scram.client_key(self.algorithm, salted)
        without_proof = f"c=biws,r={nonce or fields['r']}"
        self.auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = self.algorithm.hmac(self.algorithm.digest(client_key), self.auth_message)
        self.server_key = self.algorithm.hmac(salted, b"Server Key")
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        expected = b"v=" + base64.b64encode(self.algorithm.hmac(self.server_key, self.auth_message))
        return hmac.compare_digest(server_final, expected)


def sasl_client(broker) -> RawClient:
    return RawClient(next(b.port for b in broker.broker.bound if b.name == "SASL_PLAINTEXT"))


def authenticate(client: RawClient, token: bytes):
    return client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})


def handshake(client: RawClient, mechanism: str) -> None:
    answer = client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    assert (answer.error_code, answer.mechanisms) == (ErrorCode.none, ("SCRAM-SHA-256", "SCRAM-SHA-512"))



def upsertion(name: str, algorithm: scram.ScramAlgorithm = scram.SCRAM_SHA_256, password: str = PASSWORD,
              iterations: int = 4096) -> dict:
    salt = scram.random_salt()
    return {"name": name, "mechanism": algorithm.type, "iterations": iterations, "salt": salt,
            "salted_password": scram.salted_password(algorithm, password, salt, iterations)}


def alter(client: RawClient, upsertions=(), deletions=()) -> dict[str, tuple[ErrorCode, str | None]]:
    answer = client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"upsertions": list(upsertions),
                                                                  "deletions": list(deletions)})
    return {r.user: (r.error_code, r.error_message) for r in answer.results}


def describe(client: RawClient, *users: str):
    answer = client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0,
                         {"users": [{"name": u} for u in users] if users else None})
    assert answer.error_code == ErrorCode.none
    return {r.user: (r.error_code, r.error_message, {(c.mechanism, c.iterations) for c in r.credential_infos})
            for r in answer.results}


@SCRAM
def test_a_user_created_with_alter_authenticates_with_both_mechanisms(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    admin = RawClient(josef_broker.port)
    assert alter(admin, [upsertion("alice")]) == {"alice": (ErrorCode.none, None)}
    assert alter(admin, [upsertion("alice", scram.SCRAM_SHA_512, iterations=8192)]) == {"alice": (ErrorCode.none, None)}
    for algorithm in (scram.SCRAM_SHA_256, scram.SCRAM_SHA_512):
        client = sasl_client(josef_broker)
        try:
            handshake(client, algorithm.name)
            exchange = ScramClient(algorithm, "alice", PASSWORD)
            server_first = authenticate(client, exchange.first())
            assert server_first.error_code == ErrorCode.none and server_first.auth_bytes.startswith(b"r=cl1entN0nce")
            server_final = authenticate(client, exchange.final(server_first.auth_bytes))
            assert (server_final.error_code, server_final.error_message) == (ErrorCode.none, None)
            assert exchange.verify(server_final.auth_bytes)  # the broker proved it holds the credential
            assert client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                     "include_topic_authorized_operations": False}).brokers
        finally:
            client.close()
    admin.close()
    assert sum(r.getMessage().startswith("authenticated User:alice from 127.0.0.1:") for r in caplog.records) == 2
    assert PASSWORD not in caplog.text


@SCRAM
def test_wrong_password_unknown_user_replay_wrong_nonce_and_truncation_fail_alike_and_close(josef_broker, caplog):
    caplog.set_level(logging.DEBUG, logger="josef")
    admin = RawClient(josef_broker.port)
    assert alter(admin, [upsertion("alice")]) == {"alice": (ErrorCode.none, None)}
    admin.close()
    good = sasl_client(josef_broker)
    handshake(good, "SCRAM-SHA-256")
    exchange = ScramClient(scram.SCRAM_SHA_256, "alice", PASSWORD)
    good_final = exchange.final(authenticate(good, exchange.first()).auth_bytes)
    assert authenticate(good, good_final).error_code == ErrorCode.none
    good.close()

    def refused(user: str, password: str, tamper=lambda final, first: final) -> None:
        client = sasl_client(josef_broker)
        try:
            handshake(client, "SCRAM-SHA-256")
            attempt = ScramClient(scram.SCRAM_SHA_256, user, password)
            first = authenticate(client, attempt.first())
            assert first.error_code == ErrorCode.none  # an unknown user is not told apart here
            answer = authenticate(client, tamper(attempt.final(first.auth_bytes), first.auth_bytes))
            assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, SHA256_FAILED)
            assert answer.auth_bytes == b""
            assert client.closed_by_broker()
        finally:
            client.close()

    refused("alice", "hunter2")
    refused("mallory", PASSWORD)
    refused("alice", PASSWORD, lambda final, first: good_final)  # a replayed client-final: the nonce is stale
    refused("alice", PASSWORD, lambda final, first: ScramClient(scram.SCRAM_SHA_256, "alice", PASSWORD).final(
        first, nonce="cl1entN0nce" + "x" * 26))
    refused("alice", PASSWORD, lambda final, first: final[:len(final) // 2])
    # A truncated client-first fails at once.
    client = sasl_client(josef_broker)
    handshake(client, "SCRAM-SHA-256")
    answer = authenticate(client, b"n,,n=ali")
    assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed, SHA256_FAILED)
    assert client.closed_by_broker()
    client.close()
    assert PASSWORD not in caplog.text and "hunter2" not in caplog.text
    failures = [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]
    assert len(failures) == 6 and not any("alice" in line or "mallory" in line for line in failures)


def test_describe_and_alter_answer_kafka_s_errors_and_survive_a_restart(tmp_path):
    overrides = broker_overrides(tmp_path)
    with BrokerThread(overrides) as broker:
        admin = RawClient(broker.port)
        assert alter(admin, [upsertion("alice", iterations=8192), upsertion("bob", scram.SCRAM_SHA_512)]) == {
            "alice": (ErrorCode.none, None), "bob": (ErrorCode.none, None)}
        twice = (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
        assert alter(admin, [upsertion("carol", iterations=100), upsertion("dave", iterations=20000),
                             {**upsertion("erin"), "mechanism": 3}, upsertion(""), upsertion("bob")],
                     [{"name": "bob", "mechanism": 2}, {"name": "frank", "mechanism": 1}]) == {
            "carol": (ErrorCode.unacceptable_credential, "Too few iterations"),
            "dave": (ErrorCode.unacceptable_credential, "Too many iterations"),
            "erin": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
            "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
            "bob": twice,
            "frank": (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")}
        assert alter(admin, [upsertion("alice"), upsertion("alice", scram.SCRAM_SHA_512)]) == {"alice": twice}
        assert describe(admin) == {"alice": (ErrorCode.none, None, {(1, 8192)}), "bob": (ErrorCode.none, None, {(2, 4096)})}
        assert describe(admin, "alice", "zed", "bob", "bob") == {
            "alice": (ErrorCode.none, None, {(1, 8192)}),
            "zed": (ErrorCode.resource_not_found, "Attempt to describe a user credential that does not exist: zed", set()),
            "bob": (ErrorCode.duplicate_resource,
                    "Cannot describe SCRAM credentials for the same user twice in a single request: bob", set())}
        assert alter(admin, deletions=[{"name": "bob", "mechanism": 2}]) == {"bob": (ErrorCode.none, None)}
        admin.close()
    with BrokerThread(overrides) as broker:
        admin = RawClient(broker.port)
        assert describe(admin) == {"alice": (ErrorCode.none, None, {(1, 8192)})}
        admin.close()


def test_the_salted_password_is_hi_of_rfc_5802():
    """PBKDF2-HMAC is RFC 5802's Hi(): the first iteration is HMAC(password, salt || INT(1))."""
    first = hmac.new(b"pencil", RFC_SALT + b"\x00\x00\x00\x01", hashlib.sha256).digest()
    assert scram.salted_password(scram.SCRAM_SHA_256, "pencil", RFC_SALT, 1) == first
