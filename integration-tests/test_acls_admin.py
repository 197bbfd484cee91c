"""confluent-kafka's AdminClient managing ACLs on a josef broker process (CreateAcls, DescribeAcls, DeleteAcls).

librdkafka encodes these requests itself, so this checks josef's answers as
a non-josef client reads them; ``josef acls --list`` then reads what it
created, so the tool and a foreign client agree on one store.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from josef_client.commands.acls import acls as acls_command

pytestmark = pytest.mark.metadata

STANDARD_AUTHORIZER = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                       "super.users": "User:ANONYMOUS"}
TIMEOUT = 30

ALICE_READS = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
BOB_DENIED = AclBinding(ResourceType.GROUP, "billing-", ResourcePatternType.PREFIXED, "User:bob", "10.0.0.9",
                        AclOperation.READ, AclPermissionType.DENY)
EVERYTHING = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


def key(b: AclBinding) -> tuple:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


def test_confluent_kafka_creates_describes_and_deletes_acls(broker_factory):
    broker = broker_factory(**STANDARD_AUTHORIZER)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})

    created = admin.create_acls([ALICE_READS, BOB_DENIED], request_timeout=TIMEOUT)
    assert {key(b): f.result(TIMEOUT) for b, f in created.items()} == {key(ALICE_READS): None, key(BOB_DENIED): None}

    described = admin.describe_acls(EVERYTHING, request_timeout=TIMEOUT).result(TIMEOUT)
    assert sorted(map(key, described)) == sorted([key(ALICE_READS), key(BOB_DENIED)])
    # MATCH: the prefixed ACL applies to a group called billing-eu.
    matching = AclBindingFilter(ResourceType.GROUP, "billing-eu", ResourcePatternType.MATCH, None, None,
                                AclOperation.ANY, AclPermissionType.ANY)
    assert [key(b) for b in admin.describe_acls(matching, request_timeout=TIMEOUT).result(TIMEOUT)] == [
        key(BOB_DENIED)]

    listed = CliRunner().invoke(acls_command, ["--bootstrap-server", broker.bootstrap_servers, "--list",
                                               "--principal", "User:bob"])
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout == (
        "ACLs for principal `User:bob`\n"
        "Current ACLs for resource `ResourcePattern(resourceType=GROUP, name=billing-, patternType=PREFIXED)`:\n"
        "\t(principal=User:bob, host=10.0.0.9, operation=READ, permissionType=DENY)\n\n")

    bobs = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None, AclOperation.ANY,
                            AclPermissionType.ANY)
    deleted = admin.delete_acls([bobs], request_timeout=TIMEOUT)
    assert [key(b) for b in deleted[bobs].result(TIMEOUT)] == [key(BOB_DENIED)]
    assert [key(b) for b in admin.describe_acls(EVERYTHING, request_timeout=TIMEOUT).result(TIMEOUT)] == [
        key(ALICE_READS)]


def test_confluent_kafka_is_told_security_is_disabled_without_an_acl_authorizer(broker_factory):
    broker = broker_factory()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in (admin.create_acls([ALICE_READS], request_timeout=TIMEOUT)[ALICE_READS],
                   admin.delete_acls([EVERYTHING], request_timeout=TIMEOUT)[EVERYTHING]):
        with pytest.raises(KafkaException) as refused:
            future.result(TIMEOUT)
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
        assert "No Authorizer is configured." in refused.value.args[0].str()
    # librdkafka drops DescribeAcls' top-level error code (rd_kafka_DescribeAclsResponse_parse), so a
    # refusal reads as an empty list there, against Kafka as against josef; josef's own client raises it.
    assert admin.describe_acls(EVERYTHING, request_timeout=TIMEOUT).result(TIMEOUT) == []
