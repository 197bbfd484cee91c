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

The node is composed of parts split along Raft's own seams, each owning its
state, as Kafka's raft module is split:

* :mod:`.membership`: the voter set in force (static, or the latest
  VotersRecord of a dynamic quorum) and where to reach every peer;
* :mod:`.election`: roles, epochs, votes and their timers (Vote,
  BeginQuorumEpoch, EndQuorumEpoch, check-quorum, a follower's fetch timeout);
* :mod:`.replication`: appends and Fetch on both sides, the leader's view of
  every replica and the high watermark it establishes; DescribeQuorum;
* :mod:`.snapshots`: creating snapshots, FetchSnapshot, a follower's download;
* :mod:`.voter_changes`: AddRaftVoter, RemoveRaftVoter, UpdateRaftVoter (KIP-853);
* :mod:`.delivery`: the high watermark and what the state machine has been told;
* :mod:`.outbox`: the messages for the driver, and the driver's clock.

This module wires them, routes each API to the part that answers it, and
says what each role does when time passes: the leader's and a follower's
polls involve several parts, so they meet here.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Sequence

from .config import RaftConfig
from .delivery import Delivery, RaftEvent
from .election import Election, Role
from .log import OffsetAndEpoch, RaftLog
from .membership import Membership
from .outbox import FOREVER, Outbound, Outbox
from .quorum_state import QuorumStateStore
from .replication import Replication
from .snapshots import Snapshots
from .voter_changes import VoterChanges
from .voters import VoterInfo


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
        self.log = log
        self.cluster_id = cluster_id
        self.config = config = config or RaftConfig()
        rng = rng or random.Random()
        self._membership = Membership(node_id, voters, log, config.listener_name, bootstrap_servers)
        self._outbox = Outbox(config, now_ms)
        self.next_poll_ms = now_ms
        # Each part is built after the parts it calls; election tells the later ones of role changes
        # through the two callbacks.
        self._election = Election(node_id, cluster_id, config, log, state_store, rng, self._outbox,
                                  self._membership, role_ended=self._role_ended, leading=self._leading)
        self._delivery = Delivery(node_id, log)
        self._snapshots = Snapshots(node_id, config, log, self._membership, self._election, self._delivery)
        self._replication = Replication(node_id, config, log, self._outbox, rng, self._membership, self._election,
                                        self._snapshots, self._delivery, directory_id=directory_id)
        self._voter_changes = VoterChanges(node_id, config, log, self._outbox, self._membership, self._election,
                                           self._replication, directory_id=directory_id,
                                           local_endpoints=self.local_endpoints)
        self._election.initialize()

    def _role_ended(self) -> None:
        """Every transition ends the old role: the parts drop (and answer) what they kept for it."""
        self._voter_changes.stand_down()
        self._replication.stand_down()
        self._snapshots.stand_down()

    def _leading(self, granting: frozenset[int]) -> None:
        self._replication.lead(granting)

    def _resign(self) -> None:
        """Hand over: the successors are the other voters, most caught up first."""
        self._election.to_resigned(self._replication.voters_by_end_offset())

    # ---------------------------------------------------------------- public surface

    @property
    def role(self) -> Role:
        return self._election.role

    @property
    def epoch(self) -> int:
        return self._election.epoch

    @property
    def leader_id(self) -> int | None:
        return self._election.leader_id

    @property
    def voted_id(self) -> int | None:
        return self._election.voted_id

    @property
    def voters(self) -> dict[int, tuple[str, int]]:
        """The voters in force and their endpoints on this node's listener."""
        return self._membership.voters

    @property
    def is_voter(self) -> bool:
        return self._membership.is_voter

    @property
    def kraft_version(self) -> int:
        """1 once the log holds a KRaftVersionRecord (a dynamic quorum, KIP-853), else 0."""
        return self._membership.kraft_version

    def voter_set(self) -> dict[int, VoterInfo]:
        """The voters in force: the latest VotersRecord appended, else the static ones."""
        return dict(self._membership.current())

    def endpoint(self, node_id: int) -> tuple[str, int] | None:
        """Where to reach ``node_id``: a voter, a node a response named, or a bootstrap server (ids -2, -3, ...)."""
        return self._membership.endpoint(node_id)

    @property
    def high_watermark(self) -> int | None:
        """The highest offset known committed (exclusive), ``None`` until learnt after a start.

        Never decreases while the process lives; a new leader keeps exposing
        the value it knew until its own high watermark is established.
        """
        return self._delivery.high_watermark

    def append(self, payloads: Sequence[bytes], now_ms: int, *, epoch: int | None = None,
               timestamp_ms: int | None = None) -> int:
        """Append ``payloads`` (record values) as one batch of the current epoch; returns its last offset.

        The batch is flushed before the call returns. Raises
        :class:`NotLeaderError` unless this node leads (the epoch ``epoch``
        when given). Committed once :meth:`drain_events` delivers it.
        """
        self._outbox.now = now_ms
        last_offset = self._replication.append(payloads, now_ms, epoch, timestamp_ms)
        self.next_poll_ms = now_ms
        return last_offset

    def resign(self, now_ms: int) -> None:
        """Step down gracefully: as leader, become Resigned and send EndQuorumEpoch naming successors.

        The successors are the other voters, most caught up first, so the
        best placed one starts an election at once.
        """
        self._outbox.now = now_ms
        if self._election.role is Role.LEADER:
            self._resign()
        self.next_poll_ms = now_ms

    def create_snapshot(self, end_offset: int, payloads: Sequence[bytes], now_ms: int, *,
                        trim: bool = False) -> OffsetAndEpoch:
        """Store a snapshot of the state machine after every record below ``end_offset`` (committed).

        ``payloads`` are the records that rebuild that state. ``trim`` drops
        the log prefix the snapshot replaces (followers behind it then fetch
        the snapshot). Returns the snapshot id ``(end_offset, epoch)``.
        """
        self._outbox.now = now_ms
        return self._snapshots.create(end_offset, payloads, now_ms, trim=trim)

    def plan_snapshot(self, end_offset: int) -> tuple[OffsetAndEpoch, Sequence[tuple[int, bytes]]]:
        """The id of a snapshot ending at ``end_offset`` (committed), and the control records it starts with.

        For an owner that builds and writes the snapshot elsewhere (a worker
        thread) rather than through :meth:`create_snapshot`.
        """
        return self._snapshots.plan(end_offset)

    def drain_events(self, max_bytes: int = 8 * 1024 * 1024) -> list[RaftEvent]:
        """What the owner's state machine must learn, in order: leader changes, snapshot loads, committed batches.

        Committed batches are read from the log below the high watermark, at
        most about ``max_bytes`` per call (call again while it returns some).
        A :class:`SnapshotLoaded` comes first when the next batch to deliver
        is no longer in the log (a downloaded snapshot, or a start with one).
        """
        election = self._election
        return self._delivery.drain(max_bytes, election.leader_id, election.epoch,
                                    self._replication.epoch_start_offset)

    # ---------------------------------------------------------------- driver entry points

    def poll(self, now_ms: int) -> list[Outbound]:
        """Run timers (elections, fetch timeouts, long polls, retries) and return what to send.

        Afterwards :attr:`next_poll_ms` is when the node next needs a poll
        unless a message arrives first; any other call may bring it forward.
        """
        self._outbox.now = now_ms
        self._outbox.requests.expire(now_ms)
        wake = FOREVER
        for _ in range(8):  # a transition may enable the next one (single voter: prospective -> leader)
            role = self._election.role
            wake = self._poll_role(now_ms)
            if self._election.role is role:
                break
        wake = min(wake, self._replication.poll_deferred(now_ms))
        self.next_poll_ms = max(now_ms + 1, wake)
        return self._outbox.take()

    def handle_request(self, source_id: int, request: Any, now_ms: int) -> Any | None:
        """Answer an inbound Raft request; ``None`` means deferred (it comes out of :meth:`poll` later)."""
        self._outbox.now = now_ms
        self.next_poll_ms = now_ms
        api = type(request).__api_key__
        handler: Callable[[int, Any, int], Any] | None = {
            1: self._replication.on_fetch_request,
            52: self._election.on_vote_request,
            53: self._election.on_begin_quorum_epoch_request,
            54: self._election.on_end_quorum_epoch_request,
            55: self._replication.on_describe_quorum_request,
            59: self._snapshots.on_fetch_snapshot_request,
            80: self._voter_changes.on_add_raft_voter_request,
            81: self._voter_changes.on_remove_raft_voter_request,
            82: self._voter_changes.on_update_raft_voter_request,
        }.get(api)
        if handler is None:
            raise ValueError(f"not a Raft request: {type(request).__name__}")
        return handler(source_id, request, now_ms)

    def handle_response(self, source_id: int, request: Any, response: Any, now_ms: int) -> None:
        """A response to ``request`` (the object this node sent) from ``source_id``; stale ones are ignored."""
        self._outbox.now = now_ms
        self.next_poll_ms = now_ms
        api = type(response).__api_key__
        if api == 82:
            self._voter_changes.on_update_raft_voter_response(source_id, request, response, now_ms)
            return
        requests = self._outbox.requests
        if not requests.expects(source_id, request):
            return
        self._membership.learn_endpoints(response)
        handler: Callable[[int, Any, Any, int], bool] = {
            1: self._replication.on_fetch_response,
            52: self._election.on_vote_response,
            53: self._election.on_begin_quorum_epoch_response,
            54: self._election.on_end_quorum_epoch_response,
            59: self._snapshots.on_fetch_snapshot_response,
        }[api]
        ok = handler(source_id, request, response, now_ms)
        requests.done(source_id, request, ok, now_ms)

    def handle_send_failure(self, destination: int, request: Any, now_ms: int) -> None:
        """The request could not be sent or its connection failed: back off and retry later."""
        self._outbox.now = now_ms
        self.next_poll_ms = now_ms
        self._outbox.requests.done(destination, request, False, now_ms)
        self._voter_changes.send_failed(destination, request, now_ms)

    # ---------------------------------------------------------------- polling per role

    def _poll_role(self, now: int) -> int:
        role = self._election.role
        if role is Role.LEADER:
            return self._poll_leader(now)
        if role is Role.FOLLOWER:
            return self._poll_follower(now)
        return self._election.poll(now, self._replication.fetch_from_any_voter)

    def _poll_leader(self, now: int) -> int:
        election = self._election
        wake = election.check_quorum(now)
        if wake is None:
            self._resign()
            return now
        wake = min(wake, self._voter_changes.poll(now))
        if self._voter_changes.removal_committed():
            self._resign()
            return now
        return min(wake, election.send_begin_quorum_epoch(now))

    def _poll_follower(self, now: int) -> int:
        election = self._election
        leader_id = election.leader_id
        assert leader_id is not None
        if now >= election.fetch_deadline:
            if self._membership.is_voter:
                election.to_prospective()
                return now
            return min(now + self._replication.fetch_from_any_voter(), now + self.config.fetch_timeout_ms)
        snapshots = self._snapshots
        build = snapshots.fetch_request if snapshots.downloading else self._replication.fetch_request
        wake = min(election.fetch_deadline, now + self._outbox.send(leader_id, build))
        return min(wake, self._voter_changes.maybe_update_voter(now))
