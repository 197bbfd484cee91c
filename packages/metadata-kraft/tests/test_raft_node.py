"""Focused tests of the sans-IO Raft node: one rule per test, driven message by message."""

import io
import json
import random

import pytest
from kio.schema.describe_quorum.v2.request import DescribeQuorumRequest, PartitionData, TopicData
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from raft_sim import MemoryQuorumStateStore, MemoryRaftLog, Net, data_payloads

from josef.protocol.records import BatchHeader, build_batch, iter_batches
from josef_metadata_kraft.raft import (
    CommittedBatch,
    ElectionState,
    FileQuorumStateStore,
    LeaderChanged,
    NotLeaderError,
    OffsetAndEpoch,
    RaftConfig,
    RaftNode,
    Role,
    SnapshotLoaded,
)
from josef_metadata_kraft.raft import messages as m

NONE = ErrorCode.none
VOTERS = {1: ("c1", 9093), 2: ("c2", 9093), 3: ("c3", 9093)}
CFG = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                 request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50)


def make(node_id, *, voters=VOTERS, log=None, store=None, state=None, config=CFG, seed=0, now=0):
    store = store if store is not None else MemoryQuorumStateStore()
    if state is not None:
        store.write(state)
    return RaftNode(node_id, voters, log if log is not None else MemoryRaftLog(), store, cluster_id="cluster",
                    config=config, rng=random.Random(seed), now_ms=now)


def fill(log, epochs, first_control=True):
    """Append one batch per entry of ``epochs``; a new epoch opens with a control batch, as a leader's would."""
    last = None
    for epoch in epochs:
        if first_control and epoch != last:
            batch = m.leader_change_batch(base_offset=log.end_offset, epoch=epoch, leader_id=1, voters=[1, 2, 3],
                                          granting_voters=[1], timestamp_ms=0)
        else:
            batch = build_batch([(None, b"r%d" % log.end_offset, 0)], base_offset=log.end_offset, leader_epoch=epoch)
        log.append_as_leader(batch, epoch)
        last = epoch
    log.flush()
    return log


def part(response):
    """The single partition of a Raft response."""
    topics = getattr(response, "topics", None) or getattr(response, "responses", None)
    return topics[0].partitions[0]


def vote(candidate, epoch, last_epoch, last_offset, *, pre_vote=False, cluster="cluster", voter_id=-1):
    return m.vote_request(cluster_id=cluster, voter_id=voter_id, epoch=epoch, candidate_id=candidate,
                          last_epoch=last_epoch, last_offset=last_offset, pre_vote=pre_vote)


def fetch(replica, epoch, offset, last_epoch, *, max_wait=0, max_bytes=1 << 20, cluster="cluster"):
    return m.fetch_request(cluster_id=cluster, replica_id=replica, epoch=epoch, fetch_offset=offset,
                           last_fetched_epoch=last_epoch, log_start_offset=0, max_wait_ms=max_wait,
                           max_bytes=max_bytes)


def api(message):
    return type(message).__api_key__


def win_election(node, now=1000):
    """Drive ``node`` to leadership, answering its own (pre-)vote requests with grants."""
    for _ in range(10):
        votes = [o for o in node.poll(now) if api(o.message) == 52]
        for out in votes:
            sent = part(out.message)
            node.handle_response(out.destination, out.message,
                                 m.vote_response(NONE, epoch=sent.replica_epoch, granted=True), now)
        if node.role is Role.LEADER:
            node.poll(now)
            return now
        if not votes:
            now += 250
    raise AssertionError(f"node {node.node_id} did not win: {node.role}")


def exchange(follower, leader, now, rounds=10):
    """Let ``follower`` fetch from ``leader`` (zero latency) until its fetch is parked: it is caught up."""
    for _ in range(rounds):
        for out in follower.poll(now):
            response = leader.handle_request(follower.node_id, out.message, now)
            if response is None:
                return
            follower.handle_response(leader.node_id, out.message, response, now)
    raise AssertionError("the follower did not catch up")


def batches(log):
    return [(b.base, b.epoch, b.data) for b in log.batches()]


# ------------------------------------------------------------------ elections


def test_a_single_voter_elects_itself_and_commits_alone(tmp_path):
    store = FileQuorumStateStore(tmp_path / "quorum-state")
    node = make(1, voters={1: ("c1", 9093)}, store=store)
    assert (node.role, node.epoch, node.high_watermark) == (Role.LEADER, 1, 1)
    assert json.loads((tmp_path / "quorum-state").read_text())["leaderId"] == 1
    kind, value = m.control_record(node.log.read(0, 1 << 20))
    change = m.decode_leader_change(value)
    assert kind == m.LEADER_CHANGE and change.leader_id == 1
    assert [v.voter_id for v in change.voters] == [1] and [v.voter_id for v in change.granting_voters] == [1]
    events = node.drain_events()
    assert [type(e) for e in events] == [CommittedBatch, LeaderChanged]
    assert events[0].is_control and events[1] == LeaderChanged(1, 1)
    assert node.append([b"a", b"b"], 5) == 2
    assert node.high_watermark == 3
    (committed,) = node.drain_events()
    assert data_payloads(committed.data) == [b"a", b"b"] and committed.base_offset == 1
    # A restart comes back as leader of a new epoch: the old one may hold lost writes.
    again = make(1, voters={1: ("c1", 9093)}, store=store, log=node.log)
    assert (again.role, again.epoch) == (Role.LEADER, 2)


@pytest.mark.parametrize(
    ("last_epoch", "last_offset", "granted"),
    [
        (1, 100, False),  # a longer log of an older epoch is behind
        (2, 4, False),  # same epoch, shorter
        (2, 5, True),  # same epoch, same end
        (2, 9, True),
        (3, 1, True),  # a newer epoch wins whatever its length
    ],
)
def test_votes_go_only_to_candidates_at_least_as_up_to_date(last_epoch, last_offset, granted):
    voter = make(1, log=fill(MemoryRaftLog(), [1, 1, 2, 2, 2]), state=ElectionState(2))
    response = voter.handle_request(2, vote(2, 4, last_epoch, last_offset), 0)
    p = part(response)
    assert (p.error_code, p.vote_granted, p.leader_epoch) == (NONE, granted, 4)
    assert voter.epoch == 4 and voter.voted_id == (2 if granted else None)


def test_illegal_vote_requests_are_refused():
    voter = make(1, state=ElectionState(2))
    assert part(voter.handle_request(2, vote(2, 3, 3, 0), 0)).error_code == ErrorCode.invalid_request
    assert part(voter.handle_request(2, vote(2, 3, 0, -1), 0)).error_code == ErrorCode.invalid_request
    assert part(voter.handle_request(2, vote(2, 1, 0, 0), 0)).error_code == ErrorCode.fenced_leader_epoch
    assert part(voter.handle_request(2, vote(2, 3, 0, 0, voter_id=3), 0)).error_code == ErrorCode.invalid_voter_key
    assert part(voter.handle_request(9, vote(9, 3, 0, 0), 0)).error_code == ErrorCode.inconsistent_voter_set
    assert voter.voted_id is None


def test_one_vote_per_epoch_and_it_survives_a_restart(tmp_path):
    store = FileQuorumStateStore(tmp_path / "quorum-state")
    log = MemoryRaftLog()
    voter = make(1, store=store, log=log)
    assert part(voter.handle_request(2, vote(2, 1, 0, 0), 0)).vote_granted
    assert not part(voter.handle_request(3, vote(3, 1, 0, 0), 1)).vote_granted
    assert part(voter.handle_request(2, vote(2, 1, 0, 0), 2)).vote_granted  # the same candidate asking again
    restarted = make(1, store=store, log=log)
    assert (restarted.epoch, restarted.voted_id) == (1, 2)
    assert not part(restarted.handle_request(3, vote(3, 1, 0, 0), 3)).vote_granted
    assert part(restarted.handle_request(3, vote(3, 2, 0, 0), 4)).vote_granted


def test_the_vote_is_on_disk_before_the_response_exists(tmp_path):
    path = tmp_path / "quorum-state"
    voter = make(1, store=FileQuorumStateStore(path))
    response = voter.handle_request(3, vote(3, 7, 0, 0), 0)
    assert part(response).vote_granted
    assert json.loads(path.read_text()) == {"leaderId": -1, "leaderEpoch": 7, "votedId": 3,
                                            "votedDirectoryId": "AAAAAAAAAAAAAAAAAAAAAA", "data_version": 1}

    class FailingStore(MemoryQuorumStateStore):
        def write(self, state):
            if state.voted_id is not None:
                raise OSError("disk full")
            super().write(state)

    voter = make(1, store=FailingStore())
    with pytest.raises(OSError):
        voter.handle_request(3, vote(3, 7, 0, 0), 0)
    assert voter.voted_id is None  # no grant was produced, none is remembered


def test_pre_votes_neither_bump_epochs_nor_touch_the_quorum_state():
    store = MemoryQuorumStateStore()
    voter = make(1, store=store, state=ElectionState(3))
    writes = len(store.history)
    p = part(voter.handle_request(2, vote(2, 3, 0, 0, pre_vote=True), 0))
    assert p.vote_granted and p.leader_epoch == 3
    assert (voter.epoch, voter.voted_id, len(store.history)) == (3, None, writes)
    # A pre-vote from a node behind us is refused, still without any change.
    voter.log.append_as_leader(m.leader_change_batch(base_offset=0, epoch=3, leader_id=1, voters=[1],
                                                     granting_voters=[1], timestamp_ms=0), 3)
    assert not part(voter.handle_request(2, vote(2, 3, 2, 9, pre_vote=True), 0)).vote_granted
    assert (voter.epoch, len(store.history)) == (3, writes)


def test_a_follower_that_loses_its_leader_pre_votes_in_its_own_epoch():
    store = MemoryQuorumStateStore()
    node = make(1, store=store, state=ElectionState(3, leader_id=2))
    assert node.role is Role.FOLLOWER
    writes = len(store.history)
    outs = node.poll(CFG.fetch_timeout_ms)
    assert node.role is Role.PROSPECTIVE and node.epoch == 3 and len(store.history) == writes
    requests = {o.destination: part(o.message) for o in outs if api(o.message) == 52}
    assert set(requests) == {2, 3} and all(p.pre_vote and p.replica_epoch == 3 for p in requests.values())
    # Rejected by a majority: back to following the leader it knew, in the same epoch.
    for dst in (2, 3):
        request = next(o.message for o in outs if o.destination == dst)
        node.handle_response(dst, request, m.vote_response(NONE, epoch=3, leader_id=2, granted=False), 201)
    node.poll(201)
    assert (node.role, node.epoch, node.leader_id) == (Role.FOLLOWER, 3, 2)
    assert set(store.history[writes:]) <= {ElectionState(3, leader_id=2)}
    # Granted by one other voter: a real candidacy, epoch 4, our own vote durable.
    outs = node.poll(201 + CFG.fetch_timeout_ms)
    request = next(o.message for o in outs if o.destination == 3)
    node.handle_response(3, request, m.vote_response(NONE, epoch=3, granted=True), 402)
    assert (node.role, node.epoch) == (Role.CANDIDATE, 4)
    assert store.state == ElectionState(4, None, 1)
    votes = [part(o.message) for o in node.poll(402) if api(o.message) == 52]
    assert votes and all(not p.pre_vote and p.replica_epoch == 4 for p in votes)


def test_a_follower_grants_pre_votes_only_until_it_has_reached_its_leader():
    node = make(1, state=ElectionState(3, leader_id=2))
    assert part(node.handle_request(3, vote(3, 3, 0, 0, pre_vote=True), 0)).vote_granted
    request = next(o.message for o in node.poll(0) if o.destination == 2)
    node.handle_response(2, request, m.fetch_response(NONE, high_watermark=0, leader_id=2, epoch=3), 1)
    assert not part(node.handle_request(3, vote(3, 3, 0, 0, pre_vote=True), 2)).vote_granted
    assert not part(node.handle_request(3, vote(3, 3, 0, 0), 2)).vote_granted  # and never a real vote


def test_a_candidate_that_loses_backs_off_before_trying_again():
    node = make(1, state=ElectionState(5))
    outs = node.poll(1000)
    assert node.role is Role.PROSPECTIVE
    for out in outs:
        node.handle_response(out.destination, out.message, m.vote_response(NONE, epoch=5, granted=True), 1000)
    assert (node.role, node.epoch) == (Role.CANDIDATE, 6)
    outs = node.poll(1000)
    assert {o.destination for o in outs} == {2, 3}
    for out in outs:
        node.handle_response(out.destination, out.message, m.vote_response(NONE, epoch=6, granted=False), 1001)
    # Lost: a random backoff of at most election.backoff.max.ms (Kafka's binary exponential one), with
    # no vote requests meanwhile, then a new pre-vote in the same epoch.
    now, sent = 1001, []
    while node.role is Role.CANDIDATE:
        sent += [o for o in node.poll(now) if api(o.message) == 52 and not part(o.message).pre_vote]
        now += 1
    assert sent == [] and now - 1001 <= CFG.election_backoff_max_ms + 1
    assert (node.role, node.epoch) == (Role.PROSPECTIVE, 6)
    backoffs = {node._election._election_backoff_ms(retries) for retries in (1, 2, 3, 4) for _ in range(50)}
    assert backoffs <= set(range(0, CFG.election_backoff_max_ms + 1, 100)) and max(backoffs) == 100


def test_restarted_leader_is_resigned_and_restarted_candidate_keeps_its_vote():
    store = MemoryQuorumStateStore()
    leader = make(1, store=store, state=ElectionState(2))
    win_election(leader)
    assert (leader.role, leader.epoch) == (Role.LEADER, 3)
    again = make(1, store=store, log=leader.log)
    assert (again.role, again.epoch, again.leader_id) == (Role.RESIGNED, 3, 1)
    assert not part(again.handle_request(2, vote(2, 3, 3, 5), 0)).vote_granted
    candidate = make(1, state=ElectionState(4, voted_id=1))
    assert (candidate.role, candidate.epoch, candidate.voted_id) == (Role.CANDIDATE, 4, 1)


# ------------------------------------------------------------------ observers


def test_an_observer_never_votes_and_never_stands():
    observer = make(4, state=ElectionState(2))
    p = part(observer.handle_request(2, vote(2, 3, 0, 0), 0))
    assert (p.error_code, p.vote_granted, observer.epoch) == (ErrorCode.inconsistent_voter_set, False, 2)
    sent = []
    for now in range(0, 10_000, 50):
        sent += [api(o.message) for o in observer.poll(now)]
        inflight = observer._outbox.requests.inflight
        for destination in list(inflight):
            observer.handle_send_failure(destination, inflight[destination][0], now)
    assert observer.role is Role.UNATTACHED and observer.epoch == 2
    assert sent and set(sent) == {1}  # only Fetch, looking for a leader


def test_observers_follow_but_do_not_count_for_the_high_watermark():
    nodes = {n: make(n, seed=n) for n in (1, 2, 3, 4)}
    net = Net(nodes)
    assert net.run(2000, until=lambda n: n.leader() is not None and all(
        x.role is Role.FOLLOWER for i, x in n.nodes.items() if i != n.leader()))
    leader_id = net.leader()
    leader = nodes[leader_id]
    net.run(100)
    hw = leader.high_watermark
    others = [v for v in (1, 2, 3) if v != leader_id]
    for voter in others:  # the voters cannot reach the leader; the observer still can
        net.cut |= {(leader_id, voter), (voter, leader_id)}
    offset = leader.append([b"x"], net.now)
    net.run(100)
    assert nodes[4].log.end_offset > offset  # the observer has it...
    assert leader.high_watermark == hw  # ...but only voters make it committed
    described = leader.handle_request(4, DescribeQuorumRequest(
        topics=(TopicData(topic_name=m.METADATA_TOPIC, partitions=(PartitionData(partition_index=0),)),)), net.now)
    assert [o.replica_id for o in part(described).observers] == [4]
    assert part(described).observers[0].log_end_offset == offset + 1
    net.cut.discard((others[0], leader_id))
    net.cut.discard((leader_id, others[0]))
    net.run(100)
    assert leader.high_watermark == offset + 1


# ------------------------------------------------------------------ replication


def test_high_watermark_waits_for_a_record_of_the_leaders_epoch():
    """Raft's figure 8: a new leader must not commit an older epoch's record by counting replicas."""
    # Node 1 holds a record of epoch 1 (offset 1) that only it has, then wins epoch 3.
    leader = make(1, log=fill(MemoryRaftLog(), [1, 1]), state=ElectionState(2))
    now = win_election(leader)
    assert (leader.epoch, leader.log.end_offset) == (3, 3)  # LeaderChange of epoch 3 at offset 2
    # Follower 2 fetches one batch at a time: first the old record...
    r = leader.handle_request(2, fetch(2, 3, 1, 1, max_bytes=1), now)
    assert [h.base_offset for _, h in iter_batches(part(r).records)] == [1]
    # ...and reports having it: a majority (1 and 2) holds offset 1, but it is of epoch 1.
    r = leader.handle_request(2, fetch(2, 3, 2, 1, max_bytes=1), now)
    assert part(r).high_watermark == -1 and leader.high_watermark is None
    # Once the follower has the epoch-3 LeaderChange too, everything up to it is committed at once.
    r = leader.handle_request(2, fetch(2, 3, 3, 3), now)
    assert part(r).high_watermark == 3 and leader.high_watermark == 3


def test_divergent_tail_of_an_older_epoch_is_cut_back_exactly_as_kafka_does():
    # Leader: epoch 1 at 0-2, epoch 3 from 3 (it never saw epoch 2); it then wins epoch 4.
    leader = make(1, log=fill(MemoryRaftLog(), [1, 1, 1, 3]), state=ElectionState(3))
    now = win_election(leader)
    # Follower: epoch 1 at 0-1, then an unreplicated tail of epoch 2 at 2-4.
    follower = make(2, log=fill(MemoryRaftLog(), [1, 1, 2, 2, 2]), state=ElectionState(4, leader_id=1), now=now)
    request = next(o.message for o in follower.poll(now) if api(o.message) == 1)
    fp = request.topics[0].partitions[0]
    assert (fp.fetch_offset, fp.last_fetched_epoch, fp.current_leader_epoch) == (5, 2, 4)
    response = leader.handle_request(2, request, now)
    diverging = part(response).diverging_epoch
    assert (diverging.epoch, diverging.end_offset) == (1, 3)  # epoch 1 ends where epoch 3 starts
    assert not part(response).records
    follower.handle_response(1, request, response, now)
    assert (follower.log.end_offset, follower.log.last_fetched_epoch) == (2, 1)  # min(local end of 1, 3)
    exchange(follower, leader, now)
    assert batches(follower.log) == batches(leader.log)


def test_a_longer_tail_of_a_shared_epoch_is_cut_to_the_leaders_end_of_it():
    leader = make(1, log=fill(MemoryRaftLog(), [1, 2, 2, 3]), state=ElectionState(3))
    now = win_election(leader)
    follower = make(2, log=fill(MemoryRaftLog(), [1, 2, 2, 2, 2]), state=ElectionState(4, leader_id=1), now=now)
    request = next(o.message for o in follower.poll(now) if api(o.message) == 1)
    response = leader.handle_request(2, request, now)
    diverging = part(response).diverging_epoch
    assert (diverging.epoch, diverging.end_offset) == (2, 3)
    follower.handle_response(1, request, response, now)
    assert follower.log.end_offset == 3
    exchange(follower, leader, now)
    assert batches(follower.log) == batches(leader.log)


def test_fetch_long_poll_is_answered_by_an_append_or_the_timeout():
    leader = make(1)
    now = win_election(leader)
    end = leader.log.end_offset
    parked = fetch(2, leader.epoch, end, leader.epoch, max_wait=50)
    assert leader.handle_request(2, parked, now) is None
    assert leader.poll(now + 10) == []
    offset = leader.append([b"x"], now + 20)
    (out,) = [o for o in leader.poll(now + 20) if o.request is not None]
    assert out.destination == 2 and out.request is parked
    assert [h.base_offset for _, h in iter_batches(part(out.message).records)] == [offset]
    idle = fetch(2, leader.epoch, offset + 1, leader.epoch, max_wait=50)
    assert leader.handle_request(2, idle, now + 30) is None
    assert [o for o in leader.poll(now + 79) if o.request is idle] == []
    (out,) = [o for o in leader.poll(now + 80) if o.request is idle]
    assert not part(out.message).records and part(out.message).error_code == NONE


def test_snapshot_download_when_the_leader_trimmed_its_log():
    config = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                        request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50, fetch_max_bytes=64)
    nodes = {n: make(n, seed=n, config=config) for n in (1, 2)}
    net = Net(nodes)
    assert net.run(2000, until=lambda n: n.leader() is not None)
    leader = nodes[net.leader()]
    for i in range(12):
        leader.append([b"value-%d" % i], net.now)
        net.run(10)
    applied = [p for e in leader.drain_events() if isinstance(e, CommittedBatch) and not e.is_control
               for p in data_payloads(e.data)]
    assert applied == [b"value-%d" % i for i in range(12)]
    end = leader.high_watermark
    snapshot_id = leader.create_snapshot(end, applied, net.now, trim=True)
    assert snapshot_id == OffsetAndEpoch(end, leader.epoch) and leader.log.start_offset == end
    leader.append([b"after"], net.now)
    nodes[3] = make(3, seed=3, config=config)  # a new, empty voter
    assert net.run(3000, until=lambda n: n.nodes[3].log.end_offset == leader.log.end_offset)
    follower = nodes[3]
    assert follower.log.start_offset == end and follower.log.latest_snapshot_id() == snapshot_id
    positions = [part(msg).position for _, src, dst, msg in net.log if api(msg) == 59 and src == 3]
    assert len(positions) > 2 and positions == sorted(positions) and positions[1] == 64  # chunked
    events = follower.drain_events()
    loaded = [e for e in events if isinstance(e, SnapshotLoaded)]
    assert len(loaded) == 1 and data_payloads(loaded[0].data) == applied
    after = [p for e in events if isinstance(e, CommittedBatch) and not e.is_control for p in data_payloads(e.data)]
    assert after == [b"after"]
    header = BatchHeader.parse(loaded[0].data)
    assert header.is_control and m.control_record(loaded[0].data[:header.size])[0] == m.SNAPSHOT_HEADER


# ------------------------------------------------------------------ leadership changes


def elected(seed=0, voters=(1, 2, 3)):
    nodes = {n: make(n, seed=seed * 10 + n) for n in voters}
    net = Net(nodes)
    assert net.run(3000, until=lambda n: n.leader() is not None and all(
        x.role is Role.FOLLOWER for i, x in n.nodes.items() if i != n.leader()))
    net.run(60)
    return net


def test_check_quorum_makes_an_unreachable_leader_resign():
    net = elected()
    leader_id = net.leader()
    leader = net.nodes[leader_id]
    others = [n for n in net.nodes if n != leader_id]
    net.cut |= {(leader_id, others[0]), (others[0], leader_id)}  # a majority (leader + one) still talks
    net.run(1000)
    assert leader.role is Role.LEADER
    net.isolate(leader_id)
    start = net.now
    net.run(1000, step=1, until=lambda n: leader.role is not Role.LEADER)
    waited = net.now - start
    check = int(CFG.fetch_timeout_ms * 1.5)
    assert leader.role is Role.RESIGNED and check - CFG.fetch_max_wait_ms <= waited <= check + 1


def test_end_quorum_epoch_names_successors_and_speeds_up_the_election():
    net = elected(seed=1)
    old = net.leader()
    old_epoch = net.nodes[old].epoch
    net.nodes[old].resign(net.now)
    start = net.now
    net.run(1000, step=1, until=lambda n: any(x.role is Role.LEADER and x.epoch > old_epoch
                                              for x in n.nodes.values()))
    graceful = net.now - start
    ends = [msg for t, src, dst, msg in net.log if api(msg) == 54 and t >= start and src == old]
    assert ends, "the resigning leader sent EndQuorumEpoch"
    preferred = [c.candidate_id for c in part(ends[0]).preferred_candidates]
    assert sorted(preferred) == sorted(n for n in net.nodes if n != old)
    # Without EndQuorumEpoch the others wait for their fetch timeout.
    crashed = elected(seed=1)
    leader = crashed.leader()
    epoch = crashed.nodes[leader].epoch
    crashed.isolate(leader)
    start = crashed.now
    crashed.run(3000, step=1, until=lambda n: any(x.role is Role.LEADER and x.epoch > epoch
                                                  for x in n.nodes.values()))
    silent = crashed.now - start
    assert graceful < 20 <= CFG.fetch_timeout_ms <= silent


def test_a_new_leader_announces_itself_after_replaying_up_to_its_epoch():
    net = elected(seed=2)
    leader = net.nodes[net.leader()]
    events = leader.drain_events()
    mine = [i for i, e in enumerate(events) if e == LeaderChanged(leader.node_id, leader.epoch)]
    assert mine, events
    committed = [e for e in events[:mine[0]] if isinstance(e, CommittedBatch)]
    assert committed and committed[-1].last_offset + 1 >= leader._replication.epoch_start_offset
    follower = next(n for i, n in net.nodes.items() if i != leader.node_id)
    assert LeaderChanged(leader.node_id, leader.epoch) in follower.drain_events()


def test_appends_need_the_leader_of_the_right_epoch():
    net = elected(seed=3)
    leader = net.nodes[net.leader()]
    follower = next(n for i, n in net.nodes.items() if i != leader.node_id)
    with pytest.raises(NotLeaderError) as info:
        follower.append([b"x"], net.now)
    assert (info.value.leader_id, info.value.epoch) == (leader.node_id, leader.epoch)
    with pytest.raises(NotLeaderError):
        leader.append([b"x"], net.now, epoch=leader.epoch - 1)


# ------------------------------------------------------------------ wire surface


def test_cluster_id_is_checked_on_every_raft_request():
    net = elected(seed=4)
    leader = net.nodes[net.leader()]
    epoch = leader.epoch
    bad = "other-cluster"
    requests = [
        vote(2, epoch + 1, 0, 0, cluster=bad),
        m.begin_quorum_epoch_request(cluster_id=bad, voter_id=1, epoch=epoch + 1, leader_id=2, listener="C",
                                     endpoints=VOTERS),
        m.end_quorum_epoch_request(cluster_id=bad, epoch=epoch, leader_id=2, preferred=[1], listener="C",
                                   endpoints=VOTERS),
        fetch(2, epoch, 0, 0, cluster=bad),
        m.fetch_snapshot_request(cluster_id=bad, replica_id=2, epoch=epoch, snapshot_id=OffsetAndEpoch(1, 1),
                                 position=0, max_bytes=100),
    ]
    for request in requests:
        response = leader.handle_request(2, request, net.now)
        assert response.error_code == ErrorCode.inconsistent_cluster_id, type(request).__name__
    assert (leader.role, leader.epoch) == (Role.LEADER, epoch)
    # A request without a cluster id is not refused for it (Kafka only checks a given id).
    assert leader.handle_request(2, fetch(2, epoch, 0, 0, cluster=None), net.now).error_code == NONE


def test_describe_quorum_reports_kafkas_fields():
    nodes = {n: make(n, seed=n) for n in (1, 2, 3, 4)}
    net = Net(nodes)
    net.run(2000, until=lambda n: n.leader() is not None)
    net.run(200)
    leader = nodes[net.leader()]
    request = DescribeQuorumRequest(
        topics=(TopicData(topic_name=m.METADATA_TOPIC, partitions=(PartitionData(partition_index=0),)),))
    response = leader.handle_request(9, request, net.now)
    p = part(response)
    assert (p.error_code, p.leader_id, p.leader_epoch, p.high_watermark) == (
        NONE, leader.node_id, leader.epoch, leader.high_watermark)
    assert [v.replica_id for v in p.current_voters] == [1, 2, 3]
    assert {v.log_end_offset for v in p.current_voters} == {leader.log.end_offset}
    mine = next(v for v in p.current_voters if v.replica_id == leader.node_id)
    assert mine.last_fetch_timestamp == mine.last_caught_up_timestamp == net.now
    assert all(0 <= v.last_fetch_timestamp <= net.now for v in p.current_voters)
    assert [o.replica_id for o in p.observers] == [4]
    assert [n.node_id for n in response.nodes] == [1, 2, 3]
    follower = next(n for i, n in nodes.items() if i != leader.node_id)
    assert part(follower.handle_request(9, request, net.now)).error_code == ErrorCode.not_leader_or_follower
    roundtrip(response)


def roundtrip(message):
    buf = io.BytesIO()
    entity_writer(type(message))(buf, message)
    decoded, size = entity_reader(type(message))(buf.getvalue(), 0)
    assert size == len(buf.getvalue())
    return decoded


def test_every_message_the_nodes_exchange_encodes_with_kio_at_kafka_4_versions():
    config = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                        request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50, fetch_max_bytes=64)
    nodes = {n: make(n, seed=n, config=config) for n in (1, 2, 3, 4)}
    net = Net(nodes)
    net.run(2000, until=lambda n: n.leader() is not None)
    leader = nodes[net.leader()]
    for i in range(5):
        leader.append([b"v%d" % i], net.now)
        net.run(20)
    leader.create_snapshot(leader.high_watermark, [], net.now, trim=True)
    nodes[5] = RaftNode(5, VOTERS, MemoryRaftLog(), MemoryQuorumStateStore(), cluster_id="cluster",
                        config=config, rng=random.Random(5), now_ms=net.now)
    net.run(500)
    leader.resign(net.now)
    net.run(1000)
    seen = {}
    for _, _, _, message in net.log:
        seen.setdefault(type(message), message)
        assert roundtrip(message) == message, type(message).__name__
    versions = {(t.__api_key__, t.__version__, t.__name__.endswith("Request")) for t in seen}
    assert versions == {(52, 2, True), (52, 2, False), (53, 1, True), (53, 1, False), (54, 1, True),
                        (54, 1, False), (1, 17, True), (1, 17, False), (59, 1, True), (59, 1, False)}
    fetches = [msg for msg in seen.values() if api(msg) == 1]
    assert {f.topics[0].topic_id if hasattr(f, "max_wait") else f.responses[0].topic_id
            for f in fetches} == {m.METADATA_TOPIC_ID}


def test_config_from_server_properties_uses_kafkas_names_and_defaults():
    config = RaftConfig.from_properties({"controller.quorum.election.timeout.ms": "1500",
                                         "controller.quorum.fetch.timeout.ms": 3000})
    assert (config.election_timeout_ms, config.fetch_timeout_ms) == (1500, 3000)
    assert (config.election_backoff_max_ms, config.request_timeout_ms, config.retry_backoff_ms) == (1000, 2000, 20)
    assert RaftConfig() == RaftConfig.from_properties({})


@pytest.mark.parametrize("version", [0, 1])
def test_describe_quorum_answers_older_admin_tools_at_their_version(version):
    import importlib

    req = importlib.import_module(f"kio.schema.describe_quorum.v{version}.request")
    nodes = {n: make(n, seed=n) for n in (1, 2, 3)}
    net = Net(nodes)
    net.run(2000, until=lambda n: n.leader() is not None)
    net.run(100)
    leader = nodes[net.leader()]
    request = req.DescribeQuorumRequest(topics=(req.TopicData(topic_name=m.METADATA_TOPIC,
                                                              partitions=(req.PartitionData(partition_index=0),)),))
    response = leader.handle_request(-1, request, net.now)
    assert response.__version__ == version
    assert (part(response).leader_id, part(response).high_watermark) == (leader.node_id, leader.high_watermark)
    assert [v.replica_id for v in part(response).current_voters] == [1, 2, 3]
    roundtrip(response)


def test_a_new_leader_sends_begin_quorum_epoch_until_each_voter_acknowledges():
    leader = make(1, state=ElectionState(2))
    now = win_election(leader)  # its first BeginQuorumEpoch requests went nowhere
    assert [o for o in leader.poll(now + CFG.request_timeout_ms - 1) if api(o.message) == 53] == []
    now += CFG.request_timeout_ms + CFG.retry_backoff_ms  # timed out, then the retry backoff
    resent = {o.destination: o.message for o in leader.poll(now) if api(o.message) == 53}
    assert set(resent) == {2, 3}
    p = part(resent[2])
    assert (p.leader_id, p.leader_epoch, resent[2].voter_id) == (1, 3, 2)
    assert resent[2].leader_endpoints[0].host == "c1"
    voter = make(2, state=ElectionState(2), now=now)
    response = voter.handle_request(1, resent[2], now)
    assert (voter.role, voter.epoch, voter.leader_id) == (Role.FOLLOWER, 3, 1)
    leader.handle_response(2, resent[2], response, now)
    # Voter 3 never answers the request, but fetching from the leader acknowledges it as well.
    leader.handle_request(3, fetch(3, 3, 0, 0), now)
    later = leader.poll(now + CFG.request_timeout_ms + CFG.retry_backoff_ms)
    assert leader.role is Role.LEADER and [o for o in later if api(o.message) == 53] == []
