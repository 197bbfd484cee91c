from josef_console.lag import partition_lag, total_lag
from josef_console.model import Group, GroupPartition


def test_lag_is_the_end_offset_minus_the_committed_offset():
    assert partition_lag(150, 100) == 50
    assert partition_lag(100, 100) == 0


def test_lag_is_unknown_without_an_end_or_a_committed_offset():
    assert partition_lag(None, 100) is None
    assert partition_lag(100, None) is None
    assert partition_lag(100, -1) is None  # OffsetFetch's "no committed offset"
    assert partition_lag(-1, 5) is None


def test_a_commit_past_the_end_is_no_lag_rather_than_credit():
    assert partition_lag(90, 100) == 0


def test_a_total_adds_what_is_known_and_is_unknown_only_when_nothing_is():
    assert total_lag([3, None, 4]) == 7
    assert total_lag([None, None]) is None
    assert total_lag([]) is None
    assert total_lag([0]) == 0


def test_a_group_sums_its_partitions_and_a_share_group_takes_the_lag_its_coordinator_reports():
    group = Group("g", "classic", "Stable", 1, partitions=(
        GroupPartition("t", 0, 10, 25), GroupPartition("t", 1, None, 7), GroupPartition("t", 2, 5, None)))
    assert [p.lag for p in group.partitions] == [15, None, None]
    assert group.lag == 15
    assert GroupPartition("t", 0, 10, 25, reported_lag=3).lag == 3
    assert GroupPartition("t", 0, 10, 25, reported_lag=-1).lag == 15  # -1: the coordinator does not know
