"""The core's storage contract suite (:mod:`josef.testing.storage`) run against the local storage."""

from __future__ import annotations

import pytest

from josef.testing.storage import LogStorageContract
from josef_storage_local.testing import LocalHarness


class TestLocalStorageContract(LogStorageContract):
    @pytest.fixture
    def storage_harness(self) -> LocalHarness:
        return LocalHarness()
