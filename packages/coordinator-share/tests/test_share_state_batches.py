"""How writes' state batches combine with what is known (Kafka's PersisterStateBatchCombiner)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from josef_coordinator_share.state import ACKNOWLEDGED, ARCHIVED, AVAILABLE, ShareState, StateBatch, combine


def b(first: int, last: int, state: int = ACKNOWLEDGED, count: int = 1) -> StateBatch:
    return StateBatch(first, last, state, count)


def test_a_newer_range_wins_where_it_overlaps_and_cuts_the_older_one():
    assert combine([b(0, 9)], [b(3, 5, ARCHIVED, 5)], 0) == (b(0, 2), b(3, 5, ARCHIVED, 5), b(6, 9))


def test_ranges_below_the_start_offset_go_and_one_across_it_is_cut():
    assert combine([b(0, 4), b(5, 9, ARCHIVED)], [], 7) == (b(7, 9, ARCHIVED),)


def test_neighbours_with_the_same_state_and_count_are_joined():
    assert combine([b(0, 4)], [b(5, 9), b(10, 12, ACKNOWLEDGED, 2)], 0) == (b(0, 9), b(10, 12, ACKNOWLEDGED, 2))


def test_later_ranges_of_one_write_win_over_earlier_ones():
    assert combine([], [b(0, 9, AVAILABLE, 1), b(4, 4, ARCHIVED, 2)], 0) == (
        b(0, 3, AVAILABLE), b(4, 4, ARCHIVED, 2), b(5, 9, AVAILABLE))


def test_an_update_moves_the_start_and_keeps_what_it_leaves_unchanged():
    state = ShareState(0, 1, 3, 0, (b(0, 9),))
    assert state.updated(-1, -1, [b(10, 11, ARCHIVED)]) == ShareState(0, 1, 3, 0, (b(0, 9), b(10, 11, ARCHIVED)))
    assert state.updated(4, 5, []) == ShareState(0, 1, 4, 5, (b(5, 9),))


def _expand(batches) -> dict[int, tuple[int, int]]:
    return {o: (x.delivery_state, x.delivery_count) for x in batches for o in range(x.first_offset, x.last_offset + 1)}


batch = st.builds(lambda first, length, state, count: b(first, first + length, state, count),
                  st.integers(0, 60), st.integers(0, 10), st.sampled_from([AVAILABLE, ACKNOWLEDGED, ARCHIVED]),
                  st.integers(1, 3))


@given(st.lists(st.lists(batch, max_size=5), max_size=6), st.integers(0, 40))
def test_combining_write_by_write_is_laying_each_offset_over_the_last(writes, start):
    expected: dict[int, tuple[int, int]] = {}
    state: tuple[StateBatch, ...] = ()
    for write in writes:
        for x in write:
            expected.update(_expand([x]))
        state = combine(state, write, 0)
    pruned = combine(state, [], start)
    assert _expand(pruned) == {o: v for o, v in expected.items() if o >= start}
    assert all(x.last_offset < y.first_offset for x, y in zip(pruned, pruned[1:]))
    assert not any(x.last_offset + 1 == y.first_offset
                   and (x.delivery_state, x.delivery_count) == (y.delivery_state, y.delivery_count)
                   for x, y in zip(pruned, pruned[1:])), "neighbours left unjoined"
