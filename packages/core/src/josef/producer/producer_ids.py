"""Producer ids for InitProducerId: handed out of a block the metadata quorum gave this broker.

Kafka's RPCProducerIdManager without the RPC: the controller runs in the
same process, so a new block is one metadata commit (one fsync). Ids are
unique cluster-wide and across restarts because each block is recorded in the
metadata log before it is used; the unused rest of a block is skipped after a
restart, never reused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from josef.metadata.controller import ProducerIdBlock


class ProducerIdManager:
    def __init__(self, allocate: Callable[[], Awaitable[ProducerIdBlock]]) -> None:
        self._allocate = allocate
        self._next = 0
        self._end = 0  # exclusive: no block yet
        #: One block request at a time: concurrent InitProducerIds wait for it instead of each taking a block.
        self._lock = anyio.Lock()

    async def generate(self) -> int:
        """The next unused producer id; may wait for the controller to commit a new block."""
        while self._next >= self._end:  # re-checked after waiting: others may have used the block up
            async with self._lock:
                if self._next >= self._end:
                    block = await self._allocate()
                    self._next, self._end = block.first_id, block.first_id + block.size
        producer_id = self._next
        self._next += 1
        return producer_id
