"""Where requests wait for something to happen to a partition (data to fetch, a high watermark to rise).

Kafka calls this the delayed-operation purgatory. Here a waiting request
registers one :class:`anyio.Event` under the keys it cares about; whoever
changes a key calls :meth:`Purgatory.notify` and every waiter on it wakes and
re-checks its condition. Waiters never hold state across the wait, so a spurious
wake-up is harmless.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable, Iterable

import anyio


class Purgatory:
    def __init__(self) -> None:
        self._watchers: defaultdict[Hashable, set[anyio.Event]] = defaultdict(set)

    async def wait(self, keys: Iterable[Hashable], timeout_s: float) -> bool:
        """Wait until one of ``keys`` is notified or ``timeout_s`` passes; True when notified."""
        event = anyio.Event()
        keys = list(keys)
        for key in keys:
            self._watchers[key].add(event)
        try:
            with anyio.move_on_after(timeout_s):
                await event.wait()
        finally:
            for key in keys:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(event)
                    if not watchers:
                        del self._watchers[key]
        return event.is_set()

    def notify(self, key: Hashable) -> None:
        for event in self._watchers.pop(key, ()):
            event.set()
