"""Who leads which epoch: roles, transitions and timers, and the Vote, BeginQuorumEpoch and EndQuorumEpoch APIs.

The roles and their transitions are Kafka's (``QuorumState``): Unattached,
Prospective (KIP-996 pre-vote), Candidate, Leader, Follower and Resigned,
with observers (nodes outside the voter set) only ever unattached or
following. The epoch and the vote are written to the quorum-state store
before the node acts on them.

Where this departs from Kafka 4.0, on purpose:

* a follower told by EndQuorumEpoch that its leader resigned grants
  pre-votes again (as if it had not reached the leader), so the preferred
  successor wins at once instead of after the others' fetch timeouts;
* a candidate that loses backs off (binary exponential, capped by
  ``election_backoff_max_ms``) and then runs a new pre-vote;
* with static voters (``controller.quorum.voters``, kraft.version 0),
  requests naming a non-voter, or reaching an observer, get
  INCONSISTENT_VOTER_SET as in Kafka 3.x.
"""

from __future__ import annotations

import enum
import random
from typing import Any, Callable, Sequence

import attrs
from kio.schema.errors import ErrorCode

from . import messages as m
from .config import RaftConfig
from .errors import RaftInvariantError
from .log import OffsetAndEpoch, RaftLog
from .membership import Membership
from .messages import NONE
from .outbox import FOREVER, Outbox
from .quorum_state import ElectionState, QuorumStateStore

#: Kafka's RETRY_BACKOFF_BASE_MS, the unit of the exponential election backoff.
ELECTION_BACKOFF_BASE_MS = 100
#: Kafka's LeaderState.CHECK_QUORUM_TIMEOUT_FACTOR: the leader resigns when a majority
#: has not fetched within 1.5 fetch timeouts.
CHECK_QUORUM_TIMEOUT_FACTOR = 1.5


class Role(enum.Enum):
    UNATTACHED = "unattached"
    PROSPECTIVE = "prospective"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FOLLOWER = "follower"
    RESIGNED = "resigned"


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
class _FetchTimer:
    """A follower's fetch timeout: it stands for election when its leader has not answered in time."""

    deadline: int
    #: Until it reaches its leader a follower may still help a pre-vote.
    has_fetched: bool = False


@attrs.define
class _CheckQuorum:
    """A leader's check-quorum timer: reset whenever a majority (the leader included) has fetched."""

    deadline: int
    fetched: set[int] = attrs.field(factory=set)


class Election:
    """The role, epoch, leader and vote of this node, and everything that changes them (Kafka's QuorumState).

    The other parts keep state of their own for the current role (a
    leader's replica progress and parked fetches, a follower's snapshot
    download, a pending voter change); ``role_ended`` is called on every
    transition so they drop it, and ``leading(granting voters)`` once this
    node has won an election, so replication writes the epoch's first records.
    """

    def __init__(self, node_id: int, cluster_id: str, config: RaftConfig, log: RaftLog, store: QuorumStateStore,
                 rng: random.Random, outbox: Outbox, membership: Membership, *,
                 role_ended: Callable[[], None], leading: Callable[[frozenset[int]], None]) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._config = config
        self._log = log
        self._store = store
        self._rng = rng
        self._outbox = outbox
        self._membership = membership
        self._role_ended = role_ended
        self._leading = leading
        self._check_quorum_ms = int(config.fetch_timeout_ms * CHECK_QUORUM_TIMEOUT_FACTOR)
        # Role state; every transition sets all of these.
        self.role = Role.UNATTACHED
        self.epoch = 0
        self.leader_id: int | None = None
        self.voted_id: int | None = None
        self._deadline = FOREVER  # election timeout (unattached, prospective, candidate, resigned)
        self._backoff_until: int | None = None  # candidate lost and is backing off
        self._retries = 1
        self._tally: _Tally | None = None
        self._fetch_timer: _FetchTimer | None = None  # follower
        self._check_quorum: _CheckQuorum | None = None  # leader
        self._unacked: set[int] = set()  # leader, resigned: voters yet to acknowledge Begin/EndQuorumEpoch
        self._preferred: list[int] = []
        membership.subscribe(self._voters_changed)

    # ---------------------------------------------------------------- transitions (Kafka's QuorumState)

    def initialize(self) -> None:
        """Start where Kafka's ``QuorumState.initialize`` does, from the quorum-state store.

        A former leader restarts as Resigned in its epoch, a former candidate
        as Candidate, a follower as Follower, anyone else Unattached.
        """
        stored = self._store.read() or ElectionState(0)
        log_epoch = self._log.last_fetched_epoch
        membership = self._membership
        now = self._outbox.now
        if stored.epoch < log_epoch:
            self._to_unattached(log_epoch, self._random_election_timeout())
        elif membership.is_voter and stored.leader_id == self.node_id:
            # A former leader restarts resigned in its epoch: it cannot vote in it again, and
            # records it lost unflushed cannot be re-written under the same (offset, epoch).
            self._set_role(Role.RESIGNED, stored.epoch, self.node_id, stored.voted_id)
            self._deadline = now + self._random_election_timeout()
            self._unacked = set(membership.voter_ids - {self.node_id})
            self._preferred = []
        elif membership.is_voter and stored.voted_id == self.node_id:
            self._set_role(Role.CANDIDATE, stored.epoch, None, self.node_id)
            self._tally = _Tally(membership.voter_ids, {self.node_id})
            self._deadline = now + self._random_election_timeout()
            self._persist()
        elif stored.leader_id in membership.voter_ids and stored.leader_id != self.node_id:
            self._to_follower(stored.epoch, stored.leader_id)
        else:
            self._set_role(Role.UNATTACHED, stored.epoch, None, stored.voted_id if membership.is_voter else None)
            self._deadline = now + self._random_election_timeout() if membership.is_voter else FOREVER
            self._persist()
        if membership.voter_ids == {self.node_id}:
            # The only voter elects itself at once (Kafka: isOnlyVoter -> candidate).
            if self.role is Role.CANDIDATE:
                self._to_leader()
            elif self.role is not Role.LEADER:
                self.to_prospective()

    def _persist(self) -> None:
        self._store.write(ElectionState(self.epoch, self.leader_id, self.voted_id))

    def _set_role(self, role: Role, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        """Switch role in memory; pending requests are forgotten, and the other parts drop the old role's state."""
        self.role, self.epoch, self.leader_id, self.voted_id = role, epoch, leader_id, voted_id
        self._outbox.requests.reset()
        self._tally = self._fetch_timer = self._check_quorum = None
        self._backoff_until = None
        self._deadline = FOREVER
        self._role_ended()

    def _durable(self, role: Role, epoch: int, leader_id: int | None, voted_id: int | None) -> None:
        """Persist the election state first, then act on it (Kafka's durableTransitionTo)."""
        self._store.write(ElectionState(epoch, leader_id, voted_id))
        self._set_role(role, epoch, leader_id, voted_id)

    def _to_unattached(self, epoch: int, election_timeout_ms: int | None = None) -> None:
        """A new epoch with no known leader; in the same epoch only when leaving Prospective (keeps the vote)."""
        voted = self.voted_id if epoch == self.epoch else None
        now = self._outbox.now
        if election_timeout_ms is None:
            election_timeout_ms = self._random_election_timeout()
            if self.role in (Role.UNATTACHED, Role.CANDIDATE, Role.RESIGNED) or (
                    self.role is Role.PROSPECTIVE and self._tally is not None and not self._tally.lost):
                election_timeout_ms = max(0, self._deadline - now)
        self._durable(Role.UNATTACHED, epoch, None, voted)
        self._deadline = now + election_timeout_ms if self._membership.is_voter else FOREVER

    def _to_follower(self, epoch: int, leader_id: int) -> None:
        if leader_id == self.node_id:
            raise RaftInvariantError(f"node {self.node_id} told it leads epoch {epoch} it never won")
        voted = self.voted_id if epoch == self.epoch else None
        self._durable(Role.FOLLOWER, epoch, leader_id, voted)
        self._fetch_timer = _FetchTimer(self._outbox.now + self._config.fetch_timeout_ms)

    def to_prospective(self) -> None:
        """Start a pre-vote (KIP-996): no epoch bump and nothing persisted."""
        retries = self._retries + 1 if self.role is Role.CANDIDATE else 1
        self._set_role(Role.PROSPECTIVE, self.epoch, self.leader_id, self.voted_id)
        self._retries = retries
        self._tally = _Tally(self._membership.voter_ids, {self.node_id})
        self._deadline = self._outbox.now + self._random_election_timeout()
        if self._tally.won:
            self._to_candidate()

    def _to_candidate(self) -> None:
        """Bump the epoch and vote for ourselves, durably, before asking anyone."""
        self._durable(Role.CANDIDATE, self.epoch + 1, None, self.node_id)
        self._tally = _Tally(self._membership.voter_ids, {self.node_id})
        self._deadline = self._outbox.now + self._random_election_timeout()
        if self._tally.won:
            self._to_leader()

    def _to_leader(self) -> None:
        assert self._tally is not None and self._tally.won
        granting = frozenset(self._tally.granted)
        self._durable(Role.LEADER, self.epoch, self.node_id, self.node_id)
        self._check_quorum = _CheckQuorum(self._outbox.now + self._check_quorum_ms)
        self._unacked = set(self._membership.voter_ids - {self.node_id})
        self._leading(granting)

    def to_resigned(self, preferred: list[int]) -> None:
        """Step down from leading this epoch, naming ``preferred`` successors in EndQuorumEpoch."""
        self._set_role(Role.RESIGNED, self.epoch, self.node_id, self.voted_id)
        self._deadline = self._outbox.now + self._random_election_timeout()
        self._unacked = set(self._membership.voter_ids - {self.node_id})
        self._preferred = preferred

    def _voters_changed(self, previous: frozenset[int]) -> None:
        membership = self._membership
        check = self._check_quorum
        if check is not None and previous != membership.voter_ids:
            # A new set gets a full check-quorum period (a lone voter never ran the timer).
            check.fetched.clear()
            check.deadline = self._outbox.now + self._check_quorum_ms
        if membership.is_voter and self.node_id not in previous and self.role is Role.UNATTACHED:
            self._deadline = self._outbox.now + self._random_election_timeout()

    # ---------------------------------------------------------------- timers

    def _random_election_timeout(self) -> int:
        t = self._config.election_timeout_ms
        return t + self._rng.randrange(t) if t > 0 else 0

    def _election_backoff_ms(self, retries: int) -> int:
        """Kafka's binaryExponentialElectionBackoffMs: random, doubling per lost election, capped."""
        bound = 2 << min(20, retries - 1)
        return min(ELECTION_BACKOFF_BASE_MS * self._rng.randrange(bound), self._config.election_backoff_max_ms)

    def _end_epoch_backoff_ms(self, preferred: Sequence[int]) -> int:
        """Kafka's strictExponentialElectionBackoffMs: the first preferred successor goes at once."""
        max_ms = self._config.election_backoff_max_ms
        position = preferred.index(self.node_id) if self.node_id in preferred else len(preferred)
        total = len(preferred)
        if position == 0:
            return 0
        if position >= total:
            return max_ms
        base = max_ms >> (total - 1)
        return min(max_ms, base << (position - 1))

    def heard_from_leader(self, now: int) -> None:
        """The leader served a follower's fetch: the fetch timeout starts over, and the follower no longer
        helps pre-votes (its leader is alive)."""
        assert self._fetch_timer is not None
        self._fetch_timer.deadline = now + self._config.fetch_timeout_ms
        self._fetch_timer.has_fetched = True

    def restart_fetch_timeout(self, now: int) -> None:
        """The leader answered without serving anything (the snapshot offered is gone): wait for it again."""
        assert self._fetch_timer is not None
        self._fetch_timer.deadline = now + self._config.fetch_timeout_ms

    @property
    def fetch_deadline(self) -> int:
        """When a follower that has not heard from its leader stops waiting for it."""
        assert self._fetch_timer is not None
        return self._fetch_timer.deadline

    @property
    def has_fetched(self) -> bool:
        """Whether this node follows a leader it has reached in this epoch."""
        return self._fetch_timer is not None and self._fetch_timer.has_fetched

    def heard_from_voter(self, voter: int, now: int) -> None:
        """Check-quorum: a majority (the leader included) fetched since the timer was last reset."""
        check = self._check_quorum
        assert check is not None
        voters = self._membership.voter_ids
        if voter == self.node_id or voter not in voters:
            return
        check.fetched.add(voter)
        if len(check.fetched) + 1 >= len(voters) // 2 + 1:
            check.fetched.clear()
            check.deadline = now + self._check_quorum_ms

    def check_quorum(self, now: int) -> int | None:
        """When a leader must next look at its check-quorum timer; ``None`` when it has expired.

        A leader a majority cannot reach must not keep the quorum waiting:
        on ``None`` it resigns. A lone voter never runs the timer.
        """
        check = self._check_quorum
        assert check is not None
        if len(self._membership.voter_ids) <= 1:
            return FOREVER
        return None if now >= check.deadline else check.deadline

    def acknowledged(self, voter: int) -> None:
        """``voter`` has reached the leader of this epoch (a fetch): BeginQuorumEpoch need not go to it again."""
        self._unacked.discard(voter)

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

    def common_response(self, error: ErrorCode, leader_id: int | None, epoch: int) -> bool | None:
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
        membership = self._membership
        if not membership.history.dynamic and (not membership.is_voter or remote_id not in membership.voter_ids):
            # Static voters (KIP-595): only voters take part in elections. With a dynamic set
            # (KIP-853) the peer may know of a set this node has not replicated yet.
            return ErrorCode.inconsistent_voter_set
        return None

    def validate_leader_only(self, epoch: int) -> ErrorCode | None:
        if epoch < self.epoch:
            return ErrorCode.fenced_leader_epoch
        if epoch > self.epoch:
            return ErrorCode.unknown_leader_epoch
        if self.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower
        return None

    def cluster_ok(self, cluster_id: str | None) -> bool:
        return cluster_id is None or cluster_id == self.cluster_id

    def leader_or_minus_one(self) -> int:
        return -1 if self.leader_id is None else self.leader_id

    # ---------------------------------------------------------------- Vote

    def _can_grant_vote(self, candidate: int, up_to_date: bool, pre_vote: bool) -> bool:
        if not self._membership.is_voter:
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
            assert self._fetch_timer is not None
            return pre_vote and not self._fetch_timer.has_fetched and up_to_date
        return False  # leader, resigned

    def on_vote_request(self, source: int, request: Any, now: int) -> Any:
        if not self.cluster_ok(request.cluster_id):
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
        up_to_date = candidate_end.at_least(OffsetAndEpoch(self._log.end_offset, self._log.last_fetched_epoch))
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
                               leader_id=self.leader_or_minus_one(), granted=granted,
                               endpoints=self._membership.voters)

    def _vote_request(self, voter: int) -> Any:
        return m.vote_request(cluster_id=self.cluster_id, voter_id=voter, epoch=self.epoch,
                              candidate_id=self.node_id, last_epoch=self._log.last_fetched_epoch,
                              last_offset=self._log.end_offset, pre_vote=self.role is Role.PROSPECTIVE)

    def on_vote_response(self, source: int, request: Any, response: Any, now: int) -> bool:
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

    def on_begin_quorum_epoch_request(self, source: int, request: Any, now: int) -> Any:
        if not self.cluster_ok(request.cluster_id):
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
                                             leader_id=self.leader_or_minus_one(),
                                             endpoints=self._membership.voters)

    def _quorum_epoch_response(self, response: Any) -> bool | None:
        """The checks Vote, BeginQuorumEpoch and EndQuorumEpoch responses share.

        ``None`` when the answer is a success for this epoch and the API's own
        handler goes on, else whether the request is settled (Kafka's
        maybeHandleCommonResponse first).
        """
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.topics, "topic_name")
        if p is None:
            return False
        handled = self.common_response(p.error_code, p.leader_id if p.leader_id >= 0 else None, p.leader_epoch)
        if handled is not None:
            return handled
        return None if p.error_code == NONE else False

    def on_begin_quorum_epoch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        settled = self._quorum_epoch_response(response)
        if settled is not None:
            return settled
        if self.role is Role.LEADER:
            self._unacked.discard(source)
        return True

    def on_end_quorum_epoch_request(self, source: int, request: Any, now: int) -> Any:
        if not self.cluster_ok(request.cluster_id):
            return m.end_quorum_epoch_response(ErrorCode.inconsistent_cluster_id)
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            return m.end_quorum_epoch_response(ErrorCode.invalid_request)
        error = self._validate_voter_only(p.leader_id, p.leader_epoch)
        if error is None:
            self._maybe_transition(p.leader_id, p.leader_epoch)
            if self.role is Role.FOLLOWER and self.leader_id == p.leader_id:
                assert self._fetch_timer is not None
                preferred = [c.candidate_id for c in p.preferred_candidates]
                self._fetch_timer.deadline = now + self._end_epoch_backoff_ms(preferred)
                # The leader said it is gone: pre-votes for a successor are no longer disruptive.
                self._fetch_timer.has_fetched = False
        return m.end_quorum_epoch_response(NONE, partition_error=error or NONE, epoch=self.epoch,
                                           leader_id=self.leader_or_minus_one(), endpoints=self._membership.voters)

    def on_end_quorum_epoch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        settled = self._quorum_epoch_response(response)
        if settled is not None:
            return settled
        if self.role is Role.RESIGNED:
            self._unacked.discard(source)
        return True

    # ---------------------------------------------------------------- polling

    def send_begin_quorum_epoch(self, now: int) -> int:
        """A leader tells each voter that has not yet fetched from it of its epoch; returns when to look again."""
        wake = FOREVER
        for voter in sorted(self._unacked):
            wake = min(wake, now + self._outbox.send(voter, lambda v=voter: m.begin_quorum_epoch_request(
                cluster_id=self.cluster_id, voter_id=v, epoch=self.epoch, leader_id=self.node_id,
                listener=self._config.listener_name, endpoints=self._membership.voters)))
        return wake

    def poll(self, now: int, look_for_leader: Callable[[], int]) -> int:
        """The timers of the roles that are all election (unattached, prospective, candidate, resigned).

        An unattached node also looks for a leader with ``look_for_leader``
        (a Fetch to any voter), which returns how long until it may again.
        Returns when to poll next.
        """
        role = self.role
        if role is Role.CANDIDATE:
            return self._poll_candidate(now)
        if role is Role.PROSPECTIVE:
            return self._poll_prospective(now)
        if role is Role.RESIGNED:
            return self._poll_resigned(now)
        return self._poll_unattached(now, look_for_leader)

    def _poll_unattached(self, now: int, look_for_leader: Callable[[], int]) -> int:
        if self._membership.is_voter and now >= self._deadline:
            self.to_prospective()
            return now
        return min(self._deadline, now + look_for_leader())

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
                self.to_prospective()
                return now
            return self._backoff_until
        if now >= self._deadline:
            self._backoff_until = now + self._election_backoff_ms(self._retries)
            return self._backoff_until
        if tally.lost:
            return self._deadline
        return min(self._deadline, self._send_votes(tally, now))

    def _send_votes(self, tally: _Tally, now: int) -> int:
        wake = FOREVER
        for voter in tally.unrecorded():
            wake = min(wake, now + self._outbox.send(voter, lambda v=voter: self._vote_request(v)))
        return wake

    def _poll_resigned(self, now: int) -> int:
        if now >= self._deadline:
            # Kafka: an expired resignation starts the next epoch unattached, electing at once.
            self._to_unattached(self.epoch + 1, election_timeout_ms=0)
            return now
        wake = self._deadline
        for voter in sorted(self._unacked):
            wake = min(wake, now + self._outbox.send(voter, lambda: m.end_quorum_epoch_request(
                cluster_id=self.cluster_id, epoch=self.epoch, leader_id=self.node_id, preferred=self._preferred,
                listener=self._config.listener_name, endpoints=self._membership.voters)))
        return wake
