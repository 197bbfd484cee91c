"""The core's authorizer contract suite (:mod:`josef.testing.authorizer`) run against the core's ``allow-all``."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from josef.authorizer import Action
from josef.testing.authorizer import AuthorizerContract


class AllowAllHarness:
    """``allow-all`` needs no configuration and grants nothing: it allows everyone everything."""

    name = "allow-all"

    def config_keys(self) -> Mapping[str, str]:
        return {}

    def grant(self, principal: str, action: Action) -> Mapping[str, str] | None:
        return None


class TestAllowAllContract(AuthorizerContract):
    @pytest.fixture
    def authorizer_harness(self) -> AllowAllHarness:
        return AllowAllHarness()

    def test_allow_all_allows_everything(self, authorizer_harness):
        """Not part of the contract: what allow-all itself promises."""
        assert set(self.answers(self.build(authorizer_harness)).values()) == {True}
