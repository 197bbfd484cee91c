"""Log replication by fetch: the leader's side (appends, replica progress, the high watermark) and the follower's.

Replication is pull-based: followers fetch, the leader answers with
records, its high watermark, a diverging epoch (the follower truncates) or a
snapshot id (the follower downloads it with FetchSnapshot). The leader
counts a record committed once a majority of voters has fetched past it,
and only from a record of its own epoch on (Raft's figure 8).

Where this departs from Kafka 4.0, on purpose:

* a parked Fetch is also answered when the high watermark moves, so
  followers learn of commits without waiting out ``fetch_max_wait_ms``;
* a Fetch answered with an error that teaches nothing (a voter that does not
  know the leader either) is retried after ``retry_backoff_ms``, not at once.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import attrs
from kio.schema.errors import ErrorCode

from josef.protocol.records import build_batch

from . import messages as m
from .config import RaftConfig
from .delivery import Delivery
from .election import Election, Role
from .errors import NotLeaderError, RaftInvariantError
from .log import (
    FetchPosition,
    OffsetAndEpoch,
    RaftLog,
    truncation_offset,
    validate_offset_and_epoch,
)
from .membership import Membership
from .messages import NONE
from .outbox import FOREVER, Outbox
from .snapshots import Snapshots
from .voters import control_records, voters_control

#: Kafka's KafkaRaftClient.MAX_BATCH_SIZE_BYTES: the largest batch a leader appends.
MAX_BATCH_BYTES = 8 * 1024 * 1024
#: Kafka's LeaderState.OBSERVER_SESSION_TIMEOUT_MS: observers leave DescribeQuorum after this.
OBSERVER_SESSION_TIMEOUT_MS = 300_000


@attrs.define
class _Progress:
    """What the leader knows of one replica (Kafka's LeaderState.ReplicaState)."""

    end_offset: int | None = None
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    last_fetch_leader_end: int | None = None
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
class _Leader:
    """What replication keeps for the epoch this node leads."""

    epoch_start_offset: int
    voters: dict[int, _Progress]
    high_watermark: int | None = None
    observers: dict[int, _Progress] = attrs.field(factory=dict)
    deferred: list[_Deferred] = attrs.field(factory=list)


class Replication:
    """Appends and Fetch, on both sides, and the leader's view of every replica."""

    def __init__(self, node_id: int, config: RaftConfig, log: RaftLog, outbox: Outbox, rng: random.Random,
                 membership: Membership, election: Election, snapshots: Snapshots, delivery: Delivery, *,
                 directory_id: Any) -> None:
        self._node_id = node_id
        self._config = config
        self._log = log
        self._outbox = outbox
        self._rng = rng
        self._membership = membership
        self._election = election
        self._snapshots = snapshots
        self._delivery = delivery
        self._directory_id = directory_id
        self._leader: _Leader | None = None
        membership.subscribe(self._voters_changed)

    # ---------------------------------------------------------------- leadership

    def lead(self, granting: frozenset[int]) -> None:
        """This node won its epoch: track every voter, and write the epoch's first records at once.

        The high watermark can only move once a record of this epoch is on a
        majority, so a LeaderChange record goes first (Kafka's
        appendStartOfEpochControlRecords).
        """
        log, epoch, now = self._log, self._election.epoch, self._outbox.now
        voter_ids = self._membership.voter_ids
        start = log.end_offset
        self._leader = _Leader(start, {v: _Progress() for v in voter_ids})
        batch = m.leader_change_batch(base_offset=start, epoch=epoch, leader_id=self._node_id,
                                      voters=voter_ids, granting_voters=granting, timestamp_ms=now)
        log.append_as_leader(batch, epoch)
        history = self._membership.history
        if history.dynamic and history.last_offset() == -1:
            # The voters came from the bootstrap snapshot, which followers never fetch: put them in the
            # log (Kafka's appendStartOfEpochControlRecords does the same).
            batch = control_records(voters_control(history.current(), with_version=True),
                                    base_offset=log.end_offset, epoch=epoch, timestamp_ms=now)
            log.append_as_leader(batch, epoch)
            self._membership.learn(batch)
        log.flush()
        self.leader_appended()

    def stand_down(self) -> None:
        """The epoch this node led is over: its parked fetches are answered with the error they now get."""
        leader, self._leader = self._leader, None
        if leader is not None:
            for parked in leader.deferred:
                self._outbox.put(parked.source, self._fetch_error(parked.partition), parked.request)

    @property
    def epoch_start_offset(self) -> int | None:
        """The offset of the LeaderChange record that opened the epoch this node leads."""
        return None if self._leader is None else self._leader.epoch_start_offset

    @property
    def leader_high_watermark(self) -> int | None:
        """The high watermark established as leader: ``None`` until a majority has its epoch's first record."""
        assert self._leader is not None
        return self._leader.high_watermark

    def observer(self, node_id: int) -> _Progress | None:
        """What the leader knows of an observer that has fetched from it."""
        assert self._leader is not None
        return self._leader.observers.get(node_id)

    def voters_by_end_offset(self) -> list[int]:
        """The other voters, most caught up first: the successors a resigning leader prefers."""
        leader = self._leader
        if leader is None:
            return []
        others = [v for v in leader.voters if v != self._node_id]
        return sorted(others, key=lambda v: (-(leader.voters[v].end_offset if leader.voters[v].end_offset
                                                is not None else -1), v))

    def _voters_changed(self, previous: frozenset[int]) -> None:
        """A voter set in force at once moves replicas between voters and observers, and may move the high watermark."""
        leader = self._leader
        if leader is None:
            return
        voter_ids = self._membership.voter_ids
        for v in [v for v in leader.voters if v not in voter_ids]:
            leader.observers[v] = leader.voters.pop(v)
        for v in voter_ids:
            if v not in leader.voters:
                leader.voters[v] = leader.observers.pop(v, None) or _Progress()
        if self._maybe_advance_hw():
            self._hw_advanced()

    # ---------------------------------------------------------------- appends and the high watermark

    def append(self, payloads: Sequence[bytes], now: int, epoch: int | None, timestamp_ms: int | None) -> int:
        election = self._election
        if election.role is not Role.LEADER or (epoch is not None and epoch != election.epoch):
            raise NotLeaderError(election.leader_id, election.epoch)
        if not payloads:
            raise ValueError("append needs at least one record")
        ts = now if timestamp_ms is None else timestamp_ms
        batch = build_batch([(None, p, ts) for p in payloads], base_offset=self._log.end_offset,
                            leader_epoch=election.epoch)
        if len(batch) > MAX_BATCH_BYTES:
            raise ValueError(f"batch of {len(batch)} bytes exceeds {MAX_BATCH_BYTES}")
        result = self._log.append_as_leader(batch, election.epoch)
        self._log.flush()
        self.leader_appended()
        return result.last_offset

    def leader_appended(self) -> None:
        """The leader's own log end moved (flushed): it counts towards the high watermark like a voter's fetch."""
        leader = self._leader
        assert leader is not None
        own = leader.voters.get(self._node_id) or leader.observers.setdefault(self._node_id, _Progress())
        own.end_offset = self._log.end_offset
        own.last_fetch_ms = own.last_caught_up_ms = self._outbox.now
        if self._maybe_advance_hw():
            self._hw_advanced()

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
        self._delivery.advance(leader.high_watermark)

    # ---------------------------------------------------------------- Fetch (leader side)

    def _fetch_error(self, partition: Any) -> Any:
        """The answer to a fetch this node cannot serve (or can no longer, for a parked one)."""
        election = self._election
        error = election.validate_leader_only(partition.current_leader_epoch) or ErrorCode.not_leader_or_follower
        return m.fetch_response(NONE, partition_error=error, log_start_offset=self._log.start_offset,
                                leader_id=election.leader_or_minus_one(), epoch=election.epoch,
                                endpoints=self._membership.voters)

    def on_fetch_request(self, source: int, request: Any, now: int) -> Any | None:
        election = self._election
        if not election.cluster_ok(request.cluster_id):
            return m.fetch_response(ErrorCode.inconsistent_cluster_id)
        fp = m.single_partition(request.topics, "topic_id", index_field="partition", topic=m.METADATA_TOPIC_ID)
        if fp is None:
            return m.fetch_response(ErrorCode.invalid_request)
        max_wait = int(request.max_wait.total_seconds() * 1000)
        if (max_wait < 0 or fp.fetch_offset < 0 or fp.last_fetched_epoch < 0
                or fp.last_fetched_epoch > fp.current_leader_epoch):
            return m.fetch_response(NONE, partition_error=ErrorCode.invalid_request,
                                    log_start_offset=self._log.start_offset,
                                    leader_id=election.leader_or_minus_one(), epoch=election.epoch)
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
        error = self._election.validate_leader_only(fp.current_leader_epoch)
        if error is not None:
            return self._fetch_error(fp), True
        leader = self._leader
        assert leader is not None
        log = self._log
        position = validate_offset_and_epoch(log, fp.fetch_offset, fp.last_fetched_epoch)
        records = b""
        if position.kind == FetchPosition.VALID:
            records = log.read(fp.fetch_offset, min(fp.partition_max_bytes, self._config.fetch_max_bytes))
            if update:
                self._update_replica(replica, fp.fetch_offset, now, fp)
        hw = leader.high_watermark
        response = m.fetch_response(
            NONE, high_watermark=-1 if hw is None else hw, log_start_offset=log.start_offset,
            leader_id=self._node_id, epoch=self._election.epoch,
            diverging=position.position if position.kind == FetchPosition.DIVERGING else None,
            snapshot_id=position.position if position.kind == FetchPosition.SNAPSHOT else None,
            records=records)
        return response, bool(records) or position.kind != FetchPosition.VALID

    def _update_replica(self, replica: int, fetch_offset: int, now: int, fp: Any = None) -> None:
        """A valid fetch tells the leader the replica's log end (Kafka's LeaderState.updateReplicaState)."""
        leader = self._leader
        assert leader is not None
        if replica < 0 or replica == self._node_id:
            return
        voter = replica in leader.voters
        progress = leader.voters[replica] if voter else leader.observers.setdefault(replica, _Progress())
        leader_end = self._log.end_offset
        if fetch_offset >= leader_end:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, now)
        elif progress.last_fetch_leader_end is not None and fetch_offset >= progress.last_fetch_leader_end:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.last_fetch_leader_end = leader_end
        progress.last_fetch_ms = max(progress.last_fetch_ms, now)
        progress.end_offset = fetch_offset
        progress.directory_id = getattr(fp, "replica_directory_id", None) if fp is not None else None
        if voter:
            self._election.acknowledged(replica)
            self._election.heard_from_voter(replica, now)
            if self._maybe_advance_hw():
                self._hw_advanced()

    def poll_deferred(self, now: int) -> int:
        """Answer parked fetches that have data, a new high watermark, or have waited long enough."""
        leader = self._leader
        if leader is None or not leader.deferred:
            return FOREVER
        end = self._log.end_offset
        parked, leader.deferred = leader.deferred, []
        wake = FOREVER
        for d in parked:
            if self._leader is not leader:  # a completion made us step down: stand_down answered the rest
                self._outbox.put(d.source, self._fetch_error(d.partition), d.request)
                continue
            if d.partition.fetch_offset < end or leader.high_watermark != d.high_watermark:
                response, _ = self._complete_fetch(d.replica_id, d.partition, now, update=True)
            elif now >= d.deadline:
                response, _ = self._complete_fetch(d.replica_id, d.partition, now, update=False)
            else:
                leader.deferred.append(d)
                wake = min(wake, d.deadline)
                continue
            self._outbox.put(d.source, response, d.request)
        return wake

    # ---------------------------------------------------------------- Fetch (follower side)

    def fetch_request(self) -> Any:
        log, election = self._log, self._election
        return m.fetch_request(cluster_id=election.cluster_id, replica_id=self._node_id, epoch=election.epoch,
                               fetch_offset=log.end_offset, last_fetched_epoch=log.last_fetched_epoch,
                               log_start_offset=log.start_offset, max_wait_ms=self._config.fetch_max_wait_ms,
                               max_bytes=self._config.fetch_max_bytes, directory_id=self._directory_id)

    def fetch_from_any_voter(self) -> int:
        """Look for the leader by asking a random voter (Kafka's maybeSendFetchToAnyBootstrap); returns the wait."""
        requests, now = self._outbox.requests, self._outbox.now
        if requests.inflight:
            return min(requests.wait_ms(d, now) for d in requests.inflight)
        membership = self._membership
        candidates = [v for v in sorted(membership.voter_ids) if v != self._node_id and v in membership.voters]
        if not candidates:
            candidates = sorted(membership.bootstrap)
        if not candidates:
            return FOREVER
        ready = [v for v in candidates if requests.wait_ms(v, now) == 0]
        if not ready:
            return min(requests.wait_ms(v, now) for v in candidates)
        return self._outbox.send(self._rng.choice(ready), self.fetch_request)

    def on_fetch_response(self, source: int, request: Any, response: Any, now: int) -> bool:
        if response.error_code != NONE:
            return False
        p = m.single_partition(response.responses, "topic_id", topic=m.METADATA_TOPIC_ID)
        if p is None:
            return False
        election = self._election
        leader_id = p.current_leader.leader_id
        before = (election.role, election.epoch, election.leader_id)
        handled = election.common_response(p.error_code, leader_id if leader_id >= 0 else None,
                                           p.current_leader.leader_epoch)
        if handled is not None:
            # An error that taught us nothing new (a voter that does not know the leader either, a
            # leader that resigned): back off before asking again rather than spin at network speed.
            return handled and (p.error_code == NONE or before != (election.role, election.epoch, election.leader_id))
        if p.error_code != NONE:
            return False
        if election.role is not Role.FOLLOWER or source != election.leader_id:
            return True
        log = self._log
        if p.diverging_epoch.epoch >= 0:
            diverging = OffsetAndEpoch(p.diverging_epoch.end_offset, p.diverging_epoch.epoch)
            hw = self._delivery.high_watermark
            if hw is not None and diverging.offset < hw:
                raise RaftInvariantError(f"node {self._node_id}: leader {source} asks to truncate to "
                                         f"{diverging.offset}, below the high watermark {hw}")
            log.truncate_to(max(truncation_offset(log, diverging), log.start_offset))
            self._membership.truncate(log.end_offset)
        elif p.snapshot_id.epoch >= 0 or p.snapshot_id.end_offset >= 0:
            if p.snapshot_id.epoch < 0 or p.snapshot_id.end_offset < 0:
                return False
            self._snapshots.start_download(OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch))
        else:
            if p.records:
                log.append_as_follower(bytes(p.records), election.epoch)
                self._membership.learn(bytes(p.records))
                # Voters report their log end as replicated: it must survive a crash first.
                log.flush()
            if p.high_watermark >= 0:
                self._delivery.advance(min(p.high_watermark, log.end_offset))
        election.heard_from_leader(now)
        return True

    # ---------------------------------------------------------------- DescribeQuorum

    def on_describe_quorum_request(self, source: int, request: Any, now: int) -> Any:
        if not 0 <= request.__version__ <= 2:
            raise ValueError(f"DescribeQuorum v{request.__version__} is not supported (0-2)")
        return m.describe_quorum_at_version(self._describe_quorum(request, now), request.__version__)

    def _describe_quorum(self, request: Any, now: int) -> Any:
        p = m.single_partition(request.topics, "topic_name")
        if p is None:
            topic = request.topics[0].topic_name if request.topics else m.METADATA_TOPIC
            return m.describe_quorum_response(partition_error=ErrorCode.unknown_topic_or_partition, topic=topic)
        election = self._election
        leader = self._leader
        if election.role is not Role.LEADER or leader is None:
            return m.describe_quorum_response(partition_error=ErrorCode.not_leader_or_follower,
                                              leader_id=election.leader_or_minus_one(), epoch=election.epoch)

        current = self._membership.current()

        def state(replica: int, progress: _Progress) -> Any:
            voter = current.get(replica)
            directory = voter.directory_id if voter is not None else None
            if replica == self._node_id:
                return m.replica_state(replica, self._log.end_offset, now, now, directory)
            end = -1 if progress.end_offset is None else progress.end_offset
            return m.replica_state(replica, end, progress.last_fetch_ms, progress.last_caught_up_ms, directory)

        voters = [state(v, leader.voters[v]) for v in sorted(leader.voters)]
        observers = [state(o, progress) for o, progress in sorted(leader.observers.items())
                     if now - progress.last_fetch_ms < OBSERVER_SESSION_TIMEOUT_MS]
        hw = -1 if leader.high_watermark is None else leader.high_watermark
        return m.describe_quorum_response(leader_id=self._node_id, epoch=election.epoch, high_watermark=hw,
                                          voters=voters, observers=observers,
                                          listener=self._config.listener_name, endpoints=self._membership.voters)
