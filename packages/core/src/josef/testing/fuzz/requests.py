"""Hypothesis strategies for Kafka requests, derived from kio's request schemas: valid ones and broken ones.

A request is written here field by field from its schema (kio's dataclass
for the API and version), straight to bytes, rather than built as a kio
object and serialised: that way a field can also be written in a way no kio
object allows (a null where the schema has no null, a length that claims
more than the frame holds, a bool of 2, tagged fields out of order). Values
lean to what finds bugs: integers at their bounds, empty and odd-length
strings and bytes, arrays of zero, one, a few or thousands of entries
(repeats of one drawn entry, so a huge array costs one draw), unknown tagged
fields, and names from a small pool (the fuzzer's topics, the internal ones,
real config names) so that requests reach real state, not only
UNKNOWN_TOPIC_OR_PARTITION.

Fields that make the broker wait (Fetch's ``max_wait``, admin ``timeout`` s,
JoinGroup's ``rebalance_timeout``) are drawn at most
:data:`MAX_WAIT_MS` (and :func:`capped_waits` cuts them so in captured
frames): a broker that waits as long as it was asked is right, and the
fuzzer bounds how long an answer may take.

:func:`request_frames` is the strategy of whole frames (size, header, body)
for the APIs and versions a broker advertises; each comes as a
:class:`Input` that says what the broker will read in its header.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from functools import cache
from typing import Any, Callable, Mapping

import attrs
from hypothesis import strategies as st
from kio.schema.index import api_key_map, schema_name_map
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

from josef.protocol.messages import encode_body, is_flexible, parse_body, parse_header, request_type
from josef.protocol.records import Compression, build_batch, build_marker

#: The longest a drawn request asks the broker to wait (ms).
MAX_WAIT_MS = 1500
#: Entries of the huge arrays drawn (one entry repeated); the last is over the broker's cap on array elements.
HUGE_COUNTS = (100, 1000, 10_000)
#: The largest request body drawn, in bytes (a huge array of big entries is cut to fit).
MAX_BODY = 256 << 10

#: Topics the fuzzer creates before it starts, so that drawn requests reach real partitions.
FUZZ_TOPICS = ("fuzz-a", "fuzz-b")
#: Names drawn for string fields, besides random text: real topics, groups, configs and the odd ones.
NAMES = (*FUZZ_TOPICS, "", "fuzz-group", "fuzz-txn", "__consumer_offsets", "__transaction_state",
         "__cluster_metadata", "missing-topic", "PLAINTEXT", "CONTROLLER", "User:ANONYMOUS", "User:*", "*",
         "cleanup.policy", "retention.ms", "max.message.bytes", "compression.type", "segment.bytes",
         "consumer", "range", "cooperative-sticky", "uniform", "PLAIN", "SCRAM-SHA-256", "GSSAPI", ".", "..",
         "a" * 249, "a" * 250, "fuzz/slash", "f" * 2000, "ünïcödé", "\x00")

_INT_BOUNDS = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "error_code": 15, "timedelta_i32": 31,
               "timedelta_i64": 63, "datetime_i64": 63}
_FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q", "error_code": ">h", "timedelta_i32": ">i",
          "timedelta_i64": ">q", "datetime_i64": ">q", "uint16": ">H", "float64": ">d"}
#: Fields whose value is how long the broker waits before answering.
WAITS = frozenset({"max_wait", "timeout", "rebalance_timeout", "timeout_ms", "max_wait_ms"})


@attrs.frozen
class Input:
    """One request frame as sent (size prefix included), and what the broker reads in its header."""

    data: bytes
    api_key: int
    api_version: int
    correlation_id: int
    #: "valid" (the schema's encoding of the version the header names) or "invalid" (broken somewhere).
    kind: str
    #: How it was broken, for the report ("" when valid).
    corruption: str = ""


# --------------------------------------------------------------------------- primitives


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(n: int | None, flexible: bool, legacy: str) -> bytes:
    """The length (or count) prefix of a string, bytes or array; None is null."""
    if flexible:
        return uvarint(0 if n is None else n + 1)
    return struct.pack(legacy, -1 if n is None else n)


@cache
def _ints(kafka_type: str, name: str) -> st.SearchStrategy[int]:
    if kafka_type == "uint16":
        low, high = 0, 65535
    else:
        bits = _INT_BOUNDS[kafka_type]
        low, high = -(2**bits), 2**bits - 1
    if name in WAITS:
        high = min(high, MAX_WAIT_MS)
    edges = sorted(v for v in {low, low + 1, -1, 0, 1, 2, high - 1, high} if low <= v <= high)
    small = st.integers(max(low, -1), min(high, 3))  # partition indexes, broker ids, versions: where state is
    return st.one_of(st.sampled_from(edges), small, st.integers(low, high))


_UUIDS = (uuid.UUID(int=0), uuid.UUID(int=1), uuid.UUID("ffffffff-ffff-ffff-ffff-ffffffffffff"))


@cache
def _record_sets() -> tuple[bytes, ...]:
    """Record data for produce-like fields: well-formed batches of several kinds, and broken ones."""
    one = build_batch([(b"k", b"v", 1_700_000_000_000)])
    broken_crc = one[:-1] + bytes([one[-1] ^ 0xFF])
    return (
        one,
        build_batch([(None, b"x" * 100, 1_700_000_000_000)] * 3, compression=Compression.GZIP),
        build_batch([(b"k", b"v", 1_700_000_000_000)], producer_id=1, producer_epoch=0, base_sequence=0),
        build_batch([(b"k", b"v", 1_700_000_000_000)], producer_id=2, producer_epoch=0, base_sequence=0,
                    attributes=0x10),
        build_marker(2, 0, 0, True, 1_700_000_000_000),
        broken_crc,
        one[:30],
        one + one,
        b"\x00" * 61,
    )


# --------------------------------------------------------------------------- the writer


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str | None
    entity: type | None
    is_array: bool
    optional: bool
    tag: int | None


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    found = []
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        entity = kind.type_ if isinstance(kind, (EntityField, EntityTupleField)) else None
        tag = field.metadata.get("tag")
        found.append(_Field(field.name, field.metadata.get("kafka_type"), entity,
                            isinstance(kind, (EntityTupleField, PrimitiveTupleField)), is_optional(field),
                            None if tag is None else int(tag)))
    return tuple(found)


class _Writer:
    """Writes one drawn request body; in ``corrupt`` mode breaks it at one drawn place (at the end if none)."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any], corrupt: bool) -> None:
        self.draw = draw
        self.corrupt = corrupt
        self.corruption = ""

    def _break_here(self) -> bool:
        return self.corrupt and not self.corruption and self.draw(st.integers(0, 15)) == 0

    def entity(self, cls: type, nested_budget: int = MAX_BODY) -> bytes:
        flexible = bool(getattr(cls, "__flexible__", False))
        out = []
        tagged = []
        for field in _fields(cls):
            if field.tag is not None:
                if self.draw(st.booleans()):
                    tagged.append((field.tag, self.value(field, flexible, tagged_value=True)))
                continue
            out.append(self.value(field, flexible))
        if flexible:
            out.append(self.tagged_fields(tagged, {f.tag for f in _fields(cls) if f.tag is not None}))
        return b"".join(out)

    def tagged_fields(self, drawn: list[tuple[int, bytes]], known: set[int]) -> bytes:
        """The tagged-field section: the ``drawn`` ones of the ``known`` tags, maybe unknown ones (which a
        reader must skip)."""
        fields = list(drawn)
        for _ in range(self.draw(st.integers(0, 2)) if self.draw(st.integers(0, 5)) == 0 else 0):
            tag = self.draw(st.integers(0, 2**31 - 1))
            if tag not in known and all(tag != t for t, _ in fields):
                fields.append((tag, self.draw(st.binary(max_size=20))))
        fields.sort(key=lambda item: item[0])
        count = len(fields)
        if self._break_here():
            how = self.draw(st.sampled_from(["count", "order", "duplicate", "size"]))
            self.corruption = f"tagged fields: {how}"
            if how == "count":
                count = self.draw(st.sampled_from([count + 1, 10_001, 2**31 - 1, 2**35 - 1]))
            elif how == "order" and len(fields) >= 2:
                fields.reverse()
            elif how == "duplicate" or how == "order":
                fields.append(fields[0] if fields else (0, b""))
                fields.append(fields[-1])
                count = len(fields)
            else:
                return uvarint(count + 1) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in fields) \
                    + uvarint(0) + uvarint(2**31 - 1)
        return uvarint(count) + b"".join(uvarint(t) + uvarint(len(v)) + v for t, v in fields)

    def value(self, field: _Field, flexible: bool, tagged_value: bool = False) -> bytes:
        nullable = field.optional and not tagged_value
        if field.is_array:
            return self.array(field, flexible, nullable)
        if field.entity is not None:
            if nullable:  # KIP-893's nullable struct: a marker byte
                if self._break_here():
                    self.corruption = f"{field.name}: struct marker"
                    return bytes([self.draw(st.sampled_from([0, 2, 0x7F, 0x80]))])
                if self.draw(st.integers(0, 3)) == 0:
                    return b"\xff"
                return b"\x01" + self.entity(field.entity)
            return self.entity(field.entity)
        return self.primitive(field, flexible, nullable)

    def array(self, field: _Field, flexible: bool, nullable: bool) -> bytes:
        if self._break_here():
            return self._broken_length(field, flexible, "array", nullable)
        if nullable and self.draw(st.integers(0, 5)) == 0:
            return _length(None, flexible, ">i")
        element = (lambda: self.entity(field.entity)) if field.entity is not None \
            else (lambda: self.primitive(field, flexible, False))
        if self.draw(st.integers(0, 150)) == 0:  # huge: one entry repeated
            count = self.draw(st.sampled_from(HUGE_COUNTS))
            one = element()
            if one:
                count = max(1, min(count, MAX_BODY // len(one)))
            return _length(count, flexible, ">i") + one * count
        count = self.draw(st.integers(0, 3))
        return _length(count, flexible, ">i") + b"".join(element() for _ in range(count))

    def _broken_length(self, field: _Field, flexible: bool, what: str, nullable: bool) -> bytes:
        """A length or count no reader may accept: null where none is allowed, negative, more than the frame."""
        choices = ["huge", "negative"] + ([] if nullable else ["null"])
        how = self.draw(st.sampled_from(choices))
        self.corruption = f"{field.name}: {how} {what} length"
        legacy = ">h" if what == "string" else ">i"
        if how == "null":
            return _length(None, flexible, legacy)
        if how == "negative":
            return uvarint(2**32 - 1) if flexible else struct.pack(legacy, self.draw(st.sampled_from([-2, -(2**15)])))
        return uvarint(2**31 - 1) + b"x" if flexible else struct.pack(legacy, 2**15 - 1 if legacy == ">h" else 2**31 - 1)

    def primitive(self, field: _Field, flexible: bool, nullable: bool) -> bytes:
        kafka_type = field.kafka_type or ""
        if kafka_type in _FIXED:
            if kafka_type == "float64":
                value = self.draw(st.floats(allow_nan=True, allow_infinity=True))
            elif kafka_type == "datetime_i64" and nullable and self.draw(st.integers(0, 3)) == 0:
                value = -1
            else:
                value = self.draw(_ints(kafka_type, field.name))
            return struct.pack(_FIXED[kafka_type], value)
        if kafka_type == "bool":
            if self._break_here():
                self.corruption = f"{field.name}: bool"
                return bytes([self.draw(st.sampled_from([2, 0x80, 0xFF]))])
            return b"\x01" if self.draw(st.booleans()) else b"\x00"
        if kafka_type == "uuid":
            return self.draw(st.one_of(st.sampled_from(_UUIDS), st.uuids())).bytes
        if kafka_type == "string":
            if self._break_here():
                if self.draw(st.booleans()):
                    self.corruption = f"{field.name}: invalid UTF-8"
                    raw = self.draw(st.sampled_from([b"\xff", b"\xc3\x28", b"a\xed\xa0\x80", b"\x80" * 5]))
                    return _length(len(raw), flexible, ">h") + raw
                return self._broken_length(field, flexible, "string", nullable)
            if nullable and self.draw(st.integers(0, 4)) == 0:
                return _length(None, flexible, ">h")
            text = self.draw(st.one_of(st.sampled_from(NAMES), st.text(max_size=30)))
            raw = text.encode("utf-8", "surrogatepass")[:32767]
            return _length(len(raw), flexible, ">h") + raw
        if kafka_type in ("bytes", "records"):
            if self._break_here():
                return self._broken_length(field, flexible, "bytes", nullable)
            if nullable and self.draw(st.integers(0, 4)) == 0:
                return _length(None, flexible, ">i")
            if kafka_type == "records" and self.draw(st.booleans()):
                raw = self.draw(st.sampled_from(_record_sets()))
            else:
                raw = self.draw(st.binary(max_size=64))
            return _length(len(raw), flexible, ">i") + raw
        raise NotImplementedError(f"kafka type {kafka_type!r} of field {field.name}")


# --------------------------------------------------------------------------- frames


def header(api_key: int, version: int, correlation_id: int, client_id: bytes | None, flexible: bool) -> bytes:
    """Request header v1 (v2 with an empty tagged-field section when ``flexible``)."""
    client = struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return struct.pack(">hhi", api_key, version, correlation_id) + client + (b"\x00" if flexible else b"")


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


_CLIENT_IDS = st.one_of(st.sampled_from([b"fuzz", b"", None, b"rdkafka", b"x" * 300]),
                        st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")))
_CORRELATIONS = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1))


@st.composite
def _request(draw: Callable[..., Any], versions: Mapping[int, tuple[int, int]], corrupt: bool) -> Input:
    api_key = draw(st.sampled_from(sorted(versions)))
    low, high = versions[api_key]
    version = draw(st.integers(low, high))
    correlation_id = draw(_CORRELATIONS)
    client_id = draw(_CLIENT_IDS)
    flexible = is_flexible(api_key, version)
    writer = _Writer(draw, corrupt)
    body = writer.entity(request_type(api_key, version))
    head = header(api_key, version, correlation_id, client_id, flexible)
    if corrupt and not writer.corruption:
        how = draw(st.sampled_from(["truncated", "trailing bytes", "header version", "unsupported version",
                                    "unknown api key", "client id length", "empty body"]))
        writer.corruption = how
        if how == "truncated":
            body = body[:draw(st.integers(0, max(0, len(body) - 1)))]
        elif how == "trailing bytes":
            body += draw(st.binary(min_size=1, max_size=16))
        elif how == "header version":  # the other header version than the request's: fields shift by one byte
            head = header(api_key, version, correlation_id, client_id, not flexible)
        elif how == "unsupported version":
            version = draw(st.sampled_from([high + 1, high + 100, -1, -(2**15), 2**15 - 1]
                                           + ([low - 1] if low > 0 else [])))
            head = header(api_key, version, correlation_id, client_id, flexible)
        elif how == "unknown api key":
            api_key = draw(st.sampled_from([-1, -(2**15), 2**15 - 1, 1000, max(api_key_map) + 1]
                                           + [k for k in api_key_map if k not in versions][:5]))
            head = header(api_key, version, correlation_id, client_id, flexible)
        elif how == "client id length":
            bad = draw(st.sampled_from([-2, -(2**15), 2**15 - 1]))
            head = struct.pack(">hhih", api_key, version, correlation_id, bad) + (b"\x00" if flexible else b"")
        else:
            body = b""
    return Input(frame(head + body), api_key, version, correlation_id, "invalid" if corrupt else "valid",
                 writer.corruption)


def request_frames(versions: Mapping[int, tuple[int, int]], invalid_share: int = 2) -> st.SearchStrategy[Input]:
    """Request frames for the APIs and version ranges in ``versions`` (api key -> (lowest, highest)): valid ones,
    and one broken one for every ``invalid_share`` valid ones."""
    known = {key: (low, high) for key, (low, high) in versions.items() if key in api_key_map
             and low <= high and max(schema_name_map[api_key_map[key]]) >= low}
    return st.one_of(*[_request(known, False)] * invalid_share, _request(known, True))


def declared_wait_ms(frame_data: bytes) -> int:
    """How long a request frame (size prefix included) asks the broker to wait at most, in ms: the largest of
    its waiting fields (0 when it has none or cannot be read)."""
    try:
        data = frame_data[4:]
        head = parse_header(data, is_flexible)
        request = parse_body(head.api_key, head.api_version, data, head.body_offset)
    except Exception:
        return 0
    waits = [getattr(request, name) for name in WAITS if hasattr(request, name)]
    return max((int(w.total_seconds() * 1000) if isinstance(w, datetime.timedelta) else int(w) for w in waits),
               default=0)


def capped_waits(frame_data: bytes) -> bytes:
    """A request frame (a captured client's) with its waiting fields cut to :data:`MAX_WAIT_MS` (librdkafka's
    JoinGroup asks for a 300 s rebalance, which a group whose other members left may take in full)."""
    if declared_wait_ms(frame_data) <= MAX_WAIT_MS:
        return frame_data
    data = frame_data[4:]
    head = parse_header(data, is_flexible)
    request = parse_body(head.api_key, head.api_version, data, head.body_offset)
    changes = {}
    for name in WAITS:
        value = getattr(request, name, None)
        if isinstance(value, datetime.timedelta) and value > datetime.timedelta(milliseconds=MAX_WAIT_MS):
            changes[name] = datetime.timedelta(milliseconds=MAX_WAIT_MS)
        elif isinstance(value, int) and value > MAX_WAIT_MS:
            changes[name] = type(value)(MAX_WAIT_MS)
    body = encode_body(dataclasses.replace(request, **changes))
    return frame(bytes(data[:head.body_offset]) + body)
