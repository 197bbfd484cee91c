"""Share sessions (KIP-932): which partitions a member fetches from this broker, and the epoch of its next request.

A member opens a session with ShareFetch epoch 0, naming its partitions;
each later ShareFetch or ShareAcknowledge carries the session's next epoch
(1, 2, ...), may add partitions and forget others, and is refused with
INVALID_SHARE_SESSION_EPOCH out of order or SHARE_SESSION_NOT_FOUND without
a session. Epoch -1 is the member's last request: it acknowledges and closes
the session, and what the member still holds is released. A session not used
for ``group.share.session.timeout.ms`` is closed the same way, as is one
replaced by a new epoch 0; at most ``group.share.max.share.sessions`` are
kept (SHARE_SESSION_LIMIT_REACHED beyond).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable

import attrs
from kio.schema.errors import ErrorCode

from josef_coordinator_share.share_partition import ShareError

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
MAX_EPOCH = 2**31 - 1


@attrs.define
class ShareSession:
    group_id: str
    member_id: str
    #: The session's partitions, as (topic id, partition index), in the order they were added.
    partitions: dict[Hashable, None] = attrs.field(factory=dict)
    #: The epoch the member's next request must carry.
    epoch: int = 1
    last_used: float = attrs.field(factory=time.monotonic)


class ShareSessionCache:
    """The share sessions of one broker, by (group, member)."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        #: Sessions closed because they were idle (Kafka's ShareSessionEvictionsPerSec).
        self.evictions = 0

    def open(self, group_id: str, member_id: str, partitions: Iterable[Hashable], max_sessions: int,
             idle_timeout_s: float) -> tuple[ShareSession, list[ShareSession]]:
        """A new session (epoch 0 was asked); also the sessions closed to make room: the member's previous one
        and those idle for ``idle_timeout_s``, whose acquisitions the caller releases."""
        closed = self.expire(idle_timeout_s)
        previous = self.sessions.pop((group_id, member_id), None)
        if previous is not None:
            closed.append(previous)
        if len(self.sessions) >= max_sessions:
            raise ShareError(ErrorCode.share_session_limit_reached,
                             f"this broker keeps at most {max_sessions} share sessions")
        session = ShareSession(group_id, member_id, dict.fromkeys(partitions))
        self.sessions[group_id, member_id] = session
        return session, closed

    def use(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """The member's session for a request of ``epoch`` (not 0), its next epoch advanced; -1 closes it."""
        session = self.sessions.get((group_id, member_id))
        if session is None:
            raise ShareError(ErrorCode.share_session_not_found, f"member {member_id} of {group_id} has no share "
                             "session on this broker")
        if epoch == FINAL_EPOCH:
            del self.sessions[group_id, member_id]
            return session
        if epoch != session.epoch:
            raise ShareError(ErrorCode.invalid_share_session_epoch,
                             f"share session epoch {epoch}, expected {session.epoch}")
        session.epoch = 1 if session.epoch == MAX_EPOCH else session.epoch + 1
        session.last_used = time.monotonic()
        return session

    def expire(self, idle_timeout_s: float) -> list[ShareSession]:
        """Close and return the sessions not used for ``idle_timeout_s``."""
        cutoff = time.monotonic() - idle_timeout_s
        idle = [s for s in self.sessions.values() if s.last_used < cutoff]
        for session in idle:
            del self.sessions[session.group_id, session.member_id]
        self.evictions += len(idle)
        return idle
