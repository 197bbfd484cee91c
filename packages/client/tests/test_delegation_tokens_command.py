"""``josef delegation-tokens`` (kafka-delegation-tokens.sh) against an in-process broker with SASL/SCRAM and
``delegation.token.secret.key``, and josef's client authenticating with the token it printed (SCRAM tokenauth).

The tool runs as ``alice`` over SCRAM-SHA-512 (tokens are refused over
PLAINTEXT, as in Kafka); the broker's PLAINTEXT listener is the test's admin,
a super user of the StandardAuthorizer.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from josef.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.cli import build_cli
from josef_client.admin import Admin, NewTopic, ScramCredentialUpsertion
from josef_client.commands.delegation_tokens import delegation_tokens

SCRAM_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
TOKEN_BROKER = pytest.mark.josef_config(**{
    "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
    "inter.broker.listener.name": "PLAINTEXT",
    "sasl.enabled.mechanisms": "SCRAM-SHA-512",
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
    "delegation.token.secret.key": "tool-test-secret",
})
#: Flag checks happen before connecting: nothing listens here.
NOWHERE = "127.0.0.1:1"
HEADER = ("TOKENID         HMAC                           OWNER           REQUESTER       RENEWERS                  "
          "ISSUEDATE       EXPIRYDATE      MAXDATE        ")


def jaas(username: str, password: str, token: bool = False) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{username}" '
            f'password="{password}"' + (' tokenauth="true"' if token else "") + ";")


def sasl_settings(username: str, password: str, token: bool = False) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": jaas(username, password, token)}


def properties(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def tool(bootstrap: str, *args: str) -> Result:
    result = CliRunner().invoke(delegation_tokens, ["--bootstrap-server", bootstrap, *args])
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result


def ok(bootstrap: str, *args: str) -> str:
    result = tool(bootstrap, *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def refused(*args: str, bootstrap: str = NOWHERE) -> str:
    result = tool(bootstrap, *args)
    assert result.exit_code == 1, result.stdout
    return result.stderr.strip()


def test_the_command_is_registered_on_josef():
    assert build_cli().commands["delegation-tokens"] is delegation_tokens


def test_kafka_s_flag_checks_refuse_before_connecting(tmp_path):
    config = str(properties(tmp_path / "c.properties", {}))
    cases = [
        ((), "Error: Command must include exactly one action: --create, --renew, --expire or --describe"),
        (("--create", "--describe"),
         "Error: Command must include exactly one action: --create, --renew, --expire or --describe"),
        (("--describe",), 'Error: Missing required argument "[command-config]"'),
        (("--create", "--command-config", config), 'Error: Missing required argument "[max-life-time-period]"'),
        (("--renew", "--command-config", config, "--renew-time-period", "-1"),
         'Error: Missing required argument "[hmac]"'),
        (("--expire", "--command-config", config, "--hmac", "aA=="),
         'Error: Missing required argument "[expiry-time-period]"'),
        (("--create", "--command-config", config, "--max-life-time-period", "-1", "--hmac", "aA=="),
         'Error: Option "[create]" can\'t be used with option "[hmac]"'),
        (("--renew", "--command-config", config, "--hmac", "aA==", "--renew-time-period", "-1", "--owner-principal",
          "User:a"), 'Error: Option "[renew]" can\'t be used with option "[owner-principal]"'),
        (("--describe", "--command-config", config, "--max-life-time-period", "1"),
         'Error: Option "[describe]" can\'t be used with option "[max-life-time-period]"'),
        (("--create", "--command-config", config, "--max-life-time-period", "-1", "--renewer-principal", "bob"),
         "Error: expected a string in format principalType:principalName but got bob"),
    ]
    for args, message in cases:
        assert refused(*args) == message, args


def sasl_bootstrap(broker) -> str:
    return next(f"127.0.0.1:{b.port}" for b in broker.broker.bound if b.name == "SASL_PLAINTEXT")


def date(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%dT%H:%M")


@TOKEN_BROKER
def test_create_describe_use_renew_and_expire_a_token_with_kafka_s_output(josef_broker, tmp_path):
    with Admin(bootstrap_servers=josef_broker.bootstrap_servers) as admin:
        admin.alter_user_scram_credentials([ScramCredentialUpsertion("alice", "SCRAM-SHA-512", "alice-secret")])
        admin.create_topics([NewTopic("alices", num_partitions=1), NewTopic("others", num_partitions=1)])
        admin.create_acls([AclBinding(ResourceType.TOPIC, "alices", PatternType.LITERAL, "User:alice", "*",
                                      AclOperation.DESCRIBE, AclPermissionType.ALLOW)])
    bootstrap = sasl_bootstrap(josef_broker)
    alice = str(properties(tmp_path / "alice.properties", sasl_settings("alice", "alice-secret")))

    created = ok(bootstrap, "--command-config", alice, "--create", "--max-life-time-period", "-1",
                 "--renewer-principal", "User:bob")
    lines = created.split("\n")
    assert lines[0] == "Calling create token operation with renewers :[User:bob] , max-life-time-period :-1"
    token_id = re.fullmatch(r"Created delegation token with tokenId : (\S+)", lines[1])[1]
    assert (lines[2], lines[3], lines[4]) == ("", HEADER, "")
    cells = lines[5].split()
    assert cells[0] == token_id and cells[2:5] == ["User:alice", "User:alice", "[User:bob]"]
    hmac = cells[1]

    described = ok(bootstrap, "--command-config", alice, "--describe")
    assert described.startswith("Calling describe token operation for current user.\nTotal number of tokens : 1\n"
                                + HEADER + "\n\n")
    assert described.split("\n")[4].split()[:2] == [token_id, hmac]
    assert ok(bootstrap, "--command-config", alice, "--describe", "--owner-principal", "User:bob").startswith(
        "Calling describe token operation for owners: [User:bob]\nTotal number of tokens : 1\n")
    assert "Total number of tokens : 0\n" in ok(bootstrap, "--command-config", alice, "--describe",
                                                 "--owner-principal", "User:nobody")

    # josef's client authenticates with the token (tokenauth="true") and acts as alice.
    delegated = sasl_settings(token_id, hmac, token=True)
    with Admin(bootstrap_servers=bootstrap, **delegated) as as_alice:
        topics = as_alice.list_topics()
        assert set(topics) == {"alices"}  # alice may describe that one only
    # ... but a token-authenticated connection may not manage tokens, nor may PLAINTEXT.
    token_config = str(properties(tmp_path / "token.properties", delegated))
    not_allowed = ("Error: DELEGATION_TOKEN_REQUEST_NOT_ALLOWED (64): Delegation Token requests are not allowed on PLAINTEXT/1-way SSL channels and on "
                   "delegation token authenticated channels.")
    assert refused("--command-config", token_config, "--create", "--max-life-time-period", "-1",
                   bootstrap=bootstrap) == not_allowed
    plaintext = str(properties(tmp_path / "plaintext.properties", {}))
    assert refused("--command-config", plaintext, "--describe", bootstrap=josef_broker.bootstrap_servers) == not_allowed

    renewed = ok(bootstrap, "--command-config", alice, "--renew", "--renew-time-period", "3600000", "--hmac", hmac)
    first, second = renewed.rstrip("\n").split("\n")
    assert first == f"Calling renew token operation with hmac :{hmac} , renew-time-period :3600000"
    assert re.fullmatch(r"Completed renew operation\. New expiry date : \d{4}-\d\d-\d\dT\d\d:\d\d", second)

    expired = ok(bootstrap, "--command-config", alice, "--expire", "--expiry-time-period", "-1", "--hmac", hmac)
    assert expired.split("\n")[0] == f"Calling expire token operation with hmac :{hmac} , expire-time-period :-1"
    assert expired.split("\n")[1].startswith("Completed expire operation. New expiry date : ")
    assert ok(bootstrap, "--command-config", alice, "--describe").startswith(
        "Calling describe token operation for current user.\nTotal number of tokens : 0\n")
    assert refused("--command-config", alice, "--renew", "--renew-time-period", "-1", "--hmac", hmac,
                   bootstrap=bootstrap) == ("Error: DELEGATION_TOKEN_NOT_FOUND (62): Delegation Token is not found "
                                            "on server.")
    # The expired token no longer authenticates.
    result = tool(bootstrap, "--command-config", token_config, "--describe")
    assert result.exit_code == 1 and "Authentication failed" in result.stderr
