"""A sans-IO KRaft replica: Kafka's KafkaRaftClient as a deterministic state machine.

The node never touches a socket, a clock or a thread. Its owner (a network
driver, or a test's simulated network) feeds it

* inbound requests (:meth:`RaftNode.handle_request`) and answers them with what
  it returns (``None`` means the answer is deferred: a Fetch long poll);
* responses to the requests it sent (:meth:`RaftNode.handle_response`) or the
  news that one failed (:meth:`RaftNode.handle_send_failure`);
* the passage of time (:meth:`RaftNode.poll`), which also hands back everything
  the node wants sent: requests, and the deferred responses;
* appends as leader (:meth:`RaftNode.append`) and snapshots of committed state
  (:meth:`RaftNode.create_snapshot`),

and reads committed batches, snapshots to load and leadership changes from
:meth:`RaftNode.drain_events`. Every message is a kio request/response object
at the version Kafka 4.x uses, so the driver only frames and encodes it.

The roles and their transitions are Kafka's (``QuorumState``): Unattached,
Prospective (KIP-996 pre-vote), Candidate, Leader, Follower and Resigned, with
observers (nodes outside the static voter set) only ever unattached or
following. Replication is pull-based: followers fetch, the leader answers with
records, its high watermark, a diverging epoch (the follower truncates) or a
snapshot id (the follower downloads it with FetchSnapshot).

Where this departs from Kafka 4.0, on purpose:

* a parked Fetch is also answered when the high watermark moves, so
  followers learn of commits without waiting out ``fetch_max_wait_ms``;
* a follower told by EndQuorumEpoch that its leader resigned grants
  pre-votes again (as if it had not reached the leader), so the preferred
  successor wins at once instead of after the others' fetch timeouts;
* a Fetch answered with an error that teaches nothing (a voter that does not
  know the leader either) is retried after ``retry_backoff_ms``, not at once;
* a candidate that loses backs off (binary exponential, capped by
  ``election_backoff_max_ms``) and then runs a new pre-vote;
* with static voters (``controller.quorum.voters``, kraft.version 0),
  requests naming a non-voter, or reaching an observer, get
  INCONSISTENT_VOTER_SET as in Kafka 3.x.

Dynamic quorums (KIP-853, kraft.version 1): the voter set is the latest
VotersRecord appended to the log (or held by the latest snapshot, or the
bootstrap snapshot ``0-0`` that ``josef storage format --standalone`` or
``--initial-controllers`` writes), not configuration. A node that knows no
voter asks its bootstrap servers (``controller.quorum.bootstrap.servers``,
destination ids -2, -3, ...), which answer with the leader. The leader
serves AddRaftVoter and RemoveRaftVoter one change at a time by appending a
new VotersRecord, in force (for elections and the high watermark) as soon as
it is appended, and answers once it is committed.
"""

from __future__ import annotations

import enum
import random
from typing import Any, Callable, Mapping, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.records import build_batch, iter_batches

from . import messages as m
from .log import FetchPosition, OffsetAndEpoch, RaftLog, truncation_offset, validate_offset_and_epoch
from .quorum_state import ElectionState, QuorumStateStore
from .voters import NO_DIRECTORY_ID, VoterInfo, VoterSetHistory, control_records, voters_control

NONE = ErrorCode.none
#: Kafka's KafkaRaftClient.MAX_BATCH_SIZE_BYTES: the largest batch a leader appends.
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Kafka's RETRY_BACKOFF_BASE_MS, the unit of the exponential election backoff.
ELECTION_BACKOFF_BASE_MS = 100
#: Kafka's LeaderState.CHECK_QUORUM_TIMEOUT_FACTOR: the leader resigns when a majority
#: has not fetched within 1.5 fetch timeouts.
CHECK_QUORUM_TIMEOUT_FACTOR = 1.5
#: Kafka's LeaderState.OBSERVER_SESSION_TIMEOUT_MS: observers leave DescribeQuorum after this.
OBSERVER_SESSION_TIMEOUT_MS = 300_000
_FOREVER = 2**62


class Role(enum.Enum):
    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


class NotLeaderError(Exception):
    """An append or snapshot needed the leader; ``leader_id``/``epoch`` say who is, as far as known."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader (leader {leader_id}, epoch {epoch})")
        self.leader_id, self.epoch = leader_id, epoch


class RaftInvariantError(Exception):
    """A peer's message contradicts what Raft guarantees (two leaders in one epoch, truncation below the HW)."""


@attrs.frozen
class RaftConfig:
    """The ``controller.quorum.*`` settings, with Kafka's defaults."""

    election_timeout_ms: int = 1000
    election_backoff_max_ms: int = 1000
    fetch_timeout_ms: int = 2000
    request_timeout_ms: int = 2000
    retry_backoff_ms: int = 20
    #: Kafka's KafkaRaftClient.MAX_FETCH_WAIT_MS: how long the leader parks an empty Fetch.
    fetch_max_wait_ms: int = 500
    #: Max bytes asked for in Fetch and FetchSnapshot (Kafka: MAX_FETCH_SIZE_BYTES, 8 MiB).
    fetch_max_bytes: int = 8 * 1024 * 1024
    #: The listener name announced with the leader's endpoint.
    listener_name: str = "CONTROLLER"

    #: server.properties keys (Kafka's names) and the fields they set.
    KEYS = {
        "controller.quorum.election.timeout.ms": "election_timeout_ms",
        "controller.quorum.election.backoff.max.ms": "election_backoff_max_ms",
        "controller.quorum.fetch.timeout.ms": "fetch_timeout_ms",
        "controller.quorum.request.timeout.ms": "request_timeout_ms",
        "controller.quorum.retry.backoff.ms": "retry_backoff_ms",
    }

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], listener_name: str = "CONTROLLER") -> RaftConfig:
        """From server.properties-style keys (Kafka's names); missing keys keep Kafka's defaults."""
        values = {field: int(props[key]) for key, field in cls.KEYS.items() if props.get(key) is not None}
        return cls(listener_name=listener_name, **values)


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


@attrs.frozen
class CommittedBatch:
    """One committed batch of the log, in offset order; ``data`` is the batch as stored (magic v2)."""

    base_offset: int
    last_offset: int
    epoch: int
    is_control: bool
    data: bytes


@attrs.frozen
class SnapshotLoaded:
    """Replace the state machine by this snapshot (header, data batches, footer); commits continue after it."""

    snapshot_id: OffsetAndEpoch
    data: bytes


@attrs.frozen
class LeaderChanged:
    """The known leader (``None`` during an election) of ``epoch``.

    The node announces its own leadership only once every batch before its
    epoch's start has been delivered, as Kafka's listeners see it.
    """

    leader_id: int | None
    epoch: int


RaftEvent = CommittedBatch | SnapshotLoaded | LeaderChanged


# ------------------------------------------------------------------ per-role state


@attrs.define
class _Tally:
    """Votes of one (pre-)election (Kafka's EpochElection); the local voter grants itself."""

    voters: frozenset[int]
    granted: set[int] = attrs.field(factory=set)
    rejected: set[int] = attrs.field(factory=set)

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def record(self, voter: int, granted: bool) -> None:
        if voter in self.voters and voter not in self.granted and voter not in self.rejected:
            (self.granted if granted else self.rejected).add(voter)

    @property
    def won(self) -> bool:
        return len(self.granted) >= self.majority

    @property
    def lost(self) -> bool:
        return len(self.voters) - len(self.rejected) < self.majority

    def unrecorded(self) -> list[int]:
        return sorted(self.voters - self.granted - self.rejected)


@attrs.define
class _Progress:
    """What the leader knows of one replica (Kafka's LeaderState.ReplicaState)."""

    end_offset: int | None = None
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    last_fetch_leader_end: int | None = None
    acknowledged: bool = False
    directory_id: Any = None


@attrs.define
class _Deferred:
    """A parked Fetch: answered when data arrives, the high watermark moves or ``deadline`` passes."""

    source: int
    request: Any
    partition: Any
    replica_id: int
    deadline: int
    high_watermark: int | None


@attrs.define
class _Change:
    """A voter change the leader appended; answered once committed, or when ``deadline`` passes."""

    source: int
    request: Any
    offset: int
    deadline: int
    respond: Callable[..., Any]


@attrs.define
class _Leader:
    epoch_start_offset: int
    voters: dict[int, _Progress]
    granting: frozenset[int]
    check_quorum_deadline: int
    high_watermark: int | None = None
    observers: dict[int, _Progress] = attrs.field(factory=dict)
    fetched_voters: set[int] = attrs.field(factory=set)
    deferred: list[_Deferred] = attrs.field(factory=list)
    pending: _Change | None = None


@attrs.define
class _Download:
    snapshot_id: OffsetAndEpoch
    data: bytearray = attrs.field(factory=bytearray)


@attrs.define
class _Follower:
    fetch_deadline: int
    has_fetched: bool = False
    download: _Download | None = None


class _Requests:
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


# ------------------------------------------------------------------ the node


class RaftNode:
    """One replica of the ``__cluster_metadata`` partition: a voter if its id is in ``voters``, else an observer.

    Construction reads the quorum-state store and starts where Kafka's
    ``QuorumState.initialize`` does: a former leader as Resigned in its
    epoch, a former candidate as Candidate, a follower as Follower, anyone
    else Unattached. ``now_ms`` is the driver's clock (wall-clock ms in
    production, simulated time in tests); every call takes the current time.

    Driving contract: after any call, call :meth:`poll` and send what it
    returns; call it again at :attr:`next_poll_ms` if nothing else happens
    first. The node is single-threaded: one caller at a time.
    """

    def __init__(
        self,
        node_id: int,
        voters: Mapping[int, tuple[str, int]],
        log: RaftLog,
        state_store: QuorumStateStore,
        *,
        cluster_id: str,
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
        now_ms: int = 0,
        bootstrap_servers: Sequence[tuple[str, int]] = (),
        directory_id: Any = None,
        local_endpoints: Sequence[tuple[str, str, int]] = (),
    ) -> None:
        self.node_id = node_id
        #: This replica's directory id (meta.properties ``directory.id``) and controller endpoints: a voter
        #: whose endpoints in the voter set differ sends UpdateRaftVoter to its leader (KIP-853).
        self.directory_id = directory_id
        self.local_endpoints = tuple(local_endpoints)
        self._update_after = 0
        self.log = log
        self.cluster_id = cluster_id
        self.config = config or RaftConfig()
        listener = self.config.listener_name
        self._history = VoterSetHistory({v: VoterInfo(v, None, ((listener, host, port),))
                                         for v, (host, port) in voters.items()})
        self._load_history()
        self._bootstrap = {-2 - i: tuple(address) for i, address in enumerate(bootstrap_servers)}
        if not self._history.current() and not self._bootstrap:
            raise ValueError("a KRaft quorum needs at least one voter (controller.quorum.voters) or "
                             "controller.quorum.bootstrap.servers")
        #: Endpoints learnt from responses (the leader's, for an observer that found it through a bootstrap server).
        self._endpoints: dict[int, tuple[str, int]] = {}
        self.voters: dict[int, tuple[str, int]] = {}
        self._voter_ids: frozenset[int] = frozenset()
        self.is_voter = False
        self._leader: _Leader | None = None
        self._refresh_voters()
        self._store = state_store
        self._rng = rng or random.Random()
        self._now = now_ms
        self._requests = _Requests(self.config)
        self._update_requests = _Requests(self.config)
        self._outbox: list[Outbound] = []
        self._hw: int | None = None
        self._next_delivery: int | None = None
        self._announced: tuple[int | None, int] | None = None
        self.next_poll_ms = now_ms
        # Role state; every transition sets all of these.
        self.role = Role.UNATTACHED
        self.epoch = 0
        self.leader_id: int | None = None
        self.voted_id: int | None = None
        self._deadline = _FOREVER  # election timeout (unattached, prospective, candidate, resigned)
        self._backoff_until: int | None = None  # candidate lost and is backing off
        self._retries = 1
        self._tally: _Tally | None = None
        self._follower: _Follower | None = None
        self._unacked: set[int] = set()  # resigned: voters yet to acknowledge EndQuorumEpoch
        self._preferred: list[int] = []
        self._initialize()

    # ---------------------------------------------------------------- public surface

    @property
    def kraft_version(self) -> int:
        """1 once the log holds a KRaftVersionRecord (a dynamic quorum, KIP-853), else 0."""
        return 1 if self._history.dynamic else 0

    def voter_set(self) -> dict[int, VoterInfo]:
        """The voters in force: the latest VotersRecord appended, else the static ones."""
        return dict(self._history.current())

    def endpoint(self, node_id: int) -> tuple[str, int] | None:
        """Where to reach ``node_id``: a voter, a node a response named, or a bootstrap server (ids -2, -3, ...)."""
        return self.voters.get(node_id) or self._endpoints.get(node_id) or self._bootstrap.get(node_id)

    # ---------------------------------------------------------------- voter sets (KIP-853)

    def _load_history(self) -> None:
        snapshot = self.log.latest_snapshot_id()
        if snapshot is not None:
            data = self.log.read_snapshot(snapshot, 0, self.log.snapshot_size(snapshot) or 0) or b""
            self._history.scan(data, offset_base=snapshot.offset - 1)
        offset = self.log.start_offset
        while offset < self.log.end_offset:
            chunk = self.log.read(offset, 8 * 1024 * 1024)
            last = None
            for _, header in iter_batches(chunk):
                last = header.last_offset
            if last is None or last < offset:
                break
            self._history.scan(chunk)
            offset = last + 1

    def _refresh_voters(self) -> None:
        """Put the current voter set in force: endpoints, membership and the leader's replica progress."""
        current = self._history.current()
        listener = self.config.listener_name
        self.voters = {v: e for v, info in current.items() if (e := info.endpoint(listener)) is not None}
        self._voter_ids = frozenset(current)
        was_voter, self.is_voter = self.is_voter, self.node_id in self._voter_ids
        leader = self._leader
        if leader is not None:
            if set(leader.voters) != self._voter_ids:
                # A new set gets a full check-quorum period (a lone voter never ran the timer).
                leader.fetched_voters.clear()
                leader.check_quorum_deadline = self._now + int(self.config.fetch_timeout_ms
                                                               * CHECK_QUORUM_TIMEOUT_FACTOR)
            for v in [v for v in leader.voters if v not in self._voter_ids]:
                leader.observers[v] = leader.voters.pop(v)
            for v in self._voter_ids:
                if v not in leader.voters:
                    leader.voters[v] = leader.observers.pop(v, None) or _Progress()
            if self._maybe_advance_hw():
                self._hw_advanced()
        elif self.is_voter and not was_voter and getattr(self, "role", None) is Role.UNATTACHED:
            self._deadline = self._now + self._random_election_timeout()

    def _learn(self, batches: bytes) -> None:
        if self._history.scan(batches):
            self._refresh_voters()

    @property
    def high_watermark(self) -> int | None:
        """The highest offset known committed (exclusive), ``None`` until learnt after a start.

        Never decreases while the process lives; a new leader keeps exposing
        the value it knew until its own high watermark is established.
        """
        return self._hw

    def append(self, payloads: Sequence[bytes], now_ms: int, *, epoch: int | None = None,
               timestamp_ms: int | None = None) -> int:
        """Append ``payloads`` (record values) as one batch of the current epoch; returns its last offset.

        The batch is flushed before the call returns. Raises
        :class:`NotLeaderError` unless this node leads (the epoch ``epoch``
        when given). Committed once :meth:`drain_events` delivers it.
        """
        self._now = now_ms
        if self.role is not Role.LEADER or (epoch is not None and epoch != self.epoch):
            raise NotLeaderError(self.leader_id, self.epoch)
        if not payloads:
            raise ValueError("append needs at least one record")
        ts = now_ms if timestamp_ms is None else timestamp_ms
        batch = build_batch([(None, p, ts) for p in payloads], base_offset=self.log.end_offset,
                            leader_epoch=self.epoch)
        if len(batch) > MAX_BATCH_BYTES:
            raise ValueError(f"batch of {len(batch)} bytes exceeds {MAX_BATCH_BYTES}")
        result = self.log.append_as_leader(batch, self.epoch)
        self.log.flush()
        self._leader_end_offset_updated()
        self.next_poll_ms = now_ms
        return result.last_offset

    def resign(self, now_ms: int) -> None:
        """Step down gracefully: as leader, become Resigned and send EndQuorumEpoch naming successors.

        The successors are the other voters, most caught up first, so the
        best placed one starts an election at once.
        """
        self._now = now_ms
        if self.role is Role.LEADER:
            self._to_resigned(self._voters_by_end_offset())
        self.next_poll_ms = now_ms

    def create_snapshot(self, end_offset: int, payloads: Sequence[bytes], now_ms: int, *,
                        trim: bool = False) -> OffsetAndEpoch:
        """Store a snapshot of the state machine after every record below ``end_offset`` (committed).

        ``payloads`` are the records that rebuild that state. ``trim`` drops
        the log prefix the snapshot replaces (followers behind it then fetch
        the snapshot). Returns the snapshot id ``(end_offset, epoch)``.
        """
        self._now = now_ms
        snapshot_id, control = self.plan_snapshot(end_offset)
        if self.log.snapshot_size(snapshot_id) is None:
            self.log.create_snapshot(snapshot_id, m.snapshot_bytes(snapshot_id, payloads, now_ms, control=control))
        if trim:
            self.log.delete_before_snapshot(snapshot_id)
        return snapshot_id

    def plan_snapshot(self, end_offset: int) -> tuple[OffsetAndEpoch, Sequence[tuple[int, bytes]]]:
        """The id of a snapshot ending at ``end_offset`` (committed), and the control records it starts with.

        For an owner that builds and writes the snapshot elsewhere (a worker
        thread) rather than through :meth:`create_snapshot`.
        """
        if self._hw is None or end_offset > self._hw or end_offset <= 0:
            raise ValueError(f"offset {end_offset} is not committed (high watermark {self._hw})")
        if end_offset < self.log.start_offset:
            raise ValueError(f"offset {end_offset} is below the log start {self.log.start_offset}")
        snapshot_id = OffsetAndEpoch(end_offset, self._epoch_before(end_offset))
        control = (voters_control(self._history.at(end_offset - 1), with_version=True)
                   if self._history.dynamic else ())
        return snapshot_id, control

    def drain_events(self, max_bytes: int = 8 * 1024 * 1024) -> list[RaftEvent]:
        """What the owner's state machine must learn, in order: leader changes, snapshot loads, committed batches.

        Committed batches are read from the log below the high watermark, at
        most about ``max_bytes`` per call (call again while it returns some).
        A :class:`SnapshotLoaded` comes first when the next batch to deliver
        is no longer in the log (a downloaded snapshot, or a start with one).
        """
        events: list[RaftEvent] = []
        current = (self.leader_id, self.epoch)
        own = self.leader_id == self.node_id
        if not own and current != self._announced:
            events.append(LeaderChanged(*current))
            self._announced = current
        hw = self._hw
        if hw is not None:
            self._deliver(hw, max_bytes, events)
        if own and self.role is Role.LEADER and current != self._announced:
            assert self._leader is not None
            if self._next_delivery is not None and self._next_delivery >= self._leader.epoch_start_offset:
                events.append(LeaderChanged(*current))
                self._announced = current
        return events

    # ---------------------------------------------------------------- driver entry points

    def poll(self, now_ms: int) -> list[Outbound]:
        """Run timers (elections, fetch timeouts, long polls, retries) and return what to send.

        Afterwards :attr:`next_poll_ms` is when the node next needs a poll
        unless a message arrives first; any other call may bring it forward.
        """
        self._now = now_ms
        self._requests.expire(now_ms)
        wake = _FOREVER
        for _ in range(8):  # a transition may enable the next one (single voter: prospective -> leader)
            role = self.role
            wake = self._poll_role(now_ms)
            if self.role is role:
                break
        if self._leader is not None:
            wake = min(wake, self._poll_deferred(now_ms))
        out, self._outbox = self._outbox, []
        self.next_poll_ms = max(now_ms + 1, wake)
        return out

    def handle_request(self, source_id: int, request: Any, now_ms: int) -> Any | None:
        """Answer an inbound Raft request; ``None`` means deferred (it comes out of :meth:`poll` later)."""
        self._now = now_ms
        self.next_poll_ms = now_ms
        api = type(request).__api_key__
        if api == 1:
            return self._on_fetch_request(source_id, request, now_ms)
        if api == 52:
            return self._on_vote_request(request, now_ms)
        if api == 53:
            return self._on_begin_quorum_epoch_request(request, now_ms)
        if api == 54:
            return self._on_end_quorum_epoch_request(request, now_ms)
        if api == 59:
            return self._on_fetch_snapshot_request(request, now_ms)
        if api == 55:
            return self._on_describe_quorum_request(request, now_ms)
        if api == 80:
            return self._on_add_raft_voter_request(source_id, request, now_ms)
        if api == 81:
            return self._on_remove_raft_voter_request(source_id, request, now_ms)
        if api == 82:
            return self._on_update_raft_voter_request(source_id, request, now_ms)
        raise ValueError(f"not a Raft request: {type(request).__name__}")

    def handle_response(self, source_id: int, request: Any, response: Any, now_ms: int) -> None:
        """A response to ``request`` (the object this node sent) from ``source_id``; stale ones are ignored."""
        self._now = now_ms
        self.next_poll_ms = now_ms
        if type(response).__api_key__ == 82:
            if self._update_requests.expects(source_id, request):
                ok = response.error_code == NONE
                self._update_requests.done(source_id, request, ok, now_ms)
                # Succeeded: the new set arrives by Fetch. Refused: try again later, not at network speed.
                self._update_after = now_ms + self.config.election_timeout_ms
            return
        if not self._requests.expects(source_id, request):
            return
        for node in getattr(response, "node_endpoints", None) or ():
            if node.node_id >= 0:
                self._endpoints[int(node.node_id)] = (node.host, int(node.port))
        api = type(response).__api_key__
        handler: Callable[[int, Any, Any, int], bool] = {
            1: self._on_fetch_response, 52: self._on_vote_response, 53: self._on_begin_quorum_epoch_response,
            54: self._on_end_quorum_epoch_response, 59: self._on_fetch_snapshot_response,
        }[api]
        ok = handler(source_id, request, response, now_ms)
        self._requests.done(source_id, request, ok, now_ms)

    def handle_send_failure(self, destination: int, request: Any, now_ms: int) -> None:
        """The request could not be sent or its connection failed: back off and retry later."""
        self._now = now_ms
        self.next_poll_ms = now_ms
        self._requests.done(destination, request, False, now_ms)
        if self._update_requests.expects(destination, request):
            self._update_requests.done(destination, request, False, now_ms)
            self._update_after = now_ms + self.config.election_timeout_ms

    # ---------------------------------------------------------------- transitions (Kafka's QuorumState)

    def _initialize(self) -> None:
        stored = self._store.read() or ElectionState(0)
        log_epoch = self.log.last_fetched_epoch
        if stored.epoch < log_epoch:
            self._to_unattached(log_epoch, self._random_election_timeout())
        elif self.is_voter and stored.leader_id == self.node_id:
            # A former leader restarts resigned in its epoch: it cannot vote in it again, and
            # records it lost unflushed cannot be re-written under the same (offset, epoch).
            self._set_role(Role.RESIGNED, stored.epoch, self.node_id, stored.voted_id)
            self._deadline = self._now + self._random_election_timeout()
            self._unacked = set(self._voter_ids - {self.node_id})
            self._preferred = []
        elif self.is_voter and stored.voted_id == self.node_id:
            self._set_role(Role.CANDIDATE, stored.epoch, None, self.node_id)
            self._tally = _Tally(self._voter_ids, {self.node_id})
            self._deadline = self._now + self._random_election_timeout()
            self._persist()
        elif stored.leader_id in self._voter_ids and stored.leader_id != self.node_id:
            self._to_follower(stored.epoch, stored.leader_id)
        else:
            self._set_role(Role.UNATTACHED, stored.epoch, None, stored.voted_id if self.is_voter else None)
            self._deadline = self._now + self._random_election_timeout() if self.is_voter else _FOREVER
            self._persist()
        if self._voter_ids == {self.node_id}:
            # The only voter elects itself at once (Kafka: isOnlyVoter -> candidate).
            if self.role is Role.CANDIDATE:
                self._to_leader()
            elif self.role is not Role.LEADER:
                self._to_prospective()

    def _persist(self) -> None:
        self._store.write(ElectionState(self.epoch, self.leader_id, self.voted_id))

    def _set_role(self, role: Role, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        """Switch role in memory; pending requests are forgotten, parked fetches answered."""
        old_leader = self._leader
        self.role, self.epoch, self.leader_id, self.voted_id = role, epoch, leader_id, voted_id
        self._requests.reset()
        self._update_requests.reset()
        self._tally = self._leader = self._follower = None
        self._backoff_until = None
        self._deadline = _FOREVER
        if old_leader is not None:
            change = old_leader.pending
            if change is not None:
                self._outbox.append(Outbound(change.source, change.respond(
                    ErrorCode.not_leader_or_follower, "the leader changed before the voter change committed"),
                    change.request))
            for parked in old_leader.deferred:
                self._outbox.append(Outbound(parked.source, self._fetch_error(parked.partition), parked.request))

    def _durable(self, role: Role, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        """Persist the election state first, then act on it (Kafka's durableTransitionTo)."""
        self._store.write(ElectionState(epoch, leader_id, voted_id))
        self._set_role(role, epoch, leader_id, voted_id)

    def _to_unattached(self, epoch: int, election_timeout_ms: int | None = None) -> None:
        """A new epoch with no known leader; in the same epoch only when leaving Prospective (keeps the vote)."""
        voted = self.voted_id if epoch == self.epoch else None
        if election_timeout_ms is None:
            election_timeout_ms = self._random_election_timeout()
            if self.role in (Role.UNATTACHED, Role.CANDIDATE, Role.RESIGNED) or (
                    self.role is Role.PROSPECTIVE and self._tally is not None and not self._tally.lost):
                election_timeout_ms = max(0, self._deadline - self._now)
        self._durable(Role.UNATTACHED, epoch, None, voted)
        self._deadline = self._now + election_timeout_ms if self.is_voter else _FOREVER

    def _to_follower(self, epoch: int, leader_id: int) -> None:
        if leader_id == self.node_id:
            raise RaftInvariantError(f"node {self.node_id} told it leads epoch {epoch} it never won")
        voted = self.voted_id if epoch == self.epoch else None
        self._durable(Role.FOLLOWER, epoch, leader_id, voted)
        self._follower = _Follower(self._now + self.config.fetch_timeout_ms)

    def _to_prospective(self) -> None:
        """Start a pre-vote (KIP-996): no epoch bump and nothing persisted."""
        retries = self._retries + 1 if self.role is Role.CANDIDATE else 1
        self._set_role(Role.PROSPECTIVE, self.epoch, self.leader_id, self.voted_id)
        self._retries = retries
        self._tally = _Tally(self._voter_ids, {self.node_id})
        self._deadline = self._now + self._random_election_timeout()
        if self._tally.won:
            self._to_candidate()

    def _to_candidate(self) -> None:
        """Bump the epoch and vote for ourselves, durably, before asking anyone."""
        self._durable(Role.CANDIDATE, self.epoch + 1, None, self.node_id)
        self._tally = _Tally(self._voter_ids, {self.node_id})
        self._deadline = self._now + self._random_election_timeout()
        if self._tally.won:
            self._to_leader()

    def _to_leader(self) -> None:
        assert self._tally is not None and self._tally.won
        granting = frozenset(self._tally.granted)
        self._durable(Role.LEADER, self.epoch, self.node_id, self.node_id)
        start = self.log.end_offset
        check_ms = int(self.config.fetch_timeout_ms * CHECK_QUORUM_TIMEOUT_FACTOR)
        self._leader = _Leader(start, {v: _Progress() for v in self._voter_ids}, granting, self._now + check_ms)
        self._unacked = set(self._voter_ids - {self.node_id})
        # The high watermark can only move once a record of this epoch is on a majority:
        # write one at once (Kafka's appendStartOfEpochControlRecords).
        batch = m.leader_change_batch(base_offset=start, epoch=self.epoch, leader_id=self.node_id,
                                      voters=self._voter_ids, granting_voters=granting, timestamp_ms=self._now)
        self.log.append_as_leader(batch, self.epoch)
        if self._history.dynamic and self._history.last_offset() == -1:
            # The voters came from the bootstrap snapshot, which followers never fetch: put them in the
            # log (Kafka's appendStartOfEpochControlRecords does the same).
            batch = control_records(voters_control(self._history.current(), with_version=True),
                                    base_offset=self.log.end_offset, epoch=self.epoch, timestamp_ms=self._now)
            self.log.append_as_leader(batch, self.epoch)
            self._learn(batch)
        self.log.flush()
        self._leader_end_offset_updated()

    def _to_resigned(self, preferred: list[int]) -> None:
        self._set_role(Role.RESIGNED, self.epoch, self.node_id, self.voted_id)
        self._deadline = self._now + self._random_election_timeout()
        self._unacked = set(self._voter_ids - {self.node_id})
        self._preferred = preferred

    def _random_election_timeout(self) -> int:
        t = self.config.election_timeout_ms
        return t + self._rng.randrange(t) if t > 0 else 0

    def _election_backoff_ms(self, retries: int) -> int:
        """Kafka's binaryExponentialElectionBackoffMs: random, doubling per lost election, capped."""
        bound = 2 << min(20, retries - 1)
        return min(ELECTION_BACKOFF_BASE_MS * self._rng.randrange(bound), self.config.election_backoff_max_ms)

    def _end_epoch_backoff_ms(self, preferred: Sequence[int]) -> int:
        """Kafka's strictExponentialElectionBackoffMs: the first preferred successor goes at once."""
        position = preferred.index(self.node_id) if self.node_id in preferred else len(preferred)
        total = len(preferred)
        if position == 0:
            return 0
        if position >= total:
            return self.config.election_backoff_max_ms
        base = self.config.election_backoff_max_ms >> (total - 1)
        return min(self.config.election_backoff_max_ms, base << (position - 1))

    # ---------------------------------------------------------------- common request/response rules

    def _consistent_leader(self, epoch: int, leader_id: int | None) -> bool:
        if leader_id is not None and leader_id == self.node_id:
            return epoch == self.epoch and self.role in (Role.LEADER, Role.RESIGNED)
        return epoch != self.epoch or leader_id is None or self.leader_id is None or leader_id == self.leader_id

    def _maybe_transition(self, leader_id: int | None, epoch: int) -> None:
        """Learn of an epoch or a leader from a peer (Kafka's maybeTransition)."""
        if not self._consistent_leader(epoch, leader_id):
            raise RaftInvariantError(
                f"node {self.node_id}: peer names leader {leader_id} of epoch {epoch}, "
                f"but this node knows leader {self.leader_id} of epoch {self.epoch} ({self.role.value})")
        if epoch > self.epoch:
            if leader_id is not None:
                self._to_follower(epoch, leader_id)
            else:
                self._to_unattached(epoch)
        elif leader_id is not None and self.leader_id is None:
            self._to_follower(epoch, leader_id)

    def _common_response(self, error: ErrorCode, leader_id: int | None, epoch: int) -> bool | None:
        """Kafka's maybeHandleCommonResponse: ``None`` lets the API's own handler go on."""
        if epoch < self.epoch or error == ErrorCode.unknown_leader_epoch:
            return True
        if epoch > self.epoch or error in (ErrorCode.fenced_leader_epoch, ErrorCode.not_leader_or_follower):
            self._maybe_transition(leader_id, epoch)
            return True
        if leader_id is not None and self.leader_id is None:
            self._to_follower(epoch, leader_id)
            return None if error == NONE else True
        if error == ErrorCode.broker_not_available:
            return False
        if error == ErrorCode.invalid_voter_key:
            return True
        return None

    def _validate_voter_only(self, remote_id: int, epoch: int) -> ErrorCode | None:
        if epoch < self.epoch:
            return ErrorCode.fenced_leader_epoch
        if remote_id < 0:
            return ErrorCode.invalid_request
        if not self._history.dynamic and (not self.is_voter or remote_id not in self._voter_ids):
            # Static voters (KIP-595): only voters take part in elections. With a dynamic set
            # (KIP-853) the peer may know of a set this node has not replicated yet.
            return ErrorCode.inconsistent_voter_set
        return None

    def _validate_leader_only(self, epoch: int) -> ErrorCode | None:
        if epoch < self.epoch:
            return ErrorCode.fenced_leader_epoch
        if epoch > self.epoch:
            return ErrorCode.unknown_leader_epoch
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        return None

    def _cluster_ok(self, cluster_id: str | None) -> bool:
        return cluster_id is None or cluster_id == self.cluster_id

    def _leader_or_minus_one(self) -> int:
        return -1 if self.leader_id is None else self.leader_id

    # ---------------------------------------------------------------- Vote

    def _can_grant_vote(self, candidate: int, up_to_date: bool, pre_vote: bool) -> bool:
        if not self.is_voter:
            return False  # an observer (dynamic quorum) has no vote
        role = self.role
        if role in (Role.UNATTACHED, Role.PROSPECTIVE):
            if pre_vote:
                return up_to_date
            if self.voted_id is not None:
                return self.voted_id == candidate
            if self.leader_id is not None:
                return False
            return up_to_date
        if role is Role.CANDIDATE:
            return pre_vote and up_to_date  # our own vote is spoken for
        if role is Role.FOLLOWER:
            # A follower that has not reached its leader may help a pre-vote, never a real one.
            assert self._follower is not None
            return pre_vote and not self._follower.has_fetched and up_to_date
        return False  # leader, resigned

    def _on_vote_request(self, request: Any, now: int) -> Any:
        if not self._cluster_ok(request.cluster_id):
            return m.vote_response(ErrorCode.inconsistent_cluster_id)
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            return m.vote_response(ErrorCode.invalid_request)
        illegal = p.last_offset_epoch > p.replica_epoch if p.pre_vote else p.last_offset_epoch >= p.replica_epoch
        if p.last_offset < 0 or p.last_offset_epoch < 0 or illegal:
            return self._vote_response(ErrorCode.invalid_request, False)
        error = self._validate_voter_only(p.replica_id, p.replica_epoch)
        if error is not None:
            return self._vote_response(error, False)
        if p.replica_epoch > self.epoch:
            self._to_unattached(p.replica_epoch)
        if request.voter_id >= 0 and request.voter_id != self.node_id:
            return self._vote_response(ErrorCode.invalid_voter_key, False)
        candidate_end = OffsetAndEpoch(p.last_offset, p.last_offset_epoch)
        up_to_date = candidate_end.at_least(OffsetAndEpoch(self.log.end_offset, self.log.last_fetched_epoch))
        granted = self._can_grant_vote(p.replica_id, up_to_date, p.pre_vote)
        if granted and not p.pre_vote and self.voted_id is None:
            # The vote is durable before anyone hears of it.
            if self.role is Role.UNATTACHED:
                self._durable(Role.UNATTACHED, self.epoch, None, p.replica_id)
                self._deadline = now + self._random_election_timeout()
            elif self.role is Role.PROSPECTIVE:
                tally, retries = self._tally, self._retries
                self._durable(Role.PROSPECTIVE, self.epoch, self.leader_id, p.replica_id)
                self._tally, self._retries = tally, retries
                self._deadline = now + self._random_election_timeout()
        return self._vote_response(NONE, granted)

    def _vote_response(self, partition_error: ErrorCode, granted: bool) -> Any:
        return m.vote_response(NONE, partition_error=partition_error, epoch=self.epoch,
                               leader_id=self._leader_or_minus_one(), granted=granted, endpoints=self.voters)

    def _vote_request(self, voter: int) -> Any:
        return m.vote_request(cluster_id=self.cluster_id, voter_id=voter, epoch=self.epoch,
                              candidate_id=self.node_id, last_epoch=self.log.last_fetched_epoch,
                              last_offset=self.log.end_offset, pre_vote=self.role is Role.PROSPECTIVE)

    def _on_vote_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        settled = self._quorum_epoch_response(response)
        if settled is not None:
            return settled
        p = m.single_partition(response.topics, "topic_name")
        sent = request.topics[0].partitions[0]
        expected = Role.PROSPECTIVE if sent.pre_vote else Role.CANDIDATE
        if self.role is not expected or sent.replica_epoch != self.epoch or self._tally is None:
            return True  # an answer to an election we are no longer running
        self._tally.record(source, p.vote_granted)
        if self._tally.won:
            if self.role is Role.PROSPECTIVE:
                self._to_candidate()
            else:
                self._to_leader()
        elif self._tally.lost:
            if self.role is Role.CANDIDATE and self._backoff_until is None:
                self._backoff_until = now + self._election_backoff_ms(self._retries)
        return True

    # ---------------------------------------------------------------- BeginQuorumEpoch / EndQuorumEpoch

    def _on_begin_quorum_epoch_request(self, request: Any, now: int) -> Any:
        if not self._cluster_ok(request.cluster_id):
            return m.begin_quorum_epoch_response(ErrorCode.inconsistent_cluster_id)
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            return m.begin_quorum_epoch_response(ErrorCode.invalid_request)
        error = self._validate_voter_only(p.leader_id, p.leader_epoch)
        if error is None:
            self._maybe_transition(p.leader_id, p.leader_epoch)
            if request.voter_id >= 0 and request.voter_id != self.node_id:
                error = ErrorCode.invalid_voter_key
        return m.begin_quorum_epoch_response(NONE, partition_error=error or NONE, epoch=self.epoch,
                                             leader_id=self._leader_or_minus_one(), endpoints=self.voters)

    def _quorum_epoch_response(self, response: Any) -> bool | None:
        """The checks Vote, BeginQuorumEpoch and EndQuorumEpoch responses share: ``None`` when the answer is a success for this epoch and the
        API's own handler goes on, else whether the request is settled (Kafka's maybeHandleCommonResponse first)."""
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.topics, "topic_name")
        if p is None:
            return False
        handled = self._common_response(p.error_code, p.leader_id if p.leader_id >= 0 else None, p.leader_epoch)
        if handled is not None:
            return handled
        return None if p.error_code == NONE else False

    def _on_begin_quorum_epoch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        settled = self._quorum_epoch_response(response)
        if settled is not None:
            return settled
        if self.role is Role.LEADER and self._leader is not None:
            self._leader.voters[source].acknowledged = True
            self._unacked.discard(source)
        return True

    def _on_end_quorum_epoch_request(self, request: Any, now: int) -> Any:
        if not self._cluster_ok(request.cluster_id):
            return m.end_quorum_epoch_response(ErrorCode.inconsistent_cluster_id)
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            return m.end_quorum_epoch_response(ErrorCode.invalid_request)
        error = self._validate_voter_only(p.leader_id, p.leader_epoch)
        if error is None:
            self._maybe_transition(p.leader_id, p.leader_epoch)
            if self.role is Role.FOLLOWER and self.leader_id == p.leader_id:
                assert self._follower is not None
                preferred = [c.candidate_id for c in p.preferred_candidates]
                self._follower.fetch_deadline = now + self._end_epoch_backoff_ms(preferred)
                # The leader said it is gone: pre-votes for a successor are no longer disruptive.
                self._follower.has_fetched = False
        return m.end_quorum_epoch_response(NONE, partition_error=error or NONE, epoch=self.epoch,
                                           leader_id=self._leader_or_minus_one(), endpoints=self.voters)

    def _on_end_quorum_epoch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        settled = self._quorum_epoch_response(response)
        if settled is not None:
            return settled
        if self.role is Role.RESIGNED:
            self._unacked.discard(source)
        return True

    # ---------------------------------------------------------------- Fetch (leader side)

    def _fetch_error(self, partition: Any) -> Any:
        """The answer to a fetch this node cannot serve (or can no longer, for a parked one)."""
        error = self._validate_leader_only(partition.current_leader_epoch) or ErrorCode.not_leader_or_follower
        return m.fetch_response(NONE, partition_error=error, log_start_offset=self.log.start_offset,
                                leader_id=self._leader_or_minus_one(), epoch=self.epoch, endpoints=self.voters)

    def _on_fetch_request(self, source: int, request: Any, now: int) -> Any | None:
        if not self._cluster_ok(request.cluster_id):
            return m.fetch_response(ErrorCode.inconsistent_cluster_id)
        fp = m.single_partition(request.topics, "topic_id", index_field="partition", topic=m.METADATA_TOPIC_ID)
        if fp is None:
            return m.fetch_response(ErrorCode.invalid_request)
        max_wait = int(request.max_wait.total_seconds() * 1000)
        if (max_wait < 0 or fp.fetch_offset < 0 or fp.last_fetched_epoch < 0
                or fp.last_fetched_epoch > fp.current_leader_epoch):
            return m.fetch_response(NONE, partition_error=ErrorCode.invalid_request,
                                    log_start_offset=self.log.start_offset,
                                    leader_id=self._leader_or_minus_one(), epoch=self.epoch)
        replica = request.replica_state.replica_id
        response, immediate = self._complete_fetch(replica, fp, now, update=True)
        if immediate or max_wait == 0:
            return response
        assert self._leader is not None
        self._leader.deferred.append(_Deferred(source, request, fp, replica, now + max_wait,
                                               self._leader.high_watermark))
        return None

    def _complete_fetch(self, replica: int, fp: Any, now: int, *, update: bool) -> tuple[Any, bool]:
        """Kafka's tryCompleteFetchRequest: ``(response, whether it must go out now)``."""
        error = self._validate_leader_only(fp.current_leader_epoch)
        if error is not None:
            return self._fetch_error(fp), True
        leader = self._leader
        assert leader is not None
        position = validate_offset_and_epoch(self.log, fp.fetch_offset, fp.last_fetched_epoch)
        records = b""
        if position.kind == FetchPosition.VALID:
            records = self.log.read(fp.fetch_offset, min(fp.partition_max_bytes, self.config.fetch_max_bytes))
            if update:
                self._update_replica(replica, fp.fetch_offset, now, fp)
        hw = leader.high_watermark
        response = m.fetch_response(
            NONE, high_watermark=-1 if hw is None else hw, log_start_offset=self.log.start_offset,
            leader_id=self.node_id, epoch=self.epoch,
            diverging=position.position if position.kind == FetchPosition.DIVERGING else None,
            snapshot_id=position.position if position.kind == FetchPosition.SNAPSHOT else None,
            records=records)
        return response, bool(records) or position.kind != FetchPosition.VALID

    def _update_replica(self, replica: int, fetch_offset: int, now: int, fp: Any = None) -> None:
        """A valid fetch tells the leader the replica's log end (Kafka's LeaderState.updateReplicaState)."""
        leader = self._leader
        assert leader is not None
        if replica < 0 or replica == self.node_id:
            return
        voter = replica in leader.voters
        progress = leader.voters[replica] if voter else leader.observers.setdefault(replica, _Progress())
        leader_end = self.log.end_offset
        if fetch_offset >= leader_end:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, now)
        elif progress.last_fetch_leader_end is not None and fetch_offset >= progress.last_fetch_leader_end:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.last_fetch_leader_end = leader_end
        progress.last_fetch_ms = max(progress.last_fetch_ms, now)
        progress.end_offset = fetch_offset
        progress.acknowledged = True
        progress.directory_id = getattr(fp, "replica_directory_id", None) if fp is not None else None
        if voter:
            self._unacked.discard(replica)
            self._heard_from_voter(replica, now)
            if self._maybe_advance_hw():
                self._hw_advanced()

    def _heard_from_voter(self, voter: int, now: int) -> None:
        """Check-quorum: a majority (the leader included) fetched since the timer was last reset."""
        leader = self._leader
        assert leader is not None
        if voter == self.node_id or voter not in leader.voters:
            return
        leader.fetched_voters.add(voter)
        if len(leader.fetched_voters) + 1 >= len(leader.voters) // 2 + 1:
            leader.fetched_voters.clear()
            leader.check_quorum_deadline = now + int(self.config.fetch_timeout_ms * CHECK_QUORUM_TIMEOUT_FACTOR)

    def _maybe_advance_hw(self) -> bool:
        """The largest offset on a majority of voters, once it covers a record of this epoch.

        A new leader cannot count entries of older epochs as committed on
        their own: only when the majority offset passes its epoch's start
        offset (its LeaderChange record) does the high watermark move, and
        then never backwards.
        """
        leader = self._leader
        assert leader is not None
        ends = sorted((p.end_offset for p in leader.voters.values() if p.end_offset is not None), reverse=True)
        index = len(leader.voters) // 2
        if len(ends) <= index:
            return False
        candidate = ends[index]
        if candidate > leader.epoch_start_offset and (leader.high_watermark is None
                                                       or candidate > leader.high_watermark):
            leader.high_watermark = candidate
            return True
        return False

    def _hw_advanced(self) -> None:
        leader = self._leader
        assert leader is not None and leader.high_watermark is not None
        if self._hw is None or leader.high_watermark > self._hw:
            self._hw = leader.high_watermark

    def _leader_end_offset_updated(self) -> None:
        leader = self._leader
        assert leader is not None
        own = leader.voters.get(self.node_id) or leader.observers.setdefault(self.node_id, _Progress())
        own.end_offset = self.log.end_offset
        own.last_fetch_ms = own.last_caught_up_ms = self._now
        if self._maybe_advance_hw():
            self._hw_advanced()

    def _poll_deferred(self, now: int) -> int:
        """Answer parked fetches that have data, a new high watermark, or have waited long enough."""
        leader = self._leader
        assert leader is not None
        if not leader.deferred:
            return _FOREVER
        end = self.log.end_offset
        parked, leader.deferred = leader.deferred, []
        wake = _FOREVER
        for d in parked:
            if self._leader is not leader:  # a completion made us step down: _set_role answered the rest
                self._outbox.append(Outbound(d.source, self._fetch_error(d.partition), d.request))
                continue
            if d.partition.fetch_offset < end or leader.high_watermark != d.high_watermark:
                response, _ = self._complete_fetch(d.replica_id, d.partition, now, update=True)
            elif now >= d.deadline:
                response, _ = self._complete_fetch(d.replica_id, d.partition, now, update=False)
            else:
                leader.deferred.append(d)
                wake = min(wake, d.deadline)
                continue
            self._outbox.append(Outbound(d.source, response, d.request))
        return wake

    # ---------------------------------------------------------------- Fetch (follower side)

    def _fetch_request(self) -> Any:
        return m.fetch_request(cluster_id=self.cluster_id, replica_id=self.node_id, epoch=self.epoch,
                               fetch_offset=self.log.end_offset, last_fetched_epoch=self.log.last_fetched_epoch,
                               log_start_offset=self.log.start_offset, max_wait_ms=self.config.fetch_max_wait_ms,
                               max_bytes=self.config.fetch_max_bytes, directory_id=self.directory_id)

    def _on_fetch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.responses, "topic_id", topic=m.METADATA_TOPIC_ID)
        if p is None:
            return False
        leader_id = p.current_leader.leader_id
        before = (self.role, self.epoch, self.leader_id)
        handled = self._common_response(p.error_code, leader_id if leader_id >= 0 else None,
                                        p.current_leader.leader_epoch)
        if handled is not None:
            # An error that taught us nothing new (a voter that does not know the leader either, a
            # leader that resigned): back off before asking again rather than spin at network speed.
            return handled and (p.error_code == NONE or before != (self.role, self.epoch, self.leader_id))
        if p.error_code != NONE:
            return False
        follower = self._follower
        if self.role is not Role.FOLLOWER or follower is None or source != self.leader_id:
            return True
        if p.diverging_epoch.epoch >= 0:
            diverging = OffsetAndEpoch(p.diverging_epoch.end_offset, p.diverging_epoch.epoch)
            if self._hw is not None and diverging.offset < self._hw:
                raise RaftInvariantError(f"node {self.node_id}: leader {source} asks to truncate to "
                                         f"{diverging.offset}, below the high watermark {self._hw}")
            self.log.truncate_to(max(truncation_offset(self.log, diverging), self.log.start_offset))
            if self._history.truncate(self.log.end_offset):
                self._refresh_voters()
        elif p.snapshot_id.epoch >= 0 or p.snapshot_id.end_offset >= 0:
            if p.snapshot_id.epoch < 0 or p.snapshot_id.end_offset < 0:
                return False
            follower.download = _Download(OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch))
        else:
            if p.records:
                self.log.append_as_follower(bytes(p.records), self.epoch)
                self._learn(bytes(p.records))
                # Voters report their log end as replicated: it must survive a crash first.
                self.log.flush()
            if p.high_watermark >= 0:
                self._follower_hw(min(p.high_watermark, self.log.end_offset))
        follower.fetch_deadline = now + self.config.fetch_timeout_ms
        follower.has_fetched = True
        return True

    def _follower_hw(self, hw: int) -> None:
        if self._hw is None or hw > self._hw:
            self._hw = hw

    # ---------------------------------------------------------------- FetchSnapshot

    def _on_fetch_snapshot_request(self, request: Any, now: int) -> Any:
        if not self._cluster_ok(request.cluster_id):
            return m.fetch_snapshot_response(ErrorCode.inconsistent_cluster_id)
        if len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
            return m.fetch_snapshot_response(ErrorCode.invalid_request)
        ps = m.single_partition(request.topics, "name", index_field="partition")
        if ps is None:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.unknown_topic_or_partition)
        leader = dict(leader_id=self._leader_or_minus_one(), epoch=self.epoch, endpoints=self.voters)
        error = self._validate_leader_only(ps.current_leader_epoch)
        if error is not None:
            return m.fetch_snapshot_response(NONE, partition_error=error, **leader)  # type: ignore[arg-type]
        snapshot_id = OffsetAndEpoch(ps.snapshot_id.end_offset, ps.snapshot_id.epoch)
        size = self.log.snapshot_size(snapshot_id) if snapshot_id != OffsetAndEpoch(0, 0) else None
        if size is None:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.snapshot_not_found,
                                             **leader)  # type: ignore[arg-type]
        if ps.position < 0 or ps.position >= size:
            return m.fetch_snapshot_response(NONE, partition_error=ErrorCode.position_out_of_range,
                                             **leader)  # type: ignore[arg-type]
        data = self.log.read_snapshot(snapshot_id, ps.position, min(request.max_bytes, size)) or b""
        if self._leader is not None:
            self._heard_from_voter(request.replica_id, now)
        return m.fetch_snapshot_response(NONE, snapshot_id=snapshot_id, size=size, position=ps.position,
                                         data=data, **leader)  # type: ignore[arg-type]

    def _fetch_snapshot_request(self, download: _Download) -> Any:
        return m.fetch_snapshot_request(cluster_id=self.cluster_id, replica_id=self.node_id, epoch=self.epoch,
                                        snapshot_id=download.snapshot_id, position=len(download.data),
                                        max_bytes=self.config.fetch_max_bytes)

    def _on_fetch_snapshot_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.topics, "name", index_field="index")
        if p is None:
            return False
        leader_id = p.current_leader.leader_id
        handled = self._common_response(p.error_code, leader_id if leader_id >= 0 else None,
                                        p.current_leader.leader_epoch)
        if handled is not None:
            return handled
        follower = self._follower
        if self.role is not Role.FOLLOWER or follower is None:
            return True
        if (p.error_code == ErrorCode.snapshot_not_found or p.snapshot_id.end_offset < 0
                or p.snapshot_id.epoch < 0):
            # The leader replaced the snapshot meanwhile: start over with a Fetch.
            follower.download = None
            follower.fetch_deadline = now + self.config.fetch_timeout_ms
            return True
        if p.error_code != NONE:
            return False
        download = follower.download
        snapshot_id = OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
        if download is None or download.snapshot_id != snapshot_id or p.position != len(download.data):
            return False
        download.data += p.unaligned_records
        if len(download.data) >= p.size:
            self.log.install_snapshot(snapshot_id, bytes(download.data))
            static = self._history.static
            self._history = VoterSetHistory(static)
            self._history.scan(bytes(download.data), offset_base=snapshot_id.offset - 1)
            self._refresh_voters()
            follower.download = None
            self._follower_hw(snapshot_id.offset)
        follower.fetch_deadline = now + self.config.fetch_timeout_ms
        follower.has_fetched = True
        return True

    # ---------------------------------------------------------------- DescribeQuorum

    def _on_describe_quorum_request(self, request: Any, now: int) -> Any:
        if not 0 <= request.__version__ <= 2:
            raise ValueError(f"DescribeQuorum v{request.__version__} is not supported (0-2)")
        return m.describe_quorum_at_version(self._describe_quorum(request, now), request.__version__)

    def _describe_quorum(self, request: Any, now: int) -> Any:
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            topic = request.topics[0].topic_name if request.topics else m.METADATA_TOPIC
            return m.describe_quorum_response(partition_error=ErrorCode.unknown_topic_or_partition, topic=topic)
        leader = self._leader
        if self.role is not Role.LEADER or leader is None:
            return m.describe_quorum_response(partition_error=ErrorCode.not_leader_or_follower,
                                              leader_id=self._leader_or_minus_one(), epoch=self.epoch)

        current = self._history.current()

        def state(replica: int, progress: _Progress) -> Any:
            voter = current.get(replica)
            directory = voter.directory_id if voter is not None else None
            if replica == self.node_id:
                return m.replica_state(replica, self.log.end_offset, now, now, directory)
            end = -1 if progress.end_offset is None else progress.end_offset
            return m.replica_state(replica, end, progress.last_fetch_ms, progress.last_caught_up_ms, directory)

        voters = [state(v, leader.voters[v]) for v in sorted(leader.voters)]
        observers = [state(o, progress) for o, progress in sorted(leader.observers.items())
                     if now - progress.last_fetch_ms < OBSERVER_SESSION_TIMEOUT_MS]
        hw = -1 if leader.high_watermark is None else leader.high_watermark
        return m.describe_quorum_response(leader_id=self.node_id, epoch=self.epoch, high_watermark=hw,
                                          voters=voters, observers=observers,
                                          listener=self.config.listener_name, endpoints=self.voters)

    # ---------------------------------------------------------------- polling per role

    def _send(self, destination: int, build: Callable[[], Any]) -> int:
        """Send ``build()`` to ``destination`` unless a request is in flight or backing off; returns the wait."""
        wait = self._requests.wait_ms(destination, self._now)
        if wait == 0:
            message = build()
            self._requests.sent(destination, message, self._now)
            self._outbox.append(Outbound(destination, message))
            return self.config.request_timeout_ms
        return wait

    def _send_fetch_to_any_voter(self) -> int:
        """Look for the leader by asking a random voter (Kafka's maybeSendFetchToAnyBootstrap)."""
        if self._requests.inflight:
            return min(self._requests.wait_ms(d, self._now) for d in self._requests.inflight)
        candidates = [v for v in sorted(self._voter_ids) if v != self.node_id and v in self.voters]
        if not candidates:
            candidates = sorted(self._bootstrap)
        if not candidates:
            return _FOREVER
        ready = [v for v in candidates if self._requests.wait_ms(v, self._now) == 0]
        if not ready:
            return min(self._requests.wait_ms(v, self._now) for v in candidates)
        return self._send(self._rng.choice(ready), self._fetch_request)

    def _poll_role(self, now: int) -> int:
        role = self.role
        if role is Role.LEADER:
            return self._poll_leader(now)
        if role is Role.FOLLOWER:
            return self._poll_follower(now)
        if role is Role.CANDIDATE:
            return self._poll_candidate(now)
        if role is Role.PROSPECTIVE:
            return self._poll_prospective(now)
        if role is Role.RESIGNED:
            return self._poll_resigned(now)
        return self._poll_unattached(now)

    def _poll_leader(self, now: int) -> int:
        leader = self._leader
        assert leader is not None
        if len(leader.voters) > 1 and now >= leader.check_quorum_deadline:
            # Check-quorum: a leader a majority cannot reach must not keep the quorum waiting.
            self._to_resigned(self._voters_by_end_offset())
            return now
        wake = leader.check_quorum_deadline if len(leader.voters) > 1 else _FOREVER
        hw = leader.high_watermark
        change = leader.pending
        if change is not None:
            if hw is not None and hw > change.offset:
                leader.pending = None
                self._outbox.append(Outbound(change.source, change.respond(NONE), change.request))
            elif now >= change.deadline:
                leader.pending = None
                self._outbox.append(Outbound(change.source, change.respond(
                    ErrorCode.request_timed_out, "the voter change did not commit in time"), change.request))
            else:
                wake = min(wake, change.deadline)
        last = self._history.last_offset()
        if not self.is_voter and hw is not None and last is not None and hw > last:
            # Removed from the voter set and the removal committed: hand over (KIP-853).
            self._to_resigned(self._voters_by_end_offset())
            return now
        for voter in sorted(self._unacked):
            wake = min(wake, now + self._send(voter, lambda v=voter: m.begin_quorum_epoch_request(
                cluster_id=self.cluster_id, voter_id=v, epoch=self.epoch, leader_id=self.node_id,
                listener=self.config.listener_name, endpoints=self.voters)))
        return wake

    def _voters_by_end_offset(self) -> list[int]:
        leader = self._leader
        if leader is None:
            return []
        others = [v for v in leader.voters if v != self.node_id]
        return sorted(others, key=lambda v: (-(leader.voters[v].end_offset if leader.voters[v].end_offset
                                                is not None else -1), v))

    def _poll_follower(self, now: int) -> int:
        follower = self._follower
        assert follower is not None and self.leader_id is not None
        if now >= follower.fetch_deadline:
            if self.is_voter:
                self._to_prospective()
                return now
            return min(now + self._send_fetch_to_any_voter(), now + self.config.fetch_timeout_ms)
        download = follower.download
        build = (lambda: self._fetch_snapshot_request(download)) if download is not None else self._fetch_request
        wake = min(follower.fetch_deadline, now + self._send(self.leader_id, build))
        return min(wake, self._maybe_update_voter(now))

    def _maybe_update_voter(self, now: int) -> int:
        """A voter whose endpoints in the voter set are not its own asks the leader to update them (KIP-853)."""
        follower = self._follower
        if (not self.is_voter or not self._history.dynamic or not self.local_endpoints or follower is None
                or not follower.has_fetched or self.leader_id is None):
            return _FOREVER
        mine = self._history.current().get(self.node_id)
        if mine is None or set(mine.endpoints) == set(self.local_endpoints):
            return _FOREVER
        if now < self._update_after:
            return self._update_after
        leader = self.leader_id
        wait = self._update_requests.wait_ms(leader, now)
        if wait:
            return now + wait
        request = m.update_raft_voter_request(cluster_id=self.cluster_id, epoch=self.epoch, voter_id=self.node_id,
                                              directory_id=self.directory_id, endpoints=self.local_endpoints)
        self._update_requests.sent(leader, request, now)
        self._outbox.append(Outbound(leader, request))
        return now + self.config.request_timeout_ms

    def _poll_unattached(self, now: int) -> int:
        if self.is_voter and now >= self._deadline:
            self._to_prospective()
            return now
        return min(self._deadline, now + self._send_fetch_to_any_voter())

    def _poll_prospective(self, now: int) -> int:
        tally = self._tally
        assert tally is not None
        if tally.lost or now >= self._deadline:
            if self.leader_id is not None:
                self._to_follower(self.epoch, self.leader_id)
            else:
                self._to_unattached(self.epoch)
            return now
        return min(self._deadline, self._send_votes(tally, now))

    def _poll_candidate(self, now: int) -> int:
        tally = self._tally
        assert tally is not None
        if tally.won:
            self._to_leader()
            return now
        if self._backoff_until is not None:
            if now >= self._backoff_until:
                self._to_prospective()
                return now
            return self._backoff_until
        if now >= self._deadline:
            self._backoff_until = now + self._election_backoff_ms(self._retries)
            return self._backoff_until
        if tally.lost:
            return self._deadline
        return min(self._deadline, self._send_votes(tally, now))

    def _send_votes(self, tally: _Tally, now: int) -> int:
        wake = _FOREVER
        for voter in tally.unrecorded():
            wake = min(wake, now + self._send(voter, lambda v=voter: self._vote_request(v)))
        return wake

    def _poll_resigned(self, now: int) -> int:
        if now >= self._deadline:
            # Kafka: an expired resignation starts the next epoch unattached, electing at once.
            self._to_unattached(self.epoch + 1, election_timeout_ms=0)
            return now
        wake = self._deadline
        for voter in sorted(self._unacked):
            wake = min(wake, now + self._send(voter, lambda: m.end_quorum_epoch_request(
                cluster_id=self.cluster_id, epoch=self.epoch, leader_id=self.node_id, preferred=self._preferred,
                listener=self.config.listener_name, endpoints=self.voters)))
        return wake

    # ---------------------------------------------------------------- delivery to the state machine

    def _epoch_before(self, offset: int) -> int:
        """Epoch of the record at ``offset - 1`` (the id of a snapshot ending at ``offset``)."""
        start = self.log.start_offset
        if offset == start:
            snapshot = self.log.earliest_snapshot_id()
            return snapshot.epoch if snapshot is not None and snapshot.offset == start else 0
        data = self.log.read(offset - 1, 1)
        for _, header in iter_batches(data):
            if header.last_offset != offset - 1:
                raise ValueError(f"offset {offset} is inside a batch: snapshots end at batch boundaries")
            return header.partition_leader_epoch
        raise ValueError(f"offset {offset} is beyond the log end")

    def _deliver(self, hw: int, max_bytes: int, events: list[RaftEvent]) -> None:
        nxt = self._next_delivery
        start = self.log.start_offset
        if nxt is None or nxt < start:
            snapshot = self.log.latest_snapshot_id()
            if snapshot is not None and snapshot.offset > 0 and (nxt is None or nxt < snapshot.offset):
                size = self.log.snapshot_size(snapshot) or 0
                events.append(SnapshotLoaded(snapshot, self.log.read_snapshot(snapshot, 0, size) or b""))
                nxt = snapshot.offset
            elif nxt is None:
                nxt = start
            if nxt < start:
                raise RaftInvariantError(f"next offset {nxt} to deliver is below the log start {start}")
        delivered = 0
        while nxt < hw and delivered < max_bytes:
            chunk = self.log.read(nxt, max_bytes)
            progressed = False
            for pos, header in iter_batches(chunk):
                if header.last_offset < nxt:
                    continue
                if header.last_offset >= hw:
                    break
                events.append(CommittedBatch(header.base_offset, header.last_offset, header.partition_leader_epoch,
                                             header.is_control, bytes(chunk[pos:pos + header.size])))
                nxt = header.last_offset + 1
                delivered += header.size
                progressed = True
            if not progressed:
                break
        self._next_delivery = nxt

    # ---------------------------------------------------------------- AddRaftVoter / RemoveRaftVoter (KIP-853)

    def _voter_change_refusal(self, cluster_id: str | None) -> tuple[ErrorCode, str] | None:
        """Why the leader cannot start a voter change now (Kafka's AddVoterHandler/RemoveVoterHandler checks)."""
        if not self._cluster_ok(cluster_id):
            return ErrorCode.inconsistent_cluster_id, f"the cluster id is {self.cluster_id}"
        leader = self._leader
        if self.role is not Role.LEADER or leader is None:
            return ErrorCode.not_leader_or_follower, f"node {self.node_id} is not the leader"
        if not self._history.dynamic:
            return (ErrorCode.unsupported_version,
                    "the quorum is at kraft.version 0 (static controller.quorum.voters): voters cannot change")
        if leader.high_watermark is None:
            return ErrorCode.request_timed_out, "the leader has not yet committed an offset in its epoch"
        last = self._history.last_offset()
        if leader.pending is not None or (last is not None and last >= leader.high_watermark):
            return ErrorCode.request_timed_out, "a voter change is still in progress"
        return None

    def _append_voter_change(self, source: int, request: Any, voters: dict[int, VoterInfo], timeout_ms: int,
                             respond: Callable[..., Any], ack_when_committed: bool = True) -> Any | None:
        leader = self._leader
        assert leader is not None
        batch = control_records(voters_control(voters, with_version=False), base_offset=self.log.end_offset,
                                epoch=self.epoch, timestamp_ms=self._now)
        result = self.log.append_as_leader(batch, self.epoch)
        self.log.flush()
        self._learn(batch)
        self._leader_end_offset_updated()
        if not ack_when_committed:
            return respond(NONE)
        leader.pending = _Change(source, request, result.last_offset, self._now + timeout_ms, respond)
        return None

    def _on_add_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        version = type(request).__version__

        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.add_raft_voter_response(version, error, message)

        refusal = self._voter_change_refusal(request.cluster_id)
        if refusal is not None:
            return respond(*refusal)
        leader = self._leader
        assert leader is not None
        voter_id = int(request.voter_id)
        if voter_id in self._voter_ids:
            return respond(ErrorCode.duplicate_voter, f"node {voter_id} is already a voter")
        endpoints = tuple((listener.name, listener.host, int(listener.port)) for listener in request.listeners)
        if not any(name == self.config.listener_name for name, _, _ in endpoints):
            return respond(ErrorCode.invalid_request,
                           f"the new voter has no endpoint on the listener {self.config.listener_name}")
        progress = leader.observers.get(voter_id)
        if (progress is None or progress.end_offset is None
                or progress.last_caught_up_ms < now - self.config.fetch_timeout_ms):
            return respond(ErrorCode.request_timed_out,
                           f"node {voter_id} is not an observer that has caught up with the leader")
        directory = request.voter_directory_id
        if (progress.directory_id not in (None, NO_DIRECTORY_ID) and directory not in (None, NO_DIRECTORY_ID)
                and progress.directory_id != directory):
            return respond(ErrorCode.request_timed_out,
                           f"node {voter_id} fetches with directory id {progress.directory_id}, not {directory}")
        voters = dict(self._history.current())
        voters[voter_id] = VoterInfo(voter_id, None if directory in (None, NO_DIRECTORY_ID) else directory, endpoints)
        timeout_ms = int(request.timeout.total_seconds() * 1000) or self.config.request_timeout_ms
        return self._append_voter_change(source, request, voters, timeout_ms, respond,
                                         getattr(request, "ack_when_committed", True))

    @staticmethod
    def _named_voter(voters: dict[int, Any], request: Any) -> Any | None:
        """The voter a Remove/UpdateRaftVoter request names, if its id (and directory id, when both know one) match."""
        found = voters.get(int(request.voter_id))
        directory = request.voter_directory_id
        if found is None or (directory not in (None, NO_DIRECTORY_ID) and found.directory_id is not None
                             and found.directory_id != directory):
            return None
        return found

    def _on_remove_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.remove_raft_voter_response(error, message)

        refusal = self._voter_change_refusal(request.cluster_id)
        if refusal is not None:
            return respond(*refusal)
        voter_id = int(request.voter_id)
        voters = dict(self._history.current())
        if self._named_voter(voters, request) is None:
            return respond(ErrorCode.voter_not_found,
                           f"node {voter_id} with directory id {request.voter_directory_id} is not a voter")
        if len(voters) == 1:
            return respond(ErrorCode.voter_not_found, f"cannot remove the last voter {voter_id}")
        del voters[voter_id]
        return self._append_voter_change(source, request, voters, self.config.request_timeout_ms * 5, respond)

    def _on_update_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        leader_endpoint = self.endpoint(self.leader_id) if self.leader_id is not None else None

        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.update_raft_voter_response(error, leader_id=self._leader_or_minus_one(), epoch=self.epoch,
                                                endpoint=leader_endpoint)

        if self.role is Role.LEADER:
            epoch_error = self._validate_leader_only(int(request.current_leader_epoch))
            if epoch_error is not None:
                return respond(epoch_error)
        refusal = self._voter_change_refusal(request.cluster_id)
        if refusal is not None:
            return respond(refusal[0])
        voter_id = int(request.voter_id)
        voters = dict(self._history.current())
        found = self._named_voter(voters, request)
        if found is None:
            return respond(ErrorCode.voter_not_found)
        endpoints = tuple((listener.name, listener.host, int(listener.port)) for listener in request.listeners)
        if not any(name == self.config.listener_name for name, _, _ in endpoints):
            return respond(ErrorCode.invalid_request)
        if set(endpoints) == set(found.endpoints):
            return respond(NONE)
        voters[voter_id] = VoterInfo(voter_id, found.directory_id, endpoints)
        return self._append_voter_change(source, request, voters, self.config.request_timeout_ms * 5, respond)
