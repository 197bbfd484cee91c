"""What ``reassign-partitions --throttle`` throttles, and how ``topics describe`` shows a move, as Kafka's tools do."""

from josef_client.admin import PartitionDescription, PartitionReassignment, TopicDescription
from josef_client.commands.reassign_partitions import proposed_moves, throttled_replicas
from josef_client.commands.topics import describe_lines


def test_a_new_move_copies_from_the_current_replicas_to_the_added_ones():
    moves = proposed_moves({}, {("t", 0): [3, 4, 5], ("t", 1): [2, 3, 4]}, {("t", 0): (2, 3, 4), ("t", 1): (4, 3, 2)})
    assert moves == {("t", 0): ({2, 3, 4}, {5}), ("t", 1): ({2, 3, 4}, set())}
    assert throttled_replicas(moves) == {"t": ("0:2,0:3,0:4,1:2,1:3,1:4", "0:5")}


def test_moves_in_progress_keep_their_sources_and_stay_throttled():
    in_progress = {("t", 0): PartitionReassignment(replicas=(5, 6, 2, 3), adding_replicas=(5, 6), removing_replicas=(2, 3)),
                   ("u", 3): PartitionReassignment(replicas=(7, 1), adding_replicas=(7,), removing_replicas=(1,))}
    # Moving t-0 again, to 6 and 8: it is still copied from 2 and 3, the replicas it had before any move.
    moves = proposed_moves(in_progress, {("t", 0): [6, 8]}, {("t", 0): (5, 6, 2, 3)})
    assert moves == {("t", 0): ({2, 3}, {6, 8}), ("u", 3): ({1}, {7})}
    assert throttled_replicas(moves) == {"t": ("0:2,0:3", "0:6,0:8"), "u": ("3:1", "3:7")}


def test_a_moving_partition_shows_its_adding_and_removing_replicas_before_the_elr():
    partitions = [PartitionDescription(0, 2, 5, (3, 4, 5, 2), (2, 3, 4), elr=(), last_known_elr=()),
                  PartitionDescription(1, 3, 0, (3, 4), (3, 4), elr=(), last_known_elr=())]
    description = TopicDescription("t", None, False, tuple(partitions))
    moving = {0: PartitionReassignment(replicas=(3, 4, 5, 2), adding_replicas=(5,), removing_replicas=(2,))}
    assert describe_lines(description, None, moving=moving) == [
        "\tTopic: t\tPartition: 0\tLeader: 2\tReplicas: 3,4,5,2\tIsr: 2,3,4\tAdding Replicas: 5\tRemoving Replicas: 2"
        "\tElr: \tLastKnownElr: ",
        "\tTopic: t\tPartition: 1\tLeader: 3\tReplicas: 3,4\tIsr: 3,4\tElr: \tLastKnownElr: "]
