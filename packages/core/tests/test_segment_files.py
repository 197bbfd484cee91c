"""The companion-file formats tiered storage reads back from remote storage (josef.segment_files)."""

from __future__ import annotations

import pytest

from josef.segment_files import OFFSET_INDEX_ENTRY, TIME_INDEX_ENTRY, offset_for_time, position_for


def test_the_offset_index_gives_the_position_of_the_last_indexed_batch_at_or_below_an_offset():
    index = b"".join(OFFSET_INDEX_ENTRY.pack(relative, position) for relative, position in ((10, 4096), (25, 8192)))
    assert [position_for(index, 100, offset) for offset in (100, 109, 110, 124, 125, 900)] == [0, 0, 4096, 4096,
                                                                                                8192, 8192]
    with pytest.raises(ValueError, match="not whole 8-byte entries"):
        position_for(index[:-1], 100, 110)


def test_the_time_index_gives_the_offset_to_search_a_timestamp_from():
    index = b"".join(TIME_INDEX_ENTRY.pack(timestamp, relative) for timestamp, relative in ((1_000, 5), (2_000, 40)))
    # Before the first entry nothing is known: search from the base offset; then from the last entry not later.
    assert [offset_for_time(index, 100, ts) for ts in (0, 999, 1_000, 1_999, 2_000, 9_999)] == [100, 100, 105, 105,
                                                                                                  140, 140]
    assert offset_for_time(b"", 100, 5_000) == 100
    with pytest.raises(ValueError, match="not whole 12-byte entries"):
        offset_for_time(index[:-1], 100, 1_000)
