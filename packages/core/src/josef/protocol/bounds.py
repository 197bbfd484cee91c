"""Bounds checked on a request before kio parses it, as Kafka 4.4 bounds its parsers.

kio's native reader allocates an array's storage from the count on the
wire before it reads an element, so a frame of a few bytes that claims two
billion elements makes it allocate gigabytes, and a failed allocation aborts
the whole broker process. This walk reads only lengths and counts, following
the request's schema, and refuses a frame that claims more array elements
than :data:`MAX_ARRAY_ELEMENTS` (or than it has bytes left), more tagged
fields than :data:`MAX_TAGGED_FIELDS`, a null array where the schema has
none (as Kafka's readers refuse it; kio reads it as None), or runs past
its end, before anything is allocated for it. It costs one pass over the
structure of a request, not over its record data, which is skipped by
length.

The same walk finds what kio would refuse although Kafka reads it: tagged
fields the schema does not know (a newer client's; Kafka's readers keep
them aside and go on, kio's raise) and millisecond durations past what a
``timedelta`` of kio's holds (a max lifetime of 2**63-1 ms). They are
collected as edits (:func:`check_bounds`); :func:`apply_edits` makes the
copy kio parses, without the unknown fields and with the durations clamped
to the longest (290,000 years). Requests that need none are not copied.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache

from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

MAX_ARRAY_ELEMENTS = 1_000_000
MAX_TAGGED_FIELDS = 10_000

#: The longest durations (ms) kio reads into a ``timedelta`` (it counts microseconds in an int64).
_TIMEDELTA_MS = (-(2**63 // 1000), 2**63 // 1000)
#: A change to a request before kio parses it: replace ``buf[start:end]`` by ``data``.
Edit = tuple[int, int, bytes]

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "timedelta_i32": 4, "int64": 8,
          "timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16, "error_code": 2}
_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class BoundsError(ValueError):
    """The request claims more than it may, or more than it holds."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    kafka_type: str | None
    entity: type | None
    is_array: bool
    optional: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    flexible: bool
    fields: tuple[_Field, ...]
    tagged: dict[int, _Field]


@cache
def _plan(cls: type) -> _Plan:
    fields, tagged = [], {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        entity = kind.type_ if isinstance(kind, (EntityField, EntityTupleField)) else None
        is_array = isinstance(kind, (EntityTupleField, PrimitiveTupleField))
        planned = _Field(field.name, field.metadata.get("kafka_type"), entity, is_array, is_optional(field))
        if "tag" in field.metadata:
            tagged[int(field.metadata["tag"])] = planned
        else:
            fields.append(planned)
    return _Plan(bool(getattr(cls, "__flexible__", False)), tuple(fields), tagged)


class _Walk:
    __slots__ = ("buf", "pos", "end", "where", "edits")

    def __init__(self, buf: bytes | memoryview, pos: int, end: int, edits: list[Edit] | None = None) -> None:
        self.buf, self.pos, self.end = buf, pos, end
        self.where = ""
        #: Where kio needs the request changed (None: a header's tagged fields, which josef reads itself).
        self.edits = edits

    def take(self, size: int) -> int:
        start = self.pos
        if size < 0 or start + size > self.end:
            raise BoundsError(f"{self.where}: {size} bytes claimed, {self.end - start} left")
        self.pos = start + size
        return start

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.buf[self.take(1)]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 28:
                raise BoundsError(f"{self.where}: varint longer than 5 bytes")

    def length(self, flexible: bool, wide: bool) -> int:
        """A length or count: compact (uvarint N+1, 0 for null) when flexible, else int16/int32 (-1 for null)."""
        if flexible:
            return self.uvarint() - 1
        if wide:
            return _I32.unpack_from(self.buf, self.take(4))[0]
        return _I16.unpack_from(self.buf, self.take(2))[0]

    def count(self, flexible: bool) -> int:
        n = self.length(flexible, wide=True)
        if n > MAX_ARRAY_ELEMENTS:
            raise BoundsError(f"{self.where}: an array of {n} elements is over the limit of {MAX_ARRAY_ELEMENTS:,}")
        if n > self.end - self.pos:
            raise BoundsError(f"{self.where}: an array of {n} elements in {self.end - self.pos} bytes")
        return n

    def entity(self, cls: type) -> None:
        plan = _plan(cls)
        for field in plan.fields:
            self.where = f"{cls.__qualname__}.{field.name}"
            self.field(field, plan.flexible)
        if plan.flexible:
            self.tagged(plan.tagged, f"{cls.__qualname__} tagged fields")

    def field(self, field: _Field, flexible: bool) -> None:
        if field.is_array:
            n = self.count(flexible)
            if n < 0 and not field.optional:  # kio would read it as None, which no handler expects
                raise BoundsError(f"{self.where}: null, where the schema allows no null")
            if field.entity is not None:
                for _ in range(max(n, 0)):
                    self.entity(field.entity)
            elif field.kafka_type in _FIXED:
                self.take(max(n, 0) * _FIXED[field.kafka_type])
            else:
                for _ in range(max(n, 0)):
                    self.scalar(field.kafka_type, flexible)
        elif field.entity is not None:
            if field.optional and self.buf[self.take(1)] == 0xFF:  # a nullable struct: int8 -1 is null
                return
            self.entity(field.entity)
        else:
            self.scalar(field.kafka_type, flexible)

    def scalar(self, kafka_type: str | None, flexible: bool) -> None:
        if kafka_type == "timedelta_i64":
            at = self.take(8)
            (value,) = _I64.unpack_from(self.buf, at)
            low, high = _TIMEDELTA_MS
            if not low <= value <= high and self.edits is not None:
                self.edits.append((at, at + 8, _I64.pack(min(max(value, low), high))))
        elif kafka_type in _FIXED:
            self.take(_FIXED[kafka_type])
        elif kafka_type == "string":
            self.take(max(self.length(flexible, wide=False), 0))
        elif kafka_type in ("bytes", "records"):
            self.take(max(self.length(flexible, wide=True), 0))
        else:
            raise BoundsError(f"{self.where}: unknown field type {kafka_type!r}")

    def tagged(self, known: dict[int, _Field], where: str) -> None:
        """A tagged-field section: fields kio will parse (``known``) are walked, the others skipped by size
        (and edited out, since kio refuses tags it does not know)."""
        self.where = where
        count_at = self.pos
        n = self.uvarint()
        if n > MAX_TAGGED_FIELDS:
            raise BoundsError(f"{self.where}: {n} tagged fields is over the limit of {MAX_TAGGED_FIELDS:,}")
        edits = self.edits
        unknown = 0
        for _ in range(n):
            tag_at = self.pos
            tag = self.uvarint()
            size_at = self.pos
            size = self.uvarint()
            start = self.take(size)
            field = known.get(tag)
            if field is not None:  # a tagged field kio will parse: its contents are bounded too
                inner = _Walk(self.buf, start, start + size, edits)
                inner.where = f"{where}: {field.name}"
                inner.field(field, True)
                if edits:  # edits inside its value change its size
                    grown = sum(len(data) - (end - begin) for begin, end, data in edits if start <= begin < start + size)
                    if grown:
                        edits.append((size_at, start, _uvarint(size + grown)))
            elif edits is not None:
                edits.append((tag_at, self.pos, b""))
                unknown += 1
        if unknown:
            edits.append((count_at, count_at + len(_uvarint(n)), _uvarint(n - unknown)))


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def skip_tagged_fields(buf: bytes | memoryview, offset: int, where: str = "request header") -> int:
    """Where a tagged-field section at ``buf[offset:]`` that holds no field josef reads ends (a request header's)."""
    walk = _Walk(buf, offset, len(buf))
    walk.tagged({}, where)
    return walk.pos


def check_bounds(cls: type, buf: bytes | memoryview, offset: int, edits: list[Edit] | None = None) -> int:
    """Where the body of type ``cls`` at ``buf[offset:]`` ends; :class:`BoundsError` if it claims more than it may.

    What kio needs changed to parse it (usually nothing) is added to ``edits``.
    """
    walk = _Walk(buf, offset, len(buf), [] if edits is None else edits)
    walk.entity(cls)
    return walk.pos


def apply_edits(buf: bytes | memoryview, edits: list[Edit]) -> bytes:
    """``buf`` with ``edits`` made (they never overlap)."""
    out = []
    pos = 0
    for start, end, data in sorted(edits):
        out.append(buf[pos:start])
        out.append(data)
        pos = end
    out.append(buf[pos:])
    return b"".join(out)
