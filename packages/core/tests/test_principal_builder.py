"""principal.builder.class: a plugin's principal builder names authenticated connections, and may refuse them."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from josef import hookimpl
from josef.node.runner import BrokerThread
from josef.plugins import get_plugin_manager
from josef.protocol.api_keys import ApiKey
from josef.security import ANONYMOUS, AuthenticationContext, KafkaPrincipal
from josef.testing import RawClient, broker_overrides

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
        'user_alice="alice-pw" user_mallory="mallory-pw";')


class TeamBuilder:
    """Names SASL users after their team (``Team:ALICE``) and refuses mallory."""

    def __init__(self, config) -> None:
        self.seen: list[AuthenticationContext] = []

    def build(self, context: AuthenticationContext) -> KafkaPrincipal:
        self.seen.append(context)
        if context.sasl_authorization_id == "mallory":
            raise ValueError("mallory is not on a team")
        if context.sasl_authorization_id is not None:
            return KafkaPrincipal("Team", context.sasl_authorization_id.upper())
        return ANONYMOUS


class TeamsPlugin:
    @staticmethod
    @hookimpl
    def register_principal_builders(register) -> None:
        register("teams", TeamBuilder)


@pytest.fixture
def broker(tmp_path):
    pm = get_plugin_manager()
    pm.register(TeamsPlugin)
    thread = BrokerThread(broker_overrides(tmp_path, **{
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "PLAINTEXT", "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS, "principal.builder.class": "teams",
        "authorizer.class.name": "acl", "super.users": "User:ANONYMOUS;Team:ALICE"}), pm=pm)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def login(broker, user: str) -> tuple[RawClient, object]:
    client = RawClient(next(b.port for b in broker.broker.bound if b.name == "SASL_PLAINTEXT"))
    assert client.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.none
    return client, client.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": f"\x00{user}\x00{user}-pw".encode()})


def test_the_builder_names_the_principal_the_authorizer_decides_on(broker):
    client, answer = login(broker, "alice")
    try:
        assert answer.error_code == ErrorCode.none
        # Team:ALICE is a super user; User:alice would have been denied (no ACL at all).
        described = client.call(ApiKey.DESCRIBE_ACLS, 3, {
            "resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
            "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1})
        assert described.error_code == ErrorCode.none
    finally:
        client.close()
    [context] = [c for c in broker.broker.principal_builder.seen if c.sasl_authorization_id == "alice"]
    assert (context.security_protocol, context.listener_name, context.sasl_mechanism) == (
        "SASL_PLAINTEXT", "SASL_PLAINTEXT", "PLAIN")


def test_a_builder_that_refuses_fails_the_authentication_and_closes_the_connection(broker):
    client, answer = login(broker, "mallory")
    try:
        assert (answer.error_code, answer.error_message) == (ErrorCode.sasl_authentication_failed,
                                                             "Authentication failed: no principal")
        assert client.closed_by_broker()
    finally:
        client.close()
