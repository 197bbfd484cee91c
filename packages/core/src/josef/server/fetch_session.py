"""Incremental fetch sessions (KIP-227): a fetcher names only what changed, the broker answers only what changed.

A consumer or follower of 1,000 partitions that sends all 1,000 with every
poll, and gets 1,000 entries back, pays for partitions where nothing
happened. With a session the broker keeps the fetcher's partitions and
their fetch parameters: a request carries only the partitions whose
offsets or limits changed (and those to forget), and the response only the
partitions with records, a moved high watermark or log start offset, a
preferred read replica or an error.

The rules are Kafka's (``FetchSession``, ``FetchSessionCache``,
``FetchManager.newContext``):

- ``session_epoch`` -1 is a sessionless full fetch; 0 starts a new session
  (closing the one named, if any); above 0 is the next request of session
  ``session_id``, whose epoch must match (INVALID_FETCH_SESSION_EPOCH) and
  which must exist (FETCH_SESSION_ID_NOT_FOUND). A session made with topic
  ids is only continued with topic ids (FETCH_SESSION_TOPIC_ID_ERROR).
- The cache holds ``max.incremental.fetch.session.cache.slots`` sessions.
  When it is full, a new session evicts one unused for two minutes, else
  the least valuable evictable one if the new one is worth more: followers'
  sessions (privileged) outrank consumers', then more partitions outrank
  fewer; a session younger than two minutes can only be evicted by a
  follower's, and a follower's only once it is older than that.
- Partitions answered are moved to the end of the session's order, so
  ``max_bytes`` is shared round-robin across polls.
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Callable, Iterable

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.fetch_codec import FetchPartition, FetchRequest

#: ``session_epoch`` values with a meaning of their own.
INITIAL_EPOCH, FINAL_EPOCH = 0, -1
#: ``session_id`` of no session.
INVALID_SESSION_ID = 0
#: How long a session must be unused, or have existed, before any newcomer may evict it (Kafka's fixed 2 minutes).
EVICTION_MS = 120_000

#: A session's key for a partition: the topic id (sessions made with topic ids) or name, and the index.
PartitionKey = tuple[Any, int]


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 2**31 - 1 else epoch + 1


@attrs.define(slots=True, eq=False)
class CachedPartition:
    """What a session remembers of one partition: the fetcher's last parameters and what it was last told."""

    topic: str | None
    topic_id: uuid.UUID | None
    request: FetchPartition
    high_watermark: int = -1
    log_start_offset: int = -1


@attrs.define(slots=True, eq=False)
class FetchSession:
    id: int
    privileged: bool
    uses_topic_ids: bool
    partitions: dict[PartitionKey, CachedPartition]
    created_ms: int
    last_used_ms: int
    epoch: int = 1

    def update(self, topics: Iterable[tuple[str | None, uuid.UUID | None, FetchPartition]],
               forgotten: Iterable[PartitionKey]) -> None:
        """Take the request's partitions (added, or new parameters) and drop the forgotten ones."""
        partitions = self.partitions
        for name, topic_id, part in topics:
            key = (topic_id if self.uses_topic_ids else name, part.partition)
            cached = partitions.get(key)
            if cached is None:
                partitions[key] = CachedPartition(name, topic_id, part)
            else:
                cached.request = part
        for key in forgotten:
            partitions.pop(key, None)


class FetchSessionCache:
    """The broker's sessions, bounded by ``max.incremental.fetch.session.cache.slots``."""

    def __init__(self, max_slots: int, eviction_ms: int = EVICTION_MS, rng: random.Random | None = None) -> None:
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0
        self._rng = rng or random.Random()

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        return self.sessions.pop(session_id, None)

    def create(self, now_ms: int, privileged: bool, uses_topic_ids: bool,
               partitions: dict[PartitionKey, CachedPartition]) -> int:
        """A new session's id, or INVALID_SESSION_ID when the cache is full and nothing may be evicted."""
        if len(self.sessions) >= self.max_slots and not self._evict_for(privileged, len(partitions), now_ms):
            return INVALID_SESSION_ID
        session_id = INVALID_SESSION_ID
        while session_id == INVALID_SESSION_ID or session_id in self.sessions:
            session_id = self._rng.randint(1, 2**31 - 1)
        self.sessions[session_id] = FetchSession(session_id, privileged, uses_topic_ids, partitions, now_ms, now_ms)
        return session_id

    def _evict_for(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Kafka's ``tryEvict``: a stale session first, else the least valuable one the newcomer outranks."""
        if not self.sessions:
            return False
        stale = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - stale.last_used_ms > self.eviction_ms:
            return self._evict(stale)
        settled = [s for s in self.sessions.values() if now_ms - s.created_ms > self.eviction_ms]
        candidates = [s for s in self.sessions.values() if not s.privileged or s in settled] if privileged else settled
        if not candidates:
            return False
        weakest = min(candidates, key=lambda s: (s.privileged, len(s.partitions), s.id))
        if (privileged, size, 0) < (weakest.privileged, len(weakest.partitions), weakest.id):
            return False
        return self._evict(weakest)

    def _evict(self, session: FetchSession) -> bool:
        del self.sessions[session.id]
        self.evictions += 1
        return True


@attrs.define(slots=True)
class FetchContext:
    """How one request is answered: which partitions to read, and which of them to put in the response.

    ``session`` is set for an incremental fetch (answer only what changed);
    ``create`` for a full fetch that opens a session once answered;
    ``error`` for a request refused for its session alone.
    """

    wanted: list[tuple[str | None, uuid.UUID | None, FetchPartition]]
    error: ErrorCode = ErrorCode.none
    session: FetchSession | None = None
    #: The epoch the session must still have when the answer is written (a concurrent request moves it on).
    expected_epoch: int = 0
    create: bool = False
    response_session_id: int = INVALID_SESSION_ID


def new_context(cache: FetchSessionCache, request: FetchRequest, names: list[str | None], follower: bool,
                now_ms: int, version_uses_topic_ids: bool,
                resolve: Callable[[uuid.UUID], str | None] = lambda _: None) -> FetchContext:
    """Kafka's ``FetchManager.newContext``: the context of a request, its session updated or created as it asks.

    ``resolve`` names a topic id: a session partition whose topic this
    broker did not know yet (its metadata was behind the fetcher's) is named
    as soon as it does, as Kafka's ``maybeResolveUnknownName``.
    """
    wanted = [(name, topic.topic_id, part) for topic, name in zip(request.topics, names) for part in topic.partitions]
    session_id, epoch = request.session_id, request.session_epoch
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        if session_id != INVALID_SESSION_ID:
            cache.remove(session_id)
        return FetchContext(wanted, create=epoch == INITIAL_EPOCH)
    session = cache.get(session_id)
    if session is None:
        return FetchContext([], ErrorCode.fetch_session_id_not_found)
    if session.epoch != epoch:
        return FetchContext([], ErrorCode.invalid_fetch_session_epoch)
    if session.uses_topic_ids != version_uses_topic_ids:
        return FetchContext([], ErrorCode.fetch_session_topic_id_error)
    forgotten = [(f.topic_id if session.uses_topic_ids else f.topic, index)
                 for f in request.forgotten_topics_data for index in f.partitions]
    session.update(wanted, forgotten)
    if not session.partitions:
        cache.remove(session.id)
        return FetchContext(wanted)
    if session.uses_topic_ids:
        for cached in session.partitions.values():
            if cached.topic is None and cached.topic_id is not None:
                cached.topic = resolve(cached.topic_id)
    session.last_used_ms = now_ms
    session.epoch = next_epoch(session.epoch)
    return FetchContext([(c.topic, c.topic_id, c.request) for c in session.partitions.values()], session=session,
                        expected_epoch=session.epoch, response_session_id=session.id)


def must_respond(cached: CachedPartition, records: int, high_watermark: int, log_start_offset: int,
                 error_code: int, preferred_read_replica: int, diverging: bool) -> bool:
    """Kafka's ``maybeUpdateResponseData``: whether an incremental response names this partition (and remember
    what it was told)."""
    respond = records > 0 or preferred_read_replica >= 0 or diverging
    if cached.high_watermark != high_watermark:
        cached.high_watermark = high_watermark
        respond = True
    if cached.log_start_offset != log_start_offset:
        cached.log_start_offset = log_start_offset
        respond = True
    if error_code:
        cached.high_watermark = -1  # so the partition is named again once the error is gone
        respond = True
    return respond
