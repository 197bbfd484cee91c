from __future__ import annotations

import pytest

from console_fakes import FakeServices


@pytest.fixture
def services() -> FakeServices:
    return FakeServices()


@pytest.fixture
def anyio_backend() -> str:
    """aiohttp, and the node the console runs in, run on asyncio."""
    return "asyncio"
