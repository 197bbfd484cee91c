"""``josef share-groups``: list, describe and delete share groups, reset and delete their offsets (kafka-share-groups).

Output follows Kafka's tool: ``list`` prints one group a line (with
``--state``, GROUP STATE); ``describe`` prints GROUP TOPIC PARTITION
LEADER-EPOCH START-OFFSET LAG (``--members``: GROUP CONSUMER-ID HOST
CLIENT-ID #PARTITIONS ASSIGNMENT; ``--state``: GROUP COORDINATOR (ID)
ASSIGNMENT-STRATEGY STATE GROUP-EPOCH ASSIGNMENT-EPOCH #MEMBERS);
``reset-offsets`` prints GROUP TOPIC PARTITION NEW-OFFSET and changes nothing
without ``--execute``. Kafka's spelling works too: ``josef share-groups
--describe --group g ...``.

A share group's offsets are its share partitions' start offsets, kept by the
share coordinator: DescribeShareGroupOffsets, AlterShareGroupOffsets (the
group must be empty) and DeleteShareGroupOffsets go to the group coordinator,
which asks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from josef.protocol.api_keys import ApiKey
from josef_client.commands.common import Group, bootstrap_option, command_config_option, run, stderr
from josef_client.commands.groups import (
    _check,
    _consumer,
    _groups,
    _table,
    coordinator,
    delete_groups,
    list_groups,
    parse_datetime,
    print_groups,
)

if TYPE_CHECKING:
    from josef_client.consumer import AsyncConsumer

SHARE = ("share",)


@click.group("share-groups", cls=Group, actions=("list", "describe", "delete", "reset-offsets", "delete-offsets"))
def share_groups() -> None:
    """List, describe and delete share groups, and reset or delete their offsets (kafka-share-groups).

    Kafka's spelling works too: josef share-groups --describe --group g ...
    """


async def _describe(consumer: AsyncConsumer, group: str) -> Any:
    conn = await coordinator(consumer, group)
    response = await conn.request(ApiKey.SHARE_GROUP_DESCRIBE, {"group_ids": [group],
                                                                "include_authorized_operations": False})
    [described] = response.groups
    if described.error_code != 0:
        from kio.schema.errors import ErrorCode

        if described.error_code == ErrorCode.group_id_not_found:
            raise click.ClickException(f"Share group '{group}' does not exist.")
        _check(described.error_code, f"ShareGroupDescribe for group {group!r}")
    return described, conn


async def _offsets(consumer: AsyncConsumer, group: str, topics: list[str] | None) -> list[tuple[str, int, int, int]]:
    """(topic, partition, leader epoch, start offset) of the group's share partitions."""
    conn = await coordinator(consumer, group)
    requested = None
    if topics is not None:
        requested = []
        for topic in topics:
            partitions = await consumer.cluster.partitions_for(topic, auto_create=False)
            requested.append({"topic_name": topic, "partitions": sorted(partitions)})
    response = await conn.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, {"groups": [
        {"group_id": group, "topics": requested}]})
    [described] = response.groups
    _check(described.error_code, f"DescribeShareGroupOffsets for group {group!r}")
    return [(t.topic_name, p.partition_index, p.leader_epoch, p.start_offset)
            for t in described.topics for p in t.partitions if p.error_code == 0]


@share_groups.command("list")
@bootstrap_option
@command_config_option
@click.option("--state", "states", is_flag=False, flag_value="", default=None, metavar="[STATE,...]",
              help="Show each group's state too; with states (Stable,Empty), only groups in them.")
def list_command(bootstrap_server: str, command_config: Path | None, states: str | None) -> None:
    """List the share groups."""
    print_groups(bootstrap_server, command_config, states, SHARE)


@share_groups.command()
@bootstrap_option
@command_config_option
@click.option("--group", multiple=True, help="The group to describe (repeatable).")
@click.option("--all-groups", is_flag=True, help="Describe every share group.")
@click.option("--members", is_flag=True, help="Describe the members instead of the offsets.")
@click.option("--state", is_flag=True, help="Describe the group's state instead of the offsets.")
@click.option("--offsets", is_flag=True, help="Describe the start offsets (the default).")
@click.option("--verbose", is_flag=True, help="With --members: each member's epoch too.")
def describe(bootstrap_server: str, command_config: Path | None, group: tuple[str, ...], all_groups: bool,
             members: bool, state: bool, offsets: bool, verbose: bool) -> None:
    """Describe share groups: each share partition's start offset and lag, or the members, or the state."""
    _groups(group, all_groups)
    if sum((members, state, offsets)) > 1:
        raise click.ClickException("give only one of --members, --state, --offsets")

    async def go() -> list[tuple[str, Any, Any, list[tuple[str, int, int, int]], dict[Any, int]]]:
        async with _consumer(bootstrap_server, command_config) as consumer:
            names = list(group) or sorted(await list_groups(consumer, SHARE))
            out = []
            for name in names:
                described, conn = await _describe(consumer, name)
                starts = [] if members or state else await _offsets(consumer, name, None)
                from josef.protocol.topic_partition import TopicPartition

                ends = await consumer.end_offsets([TopicPartition(t, p) for t, p, _, _ in starts]) if starts else {}
                out.append((name, described, conn, starts, ends))
            nodes.update({address: node for node, address in consumer.cluster.brokers.items()})
            return out

    nodes: dict[tuple[str, int], int] = {}

    def coordinator_id(conn: Any) -> Any:
        return nodes.get((conn.host, conn.port), "?")

    results = run(go())
    for name, described, conn, starts, ends in results:
        if not described.members:
            stderr(f"Share group '{name}' has no active members.")
        click.echo()
        if state:
            header = ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH",
                      "#MEMBERS")
            rows = [(name, f"{conn.host}:{conn.port} ({coordinator_id(conn)})", described.assignor_name,
                     described.group_state, described.group_epoch, described.assignment_epoch,
                     len(described.members))]
            lines = _table(header, rows)
        elif members:
            header = ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT") + \
                (("MEMBER-EPOCH",) if verbose else ())
            rows = []
            for m in sorted(described.members, key=lambda m: m.member_id):
                parts = [(t.topic_name, p) for t in m.assignment.topic_partitions for p in t.partitions]
                by_topic: dict[str, list[str]] = {}
                for topic, p in parts:
                    by_topic.setdefault(topic, []).append(str(p))
                row = [name, m.member_id, m.client_host, m.client_id, len(parts),
                       ",".join(f"{t}:{','.join(ps)}" for t, ps in by_topic.items()) or "-"]
                rows.append(row + ([m.member_epoch] if verbose else []))
            lines = _table(header, rows)
        else:
            from josef.protocol.topic_partition import TopicPartition

            rows = []
            for topic, partition, epoch, start in sorted(starts):
                end = ends.get(TopicPartition(topic, partition))
                lag = end - start if start >= 0 and end is not None else None
                rows.append((name, topic, partition, "-" if epoch < 0 else epoch, "-" if start < 0 else start,
                             "-" if lag is None else lag))
            lines = _table(("GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"), rows)
        for line in lines:
            click.echo(line)


@share_groups.command()
@bootstrap_option
@command_config_option
@click.option("--group", multiple=True, help="The group to delete (repeatable).")
@click.option("--all-groups", is_flag=True, help="Delete every share group.")
def delete(bootstrap_server: str, command_config: Path | None, group: tuple[str, ...], all_groups: bool) -> None:
    """Delete share groups with no active members (and their share-partition state)."""
    delete_groups(bootstrap_server, command_config, group, all_groups, SHARE, "share")


@share_groups.command("reset-offsets")
@bootstrap_option
@command_config_option
@click.option("--group", required=True, help="The share group whose start offsets to reset.")
@click.option("--topic", "topics", multiple=True, required=True, help="A topic whose share partitions to reset.")
@click.option("--to-earliest", is_flag=True, help="To the log start offset.")
@click.option("--to-latest", is_flag=True, help="To the log end offset.")
@click.option("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss", help="To the first offset at or after this time.")
@click.option("--execute", is_flag=True, help="Reset the start offsets (without it, only print them).")
@click.option("--dry-run", is_flag=True, help="Only print the new start offsets (the default).")
def reset_offsets(bootstrap_server: str, command_config: Path | None, group: str, topics: tuple[str, ...],
                  to_earliest: bool, to_latest: bool, to_datetime: str | None, execute: bool, dry_run: bool) -> None:
    """Move a share group's start offsets (the group must have no members): the records before are skipped,
    those after delivered, whatever their state was."""
    if sum((to_earliest, to_latest, to_datetime is not None)) != 1:
        raise click.ClickException("give one of --to-earliest, --to-latest, --to-datetime")
    if execute and dry_run:
        raise click.ClickException("give --execute or --dry-run, not both")

    async def go() -> list[tuple[str, int, int]]:
        from josef.protocol.topic_partition import TopicPartition

        async with _consumer(bootstrap_server, command_config) as consumer:
            tps = []
            for topic in topics:
                tps += [TopicPartition(topic, p) for p in sorted(await consumer.cluster.partitions_for(
                    topic, auto_create=False))]
            if to_earliest:
                found = await consumer.beginning_offsets(tps)
            elif to_latest:
                found = await consumer.end_offsets(tps)
            else:
                when = parse_datetime(to_datetime or "")
                found = {tp: (o.offset if o is not None else None)
                         for tp, o in (await consumer.offsets_for_times({tp: when for tp in tps})).items()}
                ends = await consumer.end_offsets([tp for tp, o in found.items() if o is None])
                found.update(ends)
            plan = [(tp.topic, tp.partition, int(found[tp])) for tp in tps]
            if execute:
                conn = await coordinator(consumer, group)
                by_topic: dict[str, list[dict[str, int]]] = {}
                for topic, partition, offset in plan:
                    by_topic.setdefault(topic, []).append({"partition_index": partition, "start_offset": offset})
                response = await conn.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, {"group_id": group, "topics": [
                    {"topic_name": t, "partitions": ps} for t, ps in by_topic.items()]})
                if response.error_code != 0:
                    from kio.schema.errors import ErrorCode

                    if response.error_code == ErrorCode.non_empty_group:
                        raise click.ClickException(f"Share group '{group}' is not empty: stop its members first.")
                    _check(response.error_code, f"AlterShareGroupOffsets for group {group!r}")
                for topic in response.responses:
                    for part in topic.partitions:
                        _check(part.error_code, f"resetting {topic.topic_name}-{part.partition_index}")
            return plan

    for line in _table(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), [(group, *row) for row in run(go())]):
        click.echo(line)


@share_groups.command("delete-offsets")
@bootstrap_option
@command_config_option
@click.option("--group", required=True, help="The share group.")
@click.option("--topic", "topics", multiple=True, required=True, help="A topic whose share-partition state to forget.")
def delete_offsets(bootstrap_server: str, command_config: Path | None, group: str, topics: tuple[str, ...]) -> None:
    """Forget a share group's state of topics (it must have no members): it starts again by share.auto.offset.reset."""
    async def go() -> Any:
        async with _consumer(bootstrap_server, command_config) as consumer:
            conn = await coordinator(consumer, group)
            response = await conn.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, {"group_id": group, "topics": [
                {"topic_name": t} for t in topics]})
            if response.error_code != 0:
                from kio.schema.errors import ErrorCode

                if response.error_code == ErrorCode.non_empty_group:
                    raise click.ClickException(f"Share group '{group}' is not empty: stop its members first.")
                _check(response.error_code, f"DeleteShareGroupOffsets for group {group!r}")
            return response

    response = run(go())
    rows = [(t.topic_name, "Successful" if t.error_code == 0 else f"Error: {t.error_code.name.upper()}")
            for t in response.responses]
    for line in _table(("TOPIC", "STATUS"), rows):
        click.echo(line)
