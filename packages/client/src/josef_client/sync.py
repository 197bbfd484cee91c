"""The synchronous clients' engine: one asyncio loop on a daemon thread per client.

``Producer``, ``Consumer`` and ``Admin`` wrap their async counterparts for
scripts and notebooks; every call hops onto the client's loop and waits.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (re-raising its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def call(self, func: Callable[..., T], *args: Any) -> None:
        """Schedule a plain function on the loop without waiting."""
        self.loop.call_soon_threadsafe(func, *args)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        self.loop.close()
