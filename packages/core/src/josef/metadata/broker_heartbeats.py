"""Broker sessions on the active controller: Kafka's BrokerHeartbeatManager.

A registered broker stays unfenced while it heartbeats within
``broker.session.timeout.ms``. The state is soft: a newly active controller
starts every broker with a full session, as Kafka's does, because it cannot
know when the previous controller last heard from them. A controller whose
event loop stalled for longer than a session cannot tell a dead broker from
its own stall either, so after a stall it renews every session instead of
fencing the whole cluster.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import attrs


@attrs.define
class BrokerSession:
    epoch: int
    #: Offset of the committed registration: a broker whose metadata reached it has caught up.
    registration_offset: int
    last_heartbeat: float


class BrokerHeartbeats:
    def __init__(self, session_timeout_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.session_timeout = session_timeout_ms / 1000
        self._clock = clock
        self._sessions: dict[int, BrokerSession] = {}
        self._last_sweep = clock()

    def registered(self, broker_id: int, epoch: int, offset: int) -> None:
        self._sessions[broker_id] = BrokerSession(epoch, offset, self._clock())

    def session(self, broker_id: int) -> BrokerSession | None:
        return self._sessions.get(broker_id)

    def heartbeat(self, broker_id: int) -> None:
        self._sessions[broker_id].last_heartbeat = self._clock()

    def adopt(self, brokers: Iterable[tuple[int, int]]) -> None:
        """A new active controller: every registered ``(broker id, epoch)`` gets a full session."""
        now = self._clock()
        self._sessions = {b: BrokerSession(epoch, -1, now) for b, epoch in brokers}
        self._last_sweep = now

    def expired(self, candidates: Iterable[int]) -> list[int]:
        """Which of ``candidates`` (the unfenced brokers) missed their session."""
        now = self._clock()
        stalled = now - self._last_sweep > self.session_timeout
        self._last_sweep = now
        if stalled:
            for session in self._sessions.values():
                session.last_heartbeat = now
            return []
        return [b for b in candidates if (s := self._sessions.get(b)) is not None
                and now - s.last_heartbeat > self.session_timeout]
