"""What the receiver's tests share: pushes as the broker hands them to a receiver."""

from __future__ import annotations

import uuid
from typing import Callable

import pytest

from josef.telemetry import ClientTelemetryPush

MakePush = Callable[..., ClientTelemetryPush]


def make_push(payload: bytes, *, instance: uuid.UUID, client_id: str | None = "app", terminating: bool = False,
              software: tuple[str, str] = ("librdkafka", "2.16.0")) -> ClientTelemetryPush:
    return ClientTelemetryPush(client_instance_id=instance, client_id=client_id, client_software_name=software[0],
                               client_software_version=software[1], client_address="127.0.0.1",
                               principal="User:ANONYMOUS", listener="PLAINTEXT", payload=payload,
                               terminating=terminating)


@pytest.fixture
def push() -> MakePush:
    """``push(payload, instance=..., client_id=..., terminating=..., software=(name, version))``."""
    return make_push
