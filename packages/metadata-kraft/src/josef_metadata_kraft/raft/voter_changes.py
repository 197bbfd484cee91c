"""Changing the voter set of a dynamic quorum (KIP-853): AddRaftVoter, RemoveRaftVoter and UpdateRaftVoter.

The leader serves one change at a time by appending a new VotersRecord, in
force (for elections and the high watermark) as soon as it is appended,
and answers once it is committed. A leader that removed itself hands over
once the removal is committed. A voter whose endpoints in the voter set
are not its own asks its leader to update them.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
from kio.schema.errors import ErrorCode

from . import messages as m
from .config import RaftConfig
from .election import Election, Role
from .log import RaftLog
from .membership import Membership
from .messages import NONE
from .outbox import FOREVER, Outbox, RequestManager
from .replication import Replication
from .voters import NO_DIRECTORY_ID, VoterInfo, control_records, voters_control


@attrs.define
class _Change:
    """A voter change the leader appended; answered once committed, or when ``deadline`` passes."""

    source: int
    request: Any
    offset: int
    deadline: int
    respond: Callable[..., Any]


class VoterChanges:
    """The leader's voter change in progress, and a voter's request to update its own endpoints."""

    def __init__(self, node_id: int, config: RaftConfig, log: RaftLog, outbox: Outbox, membership: Membership,
                 election: Election, replication: Replication, *, directory_id: Any,
                 local_endpoints: tuple[tuple[str, str, int], ...]) -> None:
        self._node_id = node_id
        self._config = config
        self._log = log
        self._outbox = outbox
        self._membership = membership
        self._election = election
        self._replication = replication
        self._directory_id = directory_id
        self._local_endpoints = local_endpoints
        self._pending: _Change | None = None
        #: UpdateRaftVoter goes beside the Fetch to the same leader, so it has its own one-in-flight rule.
        self._update_requests = RequestManager(config)
        self._update_after = 0

    def stand_down(self) -> None:
        """A change the leader did not see committed is answered: the next leader may or may not commit it."""
        self._update_requests.reset()
        change, self._pending = self._pending, None
        if change is not None:
            self._outbox.put(change.source, change.respond(
                ErrorCode.not_leader_or_follower, "the leader changed before the voter change committed"),
                change.request)

    # ---------------------------------------------------------------- the leader's side

    def poll(self, now: int) -> int:
        """Answer the change in progress once committed or timed out; returns when to look again."""
        change = self._pending
        if change is None:
            return FOREVER
        hw = self._replication.leader_high_watermark
        if hw is not None and hw > change.offset:
            self._pending = None
            self._outbox.put(change.source, change.respond(NONE), change.request)
        elif now >= change.deadline:
            self._pending = None
            self._outbox.put(change.source, change.respond(
                ErrorCode.request_timed_out, "the voter change did not commit in time"), change.request)
        else:
            return change.deadline
        return FOREVER

    def removal_committed(self) -> bool:
        """This leader is no longer a voter, and the change that removed it is committed: it must hand over."""
        hw = self._replication.leader_high_watermark
        last = self._membership.history.last_offset()
        return not self._membership.is_voter and hw is not None and last is not None and hw > last

    def _refusal(self, cluster_id: str | None) -> tuple[ErrorCode, str] | None:
        """Why the leader cannot start a voter change now (Kafka's AddVoterHandler/RemoveVoterHandler checks)."""
        election = self._election
        if not election.cluster_ok(cluster_id):
            return ErrorCode.inconsistent_cluster_id, f"the cluster id is {election.cluster_id}"
        if election.role is not Role.LEADER:
            return ErrorCode.not_leader_or_follower, f"node {self._node_id} is not the leader"
        history = self._membership.history
        if not history.dynamic:
            return (ErrorCode.unsupported_version,
                    "the quorum is at kraft.version 0 (static controller.quorum.voters): voters cannot change")
        hw = self._replication.leader_high_watermark
        if hw is None:
            return ErrorCode.request_timed_out, "the leader has not yet committed an offset in its epoch"
        last = history.last_offset()
        if self._pending is not None or (last is not None and last >= hw):
            return ErrorCode.request_timed_out, "a voter change is still in progress"
        return None

    def _append(self, source: int, request: Any, voters: dict[int, VoterInfo], timeout_ms: int,
                respond: Callable[..., Any], ack_when_committed: bool = True) -> Any | None:
        epoch, now = self._election.epoch, self._outbox.now
        batch = control_records(voters_control(voters, with_version=False), base_offset=self._log.end_offset,
                                epoch=epoch, timestamp_ms=now)
        result = self._log.append_as_leader(batch, epoch)
        self._log.flush()
        self._membership.learn(batch)
        self._replication.leader_appended()
        if not ack_when_committed:
            return respond(NONE)
        self._pending = _Change(source, request, result.last_offset, now + timeout_ms, respond)
        return None

    def on_add_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        version = type(request).__version__

        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.add_raft_voter_response(version, error, message)

        refusal = self._refusal(request.cluster_id)
        if refusal is not None:
            return respond(*refusal)
        voter_id = int(request.voter_id)
        if voter_id in self._membership.voter_ids:
            return respond(ErrorCode.duplicate_voter, f"node {voter_id} is already a voter")
        listener = self._config.listener_name
        endpoints = tuple((lst.name, lst.host, int(lst.port)) for lst in request.listeners)
        if not any(name == listener for name, _, _ in endpoints):
            return respond(ErrorCode.invalid_request, f"the new voter has no endpoint on the listener {listener}")
        progress = self._replication.observer(voter_id)
        if (progress is None or progress.end_offset is None
                or progress.last_caught_up_ms < now - self._config.fetch_timeout_ms):
            return respond(ErrorCode.request_timed_out,
                           f"node {voter_id} is not an observer that has caught up with the leader")
        directory = request.voter_directory_id
        if (progress.directory_id not in (None, NO_DIRECTORY_ID) and directory not in (None, NO_DIRECTORY_ID)
                and progress.directory_id != directory):
            return respond(ErrorCode.request_timed_out,
                           f"node {voter_id} fetches with directory id {progress.directory_id}, not {directory}")
        voters = dict(self._membership.current())
        voters[voter_id] = VoterInfo(voter_id, None if directory in (None, NO_DIRECTORY_ID) else directory, endpoints)
        timeout_ms = int(request.timeout.total_seconds() * 1000) or self._config.request_timeout_ms
        return self._append(source, request, voters, timeout_ms, respond, getattr(request, "ack_when_committed", True))

    @staticmethod
    def _named_voter(voters: dict[int, Any], request: Any) -> Any | None:
        """The voter a Remove/UpdateRaftVoter request names, if its id (and directory id, when both know one) match."""
        found = voters.get(int(request.voter_id))
        directory = request.voter_directory_id
        if found is None or (directory not in (None, NO_DIRECTORY_ID) and found.directory_id is not None
                             and found.directory_id != directory):
            return None
        return found

    def on_remove_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.remove_raft_voter_response(error, message)

        refusal = self._refusal(request.cluster_id)
        if refusal is not None:
            return respond(*refusal)
        voter_id = int(request.voter_id)
        voters = dict(self._membership.current())
        if self._named_voter(voters, request) is None:
            return respond(ErrorCode.voter_not_found,
                           f"node {voter_id} with directory id {request.voter_directory_id} is not a voter")
        if len(voters) == 1:
            return respond(ErrorCode.voter_not_found, f"cannot remove the last voter {voter_id}")
        del voters[voter_id]
        return self._append(source, request, voters, self._config.request_timeout_ms * 5, respond)

    def on_update_raft_voter_request(self, source: int, request: Any, now: int) -> Any | None:
        election = self._election
        leader_endpoint = self._membership.endpoint(election.leader_id) if election.leader_id is not None else None

        def respond(error: ErrorCode, message: str | None = None) -> Any:
            return m.update_raft_voter_response(error, leader_id=election.leader_or_minus_one(),
                                                epoch=election.epoch, endpoint=leader_endpoint)

        if election.role is Role.LEADER:
            epoch_error = election.validate_leader_only(int(request.current_leader_epoch))
            if epoch_error is not None:
                return respond(epoch_error)
        refusal = self._refusal(request.cluster_id)
        if refusal is not None:
            return respond(refusal[0])
        voter_id = int(request.voter_id)
        voters = dict(self._membership.current())
        found = self._named_voter(voters, request)
        if found is None:
            return respond(ErrorCode.voter_not_found)
        endpoints = tuple((lst.name, lst.host, int(lst.port)) for lst in request.listeners)
        if not any(name == self._config.listener_name for name, _, _ in endpoints):
            return respond(ErrorCode.invalid_request)
        if set(endpoints) == set(found.endpoints):
            return respond(NONE)
        voters[voter_id] = VoterInfo(voter_id, found.directory_id, endpoints)
        return self._append(source, request, voters, self._config.request_timeout_ms * 5, respond)

    # ---------------------------------------------------------------- a voter's own endpoints

    def maybe_update_voter(self, now: int) -> int:
        """A voter whose endpoints in the voter set are not its own asks the leader to update them (KIP-853)."""
        election, membership = self._election, self._membership
        if (not membership.is_voter or not membership.history.dynamic or not self._local_endpoints
                or not election.has_fetched or election.leader_id is None):
            return FOREVER
        mine = membership.current().get(self._node_id)
        if mine is None or set(mine.endpoints) == set(self._local_endpoints):
            return FOREVER
        if now < self._update_after:
            return self._update_after
        leader = election.leader_id
        wait = self._update_requests.wait_ms(leader, now)
        if wait:
            return now + wait
        request = m.update_raft_voter_request(cluster_id=election.cluster_id, epoch=election.epoch,
                                              voter_id=self._node_id, directory_id=self._directory_id,
                                              endpoints=self._local_endpoints)
        self._update_requests.sent(leader, request, now)
        self._outbox.put(leader, request)
        return now + self._config.request_timeout_ms

    def on_update_raft_voter_response(self, source: int, request: Any, response: Any, now: int) -> None:
        if self._update_requests.expects(source, request):
            ok = response.error_code == NONE
            self._update_requests.done(source, request, ok, now)
            # Succeeded: the new set arrives by Fetch. Refused: try again later, not at network speed.
            self._update_after = now + self._config.election_timeout_ms

    def send_failed(self, destination: int, request: Any, now: int) -> None:
        if self._update_requests.expects(destination, request):
            self._update_requests.done(destination, request, False, now)
            self._update_after = now + self._config.election_timeout_ms
