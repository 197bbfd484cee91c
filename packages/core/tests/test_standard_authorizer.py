"""Kafka's StandardAuthorizer rules, as josef's ACL authorizer applies them (examples from Kafka's docs and tests)."""

from __future__ import annotations

import itertools
import warnings

import pytest

from josef.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation as Op,
    AclPermissionType,
    InvalidAcl,
    PatternType,
    ResourceType,
)
from josef.authorizer import Action, AllowAll, adapt
from josef.node.server_properties import load_config
from josef.plugin_api import JosefDeprecationWarning
from josef.plugins import get_plugin_manager
from josef.standard_authorizer import StandardAuthorizer
from josef.testing.authorizer import context

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
_ids = itertools.count()


def acl(name: str, principal: str, op: Op, permission: AclPermissionType = ALLOW, *, pattern: PatternType = LITERAL,
        kind: ResourceType = ResourceType.TOPIC, host: str = "*") -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, op, permission)


def authorizer(*acls: AclBinding, **config: str) -> StandardAuthorizer:
    built = StandardAuthorizer(load_config(None, {k.replace("_", "."): v for k, v in config.items()},
                                           get_plugin_manager()))
    built.load_acls({next(_ids): a for a in acls})
    return built


def may(auth: StandardAuthorizer, principal: str, operation: str, name: str, resource: str = "TOPIC",
        host: str = "10.0.0.1") -> bool:
    return auth.authorize(context(principal, host), [Action(operation, resource, name)])[0]


def test_deny_by_default_and_allow_everyone_if_no_acl_found():
    assert not may(authorizer(), "User:alice", "READ", "orders")
    relaxed = authorizer(acl("payments", "User:bob", Op.READ), allow_everyone_if_no_acl_found="true")
    assert may(relaxed, "User:alice", "READ", "orders")  # no ACL on orders at all
    assert not may(relaxed, "User:alice", "READ", "payments")  # payments has ACLs, none for alice


def test_literal_prefixed_and_wildcard_resources():
    auth = authorizer(acl("orders", "User:alice", Op.READ), acl("pay", "User:bob", Op.WRITE, pattern=PREFIXED),
                      acl("*", "User:carol", Op.DESCRIBE))
    assert may(auth, "User:alice", "READ", "orders") and not may(auth, "User:alice", "READ", "orders-eu")
    assert may(auth, "User:bob", "WRITE", "payments") and may(auth, "User:bob", "WRITE", "pay")
    assert not may(auth, "User:bob", "WRITE", "pa") and not may(auth, "User:bob", "WRITE", "orders")
    assert may(auth, "User:carol", "DESCRIBE", "anything") and not may(auth, "User:carol", "READ", "anything")


def test_wildcard_principal_and_host_matching():
    auth = authorizer(acl("orders", "User:*", Op.READ, host="10.0.0.1"))
    assert may(auth, "User:anyone", "READ", "orders", host="10.0.0.1")
    assert not may(auth, "User:anyone", "READ", "orders", host="10.0.0.2")


def test_deny_wins_over_allow_whatever_the_pattern():
    auth = authorizer(acl("*", "User:alice", Op.ALL), acl("secret", "User:alice", Op.READ, DENY, pattern=PREFIXED))
    assert may(auth, "User:alice", "READ", "orders")
    assert not may(auth, "User:alice", "READ", "secret-plans")
    assert may(auth, "User:alice", "WRITE", "secret-plans")  # the DENY is for READ only
    everyone_denied = authorizer(acl("orders", "User:alice", Op.READ), acl("orders", "User:*", Op.ALL, DENY))
    assert not may(everyone_denied, "User:alice", "READ", "orders")


def test_implied_operations_for_allow_only():
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert may(authorizer(acl("t", "User:a", op)), "User:a", "DESCRIBE", "t"), op
    assert may(authorizer(acl("t", "User:a", Op.ALTER_CONFIGS)), "User:a", "DESCRIBE_CONFIGS", "t")
    assert not may(authorizer(acl("t", "User:a", Op.CREATE)), "User:a", "DESCRIBE", "t")
    # A DENY of READ does not deny DESCRIBE, which an ALLOW of WRITE implies.
    auth = authorizer(acl("t", "User:a", Op.WRITE), acl("t", "User:a", Op.READ, DENY))
    assert may(auth, "User:a", "DESCRIBE", "t") and not may(auth, "User:a", "READ", "t")


def test_super_users_may_do_anything_despite_denies():
    auth = authorizer(acl("orders", "User:admin", Op.ALL, DENY), super_users="User:admin;User:broker")
    assert may(auth, "User:admin", "WRITE", "orders") and may(auth, "User:broker", "CLUSTER_ACTION",
                                                                "kafka-cluster", "CLUSTER")
    assert not may(auth, "User:other", "WRITE", "orders")


def test_one_batch_answers_in_order():
    auth = authorizer(acl("a", "User:x", Op.READ))
    actions = [Action("READ", "TOPIC", n) for n in ("a", "b", "a")] + [Action("READ", "GROUP", "a")]
    assert auth.authorize(context("User:x"), actions) == [True, False, True, False]


def test_authorize_by_resource_type():
    ctx = context("User:p")
    assert not authorizer().authorize_by_resource_type(ctx, "WRITE", "TOPIC")
    assert authorizer(acl("t", "User:p", Op.WRITE)).authorize_by_resource_type(ctx, "WRITE", "TOPIC")
    # A prefixed DENY that covers the only ALLOW leaves nothing to write to; a wildcard DENY covers everything.
    assert not authorizer(acl("t1", "User:p", Op.WRITE), acl("t", "User:p", Op.WRITE, DENY, pattern=PREFIXED)
                          ).authorize_by_resource_type(ctx, "WRITE", "TOPIC")
    assert not authorizer(acl("t", "User:p", Op.WRITE), acl("*", "User:p", Op.WRITE, DENY)
                          ).authorize_by_resource_type(ctx, "WRITE", "TOPIC")
    assert authorizer(super_users="User:p").authorize_by_resource_type(ctx, "WRITE", "TOPIC")


def test_filters_match_as_kafkas():
    literal, wildcard = acl("orders", "User:a", Op.READ), acl("*", "User:a", Op.READ)
    prefixed = acl("ord", "User:a", Op.READ, pattern=PREFIXED)
    match = AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.MATCH)
    assert [match.matches(b) for b in (literal, wildcard, prefixed)] == [True, True, True]
    exact = AclBindingFilter(ResourceType.TOPIC, "orders", LITERAL)
    assert [exact.matches(b) for b in (literal, wildcard, prefixed)] == [True, False, False]
    assert AclBindingFilter().matches(prefixed)
    assert not AclBindingFilter(principal="User:b").matches(literal)


@pytest.mark.parametrize("binding, reason", [
    (acl("", "User:a", Op.READ), "Resource name should not be empty"),
    (acl("x", "alice", Op.READ), "Could not parse principal"),
    (acl("other", "User:a", Op.ALTER, kind=ResourceType.CLUSTER), "kafka-cluster"),
    (acl("g", "User:a", Op.WRITE, kind=ResourceType.GROUP), "not supported on GROUP"),
    (acl("x", "User:a", Op.ANY), "Invalid operation ANY"),
])
def test_bindings_that_cannot_be_stored(binding, reason):
    with pytest.raises(InvalidAcl, match=reason):
        binding.check()


def test_an_authorizer_of_plugin_api_1_0_is_wrapped_and_warned_about():
    class OneByOne:
        def authorize(self, principal, host, action):
            return principal == "User:alice" and host == "::1" and action.operation == "READ"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = adapt(OneByOne())
    assert any(issubclass(w.category, JosefDeprecationWarning) for w in caught)
    read, write = Action("READ", "TOPIC", "t"), Action("WRITE", "TOPIC", "t")
    assert wrapped.authorize(context("User:alice", "::1"), [read, write]) == [True, False]
    assert wrapped.authorize(context("User:bob", "::1"), [read]) == [False]
    current = AllowAll()
    assert adapt(current) is current


def test_plugins_of_plugin_api_1_0_may_still_call_the_one_action_form(josef_broker):
    """A coordinator written for plugin API 1.0 asks ``services.authorizer.authorize(principal, host, action)``."""
    services = josef_broker.broker.services
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert services.authorizer.authorize("User:alice", "10.0.0.1", Action("READ", "TOPIC", "t")) is True
    assert any(issubclass(w.category, JosefDeprecationWarning) for w in caught)
    assert services.authorizer.authorize(context("User:alice"), [Action("READ", "TOPIC", "t")]) == [True]
