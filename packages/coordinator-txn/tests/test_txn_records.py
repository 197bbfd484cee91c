"""``__transaction_state`` records byte for byte as Kafka writes them (TransactionLogKey v0, TransactionLogValue v0/v1)."""

from __future__ import annotations

import pytest

from josef_coordinator_txn.records import (
    RecordFormatError,
    TransactionLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

ONGOING = TransactionLogValue(producer_id=1000, producer_epoch=2, timeout_ms=60000, state_id=1,
                              partitions=frozenset({("orders", 1), ("orders", 0)}), last_update_ms=1700000000000,
                              start_ms=1699999999000)


def test_key_is_version_0_then_the_id():
    assert encode_key("tx1") == bytes.fromhex("0000" "0003") + b"tx1"
    assert decode_key(encode_key("tx1")) == "tx1"
    assert decode_key(encode_key("ünïcode")) == "ünïcode"


def test_keys_of_other_versions_are_skipped():
    assert decode_key(bytes.fromhex("0001") + bytes.fromhex("0003") + b"tx1") is None


def test_value_version_0_layout():
    expected = bytes.fromhex(
        "0000"                              # version
        "00000000000003e8" "0002"           # producer id, epoch
        "0000ea60" "01"                     # timeout, status (Ongoing)
        "00000001" "0006") + b"orders" + bytes.fromhex(
        "00000002" "00000000" "00000001"    # partition ids
        "0000018bcfe56800"                  # last update
        "0000018bcfe56418")                 # start
    assert encode_value(ONGOING, 0) == expected
    assert decode_value(expected) == ONGOING


def test_value_version_1_layout_with_tagged_fields():
    value = TransactionLogValue(producer_id=1000, producer_epoch=2, timeout_ms=60000, state_id=1,
                                partitions=ONGOING.partitions, last_update_ms=1700000000000, start_ms=1699999999000,
                                next_producer_id=2000, client_transaction_version=2)
    expected = bytes.fromhex(
        "0001"
        "00000000000003e8" "0002" "0000ea60" "01"
        "02" "07") + b"orders" + bytes.fromhex(
        "03" "00000000" "00000001" "00"     # compact partition ids, then the entry's tagged fields
        "0000018bcfe56800" "0000018bcfe56418"
        "02"                                # two tagged fields: PreviousProducerId is at its default, not written
        "01" "08" "00000000000007d0"        # NextProducerId
        "02" "02" "0002")                   # ClientTransactionVersion
    assert encode_value(value, 1) == expected
    assert decode_value(expected) == value


def test_version_0_has_no_tagged_fields():
    value = TransactionLogValue(producer_id=1, producer_epoch=0, timeout_ms=1, state_id=4, partitions=frozenset(),
                                last_update_ms=5, start_ms=4, previous_producer_id=9, client_transaction_version=2)
    decoded = decode_value(encode_value(value, 0))
    assert (decoded.previous_producer_id, decoded.client_transaction_version) == (-1, 0)
    assert decoded.state_id == 4 and decoded.partitions == frozenset()


@pytest.mark.parametrize("version", [0, 1])
def test_empty_state_writes_a_null_partition_array(version):
    empty = TransactionLogValue(producer_id=1, producer_epoch=0, timeout_ms=1, state_id=0, partitions=frozenset(),
                                last_update_ms=5, start_ms=-1)
    complete = TransactionLogValue(producer_id=1, producer_epoch=0, timeout_ms=1, state_id=4, partitions=frozenset(),
                                   last_update_ms=5, start_ms=3)
    null, empty_array = ("ffffffff", "00000000") if version == 0 else ("00", "01")
    assert encode_value(empty, version)[2 + 8 + 2 + 4 + 1:].hex().startswith(null)
    assert encode_value(complete, version)[2 + 8 + 2 + 4 + 1:].hex().startswith(empty_array)
    assert decode_value(encode_value(empty, version)) == empty


def test_unknown_or_damaged_values_are_refused():
    with pytest.raises(RecordFormatError, match="version 2"):
        decode_value(bytes.fromhex("0002") + encode_value(ONGOING, 1)[2:])
    with pytest.raises(RecordFormatError):
        decode_value(encode_value(ONGOING, 0)[:-3])
    with pytest.raises(RecordFormatError):
        decode_value(encode_value(ONGOING, 0) + b"\x00")
    with pytest.raises(RecordFormatError):
        decode_value(b"\x00")
