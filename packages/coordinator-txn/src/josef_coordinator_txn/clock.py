"""Wall-clock milliseconds, in one place so tests can move time (transaction timeouts, id expiry) without sleeping."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch: transaction start and update times are wall-clock, as in Kafka."""
    return int(time.time() * 1000)
