"""Consumer lag as Kafka's tools compute it: the partition's end offset minus the group's committed offset.

``kafka-consumer-groups.sh --describe`` shows ``LOG-END-OFFSET - CURRENT-OFFSET``
where the end is the high watermark a consumer could read up to, and "-"
when either is unknown (no committed offset, no leader). A group's total
adds what is known: a partition whose lag cannot be known does not make the
rest unknown, but a group where none is known has no total.
"""

from __future__ import annotations

from collections.abc import Iterable


def partition_lag(end: int | None, committed: int | None) -> int | None:
    """Records between ``committed`` and ``end``; None when either is unknown (a negative offset means none).

    Never negative: a committed offset past the end (a truncated log after an
    unclean election, a commit made up by a tool) is no lag, not credit.
    """
    if end is None or committed is None or end < 0 or committed < 0:
        return None
    return max(0, end - committed)


def total_lag(lags: Iterable[int | None]) -> int | None:
    """The sum of the known lags; None when none is known."""
    known = [lag for lag in lags if lag is not None]
    return sum(known) if known else None
