"""How a partition's leader, ISR and replicas change: pure functions of the image.

Both metadata backends use them, so a Raft controller and a ZooKeeper one
decide the same. :func:`build` is Kafka's PartitionChangeBuilder: given the
ISR, replicas and reassignment a caller wants, it completes a reassignment
whose new replicas have all joined the ISR, elects a leader, and returns
the one PartitionChangeRecord that gets there (or None when nothing would
change). Everything else here says what to ask of it when a broker is
fenced, comes back, or when leaders are rebalanced.

As in Kafka's ReplicationControlManager, a fenced broker leaves every ISR it
is in unless it is the last member (the ISR never becomes empty, so the
partition remembers who has its data); a partition it led gets the first
live replica of the remaining ISR, in replica order, or no leader (-1) when
none is live, unless the topic allows unclean elections.

With eligible leader replicas (KIP-966, ``eligible.leader.replicas.version``
1) the ISR may become empty: when it shrinks below the topic's
``min.insync.replicas`` the high watermark cannot advance, so the members
that leave it hold every committed record and join the ELR; a leaderless
partition with an empty ISR elects an ELR member cleanly. ``last_known_elr``
keeps the last leader of a partition whose ISR emptied (Kafka 4.x's
balanced recovery): it may lead again, as an unclean election, once the ISR
and ELR are both empty.
"""

from __future__ import annotations

import enum
import logging
from typing import Callable, Collection, Iterator, Sequence

import attrs

from josef.metadata.image import RECOVERING, MetadataImage, PartitionImage, TopicImage
from josef.metadata.records import NO_LEADER_CHANGE, PartitionChangeRecord, uuid_from_text

log = logging.getLogger(__name__)

NO_LEADER = -1
#: Whether a broker may lead a partition now: Kafka's LeaderAcceptor.
LeaderAcceptor = Callable[[int, PartitionImage], bool]
#: Whether a topic (by name) allows unclean leader election.
UncleanPolicy = Callable[[str], bool]


class Election(enum.Enum):
    """Which leader :func:`build` looks for, as Kafka's PartitionChangeBuilder.Election."""

    #: The first replica if it is in the ISR and may lead; else as ONLINE without the unclean step.
    PREFERRED = "preferred"
    #: Keep the leader if it may still lead, else the first replica in the ISR that may.
    ONLINE = "online"
    #: As ONLINE, and when no ISR member may lead, the first live replica: records it lacks are lost.
    UNCLEAN = "unclean"


def leader_acceptor(image: MetadataImage, leaving: int = NO_LEADER, returning: int = NO_LEADER) -> LeaderAcceptor:
    """Brokers that may lead a partition: registered, unfenced, not shutting down, its replica in an online directory.

    ``leaving`` is treated as already gone and ``returning`` as already
    back, for changes committed together with the broker's own fence or
    unfence record.
    """
    def acceptable(broker_id: int, partition: PartitionImage) -> bool:
        broker = image.brokers.get(broker_id)
        if broker is not None and not broker.has_online_dir(partition.directory_of(broker_id)):
            return False
        if broker_id == returning:
            return True
        return (broker_id != leaving and broker is not None and not broker.fenced
                and not broker.in_controlled_shutdown)
    return acceptable


@attrs.frozen
class Elr:
    """Eligible leader replicas are tracked: how to get a topic's effective ``min.insync.replicas``."""

    min_isr: Callable[[TopicImage], int]


def never_unclean(topic: str) -> bool:
    return False


def election_for(unclean: UncleanPolicy, topic: str) -> Election:
    return Election.UNCLEAN if unclean(topic) else Election.ONLINE


@attrs.frozen
class _Target:
    """What the partition should become; starts as what it is."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def _complete_reassignment(target: _Target) -> _Target:
    """The target after a reassignment whose adding replicas all joined the ISR: Kafka's maybeCompleteReassignment.

    The removing replicas leave the replicas and the ISR; nothing happens
    while an adding replica is missing from the ISR, or when the ISR would
    become empty.
    """
    if not (target.adding or target.removing) or not set(target.adding) <= set(target.isr):
        return target
    isr = tuple(r for r in target.isr if r not in target.removing)
    if not isr:
        return target
    return _Target(tuple(r for r in target.replicas if r not in target.removing), isr, (), ())


def _elect(current: PartitionImage, target: _Target, elr: tuple[int, ...], tracked: bool, election: Election,
           acceptable: LeaderAcceptor) -> tuple[int, bool]:
    """``(leader, unclean)`` for the target: Kafka's electPreferredLeader / electAnyLeader.

    ``elr`` is the target ELR; its members may lead only when the target
    ISR is empty. ``tracked`` says whether eligible leader replicas are
    tracked: without, ``elr`` is what the partition kept from when they
    were (Kafka still elects from it), and the last known leader may not
    lead.
    """
    def valid(replica: int) -> bool:
        in_sync = replica in target.isr or (not target.isr and replica in elr)
        return in_sync and acceptable(replica, current)

    if election is Election.PREFERRED and target.replicas and valid(target.replicas[0]):
        return target.replicas[0], False
    if valid(current.leader):
        return current.leader, False
    leader = next((r for r in target.replicas if valid(r)), NO_LEADER)
    if leader != NO_LEADER:
        return leader, False
    if (tracked and not elr and not target.isr and len(current.last_known_elr) == 1
            and acceptable(current.last_known_elr[0], current)):
        return current.last_known_elr[0], True  # the last known leader: what it lacks of other replicas is lost
    if election is Election.UNCLEAN:
        leader = next((r for r in target.replicas if acceptable(r, current)), NO_LEADER)
        if leader != NO_LEADER:
            return leader, True
    return NO_LEADER, False


def _target_elr(current: PartitionImage, target: _Target, min_isr: int | None,
                unclean_shutdown: Collection[int]) -> tuple[int, ...] | None:
    """The ELR before the election, None when not tracked: Kafka's maybePopulateTargetElr.

    Empty once the ISR holds ``min_isr`` members; else the members of the
    current ISR and ELR that are not in the target ISR, less the brokers
    that restarted without a clean shutdown (they may have lost records).
    """
    if min_isr is None:
        return None
    if len(target.isr) >= min_isr:
        return ()
    return tuple(sorted((set(current.elr) | set(current.isr)) - set(target.isr) - set(unclean_shutdown)))


def build(topic: TopicImage, index: int, acceptable: LeaderAcceptor, *,
          isr: Sequence[int] | None = None, replicas: Sequence[int] | None = None,
          adding: Sequence[int] | None = None, removing: Sequence[int] | None = None,
          election: Election = Election.ONLINE, recovery_state: int | None = None,
          min_isr: int | None = None, unclean_shutdown: Collection[int] = ()) -> PartitionChangeRecord | None:
    """The record that takes ``topic``'s partition ``index`` to the wanted state, or None when it is already there.

    Fields left as None keep their current value. The ISR is never set
    empty unless eligible leader replicas are tracked (``min_isr``, the
    topic's effective ``min.insync.replicas``, is given);
    ``unclean_shutdown`` are brokers that restarted uncleanly and leave the
    ELR. The leader epoch is bumped (by naming the leader) when the leader
    changes or a replica leaves the replicas, not on an ISR shrink, as in
    Kafka 4.x metadata versions.
    """
    current = topic.partitions[index]
    target = _complete_reassignment(_Target(
        current.replicas if replicas is None else tuple(replicas), current.isr if isr is None else tuple(isr),
        current.adding_replicas if adding is None else tuple(adding),
        current.removing_replicas if removing is None else tuple(removing)))
    elr = _target_elr(current, target, min_isr, unclean_shutdown)
    candidates = current.elr if elr is None else elr
    leader, unclean = _elect(current, target, candidates, elr is not None, election, acceptable)
    new_leader = NO_LEADER_CHANGE
    new_isr: tuple[int, ...] | None = None
    new_recovery = current.leader_recovery_state if recovery_state is None else recovery_state
    if leader != current.leader:
        new_leader = leader
        if not target.isr and leader in candidates and not unclean:
            # A clean election from the ELR: the new leader is the ISR alone.
            target = attrs.evolve(target, isr=(leader,))
            if elr is not None:
                elr = tuple(r for r in elr if r != leader)
            log.info("Partition %s-%d elects broker %d from its eligible leader replicas", topic.name, index, leader)
        if unclean:
            new_isr, new_recovery = (leader,), RECOVERING
            log.warning("Unclean leader election for partition %s-%d: broker %d, which is not in the ISR %s, "
                        "becomes the leader; records only the old ISR had may be lost",
                        topic.name, index, leader, list(current.isr))
    elif not set(current.replicas) <= set(target.replicas):
        new_leader = current.leader  # a replica leaves: its fetches must be fenced by a new leader epoch
    # An unclean election, or ELR not tracked, leaves no ELR.
    new_elr = () if elr is None or new_isr is not None else elr
    if new_isr is None and (target.isr or elr is not None) and target.isr != current.isr:
        new_isr = target.isr
    new_last_known = None
    if elr is None:  # not tracked (any more): nothing of it is kept
        new_last_known = () if current.last_known_elr else None
    else:  # Kafka's maybeUpdateLastKnownLeader
        if new_isr == () and current.last_known_elr != (current.leader,):
            new_last_known = (current.leader,)
        elif (new_leader >= 0 or (current.leader != NO_LEADER and new_leader != NO_LEADER)) and current.last_known_elr:
            new_last_known = ()
    record = PartitionChangeRecord(
        partition_id=index, topic_id=uuid_from_text(topic.topic_id), isr=new_isr, leader=new_leader,
        replicas=None if target.replicas == current.replicas else target.replicas,
        removing_replicas=None if target.removing == current.removing_replicas else target.removing,
        adding_replicas=None if target.adding == current.adding_replicas else target.adding,
        leader_recovery_state=-1 if new_recovery == current.leader_recovery_state else new_recovery,
        eligible_leader_replicas=None if new_elr == current.elr else new_elr, last_known_elr=new_last_known)
    unchanged = PartitionChangeRecord(partition_id=index, topic_id=record.topic_id)
    return None if record == unchanged else record


@attrs.frozen
class Reassignment:
    """Replicas, adding and removing replicas while a partition moves: Kafka's PartitionReassignmentReplicas."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def reassignment(current: Sequence[int], target: Sequence[int]) -> Reassignment:
    """The move from ``current`` to ``target``: the target's replicas first (its order is the new preference),
    then those being removed."""
    removing = tuple(r for r in current if r not in target)
    return Reassignment(tuple(target) + removing, tuple(r for r in target if r not in current), removing)


@attrs.frozen
class Revert:
    """Replicas and ISR after cancelling a reassignment: Kafka's PartitionReassignmentRevert."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    #: Every ISR member was being added: the ISR becomes all the old replicas, an unclean choice.
    unclean: bool


def revert_reassignment(partition: PartitionImage) -> Revert:
    """Take out the replicas the reassignment was adding, keep those it was removing."""
    replicas = tuple(r for r in partition.replicas if r not in partition.adding_replicas)
    isr = tuple(r for r in partition.isr if r not in partition.adding_replicas)
    return Revert(replicas, isr or replicas, not isr)


def _partitions(image: MetadataImage) -> Iterator[tuple[TopicImage, int, PartitionImage]]:
    for topic in image.topics.values():
        for index, partition in topic.partitions.items():
            yield topic, index, partition


def _built(changes: Iterator[PartitionChangeRecord | None]) -> list[PartitionChangeRecord]:
    return [change for change in changes if change is not None]


def _min_isr(elr: Elr | None, topic: TopicImage) -> int | None:
    return None if elr is None else elr.min_isr(topic)


def broker_leaving(image: MetadataImage, broker_id: int, unclean: UncleanPolicy = never_unclean,
                   elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Changes that take ``broker_id`` out of every ISR and leadership, before it is fenced or shut down.

    With ELR tracked, the partitions whose ELR holds it are looked at too,
    as Kafka does (a fenced ELR member stays in the ELR).
    """
    acceptable = leader_acceptor(image, leaving=broker_id)
    return _built(
        build(topic, index, acceptable, isr=[r for r in p.isr if r != broker_id],
              election=election_for(unclean, topic.name), min_isr=_min_isr(elr, topic))
        for topic, index, p in _partitions(image)
        if broker_id in p.isr or p.leader == broker_id or (elr is not None and broker_id in p.elr))


def broker_dirs_offline(image: MetadataImage, broker_id: int, dirs: Collection[str],
                        unclean: UncleanPolicy = never_unclean, elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Changes that take ``broker_id``'s replicas in the failed directories ``dirs`` out of leadership and the ISR.

    Kafka's handleDirectoriesOffline (KIP-858): the replicas are found by the
    directories the broker assigned them to (:attr:`PartitionImage.directories`);
    another in-sync replica takes over where one may, else the partition is
    left without a leader. Replicas in the broker's other directories are
    not touched.
    """
    acceptable = leader_acceptor(image, leaving=broker_id)
    return _built(
        build(topic, index, acceptable, isr=[r for r in p.isr if r != broker_id],
              election=election_for(unclean, topic.name), min_isr=_min_isr(elr, topic))
        for topic, index, p in _partitions(image)
        if broker_id in p.replicas and p.directory_of(broker_id) in dirs
        and (broker_id in p.isr or p.leader == broker_id or (elr is not None and broker_id in p.elr)))


def broker_unclean_shutdown(image: MetadataImage, broker_id: int, unclean: UncleanPolicy = never_unclean,
                            elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Changes that take a broker that restarted without a clean shutdown out of every ISR and ELR (KIP-966).

    Its log may have lost records it acknowledged, so it may no longer be
    elected as a replica that has them. Nothing when ELR is not tracked.
    """
    if elr is None:
        return []
    acceptable = leader_acceptor(image)
    return _built(
        build(topic, index, acceptable, isr=[r for r in p.isr if r != broker_id],
              election=election_for(unclean, topic.name), min_isr=elr.min_isr(topic), unclean_shutdown=(broker_id,))
        for topic, index, p in _partitions(image) if broker_id in p.isr or broker_id in p.elr)


def broker_returning(image: MetadataImage, broker_id: int, unclean: UncleanPolicy = never_unclean,
                     elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Changes that give leaderless partitions a leader now that ``broker_id`` is unfenced (in the same commit)."""
    acceptable = leader_acceptor(image, returning=broker_id)
    return _built(build(topic, index, acceptable, election=election_for(unclean, topic.name),
                        min_isr=_min_isr(elr, topic))
                  for topic, index, p in _partitions(image) if p.leader == NO_LEADER)


def unclean_elections(image: MetadataImage, unclean: UncleanPolicy,
                      elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Leaders for leaderless partitions of topics that allow unclean election, which may have enabled it since."""
    acceptable = leader_acceptor(image)
    return _built(build(topic, index, acceptable, election=Election.UNCLEAN, min_isr=_min_isr(elr, topic))
                  for topic, index, p in _partitions(image) if p.leader == NO_LEADER and unclean(topic.name))


def preferred_election(image: MetadataImage, topic: TopicImage, index: int,
                       elr: Elr | None = None) -> PartitionChangeRecord | None:
    """The change that gives the partition its preferred leader, or None when that replica cannot lead now."""
    return build(topic, index, leader_acceptor(image), election=Election.PREFERRED, min_isr=_min_isr(elr, topic))


def rebalance(image: MetadataImage, percentage: int, elr: Elr | None = None) -> list[PartitionChangeRecord]:
    """Preferred-leader elections for the brokers whose leadership is imbalanced, as Kafka's auto rebalance.

    A broker is imbalanced when more than ``percentage`` percent of the
    partitions it is the preferred replica of are led by another broker
    (``leader.imbalance.per.broker.percentage``). Partitions being
    reassigned are left to the reassignment.
    """
    preferred: dict[int, list[tuple[TopicImage, int, PartitionImage]]] = {}
    for topic, index, p in _partitions(image):
        if p.replicas and not p.reassigning:
            preferred.setdefault(p.preferred_leader, []).append((topic, index, p))
    changes: list[PartitionChangeRecord | None] = []
    for partitions in preferred.values():
        elsewhere = [(topic, index) for topic, index, p in partitions if p.leader != p.preferred_leader]
        if len(elsewhere) * 100 > percentage * len(partitions):
            changes += [preferred_election(image, topic, index, elr) for topic, index in elsewhere]
    return _built(iter(changes))
