"""Where requests wait for something to happen to a partition (data to fetch, a high watermark to rise).

Kafka calls this the delayed-operation purgatory. Here a waiting request
registers itself under the keys it cares about; whoever changes a key calls
:meth:`Purgatory.notify` and every waiter on it wakes, learns which of its
keys fired, and re-checks only what those keys stand for. Waiters never hold
state across the wait, so a spurious wake-up is harmless.
"""

from __future__ import annotations

from typing import Hashable, Iterable

import anyio


class _Waiter:
    __slots__ = ("event", "woken")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.woken: set[Hashable] = set()


class Purgatory:
    def __init__(self) -> None:
        self._watchers: dict[Hashable, set[_Waiter]] = {}

    async def wait(self, keys: Iterable[Hashable], timeout_s: float) -> set[Hashable]:
        """Wait until one of ``keys`` is notified or ``timeout_s`` passes; the keys notified (empty on timeout)."""
        waiter = _Waiter()
        keys = list(keys)
        watchers = self._watchers
        for key in keys:
            waiting = watchers.get(key)
            if waiting is None:
                watchers[key] = {waiter}
            else:
                waiting.add(waiter)
        try:
            with anyio.move_on_after(timeout_s):
                await waiter.event.wait()
        finally:
            for key in keys:
                waiting = watchers.get(key)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del watchers[key]
        return waiter.woken

    def notify(self, key: Hashable) -> None:
        for waiter in self._watchers.pop(key, ()):
            waiter.woken.add(key)
            waiter.event.set()
