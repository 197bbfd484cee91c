"""A request for an API or version the broker does not advertise is refused as Kafka refuses it.

Kafka's SocketServer rejects a request header whose API key and version are
not enabled on the listener (InvalidRequestException) and closes that
connection; clients never get that far, since they pick versions from
ApiVersions. What matters is that the refusal is immediate (never a silent
hang) and costs only that connection.
"""

import socket
import struct

from kio.schema.index import api_key_map, schema_name_map

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient


def header_only(key: int, version: int) -> bytes:
    payload = struct.pack(">hhih", key, version, 7, 4) + b"test"
    return struct.pack(">i", len(payload)) + payload


def closed_at_once(port: int, key: int, version: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(header_only(key, version))
        return sock.recv(4) == b""  # EOF, not a timeout


def test_every_unadvertised_api_closes_only_its_connection(josef_broker):
    advertised = josef_broker.broker.dispatcher.apis
    unadvertised = sorted(set(api_key_map) - set(advertised))
    assert unadvertised, "every API is advertised: nothing to check"
    for key in unadvertised:
        assert closed_at_once(josef_broker.port, key, min(schema_name_map[api_key_map[key]])), api_key_map[key]
    client = RawClient(josef_broker.port)
    versions = client.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert {k.api_key for k in versions.api_keys} == set(advertised)


def test_a_version_outside_the_advertised_range_closes_the_connection(josef_broker):
    produce = josef_broker.broker.dispatcher.apis[ApiKey.PRODUCE]
    assert closed_at_once(josef_broker.port, ApiKey.PRODUCE, produce.max_version + 1)
    assert closed_at_once(josef_broker.port, ApiKey.PRODUCE, produce.min_version - 1)
    assert closed_at_once(josef_broker.port, 999, 0)  # a key Kafka does not have
