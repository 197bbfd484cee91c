"""From OTLP names to Prometheus ones: metric names, label names, label values.

Kafka's client metrics are named with dots (KIP-714:
``org.apache.kafka.producer.node.request.latency.avg``); Prometheus allows
ASCII letters, digits and underscores (and colons, kept for recording rules).
Every other character becomes ``_``, so the name above is exported as
``org_apache_kafka_producer_node_request_latency_avg``; a name that would
start with a digit gets a leading ``_``. Nothing else is changed: no unit is
appended and no prefix added, so a client metric keeps the name Kafka's
documentation gives it, dots read as underscores.

Label names follow OpenTelemetry's Prometheus compatibility rules: invalid
characters become ``_``, a name starting with a digit gets ``key_`` before
it, and one starting with ``__`` (reserved by Prometheus) gets ``key``.
"""

from __future__ import annotations

import json
import re

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(otlp_name: str) -> str:
    """``org.apache.kafka.producer.record.queue.time.avg`` -> ``org_apache_kafka_producer_record_queue_time_avg``."""
    name = _INVALID.sub("_", otlp_name)
    return f"_{name}" if not name or name[0].isdigit() else name


def label_name(key: str) -> str:
    """``node.id`` -> ``node_id``; ``0rack`` -> ``key_0rack``; ``__name__`` -> ``key__name__``."""
    name = _INVALID.sub("_", key)
    if not name or name[0].isdigit():
        return f"key_{name}"
    if name.startswith("__"):
        return f"key{name}"
    return name


def label_value(value: AnyValue) -> str:
    """An OTLP attribute value as a label value: strings as they are, other scalars as text, lists as JSON."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return json.dumps(_plain(value), separators=(",", ":"))


def _plain(value: AnyValue) -> object:
    """An array or key-value list as plain Python values, for JSON."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return label_value(value)
