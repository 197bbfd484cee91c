"""What the Raft core raises: to its owner (:class:`NotLeaderError`) or when a peer breaks Raft's guarantees."""

from __future__ import annotations


class NotLeaderError(Exception):
    """An append or snapshot needed the leader; ``leader_id``/``epoch`` say who is, as far as known."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader (leader {leader_id}, epoch {epoch})")
        self.leader_id, self.epoch = leader_id, epoch


class RaftInvariantError(Exception):
    """A peer's message contradicts what Raft guarantees (two leaders in one epoch, truncation below the HW)."""
