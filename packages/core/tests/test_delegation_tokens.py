"""Delegation tokens (KIP-48, KIP-373): records and image, the controller's decisions, SCRAM ``tokenauth=true``,
and the four APIs against a broker with SASL/SCRAM, the StandardAuthorizer and ``delegation.token.secret.key``."""

import base64
import datetime
import hashlib
import hmac

import anyio
import pytest
from kio.schema.errors import ErrorCode as E

from josef import delegation_tokens, scram
from josef.acls import AclOperation as Op
from josef.acls import ResourceType as R
from josef.delegation_tokens import TokenInformation, create_hmac, token_credential
from josef.metadata.controller import Controller, ControllerError
from josef.metadata.image import MetadataImage
from josef.metadata.records import DelegationTokenRecord, RemoveDelegationTokenRecord, decode, encode
from josef.node.runner import BrokerThread
from josef.node.server_properties import load_config
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey as K
from josef.protocol.sasl_client import SaslAuthenticationFailed, SaslCredentials
from josef.security import KafkaPrincipal
from josef.server.sasl import SaslAuthenticationError
from josef.server.scram import ScramServer, invalid_credentials
from josef.testing import RawClient, broker_overrides

SECRET = "the-cluster-token-secret"
SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
TOKENS = {
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM_JAAS,
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",  # the PLAINTEXT admin of the test
    "delegation.token.secret.key": SECRET,
}
ALICE, BOB, CAROL = (KafkaPrincipal("User", n) for n in ("alice", "bob", "carol"))
DAY, WEEK = 86_400_000, 604_800_000


# Records, image, HMAC ---------------------------------------------------------------------------------


def test_tokens_are_records_of_the_image_and_its_snapshot_and_their_hmac_is_kafka_s():
    token = TokenInformation("tok1", ALICE, BOB, (CAROL,), 1000, 2000, 1500)
    record = token.to_record()
    assert record == DelegationTokenRecord(owner="User:alice", requester="User:bob", renewers=("User:carol",),
                                           issue_timestamp=1000, max_timestamp=2000, expiration_timestamp=1500,
                                           token_id="tok1")
    assert decode(encode(record)) == record and encode(record)[:3] == b"\x01\x0a\x00"  # Kafka's api key 10, v0
    image, _ = MetadataImage().apply(1, [record])
    assert image.delegation_tokens == {"tok1": token}
    rebuilt, _ = MetadataImage().apply(2, list(image.records()))
    assert rebuilt.delegation_tokens == image.delegation_tokens
    removed, _ = image.apply(3, [RemoveDelegationTokenRecord(token_id="tok1")])
    assert removed.delegation_tokens == {} and encode(RemoveDelegationTokenRecord(token_id="x"))[:2] == b"\x01\x1a"
    # HMAC-SHA512 of the token id keyed by the secret, as Kafka's DelegationTokenManager.createHmac.
    assert create_hmac("tok1", SECRET) == hmac.new(SECRET.encode(), b"tok1", hashlib.sha512).digest()
    assert create_hmac("tok1", "another secret") != create_hmac("tok1", SECRET)


# The controller's decisions, over an in-memory stand-in for the quorum ---------------------------------


class MemoryQuorum:
    """Commits at once; the quorum contract without storage."""

    controller_id = 1

    def __init__(self):
        self.image = MetadataImage()

    async def append(self, records):
        self.image, _ = self.image.apply(self.image.offset + 1, [decode(encode(r)) for r in records])
        return self.image.offset


class Clocks:
    """The controller's two clocks under the test's control: wall milliseconds, monotonic seconds."""

    def __init__(self):
        self.wall_ms = 1_800_000_000_000
        self.monotonic = 100.0


def controller(**overrides):
    config = load_config(None, {"node.id": "1", **overrides}, get_plugin_manager(autoload=False))
    quorum = MemoryQuorum()
    control = Controller(quorum, config, lambda: quorum.image)
    clocks = Clocks()
    control._wall_ms = lambda: clocks.wall_ms
    control._clock = lambda: clocks.monotonic
    return control, quorum, clocks


def run(fn, *args):
    return anyio.run(lambda: fn(*args))


def code_of(fn, *args) -> E:
    with pytest.raises(ControllerError) as refused:
        run(fn, *args)
    return refused.value.code


def test_the_controller_creates_renews_and_expires_as_kafka_s_control_manager():
    control, quorum, clocks = controller(**{"delegation.token.secret.key": SECRET})
    now = clocks.wall_ms
    created = run(control.create_delegation_token, ALICE, None, [BOB], -1)
    token = created.token
    assert (token.owner, token.requester, token.renewers) == (ALICE, ALICE, (BOB,))
    assert (token.issue_timestamp, token.expiry_timestamp, token.max_timestamp) == (now, now + DAY, now + WEEK)
    assert created.hmac == create_hmac(token.token_id, SECRET) and len(token.token_id) == 22
    assert quorum.image.delegation_tokens == {token.token_id: token}
    short = run(control.create_delegation_token, ALICE, BOB, [], 3_600_000).token  # for bob, asked by alice
    assert (short.owner, short.requester, short.expiry_timestamp, short.max_timestamp) == (
        BOB, ALICE, now + 3_600_000, now + 3_600_000)
    assert code_of(control.create_delegation_token, ALICE, None, [KafkaPrincipal("Group", "g")], -1) \
        == E.invalid_principal_type

    clocks.wall_ms += 1000
    assert run(control.renew_delegation_token, BOB, created.hmac, -1) == clocks.wall_ms + DAY  # a renewer may
    assert run(control.renew_delegation_token, ALICE, created.hmac, 60_000) == clocks.wall_ms + 60_000
    assert quorum.image.delegation_tokens[token.token_id].expiry_timestamp == clocks.wall_ms + 60_000
    assert code_of(control.renew_delegation_token, CAROL, created.hmac, -1) == E.delegation_token_owner_mismatch
    assert code_of(control.renew_delegation_token, ALICE, b"not an hmac", -1) == E.delegation_token_not_found
    assert code_of(control.expire_delegation_token, CAROL, created.hmac, -1) == E.delegation_token_owner_mismatch
    assert run(control.expire_delegation_token, ALICE, created.hmac, 5000) == clocks.wall_ms + 5000

    clocks.wall_ms += 6000  # past that expiry: no renewal, and the sweep removes it
    assert code_of(control.renew_delegation_token, ALICE, created.hmac, -1) == E.delegation_token_expired
    assert code_of(control.expire_delegation_token, ALICE, created.hmac, 1) == E.delegation_token_expired
    assert run(control.expire_delegation_tokens_when_due) == [token.token_id]
    assert set(quorum.image.delegation_tokens) == {short.token_id}
    clocks.wall_ms += 3_600_000  # the other one expires too, but the next sweep is an interval away
    assert run(control.expire_delegation_tokens_when_due) == []
    clocks.monotonic += 3600
    assert run(control.expire_delegation_tokens_when_due) == [short.token_id]
    assert quorum.image.delegation_tokens == {}

    kept = run(control.create_delegation_token, ALICE, None, [], -1)
    assert run(control.expire_delegation_token, ALICE, kept.hmac, -1) == clocks.wall_ms  # negative: removed now
    assert quorum.image.delegation_tokens == {}


def test_without_a_secret_key_tokens_are_disabled():
    control, quorum, _ = controller()
    assert code_of(control.create_delegation_token, ALICE, None, [], -1) == E.delegation_token_auth_disabled
    assert code_of(control.renew_delegation_token, ALICE, b"x", -1) == E.delegation_token_auth_disabled
    assert code_of(control.expire_delegation_token, ALICE, b"x", -1) == E.delegation_token_auth_disabled
    assert quorum.image.delegation_tokens == {}


# SCRAM with tokenauth=true, on its own ---------------------------------------------------------------


def exchange(server: ScramServer, credentials: SaslCredentials) -> None:
    client = credentials.exchange()
    final = client.respond(server.evaluate(client.first()))
    assert client.respond(server.evaluate(final)) is None  # the server proved it knows the token's credential


def test_scram_tokenauth_authenticates_the_token_s_owner_until_the_token_expires():
    token = TokenInformation("tok1", ALICE, BOB, (), 1000, 9000, 5000)
    tokens = {"tok1": token}
    password = base64.b64encode(create_hmac("tok1", SECRET)).decode()
    for algorithm in (scram.SCRAM_SHA_256, scram.SCRAM_SHA_512):
        server = ScramServer(algorithm, lambda user, a: None,
                             tokens=lambda i, a: token_credential(tokens, SECRET, i, a, now_ms=4000))
        exchange(server, SaslCredentials(algorithm.name, "tok1", password, token_auth=True))
        assert (server.principal, server.token_authenticated, server.expires_at_ms) == (ALICE, True, 5000)
    assert token_credential(tokens, SECRET, "tok1", scram.SCRAM_SHA_256, now_ms=5001) is None  # expired
    assert token_credential(tokens, None, "tok1", scram.SCRAM_SHA_256, now_ms=4000) is None  # tokens disabled

    def refused(password: str, lookup, user: str = "tok1") -> str:
        server = ScramServer(scram.SCRAM_SHA_256, lambda u, a: None, tokens=lookup)
        with pytest.raises(SaslAuthenticationError) as failed:
            exchange(server, SaslCredentials("SCRAM-SHA-256", user, password, token_auth=True))
        assert server.principal is None
        return str(failed.value)

    now = lambda i, a: token_credential(tokens, SECRET, i, a, now_ms=4000)  # noqa: E731
    later = lambda i, a: token_credential(tokens, SECRET, i, a, now_ms=6000)  # noqa: E731
    failed = invalid_credentials("SCRAM-SHA-256")
    assert refused("wrong hmac", now) == failed
    assert refused(password, now, user="tok2") == failed  # unknown token
    assert refused(password, later) == failed  # expired
    assert refused(password, None) == failed  # a broker without delegation.token.secret.key
    # Without tokenauth the token id is a user name like any other: no user "tok1" exists.
    server = ScramServer(scram.SCRAM_SHA_256, lambda u, a: None, tokens=now)
    with pytest.raises(SaslAuthenticationError):
        exchange(server, SaslCredentials("SCRAM-SHA-256", "tok1", password))


def test_the_client_sends_tokenauth_when_the_jaas_config_says_so():
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="tok1" password="aG1hYw==" '
            'tokenauth="true";')
    credentials = SaslCredentials.from_client_config({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas}.get)
    assert credentials.token_auth and credentials.exchange().first().decode().endswith(",tokenauth=true")
    plain = SaslCredentials.from_client_config({"sasl.mechanism": "SCRAM-SHA-512",
                                                "sasl.jaas.config": jaas.replace('"true"', '"false"')}.get)
    assert not plain.token_auth and "tokenauth" not in plain.exchange().first().decode()


# Against a broker -----------------------------------------------------------------------------------------


def sasl_port(broker) -> int:
    return next(b.port for b in broker.broker.bound if b.name == "SASL_PLAINTEXT")


def login(broker, user: str, password: str, mechanism: str = "SCRAM-SHA-256", token: bool = False) -> RawClient:
    """A connection authenticated with josef's own SCRAM client; SaslAuthenticationFailed when refused."""
    client = RawClient(sasl_port(broker))
    assert client.call(K.SASL_HANDSHAKE, 1, {"mechanism": mechanism}).error_code == E.none
    sasl = SaslCredentials(mechanism, user, password, token_auth=token).exchange()
    message = sasl.first()
    try:
        while message is not None:
            answer = client.call(K.SASL_AUTHENTICATE, 2, {"auth_bytes": message})
            if answer.error_code != E.none:
                raise SaslAuthenticationFailed(answer.error_code, answer.error_message)
            client.lifetime_ms = int(answer.session_lifetime.total_seconds() * 1000)
            message = sasl.respond(answer.auth_bytes)
    except SaslAuthenticationFailed:
        assert client.closed_by_broker()
        client.close()
        raise
    return client


def add_user(admin: RawClient, name: str) -> None:
    salt = scram.random_salt()
    answer = admin.call(K.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": [], "upsertions": [
        {"name": name, "mechanism": 1, "iterations": 4096, "salt": salt,
         "salted_password": scram.salted_password(scram.SCRAM_SHA_256, "pw-" + name, salt, 4096)}]})
    assert answer.results[0].error_code == E.none


def grant(admin: RawClient, principal: str, resource_type: R, name: str, operation: Op) -> None:
    answer = admin.call(K.CREATE_ACLS, 3, {"creations": [
        {"resource_type": resource_type, "resource_name": name, "resource_pattern_type": 3, "principal": principal,
         "host": "*", "operation": operation, "permission_type": 3}]})
    assert answer.results[0].error_code == E.none, answer


def create(client: RawClient, owner: str | None = None, renewers=(), max_lifetime_ms: int = -1):
    return client.call(K.CREATE_DELEGATION_TOKEN, 3, {
        "owner_principal_type": "User" if owner else None, "owner_principal_name": owner,
        "renewers": [{"principal_type": "User", "principal_name": r} for r in renewers],
        "max_lifetime": max_lifetime_ms})


def describe(client: RawClient, owners=None):
    answer = client.call(K.DESCRIBE_DELEGATION_TOKEN, 3, {
        "owners": None if owners is None else [{"principal_type": "User", "principal_name": o} for o in owners]})
    return answer.error_code, {t.token_id: (t.principal_name, bytes(t.hmac)) for t in answer.tokens}


def renew(client: RawClient, token_hmac: bytes, period_ms: int = -1):
    answer = client.call(K.RENEW_DELEGATION_TOKEN, 2, {"hmac": token_hmac, "renew_period": period_ms})
    return answer.error_code, ms(answer.expiry_timestamp)


def expire(client: RawClient, token_hmac: bytes, period_ms: int = -1):
    answer = client.call(K.EXPIRE_DELEGATION_TOKEN, 2, {"hmac": token_hmac, "expiry_time_period": period_ms})
    return answer.error_code, ms(answer.expiry_timestamp)


def ms(value) -> int:
    return -1 if value is None else round(value.timestamp() * 1000) if isinstance(value, datetime.datetime) else value


def topic_errors(client: RawClient, *names: str) -> dict[str, E]:
    answer = client.call(K.METADATA, 12, {"topics": [{"name": n, "topic_id": None} for n in names],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})
    return {t.name: t.error_code for t in answer.topics}


def test_a_token_authenticates_as_its_owner_under_kafka_s_rules_and_survives_a_restart(tmp_path):
    overrides = broker_overrides(tmp_path, **TOKENS)
    with BrokerThread(overrides) as broker:
        admin = RawClient(broker.port)
        for name in ("alice", "bob", "carol"):
            add_user(admin, name)
        for name in ("mine", "theirs"):
            created = admin.call(K.CREATE_TOPICS, 5, {"topics": [{"name": name, "num_partitions": 1,
                                                                  "replication_factor": 1, "assignments": [],
                                                                  "configs": []}],
                                                      "timeout": 10000, "validate_only": False})
            assert created.topics[0].error_code == E.none
        grant(admin, "User:alice", R.TOPIC, "mine", Op.DESCRIBE)
        alice = login(broker, "alice", "pw-alice")

        # Created over SCRAM, for alice herself (no ACL needed), renewable by bob.
        made = create(alice, renewers=["bob"])
        assert (made.error_code, made.principal_name, made.token_requester_principal_name) == (E.none, "alice", "alice")
        token_id, token_hmac = made.token_id, bytes(made.hmac)
        assert token_hmac == create_hmac(token_id, SECRET)
        assert ms(made.max_timestamp) - ms(made.issue_timestamp) == WEEK
        assert ms(made.expiry_timestamp) - ms(made.issue_timestamp) == DAY

        # Described to its owner and its renewer; to carol only once she may DESCRIBE_TOKENS of alice.
        assert describe(alice) == (E.none, {token_id: ("alice", token_hmac)})
        bob = login(broker, "bob", "pw-bob")
        assert describe(bob) == (E.none, {token_id: ("alice", token_hmac)})
        carol = login(broker, "carol", "pw-carol")
        assert describe(carol) == (E.none, {})
        grant(admin, "User:carol", R.USER, "User:alice", Op.DESCRIBE_TOKENS)
        assert describe(carol) == (E.none, {token_id: ("alice", token_hmac)})
        assert describe(carol, owners=["bob"]) == (E.none, {token_id: ("alice", token_hmac)})  # bob renews it
        assert describe(carol, owners=["nobody"]) == (E.none, {})
        assert describe(carol, owners=[]) == (E.none, {})

        # The token authenticates with SCRAM (either mechanism) as alice: alice's ACLs apply, for as long as it lives.
        password = base64.b64encode(token_hmac).decode()
        delegated = login(broker, token_id, password, "SCRAM-SHA-512", token=True)
        assert topic_errors(delegated, "mine", "theirs") == {"mine": E.none, "theirs": E.topic_authorization_failed}
        assert 0 < delegated.lifetime_ms <= DAY
        # ... and may not ask for tokens, nor create one from the token, nor may PLAINTEXT.
        assert create(delegated).error_code == E.delegation_token_request_not_allowed
        assert describe(delegated)[0] == E.delegation_token_request_not_allowed
        assert renew(delegated, token_hmac) == (E.delegation_token_request_not_allowed, -1)
        assert expire(delegated, token_hmac) == (E.delegation_token_request_not_allowed, -1)
        assert create(admin).error_code == E.delegation_token_request_not_allowed
        with pytest.raises(SaslAuthenticationFailed):  # a wrong HMAC
            login(broker, token_id, base64.b64encode(b"x" * 64).decode(), "SCRAM-SHA-512", token=True)
        with pytest.raises(SaslAuthenticationFailed):  # the token id is no user name without tokenauth
            login(broker, token_id, password, "SCRAM-SHA-512")

        # KIP-373: a token for someone else needs CREATE_TOKENS on them.
        refused = create(alice, owner="bob")
        assert (refused.error_code, refused.principal_name, refused.token_requester_principal_name) == (
            E.delegation_token_authorization_failed, "bob", "alice")
        grant(admin, "User:alice", R.USER, "User:bob", Op.CREATE_TOKENS)
        for_bob = create(alice, owner="bob", max_lifetime_ms=3_600_000)
        assert (for_bob.error_code, for_bob.principal_name, for_bob.token_requester_principal_name) == (
            E.none, "bob", "alice")
        assert ms(for_bob.max_timestamp) - ms(for_bob.issue_timestamp) == 3_600_000
        as_bob = login(broker, for_bob.token_id, base64.b64encode(bytes(for_bob.hmac)).decode(), token=True)
        assert topic_errors(as_bob, "mine") == {"mine": E.topic_authorization_failed}  # bob's ACLs, not alice's
        as_bob.close()

        # Renewed by its renewer, not by carol; an unknown HMAC is not found.
        code, expiry = renew(bob, token_hmac, 60_000)
        assert code == E.none and expiry > ms(made.issue_timestamp)
        assert describe(alice, owners=["alice"]) == (E.none, {token_id: ("alice", token_hmac)})
        assert renew(carol, token_hmac) == (E.delegation_token_owner_mismatch, -1)
        assert expire(carol, token_hmac) == (E.delegation_token_owner_mismatch, -1)
        assert renew(alice, b"\x00" * 64) == (E.delegation_token_not_found, -1)
        for client in (bob, carol, delegated):
            client.close()
        alice.close()
        admin.close()

    # Tokens are in the metadata log, and their HMACs derive from the secret: both survive a restart.
    with BrokerThread(overrides) as broker:
        alice = login(broker, "alice", "pw-alice")
        assert describe(alice, owners=["alice"]) == (E.none, {token_id: ("alice", token_hmac)})
        delegated = login(broker, token_id, password, token=True)
        assert topic_errors(delegated, "mine") == {"mine": E.none}
        delegated.close()
        # Expired by its owner: gone, and it no longer authenticates.
        code, _ = expire(alice, token_hmac)
        assert code == E.none
        assert describe(alice, owners=["alice"]) == (E.none, {})
        with pytest.raises(SaslAuthenticationFailed) as failed:
            login(broker, token_id, password, token=True)
        assert str(failed.value).endswith(invalid_credentials("SCRAM-SHA-256"))
        assert renew(alice, token_hmac) == (E.delegation_token_not_found, -1)
        alice.close()


@pytest.mark.josef_config(**{k: v for k, v in TOKENS.items() if k != delegation_tokens.SECRET_KEY})
def test_without_a_secret_key_every_token_api_answers_disabled(josef_broker):
    admin = RawClient(josef_broker.port)
    add_user(admin, "alice")
    admin.close()
    alice = login(josef_broker, "alice", "pw-alice")
    try:
        assert create(alice).error_code == E.delegation_token_auth_disabled
        assert describe(alice) == (E.delegation_token_auth_disabled, {})
        assert renew(alice, b"x" * 64) == (E.delegation_token_auth_disabled, -1)
        assert expire(alice, b"x" * 64) == (E.delegation_token_auth_disabled, -1)
    finally:
        alice.close()
    with pytest.raises(SaslAuthenticationFailed):
        login(josef_broker, "some-token", "aGVsbG8=", token=True)
