"""The records of __share_group_state, byte for byte as Kafka's ShareSnapshot/ShareUpdate schemas lay them out."""

from __future__ import annotations

import struct
import uuid

import pytest

from josef_coordinator_share import record_decoder, records
from josef_coordinator_share.state import ShareKey, ShareState, StateBatch

KEY = ShareKey("group", uuid.UUID(int=7), 3)


def test_a_snapshot_key_is_its_type_then_group_topic_id_and_partition():
    data = records.encode_key(KEY, records.SNAPSHOT_KEY_VERSION)
    assert data == struct.pack(">hh", 0, 5) + b"group" + uuid.UUID(int=7).bytes + struct.pack(">i", 3)
    assert records.decode_key(data) == (0, KEY)
    assert records.decode_key(records.encode_key(KEY, records.UPDATE_KEY_VERSION)) == (1, KEY)


def test_an_unknown_record_type_is_skipped_not_misread():
    assert records.decode_key(struct.pack(">h", 9) + b"whatever") is None


def test_a_snapshot_value_is_flexible_version_0():
    state = ShareState(1, 2, 3, 10, (StateBatch(10, 12, 2, 1),))
    data = records.encode_snapshot(state)
    assert data == (struct.pack(">hHiiq", 0, 1, 2, 3, 10) + bytes([2]) + struct.pack(">qqbh", 10, 12, 2, 1)
                    + b"\x00\x00")
    version, entity = records.value_entity(records.SNAPSHOT_KEY_VERSION, data)
    assert (version, entity.state_epoch, records.state_batches(entity)) == (0, 2, state.batches)


def test_an_update_value_has_no_state_epoch_and_may_leave_the_start_offset_alone():
    data = records.encode_update(4, 7, -1, ())
    assert data == struct.pack(">hHiq", 0, 4, 7, -1) + b"\x01\x00"
    _, entity = records.value_entity(records.UPDATE_KEY_VERSION, data)
    assert (entity.snapshot_epoch, entity.leader_epoch, entity.start_offset) == (4, 7, -1)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x01\x00", b"\x00\x00\x00\x01"])
def test_malformed_values_are_format_errors(data):
    with pytest.raises(records.RecordFormatError):
        records.value_entity(records.SNAPSHOT_KEY_VERSION, data)


def test_bytes_after_a_value_are_a_format_error():
    with pytest.raises(records.RecordFormatError, match="bytes after"):
        records.value_entity(records.UPDATE_KEY_VERSION, records.encode_update(0, 0, 0, ()) + b"x")


def test_the_dump_decoder_gives_the_record_type_and_fields():
    key, value = record_decoder.decode(records.encode_key(KEY, 1), records.encode_update(0, 5, 20, ()))
    assert key["type"] == "1" and key["data"].group_id == "group"
    assert value["version"] == "0" and value["data"].leader_epoch == 5
    assert record_decoder.decode(records.encode_key(KEY, 0), None)[1] is None
    with pytest.raises(LookupError):
        record_decoder.decode(struct.pack(">h", 5), b"")
