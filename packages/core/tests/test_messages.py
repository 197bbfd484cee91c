
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from josef.protocol.messages import (
    build,
    encode_response,
    is_flexible,
    parse_header,
    response_type,
)


def test_build_drops_fields_the_version_lacks_and_converts():
    body = {"error_code": 0, "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 9}], "throttle_time": 7}
    v0 = build(response_type(18, 0), body)
    v3 = build(response_type(18, 3), body)
    assert not hasattr(v0, "throttle_time")
    assert v3.throttle_time.total_seconds() == 0.007 and v3.error_code is ErrorCode.none
    assert v3.api_keys[0].max_version == 9


def test_request_header_v1_and_v2():
    # Metadata v12 is flexible: header v2 carries a tagged-field count after the client id.
    frame = b"\x00\x03\x00\x0c\x00\x00\x00\x2a\x00\x03abc\x00" + b"rest"
    header = parse_header(frame, is_flexible)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (3, 12, 42, "abc")
    assert frame[header.body_offset:] == b"rest"
    frame = b"\x00\x03\x00\x01\x00\x00\x00\x2a\xff\xffbody"
    header = parse_header(frame, is_flexible)
    assert header.client_id is None and frame[header.body_offset:] == b"body"


def test_flexible_versions_from_kio():
    assert [is_flexible(0, v) for v in (3, 8, 9, 13)] == [False, False, True, True]
    assert [is_flexible(18, v) for v in (0, 2, 3, 4)] == [False, False, True, True]
    assert is_flexible(18, 99)  # KIP-511: unknown newer ApiVersions is parsed as flexible


def test_encode_response_header_versions():
    # ApiVersions answers with header v0 even at a flexible version: no tagged-fields byte after the id.
    response = build(response_type(18, 3), {"error_code": 0, "api_keys": [], "throttle_time": 0})
    frame = encode_response(18, 3, 5, response)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert frame[4:8] == b"\x00\x00\x00\x05"
    parsed, _ = entity_reader(type(response))(frame, 8)
    assert parsed == response
    # Any other flexible version has header v1: an empty tagged-fields byte before the body.
    delete = build(response_type(42, 2), {"throttle_time": 0, "results": []})
    assert encode_response(42, 2, 5, delete)[8:9] == b"\x00"
    assert entity_reader(type(delete))(encode_response(42, 2, 5, delete), 9)[0] == delete
