"""Wall-clock milliseconds, in one place so tests can move time (offset retention) without sleeping."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch: commit timestamps and state-change times are wall-clock, as in Kafka."""
    return int(time.time() * 1000)
