"""Coordinator records in Kafka's binary form: an int16 version, then a schema entity kio reads and writes.

Every coordinator topic of Kafka (``__consumer_offsets``, ``__transaction_state``,
``__share_group_state``) frames its keys and values this way; the plugins that
own the schemas share this framing instead of each writing it again.
"""

from __future__ import annotations

import io
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer

_I16 = struct.Struct(">h")


def encode_versioned(cls: type, entity: Any, version: int) -> bytes:
    """``version`` as an int16, then ``entity`` (an instance of the kio schema ``cls``)."""
    out = io.BytesIO()
    out.write(_I16.pack(version))
    entity_writer(cls)(out, entity)
    return out.getvalue()


def record_version(data: bytes, what: str, error: type[Exception] = ValueError) -> int:
    """The int16 version a key or value starts with; ``error`` when there is none."""
    if len(data) < 2:
        raise error(f"{what} of {len(data)} bytes has no version")
    return int(_I16.unpack_from(data)[0])


def decode_versioned(cls: type, data: bytes, what: str, error: type[Exception] = ValueError) -> Any:
    """The ``cls`` entity after the version; ``error`` when it is malformed or followed by more bytes."""
    try:
        entity, size = entity_reader(cls)(data, 2)
    except Exception as exc:  # kio raises several types for short or malformed bodies
        raise error(f"malformed {what}: {exc}") from exc
    if 2 + size != len(data):
        raise error(f"{len(data) - 2 - size} bytes after a {what}")
    return entity
