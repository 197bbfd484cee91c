"""The core's authorizer contract suite (:mod:`josef.testing.authorizer`) run against the core's two authorizers."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import pytest

from josef.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.authorizer import Action
from josef.testing.authorizer import AclAuthorizerContract, AuthorizerContract, Grant


class AllowAllHarness:
    """``allow-all`` needs no configuration and grants nothing: it allows everyone everything."""

    name = "allow-all"

    def config_keys(self) -> Mapping[str, str]:
        return {}

    def grant(self, principal: str, action: Action) -> Grant | None:
        return None


class StandardAuthorizerHarness:
    """Kafka's ACL authorizer: a grant is one LITERAL ALLOW ACL, from any host."""

    name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

    def config_keys(self) -> Mapping[str, str]:
        return {}

    def grant(self, principal: str, action: Action) -> Grant | None:
        acl = AclBinding(ResourceType[action.resource_type], action.resource_name, PatternType.LITERAL, principal,
                         "*", AclOperation[action.operation], AclPermissionType.ALLOW)
        return Grant(acls={uuid.uuid4(): acl})


class TestAllowAllContract(AuthorizerContract):
    @pytest.fixture
    def authorizer_harness(self) -> AllowAllHarness:
        return AllowAllHarness()

    def test_allow_all_allows_everything(self, authorizer_harness):
        """Not part of the contract: what allow-all itself promises."""
        assert set(self.answers(self.build(authorizer_harness)).values()) == {True}


class TestStandardAuthorizerContract(AclAuthorizerContract):
    @pytest.fixture
    def authorizer_harness(self) -> StandardAuthorizerHarness:
        return StandardAuthorizerHarness()
