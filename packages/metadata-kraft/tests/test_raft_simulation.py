"""Randomised simulations of a KRaft quorum, and proof that they would catch a broken node.

Each schedule (see :func:`raft_sim.run_schedule`) runs 3 or 5 voters and an
observer on a simulated network that delays, drops, duplicates and reorders
messages and partitions the cluster, crashes nodes (losing what they had not
flushed) and restarts them, while clients append to whoever leads and nodes
snapshot and trim their logs. After every step the simulation checks:

* election safety: at most one leader per epoch, ever;
* state machine safety: every batch below any node's high watermark is the
  one committed at that offset, and what each node applies (batches and
  loaded snapshots) is exactly the committed log;
* leader completeness: a new leader holds every committed batch;
* monotonic high watermark on every node while it is up; observers never
  vote nor stand;

and at the end of a schedule, log matching between every pair of logs and
liveness: once the network heals and every node is up, a leader is elected
and a new append is applied on every node within a bounded time.

``JOSEF_RAFT_SIM_SEEDS`` multiplies the number of schedules (default 1x:
2000 schedules).
"""

from __future__ import annotations

import os
import random

import pytest
from raft_sim import MemoryQuorumStateStore, MemoryRaftLog, Net, SafetyViolation, run_schedule

from josef.protocol.records import build_batch
from josef_metadata_kraft.raft import ElectionState, RaftConfig, RaftInvariantError, RaftLogError, RaftNode, Role
from josef_metadata_kraft.raft import messages as m
from josef_metadata_kraft.raft import replication as replication_module
from josef_metadata_kraft.raft.election import Election
from josef_metadata_kraft.raft.replication import Replication

SCALE = int(os.environ.get("JOSEF_RAFT_SIM_SEEDS", "1"))
CHUNK = 100 * SCALE
CHUNKS = {3: 12, 5: 8}  # 1200 schedules with 3 voters, 800 with 5


@pytest.mark.parametrize(("voters", "chunk"), [(v, c) for v, n in CHUNKS.items() for c in range(n)])
def test_random_schedules_keep_raft_safe_and_live(voters, chunk):
    totals = {"leaders": 0, "commits": 0, "crashes": 0, "snapshots_installed": 0}
    worst = 0
    for seed in range(chunk * CHUNK, (chunk + 1) * CHUNK):
        stats = run_schedule(seed, voters)  # raises with the seed in the message
        for key in totals:
            totals[key] += getattr(stats, key)
        worst = max(worst, stats.liveness_ms)
    # The schedules must actually exercise what they claim to check.
    assert totals["leaders"] > CHUNK and totals["commits"] > 3 * CHUNK, totals
    assert totals["crashes"] > CHUNK and totals["snapshots_installed"] > CHUNK // 10, totals
    assert 0 < worst <= 30 * 100, worst


# ------------------------------------------------------------------ plausible bugs the checks must catch


def broken(part, cls):
    """A RaftNode whose ``part`` (``"_election"``, ``"_replication"``) is a ``cls``: a subclass with a bug.

    The parts are built inside RaftNode, so the bug is swapped in once the
    node has started, before any message reaches it.
    """

    class Broken(RaftNode):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            getattr(self, part).__class__ = cls

    Broken.__name__, Broken.__doc__ = cls.__name__, cls.__doc__
    return Broken


class VoteIgnoresLog(Election):
    """Grants votes without comparing logs (Raft's election restriction dropped)."""

    def _can_grant_vote(self, candidate, up_to_date, pre_vote):
        return super()._can_grant_vote(candidate, True, pre_vote)


class VoteTwice(Election):
    """Forgets whom it voted for: a second candidate in the same epoch gets a vote too."""

    def _can_grant_vote(self, candidate, up_to_date, pre_vote):
        if self.role in (Role.UNATTACHED, Role.PROSPECTIVE) and not pre_vote:
            return up_to_date and self.leader_id is None
        return super()._can_grant_vote(candidate, up_to_date, pre_vote)


class HwCountsObservers(Replication):
    """Counts observers' fetch offsets towards the majority behind the high watermark."""

    def _maybe_advance_hw(self):
        leader = self._leader
        everyone = [*leader.voters.values(), *leader.observers.values()]
        ends = sorted((p.end_offset for p in everyone if p.end_offset is not None), reverse=True)
        index = len(leader.voters) // 2
        if len(ends) > index and ends[index] > leader.epoch_start_offset and (
                leader.high_watermark is None or ends[index] > leader.high_watermark):
            leader.high_watermark = ends[index]
            return True
        return False


class HwOldEpoch(Replication):
    """Commits by counting replicas alone, even records of older epochs (Raft's figure 8)."""

    def _maybe_advance_hw(self):
        leader = self._leader
        ends = sorted((p.end_offset for p in leader.voters.values() if p.end_offset is not None), reverse=True)
        index = len(leader.voters) // 2
        if len(ends) > index and (leader.high_watermark is None or ends[index] > leader.high_watermark):
            leader.high_watermark = ends[index]
            return True
        return False


class NoFlush(RaftNode):
    """Reports log ends it never flushed: a crash then loses records a majority was counted for."""

    def __init__(self, node_id, voters, log, *args, **kwargs):
        class Unflushed:
            def __getattr__(self, name):
                return getattr(log, name)

            def flush(self):
                pass

        super().__init__(node_id, voters, Unflushed(), *args, **kwargs)


class NaiveTruncation(Replication):
    """Truncates to the leader's diverging offset without consulting its own epochs."""

    def on_fetch_response(self, source, request, response, now):
        original = replication_module.truncation_offset
        replication_module.truncation_offset = lambda log, diverging: min(diverging.offset, log.end_offset)
        try:
            return super().on_fetch_response(source, request, response, now)
        finally:
            replication_module.truncation_offset = original


class VoteNotPersisted(Election):
    """Grants a vote without writing it to the quorum-state first."""

    def _durable(self, role, epoch, leader_id, voted_id):
        if role is Role.UNATTACHED and voted_id is not None:
            self._set_role(role, epoch, leader_id, voted_id)
        else:
            super()._durable(role, epoch, leader_id, voted_id)


@pytest.mark.parametrize("mutant", [broken("_election", VoteIgnoresLog), broken("_election", VoteTwice),
                                    broken("_replication", HwCountsObservers), NoFlush,
                                    broken("_replication", NaiveTruncation)])
def test_the_random_schedules_catch_a_broken_node(mutant):
    for seed in range(300):
        try:
            run_schedule(seed, 3, node_factory=mutant)
        except (SafetyViolation, RaftInvariantError, RaftLogError):
            return
    pytest.fail(f"300 schedules did not notice {mutant.__name__}: {mutant.__doc__}")


# ------------------------------------------------------------------ scripted histories


def log_of(epochs, *, data_at=()):
    """A log with one batch per entry of ``epochs``: a LeaderChange opening each epoch, else data."""
    log = MemoryRaftLog()
    last = None
    for epoch in epochs:
        if epoch != last and log.end_offset not in data_at:
            batch = m.leader_change_batch(base_offset=log.end_offset, epoch=epoch, leader_id=1, voters=[1, 2, 3],
                                          granting_voters=[1], timestamp_ms=0)
        else:
            batch = build_batch([(None, b"X", 0)], base_offset=log.end_offset, leader_epoch=epoch)
        log.append_as_leader(batch, epoch)
        last = epoch
    log.flush()
    return log


def figure8(factory):
    """Raft's figure 8 in KRaft: returns the batches that ever sat below some node's high watermark and
    the log of the leader elected last.

    A (1) holds a record X of epoch 1 that only it has; B (2) won epoch 2 but its LeaderChange reached
    nobody. With B cut off, A wins epoch 3 and C (3), fetching one batch at a time, gets X but not A's
    epoch-3 LeaderChange before A is cut off too. B then wins epoch 4 with C's vote, and X goes.
    Correctly, X was never committed; a leader counting replicas of old epochs would have committed it.
    """
    small = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                       request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50, fetch_max_bytes=1)

    def make(node_id, log, state):
        store = MemoryQuorumStateStore()
        store.write(state)
        return factory(node_id, {1: ("a", 1), 2: ("b", 1), 3: ("c", 1)}, log, store, cluster_id="f8",
                       config=small, rng=random.Random(node_id))

    a = make(1, log_of([1, 1], data_at={1}), ElectionState(2))
    b = make(2, log_of([1, 2]), ElectionState(2, leader_id=2, voted_id=2))
    c = make(3, log_of([1]), ElectionState(2, voted_id=2))
    net = Net({1: a, 2: b, 3: c})
    committed: dict[int, bytes] = {}

    def record(n):
        for node in n.nodes.values():
            hw = node.high_watermark or 0
            for batch in node.log.batches():
                if batch.last < hw:
                    committed.setdefault(batch.base, batch.data)
        return False

    # A's epoch-3 records (from offset 2) never reach C.
    net.drop = lambda src, dst, msg: (src, dst) == (1, 3) and type(msg).__api_key__ == 1 and bool(
        msg.responses and msg.responses[0].partitions[0].records[:8] == (2).to_bytes(8, "big"))
    net.isolate(2)
    assert net.run(3000, until=lambda n: record(n) or (
        a.role is Role.LEADER and a._replication._leader.voters[3].end_offset == 2))
    assert (a.epoch, c.log.end_offset) == (3, 2)
    net.cut.clear()
    net.isolate(1)
    net.drop = None
    assert net.run(5000, until=lambda n: record(n) or (b.role is Role.LEADER and c.log.end_offset >= 3))
    net.run(200, until=record)
    # The history went where it should: B leads epoch 4 and C's copy of X was cut away.
    assert (b.role, b.epoch, c.leader_id) == (Role.LEADER, 4, 2)
    assert [batch.epoch for batch in c.log.batches()][:2] == [1, 2]
    return committed, {batch.base: batch.data for batch in b.log.batches()}


def test_figure8_history_loses_nothing_committed():
    committed, final = figure8(RaftNode)
    assert all(final.get(offset) == data for offset, data in committed.items())


def test_figure8_history_catches_a_leader_committing_an_older_epochs_record():
    committed, final = figure8(broken("_replication", HwOldEpoch))
    assert any(final.get(offset) != data for offset, data in committed.items())


def vote_amnesia(factory):
    """A voter grants a vote, restarts, and is asked again by a rival in the same epoch: how many grants?"""
    store, log = MemoryQuorumStateStore(), MemoryRaftLog()

    def voter():
        return factory(3, {1: ("a", 1), 2: ("b", 1), 3: ("c", 1)}, log, store, cluster_id="va",
                       config=RaftConfig(), rng=random.Random(0))

    grants = 0
    for candidate in (1, 2):
        node = voter()  # the second one is the same voter restarted: same store, same log
        request = m.vote_request(cluster_id="va", voter_id=3, epoch=5, candidate_id=candidate, last_epoch=0,
                                 last_offset=0, pre_vote=False)
        grants += node.handle_request(candidate, request, 0).topics[0].partitions[0].vote_granted
    return grants


def test_a_restarted_voter_does_not_vote_twice_in_an_epoch():
    assert vote_amnesia(RaftNode) == 1
    assert vote_amnesia(broken("_election", VoteNotPersisted)) == 2
