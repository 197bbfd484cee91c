"""``josef consumer-groups``: list, describe, delete consumer groups and reset their offsets (kafka-consumer-groups).

Output follows Kafka's: ``list`` prints one group a line; ``describe`` prints
GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST
CLIENT-ID; ``reset-offsets`` prints the plan (GROUP TOPIC PARTITION
NEW-OFFSET) and changes nothing without ``--execute``. Kafka's spelling
works too: ``josef consumer-groups --describe --group g ...``.

The requests (ListGroups to every broker, DescribeGroups, OffsetFetch,
DeleteGroups and OffsetCommit to the group's coordinator, ListOffsets to the
leaders) go through a consumer's connections.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import click

from josef.protocol.api_keys import ApiKey
from josef_client.commands.common import (
    Group,
    bootstrap_option,
    client_config,
    command_config_option,
    make_client,
    read_properties,
    run,
    stderr,
)

if TYPE_CHECKING:
    from josef.protocol.connection import Connection
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.consumer import AsyncConsumer

INACTIVE = ("Empty", "Dead")


@click.group("consumer-groups", cls=Group, actions=("list", "describe", "delete", "reset-offsets"))
def consumer_groups() -> None:
    """List, describe and delete consumer groups, and reset their offsets (kafka-consumer-groups).

    Kafka's spelling works too: josef consumer-groups --describe --group g ...
    """


# The requests ---------------------------------------------------------------------------------------


def _consumer(bootstrap_server: str, command_config: Path | None, group: str | None = None) -> AsyncConsumer:
    from josef_client.consumer import AsyncConsumer

    config = client_config(bootstrap_server, read_properties(command_config))
    config.update({"enable.auto.commit": False})
    if group is not None:
        config["group.id"] = group
    else:
        config.pop("group.id", None)
    return make_client(AsyncConsumer, config)


def _check(code: Any, what: str) -> None:
    from kio.schema.errors import ErrorCode

    from josef.protocol.errors import KafkaError

    if code == ErrorCode.none:
        return
    if code == ErrorCode.group_id_not_found:
        raise click.ClickException(f"{what}: the group does not exist")
    raise KafkaError(code, what)


#: The group types kafka-consumer-groups lists (ListGroups v5's filter): share groups have their own tool.
CONSUMER_GROUP_TYPES = ("classic", "consumer")


async def list_groups(consumer: AsyncConsumer, types: Sequence[str] = CONSUMER_GROUP_TYPES) -> dict[str, tuple[str, str]]:
    """{group: (state, protocol type)} of ``types`` from every broker (each lists the groups it coordinates)."""
    await consumer.cluster.refresh([])
    found: dict[str, tuple[str, str]] = {}
    for node in sorted(consumer.cluster.brokers):
        conn = await consumer.cluster.connection(node)
        response = await conn.request(ApiKey.LIST_GROUPS, {"states_filter": [], "types_filter": list(types)})
        _check(response.error_code, f"ListGroups on broker {node}")
        for group in response.groups:
            found[group.group_id] = (getattr(group, "group_state", "") or "", group.protocol_type)
    return found


async def coordinator(consumer: AsyncConsumer, group: str) -> Connection:
    """The consumer's connection to ``group``'s coordinator (looked up by FindCoordinator each time)."""
    from josef_client.coordinator_requests import find_coordinator

    return await consumer.cluster.connection(await find_coordinator(consumer.cluster, group))


async def describe_group(consumer: AsyncConsumer, group: str) -> Any:
    conn = await coordinator(consumer, group)
    response = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": [group], "include_authorized_operations": False})
    [described] = [g for g in response.groups if g.group_id == group]
    _check(described.error_code, f"DescribeGroups for group {group!r}")
    return described


async def fetch_offsets(consumer: AsyncConsumer, group: str) -> dict[TopicPartition, int]:
    """Every committed offset of the group (OffsetFetch for all topics)."""
    from josef_client.coordinator_requests import offset_fetch

    committed = await offset_fetch(await coordinator(consumer, group), group, None)
    return {tp: entry.offset for tp, entry in committed.items() if entry is not None}


def _decode_assignment(member: Any, protocol_type: str) -> list[TopicPartition]:
    from josef.protocol.consumer_protocol import decode_assignment
    from josef.protocol.errors import KafkaError

    if protocol_type != "consumer":
        return []
    try:
        return decode_assignment(bytes(member.member_assignment))[0]
    except KafkaError:
        return []


def _groups(group: Sequence[str], all_groups: bool) -> None:
    if not group and not all_groups:
        raise click.ClickException("give --group GROUP (repeatable) or --all-groups")
    if group and all_groups:
        raise click.ClickException("give --group or --all-groups, not both")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], minimum: Sequence[int] = ()) -> list[str]:
    """Kafka's left-aligned columns: each as wide as its widest cell (at least ``minimum``), one space apart."""
    rows = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)] + ([minimum[i]] if i < len(minimum) else []))
              for i, h in enumerate(header)]
    def line(cells: Sequence[str]) -> str:
        return " ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return [line(header)] + [line(r) for r in rows]


# list ----------------------------------------------------------------------------------------------


@consumer_groups.command("list")
@bootstrap_option
@command_config_option
@click.option("--state", "states", is_flag=False, flag_value="", default=None, metavar="[STATE,...]",
              help="Show each group's state too; with states (Stable,Empty...), only groups in them.")
def list_command(bootstrap_server: str, command_config: Path | None, states: str | None) -> None:
    """List the consumer groups."""
    print_groups(bootstrap_server, command_config, states, CONSUMER_GROUP_TYPES)


def print_groups(bootstrap_server: str, command_config: Path | None, states: str | None,
                 types: Sequence[str]) -> None:
    """``--list``: the groups of ``types``, one a line, or with ``--state`` a GROUP STATE table (filtered)."""
    async def go() -> dict[str, tuple[str, str]]:
        async with _consumer(bootstrap_server, command_config) as consumer:
            return await list_groups(consumer, types)

    found = run(go())
    if states is None:
        for name in sorted(found):
            click.echo(name)
        return
    wanted = {s.strip().lower() for s in states.split(",") if s.strip()}
    rows = [(name, state) for name, (state, _) in sorted(found.items()) if not wanted or state.lower() in wanted]
    for line in _table(("GROUP", "STATE"), rows):
        click.echo(line)


# describe ------------------------------------------------------------------------------------------


@consumer_groups.command()
@bootstrap_option
@command_config_option
@click.option("--group", multiple=True, help="The group to describe (repeatable).")
@click.option("--all-groups", is_flag=True, help="Describe every group.")
@click.option("--members", is_flag=True, help="Describe the members instead of the offsets.")
@click.option("--state", is_flag=True, help="Describe the group's state instead of the offsets.")
@click.option("--offsets", is_flag=True, help="Describe the offsets (the default).")
@click.option("--verbose", is_flag=True, help="With --members: each member's assigned partitions.")
def describe(bootstrap_server: str, command_config: Path | None, group: tuple[str, ...], all_groups: bool,
             members: bool, state: bool, offsets: bool, verbose: bool) -> None:
    """Describe groups: committed offsets and lag per partition, with the member consuming each."""
    _groups(group, all_groups)
    if sum((members, state, offsets)) > 1:
        raise click.ClickException("give only one of --members, --state, --offsets")

    async def go() -> list[tuple[str, Any, dict[TopicPartition, int], dict[TopicPartition, int]]]:
        async with _consumer(bootstrap_server, command_config) as consumer:
            names = list(group) or sorted(await list_groups(consumer))
            out = []
            for name in names:
                described = await describe_group(consumer, name)
                committed = await fetch_offsets(consumer, name) if not (members or state) else {}
                if described.group_state == "Dead" and not committed:
                    raise click.ClickException(f"consumer group '{name}' does not exist")
                assigned = {tp for m in described.members for tp in _decode_assignment(m, described.protocol_type)}
                ends = await consumer.end_offsets(sorted(set(committed) | assigned)) if not (members or state) else {}
                out.append((name, described, committed, ends))
            return out

    for name, described, committed, ends in run(go()):
        if described.group_state in ("PreparingRebalance", "CompletingRebalance"):
            stderr(f"Consumer group '{name}' is rebalancing.")
        elif not described.members:
            stderr(f"Consumer group '{name}' has no active members.")
        click.echo()
        if state:
            lines = _table(("GROUP", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                           [(name, described.protocol_data or "", described.group_state, len(described.members))])
        elif members:
            header = ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS") + (("ASSIGNMENT",) if verbose else ())
            rows = []
            for m in sorted(described.members, key=lambda m: m.member_id):
                parts = _decode_assignment(m, described.protocol_type)
                row = [name, m.member_id, m.client_host, m.client_id, len(parts)]
                if verbose:
                    by_topic: dict[str, list[str]] = {}
                    for tp in parts:
                        by_topic.setdefault(tp.topic, []).append(str(tp.partition))
                    row.append(",".join(f"{t}({','.join(ps)})" for t, ps in by_topic.items()) or "-")
                rows.append(row)
            lines = _table(header, rows)
        else:
            owner = {tp: m for m in described.members for tp in _decode_assignment(m, described.protocol_type)}
            rows = []
            for tp in sorted(set(committed) | set(owner)):
                current, end = committed.get(tp), ends.get(tp)
                lag = end - current if current is not None and end is not None else None
                m = owner.get(tp)
                rows.append((name, tp.topic, tp.partition, "-" if current is None else current,
                             "-" if end is None else end, "-" if lag is None else lag,
                             m.member_id if m else "-", m.client_host if m else "-", m.client_id if m else "-"))
            for m in sorted(described.members, key=lambda m: m.member_id):  # members with nothing assigned
                if not _decode_assignment(m, described.protocol_type):
                    rows.append((name, "-", "-", "-", "-", "-", m.member_id, m.client_host, m.client_id))
            lines = _table(("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                            "HOST", "CLIENT-ID"), rows, (0, 0, 10, 15, 15, 15))
        for line in lines:
            click.echo(line)


# delete --------------------------------------------------------------------------------------------


@consumer_groups.command()
@bootstrap_option
@command_config_option
@click.option("--group", multiple=True, help="The group to delete (repeatable).")
@click.option("--all-groups", is_flag=True, help="Delete every group.")
def delete(bootstrap_server: str, command_config: Path | None, group: tuple[str, ...], all_groups: bool) -> None:
    """Delete groups with no active members, and their committed offsets."""
    delete_groups(bootstrap_server, command_config, group, all_groups, CONSUMER_GROUP_TYPES, "consumer")


def delete_groups(bootstrap_server: str, command_config: Path | None, group: Sequence[str], all_groups: bool,
                  types: Sequence[str], kind: str) -> None:
    """``--delete``: DeleteGroups of each group (or every group of ``types``), reported as Kafka's tools do."""
    from kio.schema.errors import ErrorCode

    _groups(group, all_groups)

    async def go() -> tuple[list[str], dict[str, str]]:
        async with _consumer(bootstrap_server, command_config) as consumer:
            names = list(dict.fromkeys(group)) or sorted(await list_groups(consumer, types))
            failed: dict[str, str] = {}
            for name in names:
                conn = await coordinator(consumer, name)
                response = await conn.request(ApiKey.DELETE_GROUPS, {"groups_names": [name]})
                [result] = [r for r in response.results if r.group_id == name]
                if result.error_code == ErrorCode.non_empty_group:
                    failed[name] = "The group is not empty."
                elif result.error_code == ErrorCode.group_id_not_found:
                    failed[name] = "The group id does not exist."
                elif result.error_code != ErrorCode.none:
                    failed[name] = result.error_code.name.upper()
            return names, failed

    names, failed = run(go())
    done = [n for n in names if n not in failed]
    if done:
        click.echo(f"Deletion of requested {kind} groups (" + ", ".join(f"'{n}'" for n in done) + ") was successful.")
    if failed:
        raise click.ClickException(f"deletion of some {kind} groups failed: " +
                                   "; ".join(f"group '{n}' could not be deleted due to: {why}" for n, why in failed.items()))


# reset-offsets -------------------------------------------------------------------------------------


def parse_datetime(text: str) -> int:
    """Kafka's --to-datetime (``YYYY-MM-DDTHH:mm:SS.sss``, optionally with a zone; local time without) in ms."""
    try:
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.ClickException(f"invalid --to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


def parse_topics(values: Sequence[str]) -> dict[str, list[int] | None]:
    """``--topic t`` (all partitions) or ``--topic t:0,2`` (those), repeatable."""
    topics: dict[str, list[int] | None] = {}
    for value in values:
        name, sep, parts = value.partition(":")
        if not name:
            raise click.ClickException(f"invalid --topic {value!r}: expected TOPIC or TOPIC:P1,P2")
        if not sep:
            topics[name] = None
            continue
        try:
            partitions = [int(p) for p in parts.split(",")]
        except ValueError:
            raise click.ClickException(f"invalid --topic {value!r}: partitions must be numbers, as in {name}:0,1") from None
        if any(p < 0 for p in partitions):
            raise click.ClickException(f"invalid --topic {value!r}: partitions cannot be negative")
        if name in topics and topics[name] is None:
            continue  # all of its partitions already
        topics[name] = sorted(set(topics.get(name) or ()) | set(partitions))
    return topics


@consumer_groups.command("reset-offsets")
@bootstrap_option
@command_config_option
@click.option("--group", multiple=True, help="The group whose offsets to reset (repeatable).")
@click.option("--all-groups", is_flag=True, help="Reset the offsets of every group.")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P1,P2]", help="A topic, or some of its partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every topic the group has committed offsets for.")
@click.option("--to-earliest", is_flag=True, help="To the log start offset.")
@click.option("--to-latest", is_flag=True, help="To the log end offset.")
@click.option("--to-current", is_flag=True, help="To the committed offset (the log end where none is).")
@click.option("--to-offset", type=int, metavar="N", help="To offset N (within the log).")
@click.option("--shift-by", type=int, metavar="N", help="Move the committed offset by N (may be negative).")
@click.option("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss", help="To the first offset at or after this time.")
@click.option("--by-duration", metavar="PnDTnHnMnS", help="To the first offset at or after now minus this ISO-8601 duration.")
@click.option("--execute", is_flag=True, help="Commit the new offsets (without it, only print them).")
@click.option("--dry-run", is_flag=True, help="Only print the new offsets (the default).")
def reset_offsets(bootstrap_server: str, command_config: Path | None, group: tuple[str, ...], all_groups: bool,
                  topics: tuple[str, ...], all_topics: bool, to_earliest: bool, to_latest: bool, to_current: bool,
                  to_offset: int | None, shift_by: int | None, to_datetime: str | None, by_duration: str | None,
                  execute: bool, dry_run: bool) -> None:
    """Reset a group's committed offsets; the group must have no active members."""
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.consumer import OffsetAndMetadata

    _groups(group, all_groups)
    chosen = [name for name, given in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                                       ("--to-current", to_current), ("--to-offset", to_offset is not None),
                                       ("--shift-by", shift_by is not None), ("--to-datetime", to_datetime is not None),
                                       ("--by-duration", by_duration is not None)) if given]
    if len(chosen) != 1:
        raise click.ClickException("give exactly one of --to-earliest, --to-latest, --to-current, --to-offset, "
                                   "--shift-by, --to-datetime, --by-duration" + (f" (got {', '.join(chosen)})" if chosen else ""))
    if bool(topics) == all_topics:
        raise click.ClickException("give --topic TOPIC (repeatable) or --all-topics")
    if execute and dry_run:
        raise click.ClickException("give --execute or --dry-run, not both")
    if to_offset is not None and to_offset < 0:
        raise click.ClickException(f"invalid --to-offset {to_offset}: offsets cannot be negative")
    timestamp = parse_datetime(to_datetime) if to_datetime is not None else None
    if by_duration is not None:
        timestamp = int(datetime.datetime.now().timestamp() * 1000) - parse_duration(by_duration)
    wanted_topics = parse_topics(topics)

    async def plan_for(consumer: AsyncConsumer, name: str) -> dict[TopicPartition, int]:
        described = await describe_group(consumer, name)
        if described.group_state not in INACTIVE:
            raise click.ClickException(f"assignments can only be reset if the group '{name}' is inactive, "
                                       f"but the current state is {described.group_state}")
        committed = await fetch_offsets(consumer, name)
        if all_topics:
            partitions = sorted(committed)
        else:
            partitions = []
            await consumer.cluster.refresh(list(wanted_topics))
            for topic, numbers in wanted_topics.items():
                known = consumer.cluster.partitions.get(topic)
                if known is None:
                    raise click.ClickException(f"topic {topic!r} does not exist")
                for p in numbers if numbers is not None else sorted(known):
                    if p not in known:
                        raise click.ClickException(f"topic {topic!r} has no partition {p}")
                    partitions.append(TopicPartition(topic, p))
        if not partitions:
            return {}
        earliest = await consumer.beginning_offsets(partitions)
        latest = await consumer.end_offsets(partitions)

        def clamp(tp: TopicPartition, offset: int) -> int:
            return max(earliest[tp], min(latest[tp], offset))

        plan: dict[TopicPartition, int] = {}
        if timestamp is not None:
            found = await consumer.offsets_for_times({tp: max(timestamp, 0) for tp in partitions})
        for tp in partitions:
            if to_earliest:
                plan[tp] = earliest[tp]
            elif to_latest:
                plan[tp] = latest[tp]
            elif to_current:
                plan[tp] = committed.get(tp, latest[tp])
            elif to_offset is not None:
                plan[tp] = clamp(tp, to_offset)
            elif shift_by is not None:
                if tp not in committed:
                    raise click.ClickException(f"cannot shift the offset of {tp.topic}-{tp.partition}: "
                                               f"group '{name}' has no committed offset for it")
                plan[tp] = clamp(tp, committed[tp] + shift_by)
            else:
                hit = found[tp]
                plan[tp] = latest[tp] if hit is None else hit[0]
        return plan

    async def go() -> list[tuple[str, dict[TopicPartition, int]]]:
        async with _consumer(bootstrap_server, command_config) as consumer:
            names = list(dict.fromkeys(group)) or sorted(await list_groups(consumer))
        plans = []
        for name in names:
            async with _consumer(bootstrap_server, command_config, name) as consumer:
                plan = await plan_for(consumer, name)
                if execute and plan:
                    await consumer.commit({tp: OffsetAndMetadata(offset, "") for tp, offset in plan.items()})
            plans.append((name, plan))
        return plans

    plans = run(go())
    if not execute and not dry_run:
        stderr("WARN: No action will be performed as the --execute option is missing. "
               "Add --execute to reset the offsets, or --dry-run to only print them.")
    rows = [(name, tp.topic, tp.partition, offset) for name, plan in plans for tp, offset in sorted(plan.items())]
    click.echo()
    for line in _table(("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), rows, (30, 30, 10, 15)):
        click.echo(line)


def parse_duration(text: str) -> int:
    """An ISO-8601 duration (``PnDTnHnMnS``, as Java's Duration.parse) in ms."""
    import re

    match = re.fullmatch(r"(-)?P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", text.strip().upper())
    if not match or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise click.ClickException(f"invalid --by-duration {text!r}: expected an ISO-8601 duration such as PT1H30M or P1D")
    sign, days, hours, minutes, seconds = match.groups()
    ms = ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes or 0)) * 60000 + float(seconds or 0) * 1000
    return int(-ms if sign else ms)
