"""The durable part of a voter's election state: the ``quorum-state`` file.

Raft's safety rests on two facts surviving a crash: the largest epoch a node
has seen and whom it voted for in it. Kafka keeps them in ``quorum-state``
(``QuorumStateData`` as JSON plus ``data_version``), rewritten atomically
before the node acts on a new epoch or grants a vote. This module reads and
writes that file in Kafka's shape, so Kafka's tools and josef read each
other's files.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path
from typing import Protocol

import attrs

#: Kafka's ``ReplicaKey.NO_DIRECTORY_ID`` (Uuid.ZERO_UUID) as Kafka prints it.
NO_DIRECTORY_ID = base64.urlsafe_b64encode(uuid.UUID(int=0).bytes).rstrip(b"=").decode()
#: The QuorumStateData version josef writes; 0 (Kafka's format before KIP-853) is read too.
DATA_VERSION = 1


@attrs.frozen
class ElectionState:
    """``(epoch, leader, vote)``: what a node knows about the election of its current epoch."""

    epoch: int
    leader_id: int | None = None
    voted_id: int | None = None


class QuorumStateError(Exception):
    """The quorum-state file is unreadable or of an unknown version."""


class QuorumStateStore(Protocol):
    """Where a node keeps its :class:`ElectionState`; :meth:`write` is durable when it returns."""

    def read(self) -> ElectionState | None:
        """The last state written, ``None`` if nothing was ever written."""

    def write(self, state: ElectionState) -> None:
        """Replace the state durably (the core calls this before it grants a vote or acts on an epoch)."""


def to_json(state: ElectionState, version: int = DATA_VERSION, voters: tuple[int, ...] = ()) -> str:
    """Kafka's ``QuorumStateDataJsonConverter.write`` plus ``data_version``, field order included."""
    data: dict[str, object] = {}
    if version == 0:
        data["clusterId"] = ""
    data["leaderId"] = -1 if state.leader_id is None else state.leader_id
    data["leaderEpoch"] = state.epoch
    data["votedId"] = -1 if state.voted_id is None else state.voted_id
    if version >= 1:
        data["votedDirectoryId"] = NO_DIRECTORY_ID
    else:
        data["appliedOffset"] = 0
        data["currentVoters"] = [{"voterId": v} for v in voters]
    data["data_version"] = version
    return json.dumps(data, separators=(",", ":"))


def from_json(text: str) -> ElectionState:
    """Parse either data version; ``-1`` ids mean none, as in Kafka."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise QuorumStateError(f"quorum-state is not JSON: {exc}") from None
    if not isinstance(data, dict) or "data_version" not in data:
        raise QuorumStateError("quorum-state has no data_version")
    if data["data_version"] not in (0, 1):
        raise QuorumStateError(f"quorum-state data_version {data['data_version']} is not supported (0-1)")
    leader = int(data.get("leaderId", -1))
    voted = int(data.get("votedId", -1))
    return ElectionState(int(data.get("leaderEpoch", -1)), None if leader < 0 else leader,
                         None if voted < 0 else voted)


class FileQuorumStateStore:
    """``quorum-state`` in a directory, written as Kafka's FileQuorumStateStore does.

    The new content goes to ``quorum-state.tmp``, is fsynced, renamed over
    the file, and the directory is fsynced, so a crash leaves either the old
    or the new state, never a torn one.
    """

    def __init__(self, path: Path | str, voters: tuple[int, ...] = ()) -> None:
        self.path = Path(path)
        self._voters = tuple(sorted(voters))

    def read(self) -> ElectionState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return from_json(text)

    def write(self, state: ElectionState) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(to_json(state, DATA_VERSION, self._voters))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
