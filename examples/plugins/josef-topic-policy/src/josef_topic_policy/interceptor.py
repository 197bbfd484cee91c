"""A producer interceptor for josef-client: stamps every record with the producing client's id.

Listed in a producer's ``interceptor.classes``::

    Producer({"bootstrap.servers": "...", "client.id": "billing", "interceptor.classes": ["origin-header"]})

Consumers then find ``origin: billing`` in each record's headers. Following
Kafka's interceptor contract, josef-client calls ``on_send`` on the
producer's thread before the record is partitioned, and
``on_acknowledgement`` when the broker answered (or the send failed); an
exception raised here would be logged and the record sent unchanged.
"""

from __future__ import annotations

from typing import Any

import attrs

#: The header this interceptor adds to every record.
ORIGIN_HEADER = "origin"


class OriginInterceptor:
    def __init__(self, config: dict[str, Any]) -> None:
        self.origin = str(config["client.id"]).encode()
        self.acknowledged = 0
        self.failed = 0

    def on_send(self, record: Any) -> Any:
        """The record with an ``origin`` header added (records are immutable: a copy, not a change)."""
        return attrs.evolve(record, headers=(*record.headers, (ORIGIN_HEADER, self.origin)))

    def on_acknowledgement(self, metadata: Any, error: Exception | None) -> None:
        if error is None:
            self.acknowledged += 1
        else:
            self.failed += 1
