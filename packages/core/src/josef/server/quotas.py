"""Client quotas, enforced: Kafka's ClientQuotaManager, ClientRequestQuotaManager and ControllerMutationQuotaManager.

The quotas themselves are in the metadata image (``kafka-configs
--entity-type users|clients``, AlterClientQuotas); this stage of the request
pipeline measures what each client uses and slows it down:

- ``producer_byte_rate``: the bytes of Produce requests;
- ``consumer_byte_rate``: the bytes of Fetch responses to consumers (never
  followers);
- ``request_percentage``: the time handlers spend on a client's requests,
  as a percentage of one thread (the APIs brokers send each other are exempt);
- ``controller_mutation_rate``: partitions created or deleted per second by
  CreateTopics, CreatePartitions and DeleteTopics, on the controller. Over
  the quota, the versions that know the error (CreateTopics v6+,
  CreatePartitions v3+, DeleteTopics v5+) are refused with
  THROTTLING_QUOTA_EXCEEDED, as Kafka's strict mode does; older ones pass
  and are throttled.

Each quota applies to the most specific entity that has it, in Kafka's order
(user and client-id, user and default client-id, user, default user and
client-id, default user and default client-id, default user, client-id,
default client-id), and is measured per sensor as Kafka keys them: one per
(user, client-id) for the first two kinds of match, per user for the user
ones, per client-id for the client-id ones.

A response over a quota reports ``throttle_time_ms`` (the time that brings
the client's rate back to its quota over the measuring window, Kafka's
``QuotaUtils.throttleTime``; at most one window for request time), and the
connection reads nothing more from the client for that long (KIP-219), so a
client that ignores the field is held back all the same. Deviation: a
throttled Fetch still carries its records, where Kafka answers it empty.

Without any quota in the image the stage does nothing but one dictionary
check per request.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kio.schema.errors import ErrorCode
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from josef.config import Config
from josef.metadata.client_quotas import CLIENT_ID, USER
from josef.metadata.records import QuotaEntity
from josef.protocol.api_keys import ApiKey
from josef.protocol.error_responses import error_response
from josef.protocol.messages import build, response_type
from josef.replication.replication_quota import Rate
from josef.server.authorization import CLUSTER_ACTIONS, then
from josef.server.dispatch import Encoded, Handler, RequestContext

PRODUCE, FETCH, REQUEST, MUTATION = ("producer_byte_rate", "consumer_byte_rate", "request_percentage",
                                     "controller_mutation_rate")
#: Requests no quota applies to: those brokers send each other, and what a client needs before it can be throttled.
EXEMPT = CLUSTER_ACTIONS | {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
#: The requests that mutate partitions, and the first version that knows THROTTLING_QUOTA_EXCEEDED.
MUTATIONS = {ApiKey.CREATE_TOPICS: 6, ApiKey.CREATE_PARTITIONS: 3, ApiKey.DELETE_TOPICS: 5}

Sensor = tuple[str, str, str]


def quota_for(quotas: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str,
              client_id: str) -> tuple[Sensor, float] | None:
    """The quota ``key`` of a client and the sensor it is measured on, in Kafka's order of entity matches."""
    candidates = (
        (((CLIENT_ID, client_id), (USER, user)), (user, client_id)),
        (((CLIENT_ID, None), (USER, user)), (user, client_id)),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), (user, client_id)),
        (((CLIENT_ID, None), (USER, None)), (user, client_id)),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    )
    for entity, (sensor_user, sensor_client) in candidates:
        values = quotas.get(entity)  # type: ignore[call-overload]
        if values is not None and key in values:
            return (key, sensor_user, sensor_client), values[key]
    return None


class Quotas:
    """The quota stage of one dispatcher: byte and request-time quotas on client listeners, mutations on controllers."""

    def __init__(self, config: Config, *, controller: bool) -> None:
        self.controller = controller
        self._samples, self._window_s = config["quota.window.num"], float(config["quota.window.size.seconds"])
        self._mutation_samples = config["controller.quota.window.num"]
        self._mutation_window_s = float(config["controller.quota.window.size.seconds"])
        self._rates: dict[Sensor, Rate] = {}
        #: The last throttle each sensor earned, in ms, and how many responses it throttled (for /metrics).
        self.throttles: dict[Sensor, tuple[int, int]] = {}

    def _rate(self, sensor: Sensor) -> Rate:
        rate = self._rates.get(sensor)
        if rate is None:
            samples, window = ((self._mutation_samples, self._mutation_window_s) if sensor[0] == MUTATION
                               else (self._samples, self._window_s))
            rate = self._rates[sensor] = Rate(samples, window, full_windows=samples - 1)
        return rate

    def record(self, ctx: RequestContext, key: str, value: float, now: float, *, bounded: bool = False) -> int:
        """Count ``value`` against the client's quota ``key``; the throttle time in ms it earned (0 within quota)."""
        found = quota_for(ctx.broker.image.client_quotas, key, ctx.principal.name, ctx.client_id or "")
        if found is None:
            return 0
        sensor, bound = found
        rate = self._rate(sensor)
        rate.record(value, now)
        return self._throttled_by(sensor, self._throttle(rate, bound, now, bounded))

    def _throttled_by(self, sensor: Sensor, throttle_ms: int) -> int:
        if throttle_ms > 0:
            self.throttles[sensor] = (throttle_ms, self.throttles.get(sensor, (0, 0))[1] + 1)
        return throttle_ms

    def _throttle(self, rate: Rate, bound: float, now: float, bounded: bool) -> int:
        observed = rate.measure(now)
        if observed <= bound:
            return 0
        throttle_ms = round((observed - bound) / bound * rate.span(now) * 1000) if bound > 0 else 1 << 30
        return min(throttle_ms, int(self._window_s * 1000)) if bounded else throttle_ms

    def measured(self, now: float) -> Iterator[tuple[Sensor, float, int, int]]:
        """Each sensor's rate now, its last throttle (ms) and how many responses it throttled: for /metrics."""
        for sensor, rate in list(self._rates.items()):
            last, count = self.throttles.get(sensor, (0, 0))
            yield sensor, rate.measure(now), last, count

    async def __call__(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        if not ctx.broker.image.client_quotas or ctx.api_key in EXEMPT:
            return await handler(ctx, request)
        if self.controller:
            if ctx.api_key in MUTATIONS:
                return await self._mutation(ctx, request, handler)
            return await handler(ctx, request)
        started = time.perf_counter()
        answer = await handler(ctx, request)
        now = time.monotonic()
        # Kafka's nanosToPercentage: the share of one thread the request took, in percent, as a rate per second.
        throttle = self.record(ctx, REQUEST, (time.perf_counter() - started) * 100, now, bounded=True)
        if ctx.api_key == ApiKey.PRODUCE:
            throttle = max(throttle, self.record(ctx, PRODUCE, ctx.size, now))
        elif ctx.api_key == ApiKey.FETCH and request.replica_id < 0:
            return then(answer, lambda body: self._fetched(ctx, body, throttle, now))
        return self._throttled(ctx, answer, throttle)

    def _fetched(self, ctx: RequestContext, body: Any, throttle: int, now: float) -> Any:
        size = sum(len(chunk) for chunk in body.chunks) if isinstance(body, Encoded) else 0
        throttle = max(throttle, self.record(ctx, FETCH, size, now))
        return _with_throttle(ctx, body, throttle)

    def _throttled(self, ctx: RequestContext, answer: Any, throttle: int) -> Any:
        if throttle <= 0:
            return answer
        return then(answer, lambda body: _with_throttle(ctx, body, throttle))

    async def _mutation(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        found = quota_for(ctx.broker.image.client_quotas, MUTATION, ctx.principal.name, ctx.client_id or "")
        if found is None:
            return await handler(ctx, request)
        sensor, bound = found
        rate, now = self._rate(sensor), time.monotonic()
        throttle = self._throttled_by(sensor, self._throttle(rate, bound, now, bounded=False))
        if throttle > 0 and ctx.api_version >= MUTATIONS[ctx.api_key]:
            refused = error_response(ctx.api_key, ctx.api_version, request, ErrorCode.throttling_quota_exceeded,
                                     "The throttling quota has been exceeded.")
            return _with_throttle(ctx, refused, throttle)
        rate.record(_partitions_mutated(ctx, request), now)
        return self._throttled(ctx, await handler(ctx, request),
                               self._throttled_by(sensor, self._throttle(rate, bound, now, bounded=False)))


def _partitions_mutated(ctx: RequestContext, request: Any) -> int:
    """What Kafka counts against ``controller_mutation_rate``: the partitions a request creates or deletes."""
    image = ctx.broker.image
    if ctx.api_key == ApiKey.CREATE_TOPICS:
        default = ctx.broker.config["num.partitions"]
        return sum(len(t.assignments) if t.assignments else (default if t.num_partitions == -1 else t.num_partitions)
                   for t in request.topics)
    if ctx.api_key == ApiKey.CREATE_PARTITIONS:
        return sum(max(t.count - len(image.topics[t.name].partitions), 0) if t.name in image.topics else 0
                   for t in request.topics)
    names = [t.name for t in request.topics] if ctx.api_version >= 6 else list(request.topic_names)
    return sum(len(image.topics[n].partitions) for n in names if n and n in image.topics)


def _with_throttle(ctx: RequestContext, body: Any, throttle_ms: int) -> Any:
    """The (finished) response with its throttle time set, and the connection muted for as long (KIP-219)."""
    ctx.session.throttled_until = max(ctx.session.throttled_until, time.monotonic() + throttle_ms / 1000)
    if isinstance(body, Encoded):
        return body.throttled(throttle_ms)
    if body is None:
        return None
    if isinstance(body, dict):
        body = build(response_type(ctx.api_key, ctx.api_version), body)
    if any(f.name == "throttle_time" for f in dataclasses.fields(body)):
        body = dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=throttle_ms))
    return body


#: Kafka's quota sensors' JMX type and rate attribute (``kafka.server:type=Produce,user=...,client-id=...``
#: ``byte-rate``), by quota.
_SENSOR_METRICS = {PRODUCE: ("produce", "byte_rate"), FETCH: ("fetch", "byte_rate"),
                   REQUEST: ("request", "request_time"), MUTATION: ("controllermutation", "mutation_rate")}


class QuotaMetrics:
    """The client-quota sensors of a node's dispatchers, as Kafka's JMX names them once exported: the measured rate
    (``kafka_server_produce_byte_rate{user,client_id}``...), the last throttle given (``..._throttle_time``, ms) and
    the responses throttled (``..._throttled_responses_total``). Only clients some quota applies to have sensors."""

    def __init__(self, stages: Iterable[Quotas]) -> None:
        self._stages = list(stages)

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        families: dict[str, Metric] = {}
        for kind, attribute in _SENSOR_METRICS.values():
            labels = ["user", "client_id"]
            families[f"{kind}_{attribute}"] = GaugeMetricFamily(
                f"kafka_server_{kind}_{attribute}", f"The {kind} quota's measured {attribute.replace('_', ' ')}, "
                f"over the quota window.", labels=labels)
            families[f"{kind}_throttle_time"] = GaugeMetricFamily(
                f"kafka_server_{kind}_throttle_time", f"The last {kind} quota throttle given, in ms.", labels=labels)
            families[f"{kind}_throttled"] = CounterMetricFamily(
                f"kafka_server_{kind}_throttled_responses", f"Responses throttled by the {kind} quota.",
                labels=labels)
        for stage in self._stages:
            for (key, user, client_id), rate, last, count in stage.measured(now):
                kind, attribute = _SENSOR_METRICS[key]
                labels = [user, client_id]
                families[f"{kind}_{attribute}"].add_metric(labels, rate)
                families[f"{kind}_throttle_time"].add_metric(labels, last)
                families[f"{kind}_throttled"].add_metric(labels, count)
        return iter(families.values())
