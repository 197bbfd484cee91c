"""``josef dump-log --share-group-state-decoder``: the records of ``__share_group_state`` as Kafka's tool prints them.

Kafka's ``DumpLogSegments`` prints a coordinator record's key as
``{"type":"<key version>","data":{...}}`` and its value as
``{"version":"<version>","data":{...}}``; the schema entities of
:mod:`josef_coordinator_share.records` carry exactly those fields.
"""

from __future__ import annotations

import struct
from typing import Any

from josef_coordinator_share import records


def decode(key: bytes, value: bytes | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One record's key and value (None for a tombstone), for the dump tool; see the ``register_record_decoders`` hook."""
    decoded = records.key_entity(key)
    if decoded is None:
        raise LookupError(struct.unpack_from(">h", key)[0])
    record_type, entity = decoded
    decoded_key = {"type": str(record_type), "data": entity}
    if value is None:
        return decoded_key, None
    version, data = records.value_entity(record_type, value)
    return decoded_key, {"version": str(version), "data": data}
