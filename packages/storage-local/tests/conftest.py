"""Fixtures of the local storage tests: a :class:`local_harness.Harness` on a temporary directory and its clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from josef.testing import ManualClock
from local_harness import Harness


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def harness(tmp_path: Path, clock: ManualClock) -> Iterator[Harness]:
    h = Harness(tmp_path / "logs", clock)
    yield h
    h.crash()  # release whatever the test left open
