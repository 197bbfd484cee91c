"""The ``transaction-log`` record decoder (``josef dump-log --transaction-log-decoder``), reached through the plugin hook."""

from __future__ import annotations

import dataclasses

import pytest

from josef.plugins import collect, get_plugin_manager
from josef_coordinator_txn.records import TransactionLogValue, encode_key, encode_value

ONGOING = TransactionLogValue(producer_id=1000, producer_epoch=2, timeout_ms=60000, state_id=1,
                              partitions=frozenset({("orders", 1), ("orders", 0)}), last_update_ms=1700000000000,
                              start_ms=1699999999000)


@pytest.fixture(scope="module")
def decode():
    return collect(get_plugin_manager(), "register_record_decoders", "record decoder").get("transaction-log")


def fields(entity):
    return {f.name: getattr(entity, f.name) for f in dataclasses.fields(entity)}


@pytest.mark.parametrize("version", [0, 1])
def test_a_transaction_as_its_schema_reads_it(decode, version):
    key, value = decode(encode_key("tx1"), encode_value(ONGOING, version))
    assert key["type"] == "0" and fields(key["data"]) == {"transactional_id": "tx1"}
    assert value["version"] == str(version)
    data = fields(value["data"])
    assert (data["producer_id"], data["producer_epoch"], data["transaction_timeout_ms"], data["transaction_status"]) == (
        1000, 2, 60000, 1)
    assert [(p.topic, p.partition_ids) for p in data["transaction_partitions"]] == [("orders", (0, 1))]
    assert (data["transaction_last_update_timestamp_ms"], data["transaction_start_timestamp_ms"]) == (
        1700000000000, 1699999999000)
    assert ("previous_producer_id" in data) == (version == 1)


def test_a_tombstone_and_unknown_keys(decode):
    key, value = decode(encode_key("tx1"), None)
    assert value is None and fields(key["data"]) == {"transactional_id": "tx1"}
    with pytest.raises(LookupError) as info:
        decode(bytes.fromhex("0001") + bytes.fromhex("0003") + b"tx1", None)
    assert info.value.args == (1,)
    with pytest.raises(ValueError):
        decode(encode_key("tx1"), bytes.fromhex("0007"))
