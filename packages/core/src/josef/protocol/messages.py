"""Kafka request/response framing on top of kio's generated message types.

kio parses and serialises message bodies; this module adds the header
versions, the per-API version table of what josef answers, and
:func:`build`, which turns plain dicts into the right kio dataclass of a given
version, dropping fields that version does not have. That keeps API handlers
written once for all versions instead of once per version.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from functools import cache, lru_cache
from typing import Any, Callable, Mapping

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field
from kio.static.primitive import TZAware

from josef.protocol.api_keys import ApiKey
from josef.protocol.bounds import BoundsError, Edit, apply_edits, check_bounds, skip_tagged_fields

#: The ``authorized_operations`` of a response to a request that did not ask for them (INT32_MIN).
OPERATIONS_OMITTED = -(2**31)

_HEADER_FIXED = struct.Struct(">hhih")
_INT32 = struct.Struct(">i")


class MalformedRequestError(ValueError):
    """A request frame could not be parsed: the connection is closed."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Where the body starts in the frame.
    body_offset: int


def parse_header(frame: bytes | memoryview, flexible: Callable[[int, int], bool]) -> RequestHeader:
    """Parse a request header (v1, or v2 with tagged fields when the API version is flexible)."""
    if len(frame) < _HEADER_FIXED.size:
        raise MalformedRequestError(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id, client_len = _HEADER_FIXED.unpack_from(frame, 0)
    pos = _HEADER_FIXED.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise MalformedRequestError("client id runs past the end of the request")
        client_id = bytes(frame[pos : pos + client_len]).decode("utf-8", "replace")
        pos += client_len
    if flexible(api_key, api_version):
        try:
            pos = skip_tagged_fields(frame, pos)
        except BoundsError as exc:
            raise MalformedRequestError(str(exc)) from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


@cache
def request_type(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def response_type(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def _reader(cls: type) -> Callable[..., Any]:
    return entity_reader(cls)  # type: ignore[arg-type]


@cache
def _writer(cls: type) -> Callable[..., Any]:
    return entity_writer(cls)  # type: ignore[arg-type]


@lru_cache(maxsize=4096)  # asked twice per request; bounded, since the pair comes from the wire
def is_flexible(api_key: int, version: int) -> bool:
    """Whether ``version`` of an API uses tagged fields (request header v2, response header v1).

    Asks only the schema of that version (clamped to the versions kio
    knows), never every version of the API: a process's first request of an
    API pays one schema import, not twenty.
    """
    if api_key not in api_key_map:
        return False
    versions = schema_name_map[api_key_map[api_key]]
    return _version_is_flexible(api_key, min(max(version, min(versions)), max(versions)))


@cache
def _version_is_flexible(api_key: int, version: int) -> bool:
    return bool(request_type(api_key, version).__flexible__)


def parse_body(api_key: int, version: int, frame: bytes | memoryview, offset: int) -> Any:
    """The request body, after :mod:`josef.protocol.bounds` checked it claims nothing it may not."""
    cls = request_type(api_key, version)
    edits: list[Edit] = []
    try:
        check_bounds(cls, frame, offset, edits)
    except BoundsError as exc:
        raise MalformedRequestError(f"api {api_key} v{version} request refused before parsing: {exc}") from None
    if edits:  # tagged fields kio does not know, durations a timedelta cannot hold: what Kafka reads, kio refuses
        frame = apply_edits(frame, edits)
    try:
        body, _ = _reader(cls)(frame, offset)
    except Exception as exc:  # kio raises a variety of errors on bad input
        raise MalformedRequestError(f"cannot parse api {api_key} v{version} body: {exc}") from exc
    return body


@lru_cache(maxsize=4096)
def has_flexible_response_header(api_key: int, version: int) -> bool:
    """Whether a response carries header v1 (tagged fields): flexible versions, except ApiVersions'.

    ApiVersions answers with header v0 at every version, so a client that
    does not know the broker's versions yet can always read the answer.
    """
    return api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version)


def _frame(header: bytes, entity: Any) -> bytes:
    """Size prefix, ``header`` and the serialised ``entity``: one buffer, its size patched in place."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(header)
    _writer(type(entity))(buf, entity)
    data = buf.getbuffer()
    _INT32.pack_into(data, 0, len(data) - 4)
    del data
    return buf.getvalue()


def encode_body(entity: Any) -> bytes:
    """A request or response body alone, as kio writes it."""
    buf = io.BytesIO()
    _writer(type(entity))(buf, entity)
    return buf.getvalue()


def encode_request(api_key: int, version: int, correlation_id: int, client_id: bytes, body: Mapping[str, Any]) -> bytes:
    """The full request frame: size, header (v1, or v2 with empty tagged fields), body built from a dict."""
    header = _HEADER_FIXED.pack(api_key, version, correlation_id, len(client_id)) + client_id
    if is_flexible(api_key, version):
        header += b"\x00"
    return _frame(header, build(request_type(api_key, version), body))


def decode_response(api_key: int, version: int, frame: bytes | memoryview, whole: bool = False) -> tuple[int, Any]:
    """``(correlation id, response)`` of a response frame (without its size prefix); with ``whole``, a frame
    with bytes after the response is refused (ValueError)."""
    offset = 5 if has_flexible_response_header(api_key, version) else 4
    cls = response_type(api_key, version)
    tolerant = _unset_timestamps_allowed(cls)
    response, size = _reader(tolerant)(frame, offset)
    if whole and offset + size != len(frame):
        raise ValueError(f"{len(frame) - offset - size} bytes after the api {api_key} v{version} response")
    return _INT32.unpack_from(frame, 0)[0], response if tolerant is cls else _as_kio(cls, response)


@cache
def _unset_timestamps_allowed(cls: type) -> type:
    """``cls``, or a copy of it that reads -1 in a required timestamp as None.

    Kafka writes -1 for "no time" in some required timestamps
    (DescribeTransactions' TransactionStartTimeMs of a transactional id with
    no open transaction), which kio refuses to read as a negative timestamp.
    """
    fields = []
    changed = False
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        annotation = field.type
        if isinstance(kind, (EntityField, EntityTupleField)):
            nested = _unset_timestamps_allowed(kind.type_)
            if nested is not kind.type_:
                annotation = tuple[nested, ...] if isinstance(kind, EntityTupleField) else nested  # type: ignore[valid-type]
                changed = True
        elif field.metadata.get("kafka_type") == "datetime_i64" and field.type is TZAware:
            annotation = TZAware | None
            changed = True
        default: Any = {"default": field.default} if field.default is not dataclasses.MISSING else (
            {"default_factory": field.default_factory} if field.default_factory is not dataclasses.MISSING else {})
        fields.append((field.name, annotation, dataclasses.field(metadata=field.metadata, **default)))
    if not changed:
        return cls
    namespace = {name: vars(cls)[name] for name in ("__type__", "__version__", "__flexible__", "__api_key__",
                                                     "__header_schema__") if name in vars(cls)}
    return dataclasses.make_dataclass(cls.__name__, fields, namespace=namespace, frozen=True, slots=True)


def _as_kio(cls: type, value: Any) -> Any:
    """A value read as :func:`_unset_timestamps_allowed` ``(cls)`` as an instance of kio's ``cls`` (None timestamps kept)."""
    values = {}
    for field in dataclasses.fields(cls):
        item = getattr(value, field.name)
        kind = classify_field(field)
        if isinstance(kind, EntityTupleField):
            item = tuple(_as_kio(kind.type_, entry) for entry in item)
        elif isinstance(kind, EntityField) and item is not None:
            item = _as_kio(kind.type_, item)
        values[field.name] = item
    return cls(**values)


def encode_response(api_key: int, version: int, correlation_id: int, response: Any) -> bytes:
    """The full response frame: size, header (v0, or v1 with empty tagged fields where the version has them), body."""
    flexible_header = has_flexible_response_header(api_key, version)
    return _frame(_INT32.pack(correlation_id) + (b"\x00" if flexible_header else b""), response)


# ------------------------------------------------------------------ building


def _convert_primitive(kafka_type: str) -> Callable[[Any], Any] | None:
    if kafka_type == "error_code":
        return lambda v: v if isinstance(v, ErrorCode) else ErrorCode(v)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return lambda v: v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=v)
    if kafka_type == "datetime_i64":
        return lambda v: v if v is None or isinstance(v, datetime.datetime) else datetime.datetime.fromtimestamp(v / 1000, datetime.UTC)
    if kafka_type == "uuid":
        return lambda v: v if v is None or isinstance(v, uuid.UUID) else uuid_from_kafka(v)
    return None


def uuid_from_kafka(text: str) -> uuid.UUID:
    from josef.metadata.records import uuid_from_text

    return uuid_from_text(text)


@cache
def _plan(cls: type) -> tuple[tuple[str, Any, bool, Callable[[Any], Any] | None, bool], ...]:
    plan = []
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if isinstance(kind, (EntityField, EntityTupleField)):
            plan.append((field.name, kind.type_, kind.is_array, None, has_default))
        else:
            convert = _convert_primitive(field.metadata.get("kafka_type", ""))
            if convert is not None and isinstance(kind, PrimitiveTupleField):
                convert = _each(convert)
            plan.append((field.name, None, False, convert, has_default))
    return tuple(plan)


def _each(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert`` for every element of an array field (a null array stays null)."""
    return lambda values: None if values is None else tuple(convert(v) for v in values)


def build(cls: type, data: Any) -> Any:
    """An instance of kio dataclass ``cls`` from a dict, recursively; keys ``cls`` lacks are ignored.

    Nested entities are given as dicts (or lists of dicts). Error codes,
    millisecond durations and Kafka base64 UUIDs are converted. A field with
    no value and no default is an error (a bug in the handler). An instance
    of ``cls`` is taken as it is, so a request or response received at one
    version can be sent on at that version (forwarding to the controller).
    """
    if isinstance(data, cls):
        return data
    kwargs = {}
    for name, nested, is_array, convert, has_default in _plan(cls):
        if name not in data:
            if not has_default:
                raise TypeError(f"{cls.__module__}.{cls.__name__} needs field {name!r}")
            continue
        value = data[name]
        if nested is not None and value is not None:
            value = tuple(build(nested, v) for v in value) if is_array else build(nested, value)
        elif convert is not None:
            value = convert(value)
        kwargs[name] = value
    return cls(**kwargs)


def has_field(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))
