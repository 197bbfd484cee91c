"""Wall-clock milliseconds for coordinators, in one place so tests can move time without sleeping.

Commit timestamps, offset retention, state-change times and transaction
timeouts are wall-clock in Kafka; every coordinator reads them here
(``clock.now_ms()``), and tests replace :func:`now_ms` (see
:class:`josef.testing.ManualClock`).
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch."""
    return int(time.time() * 1000)
