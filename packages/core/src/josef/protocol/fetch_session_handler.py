"""The fetcher's side of an incremental fetch session (KIP-227): Kafka's client ``FetchSessionHandler``.

A fetcher that keeps a session sends, after the session's first (full)
request, only the partitions whose fetch parameters changed since it last
sent them and the partitions it no longer wants (``forgotten_topics_data``);
the broker remembers the rest (:mod:`josef.server.fetch_session`). A
session error, or a request that failed, starts over with a full request.
"""

from __future__ import annotations

from typing import Any, Hashable

from kio.schema.errors import ErrorCode

INITIAL_EPOCH = 0
#: Top-level errors after which the session is gone or out of step: the next request is full.
SESSION_ERRORS = frozenset({ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch,
                            ErrorCode.fetch_session_topic_id_error})


class FetchSessionHandler:
    """Which partitions the next fetch names, and the session id and epoch it carries."""

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        #: What the broker's session holds for each partition: the parameters last sent.
        self._sent: dict[Hashable, Any] = {}
        self._next: dict[Hashable, Any] | None = None

    def build(self, wanted: dict[Hashable, Any]) -> tuple[list[Hashable], list[Hashable]]:
        """The keys of ``wanted`` (partition -> its request entry) to send, and the keys to forget.

        A full request (no session yet) sends every partition and forgets none.
        """
        self._next = dict(wanted)
        if self.epoch == INITIAL_EPOCH:
            return list(wanted), []
        sent = self._sent
        changed = [key for key, entry in wanted.items() if sent.get(key) != entry]
        forgotten = [key for key in sent if key not in wanted]
        return changed, forgotten

    def handle_response(self, error_code: int, session_id: int) -> bool:
        """Take the response's top-level error and session id; False when the session had to start over."""
        if error_code in SESSION_ERRORS:
            self.reset()
            return False
        if self.epoch == INITIAL_EPOCH:
            self.session_id = session_id
            self.epoch = 1 if session_id else INITIAL_EPOCH
        else:
            self.epoch = 1 if self.epoch == 2**31 - 1 else self.epoch + 1
        self._sent = self._next or {}
        return True

    def reset(self) -> None:
        """Forget the session (an error, a new connection): the next request is full and opens a new one."""
        self.session_id, self.epoch, self._sent, self._next = 0, INITIAL_EPOCH, {}, None
