"""Reading the cluster for the pages: the node's metadata image, and Kafka requests to the brokers that know the rest.

Only :class:`josef.services.BrokerServices` is used. What every node knows
(brokers, topics, partitions, replicas, ISR, ELR, reassignments, configs,
features) comes from ``services.image``; what only some broker knows is
asked of it with ``services.call_peer``, as Kafka's admin client would ask:

- the controller quorum: DescribeQuorum (a broker forwards it to the active
  controller);
- replica sizes: DescribeLogDirs of every live broker;
- end offsets: ListOffsets of each partition's leader;
- groups: ListGroups of every broker (each lists the groups it
  coordinates), then DescribeGroups, ConsumerGroupDescribe or
  ShareGroupDescribe, and OffsetFetch or DescribeShareGroupOffsets, of that
  coordinator (the leader of the group's __consumer_offsets partition, as FindCoordinator answers);
- transactions: ListTransactions and DescribeTransactions of every broker;
- a topic's configuration with where each value comes from: DescribeConfigs.

Requests to different brokers go out together, each bounded by
:data:`REQUEST_TIMEOUT_S`. A broker that does not answer makes its part
:class:`~josef_console.model.Unreadable`, shown as such, and never stops the
rest of the page.
"""

from __future__ import annotations

import datetime
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import anyio
import attrs

from josef.config import ConfigSource
from josef.metadata.image import MetadataImage
from josef.metadata.records import TOPIC_RESOURCE
from josef.protocol.api_keys import ApiKey
from josef.protocol.consumer_protocol import decode_assignment
from josef.metadata.quorum_status import Quorum, quorum_of
from josef.protocol.errors import check
from josef.services import BrokerServices
from josef_console.model import (
    Broker,
    ConfigEntry,
    Feature,
    Group,
    GroupPartition,
    Health,
    Member,
    Partition,
    Topic,
    Transaction,
    Unreadable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How long one request to a broker may take before its part of a page is shown as unreadable.
REQUEST_TIMEOUT_S = 5.0
METADATA_TOPIC = "__cluster_metadata"
LATEST, EARLIEST = -1, -2
#: FindCoordinator's key type of groups (classic, consumer and share groups alike).
GROUP_KEY_TYPE = 0
#: The group types ListGroups v5 names, in the order the groups page lists them.
GROUP_TYPES = ("consumer", "classic", "share")
TP = tuple[str, int]


def reason(exc: BaseException) -> str:
    """An error as one line for a page."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {REQUEST_TIMEOUT_S:.0f} s"
    if isinstance(exc, KeyError):  # a request to this node itself that it has no handler for
        return f"this node does not answer {getattr(exc.args[0], 'name', exc.args[0]) if exc.args else 'it'}"
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


def _ms(value: Any) -> int | None:
    """A kio duration or timestamp as ms (None: unset)."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


# What the image says ----------------------------------------------------------------------------


def brokers(image: MetadataImage) -> tuple[Broker, ...]:
    return tuple(Broker(b.broker_id, tuple(f"{e.name}://{e.host}:{e.port}" for e in b.endpoints), b.rack, b.fenced,
                        b.in_controlled_shutdown, b.epoch)
                 for b in sorted(image.brokers.values(), key=lambda b: b.broker_id))


def live_brokers(image: MetadataImage) -> list[int]:
    """Brokers that can be asked: registered and not fenced."""
    return sorted(b.broker_id for b in image.brokers.values() if not b.fenced)


def features(image: MetadataImage) -> tuple[Feature, ...]:
    """Finalized feature levels, with the range all registered brokers support (what an upgrade may finalize)."""
    names = set(image.features) | {n for b in image.brokers.values() for n in b.features}
    found = []
    for name in sorted(names):
        ranges = [b.features[name] for b in image.brokers.values() if name in b.features]
        supported = (max(r[0] for r in ranges), min(r[1] for r in ranges)) if ranges else None
        found.append(Feature(name, image.features.get(name, 0), supported))
    return tuple(found)


def min_isr(image: MetadataImage, topic: str, default: int) -> int:
    value = image.config(TOPIC_RESOURCE, topic).get("min.insync.replicas")
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def topics(image: MetadataImage, default_min_isr: int, sizes: Mapping[TP, Mapping[int, int]] | None = None,
           names: Iterable[str] | None = None) -> list[Topic]:
    """Topics (all, or ``names``) from the image, with the replica sizes known."""
    sizes = sizes or {}
    found = []
    for name in sorted(image.topics if names is None else names):
        topic = image.topics.get(name)
        if topic is None:
            continue
        least = min_isr(image, name, default_min_isr)
        found.append(Topic(name, topic.topic_id, tuple(
            Partition(name, i, p.leader, p.leader_epoch, p.replicas, p.isr, p.elr, p.last_known_elr,
                      p.adding_replicas, p.removing_replicas, least, sizes.get((name, i), {}))
            for i, p in sorted(topic.partitions.items()))))
    return found


def health(image: MetadataImage, all_topics: Iterable[Topic], controller: int | None) -> Health:
    all_topics = list(all_topics)
    partitions = [p for t in all_topics for p in t.partitions]
    return Health(len(image.brokers), sum(b.fenced for b in image.brokers.values()),
                  sum(b.in_controlled_shutdown for b in image.brokers.values()), len(all_topics), len(partitions),
                  sum(p.offline for p in partitions), sum(p.under_replicated for p in partitions),
                  sum(p.under_min_isr for p in partitions), sum(p.reassigning for p in partitions), controller)


def reassignments(all_topics: Iterable[Topic]) -> list[Partition]:
    """Partitions a reassignment is moving (KIP-455: replicas being added or removed)."""
    return [p for t in all_topics for p in t.partitions if p.reassigning]


def _members_of_classic(group: Any) -> tuple[Member, ...]:
    members = []
    for m in group.members:
        assignment: tuple[TP, ...] = ()
        if group.protocol_type == "consumer" and m.member_assignment:
            try:
                assignment = tuple(sorted((tp.topic, tp.partition) for tp in decode_assignment(m.member_assignment)[0]))
            except (ValueError, IndexError):
                pass  # an assignment that is not the consumer protocol's: shown as none
        members.append(Member(m.member_id, m.client_id, m.client_host, m.group_instance_id, assignment))
    return tuple(members)


def _members_of_new(group: Any) -> tuple[Member, ...]:
    """Members of a consumer (KIP-848) or share (KIP-932) group, whose assignment the coordinator names itself."""
    return tuple(Member(m.member_id, m.client_id, m.client_host, getattr(m, "instance_id", None),
                        tuple(sorted((t.topic_name, p) for t in m.assignment.topic_partitions for p in t.partitions)))
                 for m in group.members)


# What brokers say ------------------------------------------------------------------------------


class ClusterReader:
    """The requests behind the pages, sent through ``services.call_peer``."""

    def __init__(self, services: BrokerServices) -> None:
        self.services = services

    @property
    def image(self) -> MetadataImage:
        return self.services.image

    def broker_to_ask(self) -> int:
        """Where to send what any broker answers (DescribeQuorum, DescribeConfigs, CreateTopics): this node, unless it
        is a controller only (it answers no broker API), then a live broker."""
        if self.services.is_broker:
            return self.services.node_id
        live = live_brokers(self.image)
        if not live:
            raise LookupError("no live broker to ask")
        return live[0]

    async def call(self, node_id: int, api_key: int, body: Mapping[str, Any], version: int | None = None) -> Any:
        with anyio.fail_after(REQUEST_TIMEOUT_S):
            return await self.services.call_peer(node_id, api_key, body, version=version)

    async def on_each(self, nodes: Iterable[int], ask: Callable[[int], Awaitable[T]]) -> dict[int, T | Exception]:
        """``ask(node)`` for every node at once; each answer, or the exception that came instead."""
        results: dict[int, T | Exception] = {}

        async def one(node: int) -> None:
            try:
                results[node] = await ask(node)
            except Exception as exc:  # noqa: BLE001 - any failure of one broker is that broker's part, shown as such
                log.debug("console: broker %s: %s", node, exc)
                results[node] = exc

        async with anyio.create_task_group() as tg:
            for node in nodes:
                tg.start_soon(one, node)
        return results

    # The quorum and the topics' data -----------------------------------------------------------

    async def quorum(self) -> Quorum:
        """The KRaft quorum as its leader sees it (DescribeQuorum, asked of a broker, which forwards it)."""
        response = await self.call(self.broker_to_ask(), ApiKey.DESCRIBE_QUORUM, {"topics": [
            {"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]})
        check(response.error_code, getattr(response, "error_message", None))
        partition = next((p for t in response.topics if t.topic_name == METADATA_TOPIC for p in t.partitions), None)
        if partition is None:
            raise ValueError(f"the answer has no {METADATA_TOPIC}-0")
        check(partition.error_code, getattr(partition, "error_message", None))
        return quorum_of(partition)

    async def log_sizes(self, topic_names: Iterable[str] | None = None
                        ) -> tuple[dict[TP, dict[int, int]], list[Unreadable]]:
        """Each replica's local bytes, by (topic, partition) and broker (DescribeLogDirs of every live broker)."""
        body: dict[str, Any] = {"topics": None}
        if topic_names is not None:
            body["topics"] = [{"topic": name, "partitions": sorted(self.image.topics[name].partitions)}
                              for name in topic_names if name in self.image.topics]

        async def ask(node: int) -> Any:
            response = await self.call(node, ApiKey.DESCRIBE_LOG_DIRS, body, version=4)
            check(response.error_code)
            return response

        sizes: dict[TP, dict[int, int]] = defaultdict(dict)
        unreadable = []
        for node, answer in (await self.on_each(live_brokers(self.image), ask)).items():
            if isinstance(answer, Exception):
                unreadable.append(Unreadable(f"log directories of broker {node}", reason(answer)))
                continue
            for directory in answer.results:
                if directory.error_code != 0:
                    unreadable.append(Unreadable(f"log directory {directory.log_dir} of broker {node}",
                                                 getattr(directory.error_code, "name", str(directory.error_code))))
                    continue
                for topic in directory.topics:
                    for p in topic.partitions:
                        if not p.is_future_key:
                            tp = (str(topic.name), int(p.partition_index))
                            sizes[tp][node] = sizes[tp].get(node, 0) + int(p.partition_size)
        return dict(sizes), unreadable

    async def offsets(self, tps: Iterable[TP], timestamp: int = LATEST) -> tuple[dict[TP, int], list[Unreadable]]:
        """Each partition's end (``LATEST``: the high watermark) or start (``EARLIEST``) offset, asked of its leader.

        Partitions without a leader, and those whose leader did not answer, are left out."""
        by_leader: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for topic, partition in set(tps):
            image = self.image.topics.get(topic)
            leader = image.partitions[partition].leader if image is not None and partition in image.partitions else -1
            if leader >= 0:
                by_leader[leader][topic].append(partition)

        async def ask(node: int) -> Any:
            return await self.call(node, ApiKey.LIST_OFFSETS, {
                "replica_id": -1, "isolation_level": 0, "topics": [
                    {"name": topic, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                                    "timestamp": timestamp} for p in sorted(partitions)]}
                    for topic, partitions in sorted(by_leader[node].items())]}, version=9)

        found: dict[TP, int] = {}
        unreadable = []
        for node, answer in (await self.on_each(sorted(by_leader), ask)).items():
            if isinstance(answer, Exception):
                unreadable.append(Unreadable(f"offsets led by broker {node}", reason(answer)))
                continue
            for topic in answer.topics:
                for p in topic.partitions:
                    if p.error_code == 0 and p.offset >= 0:
                        found[(str(topic.name), int(p.partition_index))] = int(p.offset)
        return found, unreadable

    async def end_offset_sums(self) -> tuple[dict[str, int | None], set[str]]:
        """For the throughput sampler: each topic's sum of end offsets (None unless every partition answered), and
        the topics that exist."""
        image = self.image
        tps = [(name, p) for name, topic in image.topics.items() for p in topic.partitions]
        ends, _ = await self.offsets(tps)
        sums: dict[str, int | None] = {}
        for name, topic in image.topics.items():
            known = [ends.get((name, p)) for p in topic.partitions]
            sums[name] = None if any(e is None for e in known) else sum(e for e in known if e is not None)
        return sums, set(image.topics)

    async def topic_configs(self, name: str) -> list[ConfigEntry]:
        """The topic's whole configuration with where each value comes from (DescribeConfigs, as kafka-configs.sh
        --describe --all shows it); sensitive values are never sent."""
        response = await self.call(self.broker_to_ask(), ApiKey.DESCRIBE_CONFIGS, {
            "resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": name, "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": False}, version=4)
        [result] = response.results
        check(result.error_code, result.error_message)
        return [ConfigEntry(c.name, c.value, ConfigSource.of(c.config_source).name, bool(c.is_sensitive),
                            bool(c.read_only)) for c in sorted(result.configs, key=lambda c: c.name)]

    # Groups -------------------------------------------------------------------------------------

    async def list_groups(self, nodes: Iterable[int] | None = None) -> tuple[list[Group], list[Unreadable]]:
        """Every group with its type and state, from the broker coordinating it (ListGroups v5)."""

        async def ask(node: int) -> Any:
            response = await self.call(node, ApiKey.LIST_GROUPS, {"states_filter": [], "types_filter": []}, version=5)
            check(response.error_code)
            return response

        found, unreadable = [], []
        for node, answer in (await self.on_each(live_brokers(self.image) if nodes is None else nodes, ask)).items():
            if isinstance(answer, Exception):
                unreadable.append(Unreadable(f"groups coordinated by broker {node}", reason(answer)))
                continue
            found += [Group(g.group_id, g.group_type or "classic", g.group_state, node, g.protocol_type)
                      for g in answer.groups]
        return sorted(found, key=lambda g: g.group_id), unreadable

    async def describe_groups(self, listed: list[Group]) -> tuple[list[Group], list[Unreadable]]:
        """Members, committed offsets and lag of ``listed`` groups: their coordinators asked together, then the
        partitions' leaders for the end offsets."""
        by_coordinator: dict[int, list[Group]] = defaultdict(list)
        for group in listed:
            by_coordinator[group.coordinator].append(group)
        answers = await self.on_each(sorted(by_coordinator), lambda node: self._describe_on(node, by_coordinator[node]))
        unreadable = []
        described: list[Group] = []
        for node, answer in answers.items():
            if isinstance(answer, Exception):
                unreadable.append(Unreadable(f"groups coordinated by broker {node}", reason(answer)))
                described += [attrs.evolve(g, error=reason(answer)) for g in by_coordinator[node]]
            else:
                described += answer
        wanted = {(p.topic, p.partition) for g in described for p in g.partitions}
        ends, missing = await self.offsets(wanted)
        unreadable += missing
        with_ends = [attrs.evolve(g, partitions=tuple(attrs.evolve(p, end=ends.get((p.topic, p.partition)))
                                                      for p in g.partitions)) for g in described]
        return sorted(with_ends, key=lambda g: g.group_id), unreadable

    async def _describe_on(self, node: int, groups: list[Group]) -> list[Group]:
        """One coordinator's groups: members by type, committed offsets (share groups: their start offsets)."""
        ids = {t: [g.group_id for g in groups if g.type == t] for t in ("classic", "consumer", "share")}
        members: dict[str, tuple[Member, ...]] = {}
        states: dict[str, str] = {}
        errors: dict[str, str] = {}
        if ids["classic"]:
            response = await self.call(node, ApiKey.DESCRIBE_GROUPS, {"groups": ids["classic"],
                                                                      "include_authorized_operations": False}, version=5)
            for g in response.groups:
                if g.error_code != 0:
                    errors[g.group_id] = getattr(g.error_code, "name", str(g.error_code))
                else:
                    members[g.group_id], states[g.group_id] = _members_of_classic(g), g.group_state
        for kind, key, version in (("consumer", ApiKey.CONSUMER_GROUP_DESCRIBE, 0),
                                   ("share", ApiKey.SHARE_GROUP_DESCRIBE, 1)):
            if ids[kind]:
                response = await self.call(node, key, {"group_ids": ids[kind],
                                                       "include_authorized_operations": False}, version=version)
                for g in response.groups:
                    if g.error_code != 0:
                        errors[g.group_id] = g.error_message or getattr(g.error_code, "name", str(g.error_code))
                    else:
                        members[g.group_id], states[g.group_id] = _members_of_new(g), g.group_state
        committed = await self._committed(node, ids["classic"] + ids["consumer"]) if ids["classic"] or ids["consumer"] \
            else {}
        if ids["share"]:
            committed.update(await self._share_offsets(node, ids["share"]))
        described = []
        for group in groups:
            found = members.get(group.group_id)
            owners: dict[TP, tuple[str, ...]] = defaultdict(tuple)
            for member in found or ():
                for tp in member.assignment:
                    owners[tp] += (member.member_id,)
            offsets = committed.get(group.group_id, {})
            partitions = tuple(GroupPartition(t, p, offsets[(t, p)][0] if (t, p) in offsets else None, None,
                                              owners.get((t, p), ()), offsets.get((t, p), (None, None))[1])
                               for t, p in sorted(set(offsets) | set(owners)))
            described.append(attrs.evolve(group, state=states.get(group.group_id, group.state), members=found,
                                          partitions=partitions, error=errors.get(group.group_id)))
        return described

    async def _committed(self, node: int, group_ids: list[str]) -> dict[str, dict[TP, tuple[int, int | None]]]:
        """Committed offsets of classic and consumer groups (OffsetFetch v9, several groups in one request)."""
        response = await self.call(node, ApiKey.OFFSET_FETCH, {"groups": [
            {"group_id": g, "member_id": None, "member_epoch": -1, "topics": None} for g in group_ids],
            "require_stable": False}, version=9)
        found: dict[str, dict[TP, tuple[int, int | None]]] = {}
        for g in response.groups:
            if g.error_code != 0:
                continue
            found[g.group_id] = {(str(t.name), int(p.partition_index)): (int(p.committed_offset), None)
                                 for t in g.topics for p in t.partitions
                                 if p.error_code == 0 and p.committed_offset >= 0}
        return found

    async def _share_offsets(self, node: int, group_ids: list[str]) -> dict[str, dict[TP, tuple[int, int | None]]]:
        """Share groups' start offsets and the lag their coordinator computes (DescribeShareGroupOffsets v1)."""
        response = await self.call(node, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, {"groups": [
            {"group_id": g, "topics": None} for g in group_ids]}, version=1)
        found: dict[str, dict[TP, tuple[int, int | None]]] = {}
        for g in response.groups:
            if g.error_code != 0:
                continue
            found[g.group_id] = {(str(t.topic_name), int(p.partition_index)):
                                 (int(p.start_offset), int(p.lag) if p.lag >= 0 else None)
                                 for t in g.topics for p in t.partitions
                                 if p.error_code == 0 and p.start_offset >= 0}
        return found

    def coordinator(self, group_id: str) -> int:
        """The broker coordinating ``group_id``: the leader of its ``__consumer_offsets`` partition, as FindCoordinator
        answers (from the coordinator runtime and the image; FindCoordinator asked of this node itself, in process,
        has no listener to name an endpoint on)."""
        runtime = self.services.coordinators
        coordinator = runtime.by_key_type(GROUP_KEY_TYPE)
        if coordinator is None:
            raise LookupError("no group coordinator is installed on this node")
        leader = runtime.leader_of(coordinator, group_id)
        if leader < 0:
            raise LookupError("the group's coordinator partition has no leader")
        return leader

    async def group(self, group_id: str) -> tuple[Group | None, list[Unreadable]]:
        """One group in full, from its coordinator; None when the coordinator does not know it."""
        node = self.coordinator(group_id)
        listed, unreadable = await self.list_groups([node])
        found = [g for g in listed if g.group_id == group_id]
        if not found:
            return None, unreadable
        described, more = await self.describe_groups(found)
        return described[0], unreadable + more

    # Transactions -------------------------------------------------------------------------------

    async def transactions(self) -> tuple[list[Transaction], list[Unreadable]]:
        """Every transactional id of every coordinator (ListTransactions v1), described by it (DescribeTransactions)."""

        async def ask(node: int) -> list[Transaction]:
            listed = await self.call(node, ApiKey.LIST_TRANSACTIONS, {"state_filters": [], "producer_id_filters": [],
                                                                       "duration_filter": -1}, version=1)
            check(listed.error_code)
            ids = [t.transactional_id for t in listed.transaction_states]
            if not ids:
                return []
            described = await self.call(node, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": ids}, version=0)
            found = []
            for t in described.transaction_states:
                if t.error_code != 0:
                    continue
                found.append(Transaction(
                    t.transactional_id, node, t.transaction_state, int(t.producer_id), int(t.producer_epoch),
                    _ms(t.transaction_timeout), _ms(t.transaction_start_time),
                    tuple(sorted((str(topic.topic), int(p)) for topic in t.topics for p in topic.partitions))))
            named = {t.transactional_id for t in found}
            found += [Transaction(t.transactional_id, node, t.transaction_state, int(t.producer_id))
                      for t in listed.transaction_states if t.transactional_id not in named]
            return found

        found, unreadable = [], []
        for node, answer in (await self.on_each(live_brokers(self.image), ask)).items():
            if isinstance(answer, Exception):
                unreadable.append(Unreadable(f"transactions coordinated by broker {node}", reason(answer)))
            else:
                found += answer
        return sorted(found, key=lambda t: t.transactional_id), unreadable
