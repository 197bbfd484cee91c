"""``josef dump-log --transaction-log-decoder``: the records of ``__transaction_state`` as Kafka's tool prints them.

Kafka's ``DumpLogSegments`` prints the key as ``{"type":"0","data":{"transactionalId":...}}``
and the value as ``{"version":"<version>","data":{...}}``, written by the
generated TransactionLogValue converter: every field of that version, the tagged
ones (version 1) only when they differ from their default. The schema entities
of :mod:`josef_coordinator_txn.records` carry exactly that, so they are handed
to the tool as they were read.
"""

from __future__ import annotations

import struct
from typing import Any

from josef_coordinator_txn import records


def decode(key: bytes, value: bytes | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One record's key and value (None for a tombstone), for the dump tool; see the ``register_record_decoders`` hook."""
    entity = records.key_entity(key)
    if entity is None:
        raise LookupError(struct.unpack_from(">h", key)[0])
    decoded_key = {"type": str(records.KEY_VERSION), "data": entity}
    if value is None:
        return decoded_key, None
    version, data = records.value_entity(value)
    return decoded_key, {"version": str(version), "data": data}
