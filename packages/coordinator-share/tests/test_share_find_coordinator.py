"""FindCoordinator key type 2 with the share coordinator installed: a share partition's key leads to it, from v6 on."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from josef.protocol.api_keys import ApiKey
from josef.testing import RawClient, eventually

E = ErrorCode
SHARE = 2


def find(client: RawClient, version: int, key: str) -> tuple[int, ErrorCode]:
    if version >= 4:
        [answer] = client.call(ApiKey.FIND_COORDINATOR, version, {"key_type": SHARE, "coordinator_keys": [key]}
                               ).coordinators
    else:
        answer = client.call(ApiKey.FIND_COORDINATOR, version, {"key_type": SHARE, "key": key})
    return answer.node_id, answer.error_code


def test_a_share_key_finds_the_share_coordinator_from_v6_on(josef_broker):
    client = RawClient(josef_broker.port)
    try:
        key = "my group:AAAAAAAAAAAAAAAAAAAAAQ:3"  # group ids may hold anything, ':' too: the last two parts count
        assert eventually(lambda: find(client, 6, key) == (1, E.none), 30, what="the share coordinator")
        assert "__share_group_state" in josef_broker.broker.image.topics
        assert find(client, 5, key) == (-1, E.invalid_request)
        for malformed in ("g", "g:AAAAAAAAAAAAAAAAAAAAAQ", "g:nope:0", "g:AAAAAAAAAAAAAAAAAAAAAQ:-1",
                          ":AAAAAAAAAAAAAAAAAAAAAQ:0"):
            assert find(client, 6, malformed) == (-1, E.invalid_request), malformed
    finally:
        client.close()
