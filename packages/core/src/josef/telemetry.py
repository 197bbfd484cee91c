"""Client metrics (KIP-714): the subscription a broker hands clients, and the receivers their pushes go to.

librdkafka and the Java client ask a broker that advertises these APIs for a
telemetry subscription (GetTelemetrySubscriptions) and push metrics
(PushTelemetry) at the interval it names. As in Kafka, a broker advertises
them only when something receives the metrics: a plugin registers a
:class:`ClientTelemetryReceiver` through ``register_client_telemetry``, like
Kafka's metrics reporters that implement ClientTelemetry. Without one,
clients never ask and never push.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from typing import Any, Iterable, Protocol

import attrs
from kio.schema.errors import ErrorCode

from josef.plugins import collect
from josef.protocol.codecs import Compression, decompress

log = logging.getLogger(__name__)

#: Kafka's default push interval when no receiver asks for a shorter one (5 minutes).
DEFAULT_PUSH_INTERVAL_MS = 300_000
#: Codecs a client may compress its pushes with, in Kafka's order of preference.
ACCEPTED_COMPRESSION = (Compression.ZSTD, Compression.LZ4, Compression.GZIP, Compression.SNAPPY)


class TelemetryError(Exception):
    """A push the broker refuses, with the error code its answer carries."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ClientTelemetryReceiver(Protocol):
    """What a telemetry plugin provides.

    ``requested_metrics`` are metric-name prefixes ("" for every metric);
    ``push_interval_ms`` how often clients should push. ``receive`` is called
    on the broker's event loop with the decompressed OTLP payload of one push
    and must not block.
    """

    requested_metrics: tuple[str, ...]
    push_interval_ms: int

    def receive(self, client_instance_id: uuid.UUID, payload: bytes, terminating: bool) -> None: ...


@attrs.frozen
class TelemetrySubscription:
    """The subscription every client gets from this broker (the union of the receivers' wishes)."""

    subscription_id: int
    requested_metrics: tuple[str, ...]
    push_interval_ms: int


class ClientTelemetry:
    """Answers GetTelemetrySubscriptions and hands PushTelemetry payloads to every receiver."""

    def __init__(self, receivers: Iterable[ClientTelemetryReceiver], max_bytes: int) -> None:
        self.receivers = list(receivers)
        self.max_bytes = max_bytes
        metrics = tuple(sorted({m for r in self.receivers for m in r.requested_metrics}))
        interval = min((r.push_interval_ms for r in self.receivers), default=DEFAULT_PUSH_INTERVAL_MS)
        if "" in metrics:
            metrics = ("",)
        # Stable across restarts and brokers for the same set: a client that moves brokers keeps pushing.
        subscription_id = zlib.crc32(repr((metrics, interval)).encode()) & 0x7FFFFFFF
        self.subscription = TelemetrySubscription(subscription_id, metrics, interval)

    @classmethod
    def from_plugins(cls, pm: Any, max_bytes: int) -> ClientTelemetry:
        registry = collect(pm, "register_client_telemetry", "client telemetry receiver")
        return cls([factory() for _, factory in registry.items()], max_bytes)

    def instance_id(self, requested: uuid.UUID | None) -> uuid.UUID:
        """The client's instance id: its own, or a new one when it sent the zero UUID (it has none yet)."""
        return uuid.uuid4() if requested is None or requested.int == 0 else requested

    def push(self, client_instance_id: uuid.UUID | None, subscription_id: int, compression: int, metrics: bytes,
             terminating: bool) -> None:
        """Decompress one push and give it to every receiver; :class:`TelemetryError` when it is refused."""
        if client_instance_id is None or client_instance_id.int == 0:
            raise TelemetryError(ErrorCode.invalid_request, "PushTelemetry needs the client instance id the broker assigned")
        if not self.subscription.requested_metrics or subscription_id != self.subscription.subscription_id:
            raise TelemetryError(ErrorCode.unknown_subscription_id,
                                 f"subscription {subscription_id} is not current ({self.subscription.subscription_id})")
        if len(metrics) > self.max_bytes:
            raise TelemetryError(ErrorCode.telemetry_too_large, f"{len(metrics)} bytes is over telemetry.max.bytes ({self.max_bytes})")
        if compression not in (Compression.NONE, *ACCEPTED_COMPRESSION):
            raise TelemetryError(ErrorCode.unsupported_compression_type, f"compression type {compression} is not accepted")
        try:
            payload = decompress(compression, metrics) if compression else metrics
        except Exception as exc:  # a codec's own error type: the client sent something unreadable
            raise TelemetryError(ErrorCode.invalid_record, f"cannot decompress the metrics: {exc}") from None
        for receiver in self.receivers:
            try:
                receiver.receive(client_instance_id, payload, terminating)
            except Exception:
                log.exception("client telemetry receiver %r failed; the others still get the push", receiver)
