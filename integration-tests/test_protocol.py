"""Bad input on the wire closes that connection or gets an error, never the broker."""

import socket
import struct

from kio.schema.api_versions.v0.response import ApiVersionsResponse as V0
from kio.schema.api_versions.v3.response import ApiVersionsResponse as V3
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader


def connect(broker):
    return socket.create_connection(("127.0.0.1", broker.port), timeout=10)


def frame(api_key, version, correlation, body=b"", flexible=False):
    header = struct.pack(">hhih", api_key, version, correlation, 4) + b"test" + (b"\x00" if flexible else b"")
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def read_frame(sock):
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            return None
        data += chunk
    (size,) = struct.unpack(">i", data)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return body


def api_versions_ok(broker):
    with connect(broker) as sock:
        # ApiVersions v3: compact client software name and version, then tagged fields.
        sock.sendall(frame(18, 3, 7, b"\x06josef\x040.1\x00", flexible=True))
        body = read_frame(sock)
    assert body is not None and struct.unpack(">i", body[:4])[0] == 7
    response, _ = entity_reader(V3)(body, 4)
    assert response.error_code == ErrorCode.none
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def test_api_versions_lists_exactly_what_is_implemented(broker):
    versions = api_versions_ok(broker)
    assert versions[18] == (0, 4)
    assert versions[0][1] >= 9 and versions[1][1] >= 12 and versions[3][1] >= 12
    # FindCoordinator is answered once a coordinator is installed (the workspace installs the group one).
    assert versions[10] == (0, 6) and versions[11] == (0, 9) and versions[8] == (2, 10) and versions[15] == (0, 6)
    assert versions[75] == (0, 0) and versions[48] == (0, 1)
    # Client telemetry (KIP-714): the workspace installs a receiver (josef-client-telemetry); ListConfigResources.
    assert versions[71] == (0, 0) and versions[72] == (0, 0) and versions[74] == (0, 1)


def test_unknown_api_versions_version_gets_v0_answer(broker):
    with connect(broker) as sock:
        sock.sendall(frame(18, 99, 3, b"\x06josef\x040.1\x00", flexible=True))
        body = read_frame(sock)
    response, _ = entity_reader(V0)(body, 4)
    assert response.error_code == ErrorCode.unsupported_version
    assert any(k.api_key == 18 and k.max_version == 4 for k in response.api_keys)


def assert_closed(sock):
    sock.settimeout(10)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def test_garbage_unknown_keys_and_versions_close_the_connection(broker):
    cases = [
        struct.pack(">i", 3) + b"abc",  # shorter than a header
        frame(9999, 0, 1),  # unknown API key
        frame(0, 99, 1),  # unknown Produce version
        frame(3, 12, 1, b"\xff\xff\xff", flexible=True),  # garbage Metadata body
        struct.pack(">i", -5),  # negative size
        struct.pack(">i", 500 * 1024 * 1024),  # larger than socket.request.max.bytes
    ]
    for data in cases:
        with connect(broker) as sock:
            sock.sendall(data)
            assert_closed(sock)
    assert api_versions_ok(broker)


def test_abrupt_disconnects(broker):
    for _ in range(20):
        sock = connect(broker)
        sock.sendall(frame(3, 12, 1)[:9])  # half a request
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # RST
    assert api_versions_ok(broker)


def test_pipelined_requests_answered_in_order(broker):
    with connect(broker) as sock:
        sock.sendall(b"".join(frame(18, 3, i, b"\x06josef\x040.1\x00", flexible=True) for i in range(50)))
        ids = [struct.unpack(">i", read_frame(sock)[:4])[0] for _ in range(50)]
    assert ids == list(range(50))
