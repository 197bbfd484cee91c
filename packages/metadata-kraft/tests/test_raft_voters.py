"""Dynamic voter sets (KIP-853): voters from the bootstrap snapshot and the log, AddRaftVoter and RemoveRaftVoter."""

import datetime
import random
import uuid

from kio.schema.add_raft_voter.v0.request import AddRaftVoterRequest, Listener
from kio.schema.errors import ErrorCode
from kio.schema.remove_raft_voter.v0.request import RemoveRaftVoterRequest
from raft_sim import MemoryQuorumStateStore, MemoryRaftLog, Net

from josef_metadata_kraft.raft import OffsetAndEpoch, RaftConfig, RaftNode, Role
from josef_metadata_kraft.raft import messages as m
from josef_metadata_kraft.raft.voters import VoterInfo, VoterSetHistory, voters_control

NONE = ErrorCode.none
CFG = RaftConfig(election_timeout_ms=100, election_backoff_max_ms=100, fetch_timeout_ms=200,
                 request_timeout_ms=150, retry_backoff_ms=10, fetch_max_wait_ms=50)
DIRS = {n: uuid.UUID(int=100 + n) for n in range(1, 6)}
CLIENT = 99  # where AddRaftVoter/RemoveRaftVoter come from: not a node of the net


def info(node_id):
    return VoterInfo(node_id, DIRS[node_id], (("CONTROLLER", f"c{node_id}", 9093),))


def bootstrap_log(voters):
    log = MemoryRaftLog()
    snapshot = m.snapshot_bytes(OffsetAndEpoch(0, 0), [], 0,
                                control=voters_control({v: info(v) for v in voters}, with_version=True))
    log.create_snapshot(OffsetAndEpoch(0, 0), snapshot)
    return log


def node(node_id, log=None, voters=None, seed=0):
    return RaftNode(node_id, voters or {}, log if log is not None else MemoryRaftLog(), MemoryQuorumStateStore(),
                    cluster_id="cluster", config=CFG, rng=random.Random(seed),
                    bootstrap_servers=[("c1", 9093)])


def add_request(voter_id, directory=None, timeout_ms=1000):
    return AddRaftVoterRequest(cluster_id="cluster", timeout=datetime.timedelta(milliseconds=timeout_ms),
                               voter_id=voter_id, voter_directory_id=directory or DIRS[voter_id],
                               listeners=(Listener(name="CONTROLLER", host=f"c{voter_id}", port=9093),))


def remove_request(voter_id, directory=None):
    return RemoveRaftVoterRequest(cluster_id="cluster", voter_id=voter_id,
                                  voter_directory_id=directory or DIRS[voter_id])


def standalone(observers=(2, 3)):
    """Node 1 formatted --standalone; the others formatted --no-initial-controllers, bootstrapping from it."""
    nodes = {1: node(1, bootstrap_log([1]))}
    for o in observers:
        nodes[o] = node(o, seed=o)
    net = Net(nodes)
    net.nodes[-2] = nodes[1]  # the bootstrap server c1:9093 is node 1
    assert net.run(2000, until=lambda n: all(nodes[o].leader_id == 1 and nodes[o].high_watermark
                                             == nodes[1].log.end_offset for o in observers))
    return net, nodes


def answers(net, request):
    return [msg for (_, src, dst, msg) in net.log if dst == CLIENT]


def change(net, leader, request):
    """Send a voter change to ``leader`` and run until it is answered; its error code."""
    response = leader.handle_request(CLIENT, request, net.now)
    if response is not None:
        return response.error_code
    before = len(answers(net, request))
    assert net.run(3000, until=lambda n: len(answers(n, request)) > before)
    return answers(net, request)[-1].error_code


def test_a_standalone_node_takes_its_voters_from_the_bootstrap_snapshot_and_writes_them_in_the_log():
    net, nodes = standalone(observers=(2,))
    n1, n2 = nodes[1], nodes[2]
    assert n1.role is Role.LEADER and n1.kraft_version == 1 and set(n1.voter_set()) == {1}
    # The follower never fetches the bootstrap snapshot: it learns the voters from the log.
    assert n2.kraft_version == 1 and set(n2.voter_set()) == {1} and not n2.is_voter
    assert n2.voter_set()[1].directory_id == DIRS[1]
    assert n2.endpoint(1) == ("c1", 9093)


def test_add_voter_then_the_new_voter_counts_for_the_high_watermark():
    net, nodes = standalone(observers=(2, 3))
    n1, n2 = nodes[1], nodes[2]
    # An observer does not hold back commits.
    net.isolate(2)
    n1.append([b"a"], net.now)
    net.run(100)
    assert n1.high_watermark == n1.log.end_offset
    net.cut.clear()
    net.run(300)
    assert change(net, n1, add_request(2)) == NONE
    assert set(n1.voter_set()) == {1, 2}
    net.run(200)
    assert n2.is_voter and set(n2.voter_set()) == {1, 2}
    # Now the leader needs node 2 to commit.
    net.isolate(2)
    hw = n1.high_watermark
    n1.append([b"b"], net.now)
    net.run(150)
    assert n1.high_watermark == hw
    net.cut.clear()
    assert net.run(500, until=lambda n: n1.high_watermark == n1.log.end_offset)
    assert change(net, n1, add_request(3)) == NONE
    net.run(200)
    assert all(set(nodes[v].voter_set()) == {1, 2, 3} for v in (1, 2, 3))


def test_a_dynamic_quorum_elects_a_new_leader_among_the_added_voters():
    net, nodes = standalone(observers=(2, 3))
    assert change(net, nodes[1], add_request(2)) == NONE
    net.run(300)
    assert change(net, nodes[1], add_request(3)) == NONE
    net.run(300)
    del net.nodes[1], net.nodes[-2]
    assert net.run(5000, until=lambda n: n.leader() in (2, 3))
    leader = nodes[net.leader()]
    leader.append([b"after"], net.now)
    assert net.run(1000, until=lambda n: all(nodes[v].high_watermark == leader.log.end_offset for v in (2, 3)))


def test_remove_voter():
    net, nodes = standalone(observers=(2, 3))
    for v in (2, 3):
        assert change(net, nodes[1], add_request(v)) == NONE
        net.run(300)
    assert change(net, nodes[1], remove_request(3)) == NONE
    net.run(300)
    assert all(set(nodes[v].voter_set()) == {1, 2} for v in (1, 2, 3))
    assert not nodes[3].is_voter
    # Node 3 no longer counts: with it cut off, commits go on.
    net.isolate(3)
    nodes[1].append([b"x"], net.now)
    assert net.run(300, until=lambda n: nodes[1].high_watermark == nodes[1].log.end_offset)


def test_the_leader_removing_itself_hands_over_once_the_removal_committed():
    net, nodes = standalone(observers=(2, 3))
    for v in (2, 3):
        assert change(net, nodes[1], add_request(v)) == NONE
        net.run(300)
    assert change(net, nodes[1], remove_request(1)) == NONE
    assert net.run(3000, until=lambda n: any(nodes[v].role is Role.LEADER for v in (2, 3)))
    assert not nodes[1].is_voter and nodes[1].role is not Role.LEADER


def test_voter_changes_are_refused_with_kafkas_error_codes():
    net, nodes = standalone(observers=(2, 3))
    n1 = nodes[1]
    assert change(net, n1, add_request(1)) == ErrorCode.duplicate_voter
    assert change(net, n1, add_request(4)) == ErrorCode.request_timed_out  # not an observer that caught up
    assert change(net, n1, remove_request(4)) == ErrorCode.voter_not_found
    assert change(net, n1, remove_request(1, uuid.UUID(int=7))) == ErrorCode.voter_not_found  # wrong directory
    assert change(net, n1, remove_request(1)) == ErrorCode.voter_not_found  # the last voter
    assert change(net, nodes[2], add_request(3)) == ErrorCode.not_leader_or_follower
    # One change at a time: a second one while the first is uncommitted.
    net.isolate(2)
    first = n1.handle_request(CLIENT, add_request(2, timeout_ms=100), net.now)
    assert first is None  # appended, waiting for commit
    assert n1.handle_request(CLIENT, add_request(3), net.now).error_code == ErrorCode.request_timed_out
    # The pending change times out when the new voter never confirms it.
    net.run(150)
    timed_out = [a for a in answers(net, None) if a.error_code == ErrorCode.request_timed_out]
    assert timed_out


def test_static_quorums_refuse_voter_changes():
    voters = {1: ("c1", 9093)}
    n1 = RaftNode(1, voters, MemoryRaftLog(), MemoryQuorumStateStore(), cluster_id="cluster", config=CFG)
    n1.poll(0)
    assert n1.role is Role.LEADER and n1.kraft_version == 0
    assert n1.handle_request(CLIENT, add_request(2), 0).error_code == ErrorCode.unsupported_version


def test_snapshots_carry_the_voter_set():
    net, nodes = standalone(observers=(2,))
    assert change(net, nodes[1], add_request(2)) == NONE
    net.run(300)
    n1 = nodes[1]
    n1.append([b"x"], net.now)
    net.run(200)
    snapshot_id = n1.create_snapshot(n1.high_watermark, [b"state"], net.now, trim=True)
    data = n1.log.read_snapshot(snapshot_id, 0, n1.log.snapshot_size(snapshot_id))
    history = VoterSetHistory({})
    history.scan(data, offset_base=snapshot_id.offset - 1)
    assert history.kraft_version == 1 and set(history.current()) == {1, 2}
    # A node that downloads the snapshot learns the voters from it.
    nodes[3] = net.nodes[3] = node(3, seed=3)
    assert net.run(2000, until=lambda n: nodes[3].high_watermark is not None
                   and nodes[3].high_watermark >= snapshot_id.offset)
    assert set(nodes[3].voter_set()) == {1, 2}


def test_a_restarted_node_reads_its_voters_back_from_the_log():
    net, nodes = standalone(observers=(2,))
    assert change(net, nodes[1], add_request(2)) == NONE
    net.run(300)
    restarted = node(2, log=nodes[2].log, seed=9)
    assert set(restarted.voter_set()) == {1, 2} and restarted.is_voter and restarted.kraft_version == 1


def test_a_voter_whose_endpoints_changed_updates_them_with_update_raft_voter():
    net, nodes = standalone(observers=(2,))
    assert change(net, nodes[1], add_request(2)) == NONE
    net.run(300)
    moved = (("CONTROLLER", "c2-moved", 9094),)
    restarted = RaftNode(2, {}, nodes[2].log, MemoryQuorumStateStore(), cluster_id="cluster", config=CFG,
                         rng=random.Random(5), bootstrap_servers=[("c1", 9093)], directory_id=DIRS[2],
                         local_endpoints=moved, now_ms=net.now)
    nodes[2] = net.nodes[2] = restarted
    assert net.run(3000, until=lambda n: nodes[1].voter_set()[2].endpoints == moved
                   and restarted.voter_set()[2].endpoints == moved)
    assert nodes[1].endpoint(2) == ("c2-moved", 9094)
    sent = [msg for (_, src, _, msg) in net.log if type(msg).__name__ == "UpdateRaftVoterRequest"]
    net.run(1000)
    assert len([msg for (_, src, _, msg) in net.log if type(msg).__name__ == "UpdateRaftVoterRequest"]) == len(sent)


def test_add_voter_refuses_a_directory_id_other_than_the_observers():
    net, nodes = standalone(observers=())
    observer = RaftNode(2, {}, MemoryRaftLog(), MemoryQuorumStateStore(), cluster_id="cluster", config=CFG,
                        rng=random.Random(2), bootstrap_servers=[("c1", 9093)], directory_id=DIRS[2])
    nodes[2] = net.nodes[2] = observer
    assert net.run(2000, until=lambda n: observer.high_watermark == nodes[1].log.end_offset)
    assert change(net, nodes[1], add_request(2, directory=uuid.UUID(int=55))) == ErrorCode.request_timed_out
    assert change(net, nodes[1], add_request(2)) == NONE
