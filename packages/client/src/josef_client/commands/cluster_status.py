"""``josef cluster status``: the cluster's health as a table, and an exit status that scripts and CI can act on.

One command answers "is the cluster all right?" without reading four tools'
output: the brokers (DescribeCluster v2, which also lists fenced brokers),
the active controller and the KRaft quorum (DescribeQuorum, forwarded by the
broker to the controller), every partition's leader, replicas and ISR
against its topic's ``min.insync.replicas`` (DescribeTopicPartitions or
Metadata, DescribeConfigs), and each consumer group's state and lag
(ListGroups, OffsetFetch and ListOffsets, as ``josef consumer-groups
describe`` computes it)::

    $ josef cluster status --bootstrap-server localhost:9092
    Cluster:          MkU3OEVBNTcwNTJENDM2Qk
    Controller:       1 (quorum leader, epoch 4, high watermark 218)
    ...
    Status: needs attention: broker 3 (localhost:9096) is fenced; 2 under-replicated partitions: orders-0, orders-1

The exit status is 0 when nothing needs attention, 1 when something does
(the last line says what), and 2 when the status could not be read at all
(the bootstrap servers cannot be reached, a bad flag or client property), so
that 1 always means "the cluster", never "the command". A part of the
cluster that cannot be read (a group whose coordinator is moving, say) is
shown as such and counts as needing attention: a check that could not look
is not a check that passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, TypeVar

import attrs
import click

from josef.metadata.quorum_status import Quorum, QuorumNode, quorum_of
from josef.protocol.api_keys import ApiKey
from josef_client.commands.common import (
    Command,
    admin_client,
    bootstrap_option,
    command_config_option,
    quiet_broken_pipe,
    run,
)
from josef_client.commands.groups import _consumer, _table, fetch_offsets, list_groups
from josef_client.commands.metadata_quorum import METADATA_TOPIC, metadata_partition

if TYPE_CHECKING:
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.admin import AsyncAdmin
    from josef_client.consumer import AsyncConsumer

T = TypeVar("T")

HEALTHY, NEEDS_ATTENTION, CANNOT_CHECK = 0, 1, 2
#: How many problem partitions the text output lists (``--json`` lists them all).
SHOWN_PARTITIONS = 20
MIN_ISR = "min.insync.replicas"
#: The parts of the status read apart, so that one that cannot be read does not hide the others.
BROKERS, QUORUM, TOPICS, GROUPS = "brokers", "metadata quorum", "topics", "consumer groups"
#: What may be wrong with a partition: (:class:`Partition` property, label).
CONDITIONS = (("offline", "offline"), ("under_replicated", "under-replicated"), ("under_min_isr", "under-min-ISR"))


class CannotCheck(click.ClickException):
    """The status could not be read: exit status 2, so that 1 only ever means that the cluster needs attention."""

    exit_code = CANNOT_CHECK


class StatusCommand(Command):
    """A usage error is one ``Error:`` line, as with the other tools, but exits 2: the command could not check."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:
            raise CannotCheck(exc.message) from None


# What the cluster says ---------------------------------------------------------------------------


@attrs.frozen
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None
    #: Fenced by the controller: it stopped heartbeating (or has not caught up since it started). Only
    #: DescribeCluster v2 names fenced brokers; before it they are simply missing.
    fenced: bool = False


@attrs.frozen
class Partition:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    #: The topic's min.insync.replicas (None: DescribeConfigs did not say).
    min_isr: int | None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        """acks=all producers are refused (NOT_ENOUGH_REPLICAS) while this is true."""
        return self.min_isr is not None and len(self.isr) < self.min_isr

    @property
    def conditions(self) -> list[str]:
        return [label for kind, label in CONDITIONS if getattr(self, kind)]


@attrs.frozen
class GroupPartition:
    topic: str
    partition: int
    committed: int
    #: The log end offset (None: unknown, the partition has no leader or no longer exists).
    log_end: int | None

    @property
    def lag(self) -> int | None:
        return None if self.log_end is None else self.log_end - self.committed


@attrs.frozen
class Group:
    group_id: str
    state: str
    partitions: tuple[GroupPartition, ...] = ()
    #: Why its offsets could not be read (None: they were).
    error: str | None = None

    @property
    def lag(self) -> int | None:
        """The total lag over the partitions whose log end is known (None when its offsets could not be read)."""
        if self.error is not None:
            return None
        return sum(p.lag for p in self.partitions if p.lag is not None)

    @property
    def max_lag(self) -> int | None:
        return max((p.lag for p in self.partitions if p.lag is not None), default=None)

    def over(self, threshold: int | None) -> list[GroupPartition]:
        """The partitions lagging more than ``threshold`` records (None: no limit, so none)."""
        if threshold is None:
            return []
        return [p for p in self.partitions if p.lag is not None and p.lag > threshold]


@attrs.frozen
class ClusterStatus:
    cluster_id: str | None
    #: What DescribeCluster names; in KRaft a broker answers with a live broker, so :attr:`active_controller` prefers
    #: the quorum's leader.
    controller_id: int
    brokers: tuple[Broker, ...]
    #: None when the cluster does not answer DescribeQuorum (or it could not be read: see ``unreadable``).
    quorum: Quorum | None
    topics: int
    partitions: tuple[Partition, ...]
    groups: tuple[Group, ...]
    #: The parts (:data:`BROKERS`, :data:`QUORUM`, :data:`TOPICS`, :data:`GROUPS`) that could not be read, with why.
    unreadable: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def active_controller(self) -> int:
        return self.quorum.leader_id if self.quorum is not None else self.controller_id


@attrs.frozen
class Thresholds:
    """When lag counts as a problem. Group lag never does unless a threshold is given: a consumer that is
    behind is often fine (a batch job), and a script can choose its own limit."""

    group_lag: int | None = None
    voter_lag_ms: int = 10_000


@attrs.frozen
class Problem:
    kind: str  # no_controller, fenced_broker, lagging_voter, offline, under_replicated, under_min_isr, group_lag, unreadable
    message: str


# Reading it --------------------------------------------------------------------------------------


def _reason(exc: Exception) -> str:
    """An error as one line: a connection error's message says what failed, its error code adds nothing."""
    from josef.protocol.errors import KafkaConnectionError

    text = exc.message if isinstance(exc, (KafkaConnectionError, click.ClickException)) else str(exc)
    return " ".join(str(text).split())


async def _part(what: str, unreadable: dict[str, str], read: Awaitable[T], default: T) -> T:
    """``read``, or ``default`` with why in ``unreadable``: one part that cannot be read must not hide the others."""
    from josef.protocol.errors import KafkaError

    try:
        return await read
    except (KafkaError, click.ClickException) as exc:
        unreadable[what] = _reason(exc)
        return default


async def read_brokers(admin: AsyncAdmin) -> tuple[str | None, int, tuple[Broker, ...]]:
    """Cluster id, controller and brokers, fenced ones too where DescribeCluster has them (v2, KIP-1073)."""
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    conn = await admin.cluster.any_connection()
    offered = conn.versions.get(ApiKey.DESCRIBE_CLUSTER)
    if offered is None or offered[1] < 2:
        described = await admin.describe_cluster()
        return described.cluster_id, described.controller_id, tuple(
            Broker(b.node_id, b.host, b.port, b.rack) for b in sorted(described.brokers, key=lambda b: b.node_id))
    # The admin client speaks v1 (MAX_VERSIONS); v2 only adds the fenced brokers, which this reads.
    response = await conn.request(ApiKey.DESCRIBE_CLUSTER, {
        "include_cluster_authorized_operations": False, "endpoint_type": 1, "include_fenced_brokers": True}, version=2)
    if response.error_code != ErrorCode.none:
        raise KafkaError(response.error_code, response.error_message or "DescribeCluster failed")
    return response.cluster_id, response.controller_id, tuple(
        Broker(b.broker_id, b.host, b.port, b.rack, bool(b.is_fenced)) for b in sorted(response.brokers, key=lambda b: b.broker_id))


async def read_quorum(admin: AsyncAdmin) -> Quorum | None:
    """The KRaft quorum (DescribeQuorum through a broker, on the admin client's connection so --command-config's
    security applies); None from a cluster that does not offer the API."""
    from josef.protocol.errors import UnsupportedVersionError

    conn = await admin.cluster.any_connection()
    try:
        response = await conn.request(ApiKey.DESCRIBE_QUORUM, {"topics": [
            {"topic_name": METADATA_TOPIC, "partitions": [{"partition_index": 0}]}]})
    except UnsupportedVersionError:
        return None
    return quorum_of(metadata_partition(response))


def _min_isr(entries: Any) -> int | None:
    entry = None if isinstance(entries, Exception) or entries is None else entries.get(MIN_ISR)
    try:
        return int(entry.value) if entry is not None and entry.value is not None else None
    except ValueError:
        return None


async def read_partitions(admin: AsyncAdmin) -> tuple[int, tuple[Partition, ...]]:
    """The number of topics (internal ones too) and every partition, with its topic's min.insync.replicas."""
    from josef_client.admin import ConfigResource

    names = list(await admin.list_topics(include_internal=True))
    described = await admin.describe_topics(names, raise_errors=False)
    topics = {n: d for n, d in described.items() if not isinstance(d, Exception)}  # others were deleted meanwhile
    configs = await admin.describe_configs([ConfigResource.topic(n) for n in topics], keys=[MIN_ISR],
                                           include_synonyms=False, raise_errors=False)
    partitions = [Partition(name, p.partition, p.leader, p.replicas, p.isr,
                            _min_isr(configs.get(ConfigResource.topic(name))))
                  for name, description in topics.items() for p in description.partitions]
    return len(topics), tuple(partitions)


async def _group(consumer: AsyncConsumer, group_id: str, state: str,
                 led: set[TopicPartition] | None) -> Group:
    """One group's committed offsets and lag; the log end is asked only of partitions with a leader (``led``; None:
    all), so an offline partition makes its lag unknown instead of making the command wait for a leader."""
    from josef.protocol.errors import KafkaError

    try:
        committed = await fetch_offsets(consumer, group_id)
        asked = [tp for tp in committed if led is None or tp in led]
        ends = await consumer.end_offsets(asked, consumer.config["request.timeout.ms"]) if asked else {}
    except (KafkaError, click.ClickException) as exc:
        return Group(group_id, state, error=_reason(exc))
    return Group(group_id, state, tuple(GroupPartition(tp.topic, tp.partition, offset, ends.get(tp))
                                        for tp, offset in sorted(committed.items())))


async def read_groups(bootstrap_server: str, command_config: Path | None,
                      led: set[TopicPartition] | None) -> tuple[Group, ...]:
    """Classic and consumer-protocol groups, through a consumer's connections as ``josef consumer-groups`` reads them."""
    async with _consumer(bootstrap_server, command_config) as consumer:
        listed = await list_groups(consumer)
        return tuple([await _group(consumer, name, state, led) for name, (state, _) in sorted(listed.items())])


async def read_status(bootstrap_server: str, command_config: Path | None) -> ClusterStatus:
    """Everything the status shows. Only a cluster that cannot be reached at all raises (:class:`CannotCheck`)."""
    from josef.protocol.errors import KafkaConnectionError
    from josef.protocol.topic_partition import TopicPartition

    admin = admin_client(bootstrap_server, command_config)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        await admin.close()
        raise CannotCheck(f"cannot reach the cluster at {bootstrap_server}: {_reason(exc)}") from None
    unreadable: dict[str, str] = {}
    try:
        cluster_id, controller_id, brokers = await _part(
            BROKERS, unreadable, read_brokers(admin), (admin.cluster.cluster_id, admin.cluster.controller_id, ()))
        quorum = await _part(QUORUM, unreadable, read_quorum(admin), None)
        topics, partitions = await _part(TOPICS, unreadable, read_partitions(admin), (0, ()))
    finally:
        await admin.close()
    led = None if TOPICS in unreadable else {TopicPartition(p.topic, p.partition) for p in partitions if not p.offline}
    groups = await _part(GROUPS, unreadable, read_groups(bootstrap_server, command_config, led), ())
    return ClusterStatus(cluster_id, controller_id, brokers, quorum, topics, partitions, groups, unreadable)


# Judging it --------------------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _some(names: Sequence[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def lagging(node: QuorumNode, max_lag_ms: int) -> bool:
    """A voter the leader has not seen caught up for longer than ``max_lag_ms`` (or at all since its election).

    The quorum commits metadata only while a majority of voters keep up, so each such voter uses up some of its
    tolerance for failures. A live follower fetches every few hundred ms and is never far behind. Observers
    (brokers without the controller role) are judged as brokers (fenced or not), not here."""
    return node.role == "Follower" and (node.lag_time_ms is None or node.lag_time_ms > max_lag_ms)


def problems(status: ClusterStatus, thresholds: Thresholds) -> list[Problem]:
    """What needs attention, each as one sentence; none means healthy."""
    found = []
    if status.active_controller < 0:
        found.append(Problem("no_controller", "no active controller"))
    for broker in status.brokers:
        if broker.fenced:
            found.append(Problem("fenced_broker", f"broker {broker.node_id} ({broker.host}:{broker.port}) is fenced"))
    if status.quorum is not None and status.quorum.leader_id >= 0:
        for node in status.quorum.voters:
            if lagging(node, thresholds.voter_lag_ms):
                since = "since the leader's election" if node.lag_time_ms is None else f"for {node.lag_time_ms} ms"
                behind = "" if node.lag is None else f" ({_count(node.lag, 'record')} behind)"
                found.append(Problem("lagging_voter", f"controller {node.node_id} has not caught up with the quorum "
                                                      f"leader {since}{behind}"))
    for kind, label in CONDITIONS:
        names = [p.name for p in status.partitions if getattr(p, kind)]
        if names:
            found.append(Problem(kind, f"{_count(len(names), label + ' partition')}: {_some(names)}"))
    for group in status.groups:
        over = [f"{p.topic}-{p.partition} ({p.lag})" for p in group.over(thresholds.group_lag)]
        if over:
            found.append(Problem("group_lag", f"group {group.group_id} lags more than {thresholds.group_lag} "
                                              f"on {_some(over)}"))
    for group in status.groups:
        if group.error is not None:
            found.append(Problem("unreadable", f"group {group.group_id}'s offsets could not be read: {group.error}"))
    for what, why in status.unreadable.items():
        found.append(Problem("unreadable", f"could not read the {what}: {why}"))
    return found


# Showing it --------------------------------------------------------------------------------------


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _summary(status: ClusterStatus) -> list[str]:
    quorum = status.quorum
    if quorum is not None and quorum.leader_id >= 0:
        controller = f"{quorum.leader_id} (quorum leader, epoch {quorum.epoch}, high watermark {quorum.high_watermark})"
    else:
        controller = "none" if status.active_controller < 0 else str(status.active_controller)
    fenced = sum(b.fenced for b in status.brokers)
    counts = [(label, sum(getattr(p, kind) for p in status.partitions)) for kind, label in CONDITIONS]
    lags = [g.lag for g in status.groups if g.lag is not None]

    def unless_unreadable(part: str, text: str) -> str:
        return "could not be read" if part in status.unreadable else text

    rows = [("Cluster:", _dash(status.cluster_id)), ("Controller:", controller),
            ("Brokers:", unless_unreadable(BROKERS, f"{len(status.brokers)}" + (f" ({fenced} fenced)" if fenced else ""))),
            ("Topics:", unless_unreadable(TOPICS, f"{status.topics} ({_count(len(status.partitions), 'partition')}: "
                                                  + ", ".join(f"{n} {label}" for label, n in counts) + ")")),
            ("Consumer groups:", unless_unreadable(GROUPS, f"{len(status.groups)} (total lag {sum(lags)})"))]
    return [f"{label:<18}{value}" for label, value in rows]


def _brokers_table(status: ClusterStatus) -> list[str]:
    controller = status.active_controller
    rows = [(b.node_id, f"{b.host}:{b.port}", _dash(b.rack),
             "fenced" if b.fenced else "active controller" if b.node_id == controller else "ok") for b in status.brokers]
    return _table(("BROKER", "HOST:PORT", "RACK", "STATUS"), rows)


def _quorum_table(quorum: Quorum, thresholds: Thresholds) -> list[str]:
    rows = [(n.node_id, n.role, n.log_end_offset, _dash(n.lag), _dash(n.lag_time_ms),
             "lagging" if lagging(n, thresholds.voter_lag_ms) else "ok") for n in quorum.nodes]
    return _table(("QUORUM-NODE", "ROLE", "LOG-END-OFFSET", "LAG", "LAG-TIME-MS", "STATUS"), rows)


def _partitions_table(partitions: Sequence[Partition]) -> list[str]:
    def ids(nodes: Iterable[int]) -> str:
        return ",".join(str(n) for n in nodes) or "-"  # an empty cell would shift the columns to the eye

    rows = [(p.topic, p.partition, "none" if p.offline else p.leader, ids(p.replicas), ids(p.isr), _dash(p.min_isr),
             ",".join(p.conditions)) for p in partitions[:SHOWN_PARTITIONS]]
    lines = _table(("TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR", "MIN-ISR", "PROBLEM"), rows)
    if len(partitions) > SHOWN_PARTITIONS:
        lines.append(f"... and {len(partitions) - SHOWN_PARTITIONS} more (--json lists them all)")
    return lines


def _groups_table(groups: Sequence[Group], thresholds: Thresholds) -> list[str]:
    rows = [(g.group_id, g.state or "-", len(g.partitions), _dash(g.lag), _dash(g.max_lag),
             "unreadable" if g.error is not None else "lagging" if g.over(thresholds.group_lag) else "ok")
            for g in groups]
    return _table(("GROUP", "STATE", "PARTITIONS", "LAG", "MAX-PARTITION-LAG", "STATUS"), rows)


def text_lines(status: ClusterStatus, found: Sequence[Problem], thresholds: Thresholds) -> list[str]:
    lines = _summary(status) + [""] + _brokers_table(status)
    if status.quorum is not None:
        lines += [""] + _quorum_table(status.quorum, thresholds)
    troubled = [p for p in status.partitions if p.conditions]
    if troubled:
        lines += [""] + _partitions_table(troubled)
    if status.groups:
        lines += [""] + _groups_table(status.groups, thresholds)
    verdict = "healthy" if not found else "needs attention: " + "; ".join(p.message for p in found)
    return lines + ["", f"Status: {verdict}"]


def as_json(status: ClusterStatus, found: Sequence[Problem]) -> dict[str, Any]:
    """The status for scripts: every part, the problem partitions only, and the problems with a kind to match on."""
    troubled = [p for p in status.partitions if p.conditions]
    return {
        "healthy": not found,
        "problems": [attrs.asdict(p) for p in found],
        "cluster_id": status.cluster_id,
        "controller_id": status.active_controller,
        "brokers": [attrs.asdict(b) for b in status.brokers],
        "quorum": None if status.quorum is None else attrs.asdict(status.quorum),
        "topics": status.topics,
        "partitions": len(status.partitions),
        "offline_partitions": sum(p.offline for p in status.partitions),
        "under_replicated_partitions": sum(p.under_replicated for p in status.partitions),
        "under_min_isr_partitions": sum(p.under_min_isr for p in status.partitions),
        "problem_partitions": [{**attrs.asdict(p), "problems": p.conditions} for p in troubled],
        "groups": [{"group_id": g.group_id, "state": g.state, "lag": g.lag, "max_partition_lag": g.max_lag,
                    "error": g.error, "partitions": [{**attrs.asdict(p), "lag": p.lag} for p in g.partitions]}
                   for g in status.groups],
        "unreadable": dict(status.unreadable),
    }


# The command -------------------------------------------------------------------------------------


@click.command("status", cls=StatusCommand)
@bootstrap_option
@command_config_option
@click.option("--json", "json_output", is_flag=True, help="Print the status as one JSON object, for scripts.")
@click.option("--lag-threshold", type=click.IntRange(min=0), metavar="N",
              help="A consumer group partition lagging more than N records needs attention. "
                   "[default: group lag is only reported]")
@click.option("--max-voter-lag-ms", type=click.IntRange(min=0), default=Thresholds().voter_lag_ms, show_default=True,
              metavar="MS", help="A controller (quorum voter) not caught up with the leader for longer needs attention.")
@quiet_broken_pipe
def cluster_status(bootstrap_server: str, command_config: Path | None, json_output: bool, lag_threshold: int | None,
                   max_voter_lag_ms: int) -> None:
    """Print the cluster's health; exit non-zero when something needs attention, for scripts and CI.

    Shows the brokers, the active controller and the KRaft quorum, topic and
    partition counts, offline, under-replicated and under-min-ISR partitions,
    and each consumer group's state and lag.

    \b
    Exit status:
      0  healthy
      1  needs attention (the last line says why): no active controller, a
         fenced broker, a lagging controller, an offline, under-replicated or
         under-min-ISR partition, a group over --lag-threshold, or a part of
         the cluster that could not be read
      2  the status could not be read: the cluster cannot be reached, or a bad
         flag or --command-config
    """
    thresholds = Thresholds(lag_threshold, max_voter_lag_ms)
    try:
        status = run(read_status(bootstrap_server, command_config))
    except CannotCheck:
        raise
    except click.ClickException as exc:  # a bad client property, say: the cluster was not checked
        raise CannotCheck(exc.message) from None
    found = problems(status, thresholds)
    if json_output:
        click.echo(json.dumps(as_json(status, found), indent=2))
    else:
        click.echo("\n".join(text_lines(status, found, thresholds)))
    if found:
        raise SystemExit(NEEDS_ATTENTION)
