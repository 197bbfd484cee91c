"""What the node hands its driver, and the driver's clock it decided it at.

Every part of the node (election, replication, snapshots, voter changes)
sends requests and deferred answers, and stamps deadlines with the time of
the call being handled. They share one :class:`Outbox` rather than each
keeping a queue and a clock: :meth:`RaftNode.poll <josef_metadata_kraft.raft.node.RaftNode.poll>`
hands back everything in the order it was decided, and one request manager
keeps Kafka's rule of one request in flight per destination across all of them.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from .config import RaftConfig

#: A deadline that never comes.
FOREVER = 2**62


@attrs.frozen
class Outbound:
    """A message for the driver to send to ``destination``.

    ``request`` is ``None`` for a request this node makes (the driver hands
    it back, as the same object, to :meth:`RaftNode.handle_response`). For a
    deferred response it is the inbound request object being answered, so
    the driver can find the connection and correlation id it came with.
    """

    destination: int
    message: Any
    request: Any = None


class RequestManager:
    """One request in flight per destination, with timeouts and a retry backoff (Kafka's RequestManager)."""

    def __init__(self, config: RaftConfig) -> None:
        self._timeout = config.request_timeout_ms
        self._backoff_ms = config.retry_backoff_ms
        self.inflight: dict[int, tuple[Any, int]] = {}
        self._backoff: dict[int, int] = {}

    def wait_ms(self, destination: int, now: int) -> int:
        """0 when a request may go to ``destination`` now, else how long until that may change."""
        sent = self.inflight.get(destination)
        if sent is not None:
            return max(1, sent[1] + self._timeout - now)
        return max(0, self._backoff.get(destination, 0) - now)

    def sent(self, destination: int, request: Any, now: int) -> None:
        self.inflight[destination] = (request, now)

    def expects(self, destination: int, request: Any) -> bool:
        sent = self.inflight.get(destination)
        return sent is not None and sent[0] is request

    def done(self, destination: int, request: Any, ok: bool, now: int) -> None:
        if self.expects(destination, request):
            del self.inflight[destination]
            if not ok:
                self._backoff[destination] = now + self._backoff_ms

    def expire(self, now: int) -> None:
        for destination, (_, sent) in list(self.inflight.items()):
            if now >= sent + self._timeout:
                del self.inflight[destination]
                self._backoff[destination] = sent + self._timeout + self._backoff_ms

    def reset(self) -> None:
        self.inflight.clear()
        self._backoff.clear()


class Outbox:
    """Messages for the driver in the order they were decided; ``now`` is the time of the call being handled."""

    def __init__(self, config: RaftConfig, now: int) -> None:
        self.now = now
        self.requests = RequestManager(config)
        self._request_timeout_ms = config.request_timeout_ms
        self._messages: list[Outbound] = []

    def send(self, destination: int, build: Callable[[], Any]) -> int:
        """Send ``build()`` to ``destination`` unless a request is in flight or backing off; returns the wait."""
        wait = self.requests.wait_ms(destination, self.now)
        if wait == 0:
            message = build()
            self.requests.sent(destination, message, self.now)
            self._messages.append(Outbound(destination, message))
            return self._request_timeout_ms
        return wait

    def put(self, destination: int, message: Any, request: Any = None) -> None:
        """Queue ``message`` outside the request manager: a deferred answer to ``request``, or a request
        whose sender tracks it itself."""
        self._messages.append(Outbound(destination, message, request))

    def take(self) -> list[Outbound]:
        out, self._messages = self._messages, []
        return out
