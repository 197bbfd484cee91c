"""What the pages show, as plain data: read from the cluster by :mod:`josef_console.cluster`, drawn by :mod:`josef_console.pages`.

Keeping the two apart lets the pages be tested without a cluster and the
reading without HTML. Everything here is frozen: a page is a snapshot of
one request's answers.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from josef_console.lag import partition_lag, total_lag


@attrs.frozen
class Broker:
    node_id: int
    endpoints: tuple[str, ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool
    epoch: int

    @property
    def state(self) -> str:
        """As an operator would say it: fenced (the controller stopped counting on it), shutting down, or running."""
        if self.fenced:
            return "fenced"
        if self.in_controlled_shutdown:
            return "shutting down"
        return "running"


@attrs.frozen
class Feature:
    name: str
    #: The finalized level (0: off), as the cluster runs it.
    level: int
    #: The range every registered broker supports (None: no broker says).
    supported: tuple[int, int] | None


@attrs.frozen
class Partition:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    #: The topic's effective min.insync.replicas.
    min_isr: int = 1
    #: Bytes of each replica's local log, by broker (what DescribeLogDirs said; brokers that did not answer are absent).
    sizes: Mapping[int, int] = attrs.field(factory=dict)
    #: Bytes in remote storage (None: not tiered, or unknown).
    remote_size: int | None = None
    start_offset: int | None = None
    end_offset: int | None = None

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        """acks=all producers are refused while this is true."""
        return len(self.isr) < self.min_isr

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def size(self) -> int | None:
        """The leader's local log size: what one copy of the partition takes (None: unknown)."""
        return self.sizes.get(self.leader)


@attrs.frozen
class Topic:
    name: str
    topic_id: str
    partitions: tuple[Partition, ...]

    @property
    def internal(self) -> bool:
        return self.name.startswith("__")

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)

    @property
    def under_replicated(self) -> int:
        return sum(p.under_replicated for p in self.partitions)

    @property
    def offline(self) -> int:
        return sum(p.offline for p in self.partitions)

    @property
    def under_min_isr(self) -> int:
        return sum(p.under_min_isr for p in self.partitions)

    @property
    def size(self) -> int | None:
        """One copy of every partition (leaders' sizes); None when no leader's size is known."""
        sizes = [p.size for p in self.partitions if p.size is not None]
        return sum(sizes) if sizes else None

    @property
    def size_on_disk(self) -> int | None:
        """Every replica's bytes: what the topic takes on the cluster's disks."""
        sizes = [s for p in self.partitions for s in p.sizes.values()]
        return sum(sizes) if sizes else None

    @property
    def remote_size(self) -> int | None:
        sizes = [p.remote_size for p in self.partitions if p.remote_size is not None]
        return sum(sizes) if sizes else None


@attrs.frozen
class ConfigEntry:
    name: str
    value: str | None
    source: str
    sensitive: bool = False
    read_only: bool = False

    @property
    def is_default(self) -> bool:
        return self.source == "DEFAULT_CONFIG"


@attrs.frozen
class GroupPartition:
    topic: str
    partition: int
    #: The committed offset (None: the group has none for it); a share group's start offset.
    committed: int | None
    #: The partition's end (high watermark; None: unknown, the partition has no leader or did not answer).
    end: int | None
    #: The members assigned it (member ids): one in a consumer group, any number in a share group.
    owners: tuple[str, ...] = ()
    #: Lag the coordinator computed itself (share groups, DescribeShareGroupOffsets v1); None: compute it.
    reported_lag: int | None = None

    @property
    def lag(self) -> int | None:
        if self.reported_lag is not None and self.reported_lag >= 0:
            return self.reported_lag
        return partition_lag(self.end, self.committed)


@attrs.frozen
class Member:
    member_id: str
    client_id: str
    host: str
    instance_id: str | None = None
    assignment: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class Group:
    group_id: str
    #: classic, consumer or share.
    type: str
    state: str
    coordinator: int
    protocol_type: str = ""
    members: tuple[Member, ...] | None = None
    partitions: tuple[GroupPartition, ...] = ()
    #: Why part of it could not be read (None: everything was).
    error: str | None = None

    @property
    def lag(self) -> int | None:
        return total_lag(p.lag for p in self.partitions)


@attrs.frozen
class Transaction:
    transactional_id: str
    coordinator: int
    state: str
    producer_id: int
    producer_epoch: int | None = None
    timeout_ms: int | None = None
    #: When it started, ms since the epoch (None: no transaction open, or not described).
    start_ms: int | None = None
    partitions: tuple[tuple[str, int], ...] = ()


@attrs.frozen
class Health:
    """The overview's summary: counts an operator checks first."""

    brokers: int
    fenced: int
    shutting_down: int
    topics: int
    partitions: int
    offline: int
    under_replicated: int
    under_min_isr: int
    reassigning: int
    controller: int | None

    @property
    def problems(self) -> list[str]:
        """What needs attention, one phrase each; none means healthy."""
        found = []
        if self.controller is None or self.controller < 0:
            found.append("no active controller")
        for count, what in ((self.fenced, "fenced broker"), (self.offline, "offline partition"),
                            (self.under_replicated, "under-replicated partition"),
                            (self.under_min_isr, "under-min-ISR partition")):
            if count:
                found.append(f"{count} {what}{'' if count == 1 else 's'}")
        return found


@attrs.frozen
class Unreadable:
    """A part of a page that could not be read, and why: shown instead of it, never silently left out."""

    what: str
    why: str
