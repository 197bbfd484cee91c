"""``josef reassign-partitions``: Kafka's ``kafka-reassign-partitions.sh``.

``--generate`` proposes an assignment of the topics in
``--topics-to-move-json-file`` over ``--broker-list``; ``--execute`` starts
the moves of ``--reassignment-json-file`` (printing the current assignment
to roll back to); ``--verify`` reports each move; ``--cancel`` reverts moves
in progress; ``--list`` shows them. Files and output lines are Kafka's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from josef_client.commands.common import admin_client, bootstrap_option, command_config_option, run


def _json(assignment: dict[tuple[str, int], tuple[int, ...]]) -> str:
    """Kafka's reassignment JSON, compact, log dirs ``any`` as Kafka writes them."""
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(r)}
        for (t, p), r in sorted(assignment.items())]}, separators=(",", ":"))


def parse_reassignment(path: Path) -> dict[tuple[str, int], list[int]]:
    """``{"version":1,"partitions":[{"topic":..,"partition":..,"replicas":[..]}]}``; duplicates refused."""
    try:
        entries = json.loads(path.read_text())["partitions"]
        moves = [((str(e["topic"]), int(e["partition"])), [int(b) for b in e["replicas"]]) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"Invalid JSON in {path}: {exc}") from None
    result = dict(moves)
    if len(result) != len(moves):
        raise click.ClickException("Partition reassignment list cannot contain duplicate topic partitions")
    if not result:
        raise click.ClickException("Partition reassignment list cannot be empty")
    return result


def _tp(key: tuple[str, int]) -> str:
    return f"{key[0]}-{key[1]}"


def propose(current: dict[tuple[str, int], tuple[int, ...]], brokers: list[int]) -> dict[tuple[str, int], tuple[int, ...]]:
    """Spread each topic's partitions over ``brokers`` round-robin, keeping each partition's replica count."""
    proposed = {}
    for (topic, partition), replicas in sorted(current.items()):
        if len(replicas) > len(brokers):
            raise click.ClickException(f"Replication factor: {len(replicas)} larger than available brokers: "
                                       f"{len(brokers)}.")
        proposed[(topic, partition)] = tuple(brokers[(partition + i) % len(brokers)] for i in range(len(replicas)))
    return proposed


@click.command("reassign-partitions")
@bootstrap_option
@command_config_option
@click.option("--generate", "action", flag_value="generate", help="Propose an assignment of --topics-to-move-json-file.")
@click.option("--execute", "action", flag_value="execute", help="Start the moves of --reassignment-json-file.")
@click.option("--verify", "action", flag_value="verify", help="Report the moves of --reassignment-json-file.")
@click.option("--cancel", "action", flag_value="cancel", help="Cancel the moves of --reassignment-json-file.")
@click.option("--list", "action", flag_value="list", help="List the moves in progress.")
@click.option("--topics-to-move-json-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='With --generate: {"version":1,"topics":[{"topic":"foo"}]}.')
@click.option("--broker-list", help="With --generate: the brokers to spread the partitions over, as 1,2,3.")
@click.option("--reassignment-json-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The partitions and their target replicas (what --generate proposes).")
def reassign_partitions(bootstrap_server: str, command_config: Path | None, action: str | None,
                        topics_to_move_json_file: Path | None, broker_list: str | None,
                        reassignment_json_file: Path | None) -> None:
    """Move partitions between brokers."""
    if action is None:
        raise click.UsageError("Command must include exactly one action: --generate, --execute, --verify, --cancel, "
                               "--list")
    if action == "generate" and (topics_to_move_json_file is None or not broker_list):
        raise click.UsageError("--generate needs --topics-to-move-json-file and --broker-list")
    if action in ("execute", "verify", "cancel") and reassignment_json_file is None:
        raise click.UsageError(f"--{action} needs --reassignment-json-file")
    for line in run(_ACTIONS[action](bootstrap_server, command_config, topics_to_move_json_file, broker_list,
                                     reassignment_json_file)):
        click.echo(line)


async def _current(admin: Any, topics: list[str]) -> dict[tuple[str, int], tuple[int, ...]]:
    described = await admin.describe_topics(topics)
    return {(name, p.partition): p.replicas for name, d in described.items() for p in d.partitions}


async def _generate(bootstrap: str, config: Path | None, topics_file: Path, broker_list: str, _: Any) -> list[str]:
    try:
        topics = [str(t["topic"]) for t in json.loads(topics_file.read_text())["topics"]]
        brokers = [int(b) for b in broker_list.split(",")]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"Invalid --topics-to-move-json-file or --broker-list: {exc}") from None
    async with admin_client(bootstrap, config) as admin:
        current = await _current(admin, topics)
    return ["Current partition replica assignment", _json(current), "",
            "Proposed partition reassignment configuration", _json(propose(current, brokers))]


async def _execute(bootstrap: str, config: Path | None, _: Any, __: Any, path: Path) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        current = await _current(admin, sorted({t for t, _ in targets}))
        missing = [k for k in targets if k not in current]
        if missing:
            raise click.ClickException("Topic or partition not found: " + ", ".join(_tp(k) for k in missing))
        results = await admin.alter_partition_reassignments({TopicPartition(*k): r for k, r in targets.items()})
    lines = ["Current partition replica assignment", "",
             _json({k: current[k] for k in targets}), "",
             "Save this to use as the --reassignment-json-file option during rollback"]
    failed = {f"{tp.topic}-{tp.partition}": error for tp, error in results.items() if error is not None}
    if failed:
        raise click.ClickException("Error reassigning partition(s):\n"
                                   + "\n".join(f"{tp}: {error}" for tp, error in sorted(failed.items())))
    return lines + ["Successfully started partition reassignments for " + ",".join(_tp(k) for k in sorted(targets))]


async def _verify(bootstrap: str, config: Path | None, _: Any, __: Any, path: Path) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        moving = await admin.list_partition_reassignments([TopicPartition(*k) for k in targets])
        current = await _current(admin, sorted({t for t, _ in targets}))
    lines = ["Status of partition reassignment:"]
    for key, replicas in sorted(targets.items()):
        if TopicPartition(*key) in moving:
            lines.append(f"Reassignment of partition {_tp(key)} is still in progress.")
        elif list(current.get(key, ())) == replicas:
            lines.append(f"Reassignment of partition {_tp(key)} is completed.")
        else:
            lines.append(f"There is no active reassignment of partition {_tp(key)}, but replica set is "
                         f"{list(current.get(key, ()))} rather than {replicas}.")
    return lines


async def _cancel(bootstrap: str, config: Path | None, _: Any, __: Any, path: Path) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        results = await admin.alter_partition_reassignments({TopicPartition(*k): None for k in targets})
    cancelled = sorted(f"{tp.topic}-{tp.partition}" for tp, error in results.items() if error is None)
    failed = {f"{tp.topic}-{tp.partition}": error for tp, error in results.items() if error is not None}
    lines = ["Successfully cancelled partition reassignments for: " + ",".join(cancelled)] if cancelled else []
    if failed:
        for line in lines:
            click.echo(line)
        raise click.ClickException("Error cancelling partition reassignment(s):\n"
                                   + "\n".join(f"{tp}: {error}" for tp, error in sorted(failed.items())))
    return lines


async def _list(bootstrap: str, config: Path | None, *_: Any) -> list[str]:
    async with admin_client(bootstrap, config) as admin:
        moving = await admin.list_partition_reassignments()
    if not moving:
        return ["No partition reassignments found."]
    ids = ",".join
    return ["Current partition reassignments:"] + [
        f"{tp.topic}-{tp.partition}: replicas: {ids(map(str, r.replicas))}. adding: {ids(map(str, r.adding_replicas))}. "
        f"removing: {ids(map(str, r.removing_replicas))}."
        for tp, r in sorted(moving.items(), key=lambda item: (item[0].topic, item[0].partition))]


_ACTIONS = {"generate": _generate, "execute": _execute, "verify": _verify, "cancel": _cancel, "list": _list}
