"""Commit znodes: records round-trip inline or in parts, and anything else is refused with the znode's name."""

from __future__ import annotations

import uuid

import pytest

from josef.metadata.records import FeatureLevelRecord, TopicRecord
from josef_metadata_zk.commits import MAX_ZNODE_BYTES, CorruptCommitError, decode_records, encode_commit, read_header


def records(count: int, name_bytes: int = 8) -> list[TopicRecord]:
    return [TopicRecord(name=f"t{i}-" + "x" * name_bytes, topic_id=uuid.uuid4()) for i in range(count)]


def test_a_small_commit_is_one_znode_with_its_offsets():
    batch = [*records(3), FeatureLevelRecord(name="metadata.version", feature_level=27)]
    commit = encode_commit(41, batch)
    assert commit.parts == ()
    header = read_header(commit.data, "here")
    assert (header.base_offset, header.count, header.last_offset) == (41, 4, 44)
    assert decode_records(header, header.inline, "here") == batch


def test_a_commit_above_the_znode_limit_goes_in_parts_each_under_it():
    batch = records(12_000, name_bytes=200)  # about 2.6 MB
    commit = encode_commit(0, batch)
    assert len(commit.parts) >= 3 and all(len(data) <= MAX_ZNODE_BYTES for _, data in commit.parts)
    header = read_header(commit.data, "here")
    assert header.parts == tuple(name for name, _ in commit.parts)
    assert decode_records(header, b"".join(data for _, data in commit.parts), "here") == batch


@pytest.mark.parametrize("damage", ["magic", "crc", "truncated", "short"])
def test_a_damaged_commit_is_refused_naming_where_it_is(damage):
    data = bytearray(encode_commit(7, records(5)).data)
    if damage == "magic":
        data[0:2] = b"XX"
    elif damage == "crc":
        data[-1] ^= 0xFF
    elif damage == "truncated":
        del data[-3:]
    else:
        del data[10:]
    with pytest.raises(CorruptCommitError, match="/josef/metadata/log/commit-0000000003"):
        header = read_header(bytes(data), "/josef/metadata/log/commit-0000000003")
        decode_records(header, header.inline, "/josef/metadata/log/commit-0000000003")


def test_a_mirrored_commit_after_a_gap_says_which_offset_it_follows():
    # A KRaft log mirrored during a migration: Raft's LeaderChange at offset 10 is not a metadata record.
    batch = records(2)
    for inline in (True, False):
        commit = encode_commit(11, batch if inline else records(12_000, name_bytes=200), previous=9)
        header = read_header(commit.data, "here")
        assert (header.base_offset, header.previous_offset) == (11, 9)
        assert bool(header.parts) is not inline
    assert read_header(encode_commit(11, batch).data, "here").previous_offset == 10
    assert encode_commit(11, batch, previous=10).data[2] == 0  # no gap: format 0, as before
    with pytest.raises(ValueError, match="cannot follow"):
        encode_commit(11, batch, previous=11)
