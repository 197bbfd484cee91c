"""DescribeClientQuotas and AlterClientQuotas over a real socket, and the quotas surviving a restart."""

import pytest
from kio.schema.errors import ErrorCode

from josef.metadata.client_quotas import MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED
from josef.protocol.api_keys import ApiKey
from josef.node.runner import BrokerThread
from josef.testing import RawClient, broker_overrides

ALTER, DESCRIBE = ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.DESCRIBE_CLIENT_QUOTAS


def entity(**names):
    return [{"entity_type": t.replace("_", "-"), "entity_name": n} for t, n in names.items()]


def alter(client, version, *entries, validate_only=False):
    body = {"entries": [{"entity": e, "ops": [{"key": k, "value": v, "remove": r} for k, v, r in ops]}
                        for e, ops in entries], "validate_only": validate_only}
    return client.call(ALTER, version, body).entries


def describe(client, version, *components, strict=False):
    body = {"components": [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components],
            "strict": strict}
    return client.call(DESCRIBE, version, body)


def found(response):
    assert response.error_code == ErrorCode.none, response
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
            for entry in response.entries}


@pytest.mark.parametrize("version", [0, 1])
def test_alter_then_describe_with_every_match_type(josef_broker, version):
    client = RawClient(josef_broker.port)
    results = alter(client, version,
                    (entity(user="alice"), [("producer_byte_rate", 1024.0, False), ("request_percentage", 12.5, False)]),
                    (entity(user="alice", client_id="app"), [("consumer_byte_rate", 2048.0, False)]),
                    (entity(user=None), [("producer_byte_rate", 512.0, False)]),
                    (entity(ip="10.0.0.1"), [("connection_creation_rate", 5.0, False)]))
    assert [r.error_code for r in results] == [ErrorCode.none] * 4
    everything = found(describe(client, version))
    assert everything[(("user", "alice"),)] == {"producer_byte_rate": 1024.0, "request_percentage": 12.5}
    assert everything[(("client-id", "app"), ("user", "alice"))] == {"consumer_byte_rate": 2048.0}
    assert everything[(("user", None),)] == {"producer_byte_rate": 512.0}
    assert everything[(("ip", "10.0.0.1"),)] == {"connection_creation_rate": 5.0}

    assert set(found(describe(client, version, ("user", MATCH_EXACT, "alice")))) == {
        (("user", "alice"),), (("client-id", "app"), ("user", "alice"))}
    assert set(found(describe(client, version, ("user", MATCH_EXACT, "alice"), strict=True))) == {(("user", "alice"),)}
    assert set(found(describe(client, version, ("user", MATCH_DEFAULT, None)))) == {(("user", None),)}
    assert set(found(describe(client, version, ("user", MATCH_SPECIFIED, None), strict=True))) == {(("user", "alice"),)}

    # Removing the last key removes the entity; validate_only changes nothing.
    alter(client, version, (entity(ip="10.0.0.1"), [("connection_creation_rate", 0.0, True)]))
    alter(client, version, (entity(user=None), [("producer_byte_rate", 0.0, True)]), validate_only=True)
    remaining = found(describe(client, version))
    assert (("ip", "10.0.0.1"),) not in remaining and (("user", None),) in remaining


def test_bad_entries_fail_alone_with_a_message(josef_broker):
    client = RawClient(josef_broker.port)
    results = alter(client, 1,
                    (entity(user="bob"), [("producer_byte_rate", 1.5, False)]),  # not a whole number
                    (entity(ip="1.2.3.4", user="bob"), [("connection_creation_rate", 1.0, False)]),
                    (entity(user="bob"), [("connection_creation_rate", 1.0, False)]),  # an ip key
                    ([{"entity_type": "group", "entity_name": "g"}], [("producer_byte_rate", 1.0, False)]),
                    (entity(user="carol"), [("consumer_byte_rate", 10.0, False)]))
    assert [r.error_code for r in results] == [ErrorCode.invalid_request] * 4 + [ErrorCode.none]
    assert all(r.error_message for r in results[:4])
    assert set(found(describe(client, 1))) == {(("user", "carol"),)}
    bad = describe(client, 1, ("user", 7, None))
    assert bad.error_code == ErrorCode.invalid_request and "match type" in bad.error_message


def test_quotas_are_kept_in_the_metadata_log_across_restarts(tmp_path):
    overrides = broker_overrides(tmp_path)
    with BrokerThread(overrides) as broker:
        alter(RawClient(broker.port), 1, (entity(client_id="batch"), [("consumer_byte_rate", 4096.0, False)]))
    with BrokerThread(overrides) as broker:
        assert found(describe(RawClient(broker.port), 1)) == {(("client-id", "batch"),): {"consumer_byte_rate": 4096.0}}
