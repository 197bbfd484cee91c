"""The voter set in force on this node, and where to reach its peers.

With static voters (``controller.quorum.voters``, kraft.version 0) the set
is configuration. With a dynamic quorum (KIP-853, kraft.version 1) it is the
latest VotersRecord appended to the log, or held by the latest snapshot, or
the bootstrap snapshot ``0-0`` that ``josef storage format --standalone`` or
``--initial-controllers`` writes. It changes whenever the log does (an
append, a truncation, a snapshot replacing it), so :class:`Membership` is
the one place that follows the log's voter records, and tells the parts
whose state depends on the set (a leader's replica progress, its
check-quorum, an observer's election timer) when it changes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from josef.protocol.records import iter_batches

from .log import OffsetAndEpoch, RaftLog
from .voters import VoterInfo, VoterSet, VoterSetHistory


class Membership:
    """The voters in force (:attr:`voter_ids`, their endpoints in :attr:`voters`) and every endpoint known.

    A node that knows no voter asks its bootstrap servers
    (``controller.quorum.bootstrap.servers``, destination ids -2, -3, ...),
    which answer with the leader.
    """

    def __init__(self, node_id: int, voters: Mapping[int, tuple[str, int]], log: RaftLog, listener: str,
                 bootstrap_servers: Sequence[tuple[str, int]]) -> None:
        self._node_id = node_id
        self._log = log
        self._listener = listener
        self.history = VoterSetHistory({v: VoterInfo(v, None, ((listener, host, port),))
                                        for v, (host, port) in voters.items()})
        self._load_history()
        self.bootstrap = {-2 - i: tuple(address) for i, address in enumerate(bootstrap_servers)}
        if not self.history.current() and not self.bootstrap:
            raise ValueError("a KRaft quorum needs at least one voter (controller.quorum.voters) or "
                             "controller.quorum.bootstrap.servers")
        #: Endpoints learnt from responses (the leader's, for an observer that found it through a bootstrap server).
        self._endpoints: dict[int, tuple[str, int]] = {}
        self.voters: dict[int, tuple[str, int]] = {}
        self.voter_ids: frozenset[int] = frozenset()
        self.is_voter = False
        self._listeners: list[Callable[[frozenset[int]], None]] = []
        self._refresh()

    def subscribe(self, listener: Callable[[frozenset[int]], None]) -> None:
        """Call ``listener(previous voter ids)`` whenever the voter set in force changes."""
        self._listeners.append(listener)

    @property
    def kraft_version(self) -> int:
        """1 once the log holds a KRaftVersionRecord (a dynamic quorum, KIP-853), else 0."""
        return 1 if self.history.dynamic else 0

    def current(self) -> VoterSet:
        """The voters in force: the latest VotersRecord appended, else the static ones."""
        return self.history.current()

    def endpoint(self, node_id: int) -> tuple[str, int] | None:
        """Where to reach ``node_id``: a voter, a node a response named, or a bootstrap server (ids -2, -3, ...)."""
        return self.voters.get(node_id) or self._endpoints.get(node_id) or self.bootstrap.get(node_id)

    def learn_endpoints(self, response: Any) -> None:
        for node in getattr(response, "node_endpoints", None) or ():
            if node.node_id >= 0:
                self._endpoints[int(node.node_id)] = (node.host, int(node.port))

    def learn(self, batches: bytes) -> None:
        """Batches were appended to the log: their voter records are in force at once."""
        if self.history.scan(batches):
            self._refresh()

    def truncate(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: the voter records it lost are no longer in force."""
        if self.history.truncate(end_offset):
            self._refresh()

    def load_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """A downloaded snapshot replaced the log: the voters are the ones it holds."""
        self.history = VoterSetHistory(self.history.static)
        self.history.scan(data, offset_base=snapshot_id.offset - 1)
        self._refresh()

    def _load_history(self) -> None:
        log = self._log
        snapshot = log.latest_snapshot_id()
        if snapshot is not None:
            data = log.read_snapshot(snapshot, 0, log.snapshot_size(snapshot) or 0) or b""
            self.history.scan(data, offset_base=snapshot.offset - 1)
        offset = log.start_offset
        while offset < log.end_offset:
            chunk = log.read(offset, 8 * 1024 * 1024)
            last = None
            for _, header in iter_batches(chunk):
                last = header.last_offset
            if last is None or last < offset:
                break
            self.history.scan(chunk)
            offset = last + 1

    def _refresh(self) -> None:
        """Put the current voter set in force and tell the subscribers."""
        current = self.history.current()
        previous = self.voter_ids
        self.voters = {v: e for v, info in current.items() if (e := info.endpoint(self._listener)) is not None}
        self.voter_ids = frozenset(current)
        self.is_voter = self._node_id in self.voter_ids
        for listener in self._listeners:
            listener(previous)
