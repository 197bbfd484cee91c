"""The pytest plugin: a real josef broker for your tests, with no Docker and no JVM.

Installed with josef (entry point ``pytest11``). Use the ``josef_broker``
fixture; it starts a broker in a background thread of the test process on a
free port of 127.0.0.1 with storage in the test's temporary directory, and
stops it after the test::

    def test_orders(josef_broker):
        producer = confluent_kafka.Producer({"bootstrap.servers": josef_broker.bootstrap_servers})

Mark a test with ``@pytest.mark.josef_config(key="value", ...)`` (dots as in
Kafka: ``**{"num.partitions": "3"}``) to change the broker's configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from josef.runner import BrokerThread


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "josef_config(**overrides): server.properties overrides for josef_broker")


def broker_overrides(data_dir: Path, **extra: str) -> dict[str, str]:
    """A single-node broker on a free port of 127.0.0.1, storing under ``data_dir``."""
    return {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": str(data_dir), **extra}


@pytest.fixture
def josef_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    extra: dict[str, str] = {}
    for marker in reversed(list(request.node.iter_markers("josef_config"))):
        extra.update({k: str(v) for k, v in marker.kwargs.items()})
    broker = BrokerThread(broker_overrides(tmp_path_factory.mktemp("josef"), **extra))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
