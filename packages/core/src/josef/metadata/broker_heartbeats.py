"""Broker sessions on the active controller: Kafka's BrokerHeartbeatManager.

A registered broker stays unfenced while it heartbeats within
``broker.session.timeout.ms``. The state is soft: a newly active controller
starts every broker with a full session, as Kafka's does, because it cannot
know when the previous controller last heard from them. A controller whose
event loop stalled for longer than a session cannot tell a dead broker from
its own stall either, so after a stall it renews every session instead of
fencing the whole cluster.

A metadata backend whose brokers also hold a session with it (ZooKeeper's
ephemeral ``/brokers/ids/<id>``) ends a broker's session here when that one
expires, so the broker is fenced at the next sweep instead of a
``broker.session.timeout.ms`` later; its next heartbeat starts it again, as
after any missed session.
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
    #: The backend saw the broker's session with it end (:meth:`BrokerHeartbeats.end`).
    ended: bool = False


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
        session = self._sessions[broker_id]
        session.last_heartbeat = self._clock()
        session.ended = False

    def end(self, broker_id: int, epoch: int) -> bool:
        """The session of broker ``broker_id`` at ``epoch`` ended: it expires at the next sweep. Whether it did
        (not when the broker registered again since, with a later epoch)."""
        session = self._sessions.get(broker_id)
        if session is None or session.epoch != epoch:
            return False
        session.ended = True
        return True

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
        return [b for b in candidates if (s := self._sessions.get(b)) is not None
                and (s.ended or now - s.last_heartbeat > self.session_timeout)]
