"""``josef topics``: create, list, describe, alter and delete topics, as ``kafka-topics.sh`` does.

Output follows Kafka's so scripts written for it keep working: ``list``
prints one name a line, ``describe`` prints Kafka's tab-separated lines, and
``--topic`` is a regular expression (matching whole names) everywhere but
``create``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import click
from kio.schema.errors import ErrorCode

from josef.protocol.errors import KafkaError, UnsupportedVersionError
from josef.protocol.topic_partition import TopicPartition

from josef_client.commands.common import (
    Group,
    admin_client,
    bootstrap_option,
    command_config_option,
    parse_pairs,
    run,
)

if TYPE_CHECKING:
    from josef_client.admin import AsyncAdmin, PartitionDescription, PartitionReassignment, TopicDescription


@click.group("topics", cls=Group, actions=("create", "list", "describe", "alter", "delete"))
def topics() -> None:
    """Create, list, describe, alter and delete topics (kafka-topics).

    Kafka's spelling works too: josef topics --create --topic t ...
    """


def parse_assignment(text: str) -> list[list[int]]:
    """Kafka's ``--replica-assignment``: partitions separated by ``,``, each one's brokers by ``:``."""
    result = []
    for number, part in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in part.split(":")]
        except ValueError:
            raise click.ClickException(
                f"invalid --replica-assignment {text!r}: expected broker ids like 1:2,2:3 (partition {number} is {part!r})") from None
        if len(set(brokers)) != len(brokers):
            raise click.ClickException(f"invalid --replica-assignment: partition {number} lists a broker twice ({part})")
        result.append(brokers)
    return result


def _pattern(topic: str) -> re.Pattern[str]:
    try:
        return re.compile(topic)
    except re.error as exc:
        raise click.ClickException(f"--topic {topic!r} is not a valid regular expression: {exc}") from None


async def _matching(admin: AsyncAdmin, topic: str | None, exclude_internal: bool, *,
                    required: bool = False) -> list[str]:
    """Topics named by ``topic`` (a name or a regular expression; None: all); ``required``: an error if none is."""
    listed = await admin.list_topics(include_internal=not exclude_internal)
    if topic is None:
        return list(listed)
    if topic in listed:  # a plain name, even one that is not a valid regular expression
        return [topic]
    pattern = _pattern(topic)
    names = [name for name in listed if pattern.fullmatch(name)]
    if required and not names:
        raise click.ClickException(f"topic {topic!r} does not exist as expected")
    return names


# create --------------------------------------------------------------------------------------------


@topics.command()
@bootstrap_option
@command_config_option
@click.option("--topic", required=True, help="The topic to create.")
@click.option("--partitions", type=click.IntRange(min=1), help="Number of partitions (default: the broker's num.partitions).")
@click.option("--replication-factor", type=click.IntRange(1, 32767),
              help="Replicas of each partition (default: the broker's default.replication.factor).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="A topic config override (repeatable).")
@click.option("--replica-assignment", metavar="B1:B2,B3:B4",
              help="Brokers of each partition, in order: partitions by ',', replicas by ':'.")
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly if the topic already exists.")
def create(bootstrap_server: str, command_config: Path | None, topic: str, partitions: int | None,
           replication_factor: int | None, configs: tuple[str, ...], replica_assignment: str | None,
           if_not_exists: bool) -> None:
    """Create a topic."""
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError
    from josef_client.admin import NewTopic

    overrides = parse_pairs(configs, "--config")
    assignments = None
    if replica_assignment is not None:
        if partitions is not None or replication_factor is not None:
            raise click.ClickException("--replica-assignment cannot be combined with --partitions or --replication-factor")
        assignments = dict(enumerate(parse_assignment(replica_assignment)))
    new = NewTopic(topic, partitions or -1, replication_factor or -1, overrides, assignments)

    async def go() -> bool:
        async with admin_client(bootstrap_server, command_config) as admin:
            outcome = (await admin.create_topics([new], raise_errors=False))[topic]
        if isinstance(outcome, KafkaError):
            if outcome.code == ErrorCode.topic_already_exists and if_not_exists:
                return False
            raise outcome
        return True

    if run(go()):
        click.echo(f"Created topic {topic}.")


# list ----------------------------------------------------------------------------------------------


@topics.command("list")
@bootstrap_option
@command_config_option
@click.option("--topic", help="Only topics whose whole name matches this regular expression.")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics (__consumer_offsets...).")
def list_(bootstrap_server: str, command_config: Path | None, topic: str | None, exclude_internal: bool) -> None:
    """List topic names, one a line."""

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            return await _matching(admin, topic, exclude_internal)

    for name in run(go()):
        click.echo(name)


# describe ----------------------------------------------------------------------------------------------


async def _reassignments(admin: AsyncAdmin, partitions: list[TopicPartition]) -> dict[TopicPartition, PartitionReassignment]:
    """The moves in progress among ``partitions``; none when the cluster cannot or may not say, as in Kafka's tool."""
    try:
        return await admin.list_partition_reassignments(partitions) if partitions else {}
    except UnsupportedVersionError:
        return {}
    except KafkaError as exc:
        if exc.code != ErrorCode.cluster_authorization_failed:
            raise
        return {}


def _ids(nodes: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in nodes)


def _optional_ids(nodes: tuple[int, ...] | None) -> str:
    """Kafka prints N/A where the broker could not say (Metadata has no ELR fields)."""
    return "N/A" if nodes is None else _ids(nodes)


def describe_lines(description: TopicDescription, configs: dict[str, str | None] | None,
                   partitions: list[PartitionDescription] | None = None,
                   moving: Mapping[int, PartitionReassignment] | None = None) -> list[str]:
    """Kafka's describe output for one topic: its summary line (when ``configs`` is given) and a line per partition.

    A partition being reassigned (``moving``, by partition) also shows the
    replicas its move adds and removes, as Kafka 4.x does.
    """
    lines = []
    name = description.name
    if configs is not None:
        rendered = ",".join(f"{k}={'' if v is None else v}" for k, v in configs.items())
        lines.append(f"Topic: {name}\tTopicId: {description.topic_id or ''}\tPartitionCount: {len(description.partitions)}\t"
                     f"ReplicationFactor: {description.replication_factor}\tConfigs: {rendered}")
    for p in description.partitions if partitions is None else partitions:
        leader = str(p.leader) if p.leader >= 0 else "none"
        line = f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {leader}\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
        move = (moving or {}).get(p.partition)
        if move is not None:
            line += f"\tAdding Replicas: {_ids(move.adding_replicas)}\tRemoving Replicas: {_ids(move.removing_replicas)}"
        line += f"\tElr: {_optional_ids(p.elr)}\tLastKnownElr: {_optional_ids(p.last_known_elr)}"
        if p.offline_replicas:
            line += f"\tOffline: {_ids(p.offline_replicas)}"
        lines.append(line)
    return lines


@topics.command()
@bootstrap_option
@command_config_option
@click.option("--topic", help="Topics whose whole name matches this regular expression (default: all).")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics.")
@click.option("--if-exists", is_flag=True, help="Succeed quietly when no topic matches --topic.")
@click.option("--under-replicated-partitions", is_flag=True, help="Only partitions whose ISR is smaller than their replicas.")
@click.option("--unavailable-partitions", is_flag=True, help="Only partitions without a leader.")
def describe(bootstrap_server: str, command_config: Path | None, topic: str | None, exclude_internal: bool,
             if_exists: bool, under_replicated_partitions: bool, unavailable_partitions: bool) -> None:
    """Describe topics: id, partition count, replication factor, non-default configs, and each partition's leader, replicas and ISR."""
    from josef_client.admin import ConfigResource

    filtered = under_replicated_partitions or unavailable_partitions

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            names = await _matching(admin, topic, exclude_internal, required=not if_exists)
            if not names:
                return []
            descriptions = await admin.describe_topics(names, raise_errors=False)
            names = [n for n in names if not isinstance(descriptions[n], Exception)]  # deleted meanwhile
            configs = {} if filtered else await admin.describe_configs(
                [ConfigResource.topic(n) for n in names], include_synonyms=False, raise_errors=False)
            moving = await _reassignments(admin, [TopicPartition(n, p.partition)
                                                  for n in names for p in descriptions[n].partitions])
        lines: list[str] = []
        for name in names:
            description = descriptions[name]
            topic_moving = {tp.partition: move for tp, move in moving.items() if tp.topic == name}
            if filtered:
                wanted = [p for p in description.partitions
                          if (under_replicated_partitions and len(p.isr) < len(p.replicas))
                          or (unavailable_partitions and p.leader < 0)]
                lines += describe_lines(description, None, wanted, topic_moving)
                continue
            entries = configs.get(ConfigResource.topic(name))
            shown = {} if isinstance(entries, Exception) or entries is None else {
                e.name: e.value for e in entries.values() if not e.is_default and not e.is_sensitive}
            lines += describe_lines(description, shown, moving=topic_moving)
        return lines

    for line in run(go()):
        click.echo(line)


# alter -------------------------------------------------------------------------------------------------


@topics.command()
@bootstrap_option
@command_config_option
@click.option("--topic", required=True, help="The topic(s) to alter: a name or a regular expression.")
@click.option("--partitions", type=click.IntRange(min=1), help="The new, larger, number of partitions.")
@click.option("--replica-assignment", metavar="B1:B2,B3:B4",
              help="Brokers of every partition (existing ones included); only the new partitions' are used.")
@click.option("--if-exists", is_flag=True, help="Succeed quietly when no topic matches --topic.")
def alter(bootstrap_server: str, command_config: Path | None, topic: str, partitions: int | None,
          replica_assignment: str | None, if_exists: bool) -> None:
    """Grow a topic's partitions (change configs with: josef configs alter)."""
    from josef_client.admin import NewPartitions

    if partitions is None:
        raise click.ClickException("--partitions is required: it is the only thing topics alter changes "
                                   "(use 'josef configs alter' for configs)")
    assignment = parse_assignment(replica_assignment) if replica_assignment is not None else None

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            names = await _matching(admin, topic, exclude_internal=False, required=not if_exists)
            if not names:
                return
            wanted = {}
            for name in names:
                extra = None
                if assignment is not None:
                    current = len((await admin.describe_topics([name]))[name].partitions)
                    extra = assignment[current:]
                    if len(extra) != partitions - current:
                        raise click.ClickException(
                            f"--replica-assignment lists {len(assignment)} partitions; topic {name!r} will have {partitions}")
                wanted[name] = NewPartitions(partitions, extra)
            await admin.create_partitions(wanted)

    run(go())


# delete -------------------------------------------------------------------------------------------------


@topics.command()
@bootstrap_option
@command_config_option
@click.option("--topic", required=True, help="The topic(s) to delete: a name or a regular expression.")
@click.option("--if-exists", is_flag=True, help="Succeed quietly when no topic matches --topic.")
def delete(bootstrap_server: str, command_config: Path | None, topic: str, if_exists: bool) -> None:
    """Delete topics."""

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            names = await _matching(admin, topic, exclude_internal=False, required=not if_exists)
            if not names:
                return
            internal = [n for n, t in (await admin.list_topics(include_internal=True)).items() if t.is_internal and n in names]
            if internal:
                raise click.ClickException(f"topic {internal[0]} is an internal topic and may not be deleted")
            await admin.delete_topics(names)

    run(go())
