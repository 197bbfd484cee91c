"""Client metrics (KIP-714): what each client is asked to push, how its pushes are checked, and who receives them.

librdkafka and the Java client ask a broker that advertises these APIs for a
telemetry subscription (GetTelemetrySubscriptions) and push metrics
(PushTelemetry) at the interval it names. As in Kafka, a broker advertises
them only when something receives the metrics: a plugin registers a
:class:`ClientTelemetryReceiver` through ``register_client_telemetry``, like
Kafka's metrics reporters that implement ClientTelemetry. Without one,
clients never ask and never push.

What a client is asked for is Kafka's ClientMetricsManager's answer: the
union of the metrics of every client-metrics resource
(:mod:`josef.metadata.client_metrics`, ``josef client-metrics``) whose
``match`` selects it, at the shortest of their intervals. While no such
resource exists, every client gets the receivers' own wish instead: the
union of their ``requested_metrics`` at the shortest ``push_interval_ms``
(:attr:`ClientTelemetry.subscription`), so a receiver works without any
configuration.
"""

from __future__ import annotations

import collections
import logging
import math
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

import attrs
import crc32c
from kio.schema.errors import ErrorCode

from josef.metadata import client_metrics
from josef.metadata.records import uuid_to_text
from josef.plugins import collect
from josef.protocol.codecs import Compression, decompress

if TYPE_CHECKING:
    from kio.schema.push_telemetry.v0.request import PushTelemetryRequest

    from josef.metadata.image import MetadataImage
    from josef.security import Session

log = logging.getLogger(__name__)

#: Kafka's push interval when nothing asks for a shorter one (5 minutes).
DEFAULT_PUSH_INTERVAL_MS = client_metrics.DEFAULT_INTERVAL_MS
#: Codecs a client may compress its pushes with, in Kafka's order of preference.
ACCEPTED_COMPRESSION = (Compression.ZSTD, Compression.LZ4, Compression.GZIP, Compression.SNAPPY)
#: How many clients' telemetry state a broker keeps, least recently heard from forgotten first (Kafka's cache size).
MAX_CLIENTS = 16384
#: Client instance ids Kafka reserves (``Uuid.RESERVED``: the zero and one UUIDs), never a client's.
_RESERVED = frozenset({0, 1})


class TelemetryError(Exception):
    """A request the broker refuses, with the error code its answer carries."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class ClientTelemetryPush:
    """One push, as a receiver gets it (plugin API 1.5): the metrics and the client that sent them.

    Kafka's ClientTelemetryReceiver.exportMetrics gets the request's context
    beside the payload, so that a receiver can label what it exports with
    who sent it; these are the parts of that context a receiver needs.
    """

    client_instance_id: uuid.UUID
    #: The ``client.id`` of the request header (None when the client sent none).
    client_id: str | None
    #: What the client said it is in ApiVersions ("unknown" when it did not say).
    client_software_name: str
    client_software_version: str
    #: The IP address the client connected from.
    client_address: str
    #: The authenticated principal, as ``Type:name`` (``User:ANONYMOUS`` on a PLAINTEXT listener).
    principal: str
    #: The listener the push arrived on.
    listener: str
    #: The OTLP ``ExportMetricsServiceRequest`` protobuf, decompressed.
    payload: bytes
    #: Whether this is the client's last push before it closes.
    terminating: bool


class ClientTelemetryReceiver(Protocol):
    """What a telemetry plugin provides.

    ``receive_push`` is called on the broker's event loop with each push of
    metrics (not the empty ones), and must not block; an exception is logged
    and the client is answered INVALID_RECORD, as Kafka answers when its
    receiver fails (the other receivers still get the push). A receiver of
    plugin API 1.4, with ``receive(client_instance_id, payload, terminating)``
    instead, keeps working.

    ``requested_metrics`` (metric-name prefixes, "" for every metric) and
    ``push_interval_ms`` are optional: they are what clients are asked for
    while no client-metrics resource exists (by default nothing, every 5
    minutes).
    """

    requested_metrics: tuple[str, ...]
    push_interval_ms: int

    def receive_push(self, push: ClientTelemetryPush) -> None: ...


@attrs.frozen
class TelemetrySubscription:
    """What a client is asked to push, and how often; its id changes when either does."""

    subscription_id: int
    requested_metrics: tuple[str, ...]
    push_interval_ms: int


def _delivery(receiver: Any) -> Callable[[ClientTelemetryPush], None]:
    """How a receiver is given a push: its ``receive_push``, or its plugin API 1.4 ``receive`` adapted once here."""
    if hasattr(receiver, "receive_push"):
        return receiver.receive_push
    receive = receiver.receive
    return lambda push: receive(push.client_instance_id, push.payload, push.terminating)


def _subscription_id(metrics: tuple[str, ...], interval_ms: int, client_instance_id: uuid.UUID) -> int:
    """As Kafka's computeSubscriptionId: a CRC-32C of the (sorted) metrics and the interval, XORed with the instance
    id's hash (Java's ``Uuid.hashCode``), as a signed 32-bit int. The same client and set get the same id on every
    broker, and a new one when the set changes."""
    crc = crc32c.crc32c(f"{list(metrics)}{interval_ms}".encode())
    both = (client_instance_id.int >> 64) ^ (client_instance_id.int & ((1 << 64) - 1))
    value = crc ^ (both >> 32) ^ (both & 0xFFFFFFFF)
    return value - (1 << 32) if value >= 1 << 31 else value


@attrs.define
class _Client:
    """One client instance's state (Kafka's ClientMetricsInstance): its subscription and when it last asked and pushed."""

    #: The selectors a client-metrics resource's ``match`` is applied to, taken from the client's first request.
    selectors: Mapping[str, str | None]
    subscription: TelemetrySubscription
    #: The version of the client-metrics resources the subscription was chosen from.
    version: int
    last_get_ms: float = -math.inf
    last_push_ms: float = -math.inf
    terminating: bool = False
    last_error: ErrorCode = ErrorCode.none

    def may_get(self, now_ms: float) -> bool:
        """A GetTelemetrySubscriptions is due a push interval after the last request (and then counts as the last)."""
        if now_ms - max(self.last_get_ms, self.last_push_ms) >= self.subscription.push_interval_ms:
            self.last_get_ms = now_ms
            return True
        return False

    def may_push(self, now_ms: float) -> bool:
        """A push is due a push interval after the previous one, or at once after a GetTelemetrySubscriptions
        (clients add jitter to the interval, so the first push may come early)."""
        if self.last_get_ms > self.last_push_ms or now_ms - self.last_push_ms >= self.subscription.push_interval_ms:
            self.last_push_ms = now_ms
            return True
        return False


class ClientTelemetry:
    """Answers GetTelemetrySubscriptions and PushTelemetry as Kafka's ClientMetricsManager, and hands pushes to the receivers.

    ``clock`` gives seconds (``time.monotonic``); tests pass their own.
    """

    def __init__(self, receivers: Iterable[ClientTelemetryReceiver], max_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.receivers = list(receivers)
        self.max_bytes = max_bytes
        self._deliveries = [_delivery(r) for r in self.receivers]
        self._clock = clock
        metrics = tuple(sorted({m for r in self.receivers for m in getattr(r, "requested_metrics", ())}))
        if "" in metrics:
            metrics = ("",)
        interval = min((getattr(r, "push_interval_ms", DEFAULT_PUSH_INTERVAL_MS) for r in self.receivers),
                       default=DEFAULT_PUSH_INTERVAL_MS)
        #: What every client is asked for while no client-metrics resource exists (its id is the one of the zero
        #: instance id: each client's is derived from its own).
        self.subscription = TelemetrySubscription(_subscription_id(metrics, interval, uuid.UUID(int=0)), metrics,
                                                  interval)
        self._clients: collections.OrderedDict[uuid.UUID, _Client] = collections.OrderedDict()
        #: The image configs the resources were read from: an image replaces the mapping on every config change.
        self._configs: Mapping[Any, Any] | None = None
        self._resources: tuple[client_metrics.ClientMetricsResource, ...] = ()
        self._version = 0

    @classmethod
    def from_plugins(cls, pm: Any, max_bytes: int) -> ClientTelemetry:
        registry = collect(pm, "register_client_telemetry", "client telemetry receiver")
        return cls([factory() for _, factory in registry.items()], max_bytes)

    def instance_id(self, requested: uuid.UUID | None) -> uuid.UUID:
        """The client's instance id: its own, or a new one when it sent the zero UUID (it has none yet)."""
        return requested if requested is not None and requested.int != 0 else uuid.uuid4()

    def subscription_of(self, client_instance_id: uuid.UUID) -> TelemetrySubscription | None:
        """The subscription this broker last chose for a client instance (None: it has not heard from it)."""
        client = self._clients.get(client_instance_id)
        return None if client is None else client.subscription

    def subscribe(self, image: MetadataImage, session: Session, client_id: str | None,
                  requested: uuid.UUID | None) -> tuple[uuid.UUID, TelemetrySubscription]:
        """A GetTelemetrySubscriptions: the client's instance id and subscription.

        THROTTLING_QUOTA_EXCEEDED (:class:`TelemetryError`) when it asks again
        within its push interval, unless its subscription changed since or
        its last push was refused for an unknown subscription id or
        compression type (the client is then expected to ask at once).
        """
        instance_id = self.instance_id(requested)
        client = self._client(image, instance_id, session, client_id)
        if not client.may_get(self._now_ms()) and client.last_error not in (ErrorCode.unknown_subscription_id,
                                                                            ErrorCode.unsupported_compression_type):
            raise TelemetryError(ErrorCode.throttling_quota_exceeded,
                                 f"Request from the client [{uuid_to_text(instance_id)}] arrived before the next "
                                 f"push interval time")
        client.last_error = ErrorCode.none
        return instance_id, client.subscription

    def push(self, image: MetadataImage, session: Session, client_id: str | None,
             request: PushTelemetryRequest) -> None:
        """A PushTelemetry: checked as Kafka's ClientMetricsManager does, then given to every receiver.

        :class:`TelemetryError` with INVALID_REQUEST for a reserved instance
        id or a push after the client's terminating one,
        THROTTLING_QUOTA_EXCEEDED for one within the push interval (a
        terminating push is always taken), UNKNOWN_SUBSCRIPTION_ID for one
        made under a subscription that is no longer the client's,
        UNSUPPORTED_COMPRESSION_TYPE, TELEMETRY_TOO_LARGE (over
        ``telemetry.max.bytes``), INVALID_RECORD when the metrics cannot be
        decompressed or a receiver fails.
        """
        instance_id = request.client_instance_id
        if instance_id is None or instance_id.int in _RESERVED:
            raise TelemetryError(ErrorCode.invalid_request,
                                 f"Invalid request from the client [{instance_id}], invalid client instance id")
        client = self._client(image, instance_id, session, client_id)
        try:
            self._check_push(client, instance_id, request)
            if request.metrics:
                self._deliver(ClientTelemetryPush(
                    instance_id, client_id, session.client_software_name, session.client_software_version,
                    session.client_host, str(session.principal), session.listener_name,
                    self._decompress(request), request.terminating))
        except TelemetryError as exc:
            client.last_error = exc.code
            raise
        finally:
            client.terminating = request.terminating
        client.last_error = ErrorCode.none

    # Clients and their subscriptions ------------------------------------------------------------------------

    def _now_ms(self) -> float:
        return self._clock() * 1000

    def _client(self, image: MetadataImage, instance_id: uuid.UUID, session: Session,
                client_id: str | None) -> _Client:
        """The client's state, new (or its subscription chosen again) when it is unknown or the resources changed."""
        self._refresh(image)
        client = self._clients.get(instance_id)
        if client is None:
            selectors = {
                "client_instance_id": uuid_to_text(instance_id),
                "client_id": client_id,
                "client_software_name": session.client_software_name,
                "client_software_version": session.client_software_version,
                "client_source_address": session.client_host,
                "client_source_port": str(session.client_port) if session.client_port >= 0 else None,
            }
        elif client.version != self._version:
            selectors = client.selectors  # Kafka starts the instance afresh: its timestamps too
        else:
            self._clients.move_to_end(instance_id)
            return client
        client = _Client(selectors, self._subscription_for(instance_id, selectors), self._version)
        self._clients[instance_id] = client
        self._clients.move_to_end(instance_id)
        if len(self._clients) > MAX_CLIENTS:
            self._clients.popitem(last=False)
        return client

    def _refresh(self, image: MetadataImage) -> None:
        """Read the client-metrics resources again when the image's configs changed; a different set is a new version."""
        if image.configs is self._configs:
            return
        self._configs = image.configs
        resources = client_metrics.resources(image.configs)
        if resources != self._resources:
            self._resources = resources
            self._version += 1

    def _subscription_for(self, instance_id: uuid.UUID, selectors: Mapping[str, str | None]) -> TelemetrySubscription:
        """Kafka's createClientInstance: the union of the matching resources' metrics ("*" alone if one has it) at
        their shortest interval; the receivers' own subscription while there are no resources."""
        if not self._resources:
            metrics, interval = self.subscription.requested_metrics, self.subscription.push_interval_ms
        else:
            matching = [r for r in self._resources if r.matches(selectors)]
            wanted = {m for r in matching for m in r.metrics}
            metrics = (client_metrics.ALL_METRICS,) if client_metrics.ALL_METRICS in wanted else tuple(sorted(wanted))
            interval = min((r.interval_ms for r in matching), default=client_metrics.DEFAULT_INTERVAL_MS)
        return TelemetrySubscription(_subscription_id(metrics, interval, instance_id), metrics, interval)

    # Pushes -------------------------------------------------------------------------------------------------

    def _check_push(self, client: _Client, instance_id: uuid.UUID, request: PushTelemetryRequest) -> None:
        """Kafka's validatePushRequest, in its order."""
        who = uuid_to_text(instance_id)
        if client.terminating:
            raise TelemetryError(ErrorCode.invalid_request, f"Client [{who}] sent the previous request with state "
                                 f"terminating to TRUE, can not accept any requests after that")
        if not client.may_push(self._now_ms()) and not request.terminating:
            raise TelemetryError(ErrorCode.throttling_quota_exceeded,
                                 f"Request from the client [{who}] arrived before the next push interval time")
        if request.subscription_id != client.subscription.subscription_id:
            raise TelemetryError(ErrorCode.unknown_subscription_id,
                                 f"Unknown client subscription id for the client [{who}]")
        if request.compression_type not in (Compression.NONE, *ACCEPTED_COMPRESSION):
            raise TelemetryError(ErrorCode.unsupported_compression_type, f"Unknown compression type "
                                 f"[{request.compression_type}] is received in telemetry request from [{who}]")
        if len(request.metrics) > self.max_bytes:
            raise TelemetryError(ErrorCode.telemetry_too_large, f"Telemetry request from [{who}] is larger than the "
                                 f"maximum allowed size [{self.max_bytes}]")

    @staticmethod
    def _decompress(request: PushTelemetryRequest) -> bytes:
        try:
            return decompress(request.compression_type, bytes(request.metrics))
        except Exception as exc:  # a codec's own error type: the client sent something unreadable
            raise TelemetryError(ErrorCode.invalid_record, f"cannot decompress the metrics: {exc}") from None

    def _deliver(self, push: ClientTelemetryPush) -> None:
        """Every receiver gets the push, even when one fails; a failure is the client's INVALID_RECORD, as in Kafka."""
        failed = False
        for deliver in self._deliveries:
            try:
                deliver(push)
            except Exception:
                log.exception("client telemetry receiver %r failed on a push of client %s", deliver, push.client_instance_id)
                failed = True
        if failed:
            raise TelemetryError(ErrorCode.invalid_record, "a client telemetry receiver failed on the push")
