"""``josef acls`` (kafka-acls.sh) against an in-process broker running Kafka's StandardAuthorizer.

The broker's listener is PLAINTEXT, so the tool is ``User:ANONYMOUS``, made a
super user so it may change ACLs. Outputs are compared whole: they are
Kafka 4.x's lines (AclCommand, ResourcePattern and AccessControlEntry
``toString``), which scripts parse.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from josef.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.cli import build_cli
from josef_client.admin import Admin
from josef_client.commands.acls import acls

ACL_BROKER = pytest.mark.josef_config(**{"authorizer.class.name": "acl", "super.users": "User:ANONYMOUS"})
#: Flag checks happen before connecting: nothing listens here.
NOWHERE = "127.0.0.1:1"


def topic(name: str) -> str:
    return f"ResourcePattern(resourceType=TOPIC, name={name}, patternType=LITERAL)"


def entry(principal: str, operation: str, permission: str = "ALLOW", host: str = "*") -> str:
    return f"(principal={principal}, host={host}, operation={operation}, permissionType={permission})"


def run(bootstrap: str, *args: str, input: str | None = None) -> Result:
    result = CliRunner().invoke(acls, ["--bootstrap-server", bootstrap, *args], input=input)
    assert "Traceback" not in result.output + result.stderr, result.output + result.stderr
    return result


def ok(broker, *args: str, input: str | None = None) -> str:
    result = run(broker.bootstrap_servers, *args, input=input)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def refused(*args: str, bootstrap: str = NOWHERE) -> str:
    result = run(bootstrap, *args)
    assert result.exit_code == 1, result.stdout
    assert result.stdout == ""
    return result.stderr.strip()


def stored(broker) -> set[tuple[ResourceType, str, PatternType, str, str, AclOperation, AclPermissionType]]:
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        return {attrs_tuple(a) for a in admin.describe_acls()}


def attrs_tuple(a: AclBinding) -> tuple:
    return (a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host, a.operation, a.permission_type)


def test_the_command_is_registered_on_josef():
    assert build_cli().commands["acls"] is acls


@ACL_BROKER
def test_add_list_remove_round_trip_prints_kafkas_lines(josef_broker):
    added = ok(josef_broker, "--add", "--allow-principal", "User:alice", "--operation", "Read",
               "--operation", "Describe", "--topic", "orders")
    assert added == (f"Adding ACLs for resource `{topic('orders')}`: \n"
                     f" \t{entry('User:alice', 'READ')}\n\t{entry('User:alice', 'DESCRIBE')}\n\n")
    again = ok(josef_broker, "--add", "--allow-principal", "User:alice", "--operation", "READ", "--topic", "orders")
    assert again == f"Acl (pattern={topic('orders')}, entry={entry('User:alice', 'READ')}) already exists.\n"
    listed = ok(josef_broker, "--list", "--topic", "orders")
    assert listed == (f"Current ACLs for resource `{topic('orders')}`:\n"
                      f"\t{entry('User:alice', 'READ')}\n\t{entry('User:alice', 'DESCRIBE')}\n\n")
    assert ok(josef_broker, "--list") == listed
    assert ok(josef_broker, "--list", "--topic", "other") == ""

    # Without --force Kafka asks; anything but y keeps the ACLs.
    question = (f"Are you sure you want to remove ACLs: \n \t{entry('User:alice', 'READ')}\n"
                f" from resource filter `{topic('orders')}`? (y/n)\n")
    remove = ("--remove", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "orders")
    assert ok(josef_broker, *remove, input="n\n") == question
    assert ok(josef_broker, "--list", "--topic", "orders") == listed
    assert ok(josef_broker, *remove, input="Y\n") == question
    assert ok(josef_broker, "--list", "--topic", "orders") == (
        f"Current ACLs for resource `{topic('orders')}`:\n\t{entry('User:alice', 'DESCRIBE')}\n\n")

    # No principal: everything on the resource, after Kafka's other question.
    assert ok(josef_broker, "--remove", "--topic", "orders", input="y\n") == (
        f"Are you sure you want to delete all ACLs for resource filter `{topic('orders')}`? (y/n)\n")
    assert stored(josef_broker) == set()


@ACL_BROKER
def test_remove_with_force_asks_nothing(josef_broker):
    ok(josef_broker, "--add", "--allow-principal", "User:alice", "--deny-principal", "User:mallory", "--topic", "t")
    assert len(stored(josef_broker)) == 2
    assert ok(josef_broker, "--remove", "--force", "--deny-principal", "User:mallory", "--topic", "t") == ""
    assert stored(josef_broker) == {(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*",
                                     AclOperation.ALL, AclPermissionType.ALLOW)}
    assert ok(josef_broker, "--remove", "--force", "--topic", "t") == ""
    assert stored(josef_broker) == set()


@ACL_BROKER
def test_hosts_and_denials(josef_broker):
    ok(josef_broker, "--add", "--allow-principal", "User:alice", "--allow-host", "10.0.0.1", "--allow-host",
       "10.0.0.2", "--deny-principal", "User:eve", "--operation", "Write", "--topic", "t")
    assert ok(josef_broker, "--list", "--topic", "t") == (
        f"Current ACLs for resource `{topic('t')}`:\n"
        f"\t{entry('User:alice', 'WRITE', host='10.0.0.1')}\n\t{entry('User:alice', 'WRITE', host='10.0.0.2')}\n"
        f"\t{entry('User:eve', 'WRITE', 'DENY')}\n\n")


@ACL_BROKER
def test_prefixed_patterns_and_pattern_type_filters(josef_broker):
    prefixed = "ResourcePattern(resourceType=TOPIC, name=pay-, patternType=PREFIXED)"
    assert ok(josef_broker, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--topic", "pay-",
              "--resource-pattern-type", "PREFIXED") == (
        f"Adding ACLs for resource `{prefixed}`: \n \t{entry('User:alice', 'WRITE')}\n\n")
    ok(josef_broker, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "pay-eu")
    ok(josef_broker, "--add", "--allow-principal", "User:carol", "--operation", "Read", "--topic", "*")
    prefixed_block = f"Current ACLs for resource `{prefixed}`:\n\t{entry('User:alice', 'WRITE')}\n\n"
    literal_block = f"Current ACLs for resource `{topic('pay-eu')}`:\n\t{entry('User:bob', 'READ')}\n\n"
    wildcard_block = f"Current ACLs for resource `{topic('*')}`:\n\t{entry('User:carol', 'READ')}\n\n"

    # Literal is the default filter, as in Kafka: the prefixed ACL is not literally "pay-".
    assert ok(josef_broker, "--list", "--topic", "pay-") == ""
    assert ok(josef_broker, "--list", "--topic", "pay-", "--resource-pattern-type", "prefixed") == prefixed_block
    assert ok(josef_broker, "--list", "--topic", "pay-", "--resource-pattern-type", "any") == prefixed_block
    # match: every ACL that applies to a topic called pay-eu (itself, the wildcard, the prefix).
    assert ok(josef_broker, "--list", "--topic", "pay-eu", "--resource-pattern-type", "match") == (
        wildcard_block + prefixed_block + literal_block)  # sorted by name

    ok(josef_broker, "--remove", "--force", "--topic", "pay-", "--resource-pattern-type", "prefixed")
    assert ok(josef_broker, "--list", "--topic", "pay-eu", "--resource-pattern-type", "match") == (
        wildcard_block + literal_block)


@ACL_BROKER
def test_producer_and_consumer_expand_as_kafkas_acl_command(josef_broker):
    ok(josef_broker, "--add", "--allow-principal", "User:p", "--producer", "--topic", "orders",
       "--transactional-id", "tx", "--idempotent")
    ok(josef_broker, "--add", "--allow-principal", "User:c", "--consumer", "--topic", "orders", "--group", "billing")
    T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
    granted = {(t, n, p, op) for t, n, _, p, _, op, _ in stored(josef_broker)}
    O = AclOperation
    assert granted == {
        (T, "orders", "User:p", O.WRITE), (T, "orders", "User:p", O.DESCRIBE), (T, "orders", "User:p", O.CREATE),
        (X, "tx", "User:p", O.WRITE), (X, "tx", "User:p", O.DESCRIBE),
        (C, "kafka-cluster", "User:p", O.IDEMPOTENT_WRITE),
        (T, "orders", "User:c", O.READ), (T, "orders", "User:c", O.DESCRIBE), (G, "billing", "User:c", O.READ)}
    assert {a[6] for a in stored(josef_broker)} == {AclPermissionType.ALLOW}

    cluster = "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)"
    assert ok(josef_broker, "--list", "--principal", "User:p") == (
        "ACLs for principal `User:p`\n"
        f"Current ACLs for resource `{topic('orders')}`:\n"
        f"\t{entry('User:p', 'WRITE')}\n\t{entry('User:p', 'CREATE')}\n\t{entry('User:p', 'DESCRIBE')}\n\n"
        f"Current ACLs for resource `{cluster}`:\n\t{entry('User:p', 'IDEMPOTENT_WRITE')}\n\n"
        "Current ACLs for resource `ResourcePattern(resourceType=TRANSACTIONAL_ID, name=tx, patternType=LITERAL)`:\n"
        f"\t{entry('User:p', 'WRITE')}\n\t{entry('User:p', 'DESCRIBE')}\n\n")
    assert ok(josef_broker, "--list", "--group", "billing", "--principal", "User:c", "--principal", "User:p") == (
        "ACLs for principal `User:c`\n"
        "Current ACLs for resource `ResourcePattern(resourceType=GROUP, name=billing, patternType=LITERAL)`:\n"
        f"\t{entry('User:c', 'READ')}\n\n"
        "ACLs for principal `User:p`\n")

    # --remove with the same convenience flag takes back exactly what it granted.
    ok(josef_broker, "--remove", "--force", "--allow-principal", "User:c", "--consumer", "--topic", "orders",
       "--group", "billing")
    assert {a[3] for a in stored(josef_broker)} == {"User:p"}


@ACL_BROKER
def test_an_acl_survives_a_broker_restart(josef_broker):
    ok(josef_broker, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "g",
       "--resource-pattern-type", "prefixed")
    before = ok(josef_broker, "--list")
    assert "name=g, patternType=PREFIXED" in before
    josef_broker.restart()
    assert ok(josef_broker, "--list") == before


def test_without_an_acl_authorizer_the_broker_says_security_is_disabled(josef_broker):
    for args in (("--list",), ("--add", "--allow-principal", "User:a", "--topic", "t"),
                 ("--remove", "--force", "--topic", "t")):
        message = refused(*args, bootstrap=josef_broker.bootstrap_servers)
        assert message == "Error: SECURITY_DISABLED (54): No Authorizer is configured.", args


@pytest.mark.parametrize(("args", "message"), [
    (("--add", "--allow-principal", "User:a", "--operation", "Write", "--group", "g"),
     "ResourceType GROUP only supports operations [READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS, ALL]"),
    (("--add", "--allow-principal", "User:a", "--operation", "Read", "--cluster"),
     "ResourceType CLUSTER only supports operations [CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, "
     "IDEMPOTENT_WRITE, ALTER, DESCRIBE, ALL]"),
    (("--add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"),
     "ResourceType TOPIC only supports operations [READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, "
     "ALTER_CONFIGS, ALL]"),
    (("--add", "--allow-principal", "User:a", "--producer"), "With --producer you must specify a --topic"),
    (("--add", "--allow-principal", "User:a", "--consumer", "--topic", "t"),
     "With --consumer you must specify a --topic and a --group and no --cluster or --transactional-id option "
     "should be specified."),
    (("--add", "--allow-principal", "User:a", "--consumer", "--topic", "t", "--group", "g", "--cluster"),
     "With --consumer you must specify a --topic and a --group and no --cluster or --transactional-id option "
     "should be specified."),
    (("--add", "--allow-principal", "User:a", "--idempotent", "--topic", "t"),
     "The --idempotent option is only available if --producer is set"),
    (("--add", "--producer", "--operation", "Read", "--topic", "t"),
     'Option "[producer]" can\'t be used with option "[operation]"'),
    (("--list", "--consumer"), 'Option "[list]" can\'t be used with option "[consumer]"'),
    (("--list", "--allow-principal", "User:a"), 'Option "[list]" can\'t be used with option "[allow-principal]"'),
    (("--add", "--principal", "User:a", "--topic", "t"), "The --principal option is only available if --list is set"),
    (("--add", "--topic", "t"), "You must specify one of: --allow-principal, --deny-principal when trying to add ACLs."),
    (("--add", "--allow-principal", "User:a"),
     "You must provide at least one resource: --topic <topic> or --cluster or --group <group> or --delegation-token "
     "<Delegation Token ID>"),
    (("--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "any"),
     "A '--resource-pattern-type' value of 'ANY' is not valid when adding acls."),
    (("--add", "--allow-principal", "alice", "--topic", "t"),
     "expected a string in format principalType:principalName but got alice"),
    (("--topic", "t"), "Command must include exactly one action: --list, --add, --remove."),
    (("--add", "--remove", "--topic", "t"), "Command must include exactly one action: --list, --add, --remove."),
])
def test_flags_kafka_refuses_are_refused_before_connecting(args, message):
    assert refused(*args) == f"Error: {message}"


def test_operation_names_are_kafkas():
    from josef_client.commands.acls import operation

    assert operation("IdempotentWrite") == operation("idempotentwrite") == AclOperation.IDEMPOTENT_WRITE
    assert operation(" DescribeConfigs") == operation("DESCRIBE_CONFIGS") == AclOperation.DESCRIBE_CONFIGS
    assert operation("All") == operation("all") == AclOperation.ALL
    assert operation("Fly") == AclOperation.UNKNOWN


@ACL_BROKER
def test_command_config_is_read(josef_broker, tmp_path):
    config = tmp_path / "admin.properties"
    config.write_text("# Kafka's properties syntax\nclient.id=acl-tool\nrequest.timeout.ms=15000\n")
    ok(josef_broker, "--command-config", str(config), "--add", "--allow-principal", "User:a", "--cluster")
    assert ok(josef_broker, "--command-config", str(config), "--list", "--cluster") == (
        "Current ACLs for resource `ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)`:\n"
        f"\t{entry('User:a', 'ALL')}\n\n")
    config.write_text("request.timeout.ms=soon\n")
    assert "request.timeout.ms" in refused("--command-config", str(config), "--list",
                                           bootstrap=josef_broker.bootstrap_servers)
