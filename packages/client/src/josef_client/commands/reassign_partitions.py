"""``josef reassign-partitions``: Kafka's ``kafka-reassign-partitions.sh``.

``--generate`` proposes an assignment of the topics in
``--topics-to-move-json-file`` over ``--broker-list``; ``--execute`` starts
the moves of ``--reassignment-json-file`` (printing the current assignment
to roll back to); ``--verify`` reports each move; ``--cancel`` reverts moves
in progress; ``--list`` shows them. Files and output lines are Kafka's.

``--execute --throttle N`` caps the copying at N bytes/s (KIP-73): it sets
``leader.replication.throttled.rate`` and ``follower.replication.throttled.rate``
on every broker a move involves, and on each moving topic
``leader.replication.throttled.replicas`` (the replicas copied from) and
``follower.replication.throttled.replicas`` (the replicas being added).
Like Kafka's tool, ``--verify`` and ``--cancel`` remove every throttle once
no reassignment is in progress, unless ``--preserve-throttles`` is given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from josef_client.commands.common import admin_client, bootstrap_option, command_config_option, run

#: A partition's move as Kafka's tool throttles it: the brokers copied from, and the brokers copied to.
Move = tuple[frozenset[int], frozenset[int]]
Key = tuple[str, int]

BROKER_THROTTLES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
TOPIC_THROTTLES = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
CANNOT_EXECUTE_BECAUSE_OF_EXISTING = (
    "Cannot execute because there is an existing partition assignment.  Use --additional to override this and "
    "create a new partition assignment in addition to the existing one. The --additional flag can also be used to "
    "change the throttle by resubmitting the current reassignment.")


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


def _tp(key: Key) -> str:
    return f"{key[0]}-{key[1]}"


def _plural(items: Any) -> str:
    return "" if len(items) == 1 else "s"


def _ids(brokers: Any) -> str:
    return ",".join(str(b) for b in brokers)


def proposed_moves(in_progress: dict[Key, Any], targets: dict[Key, list[int]],
                   current: dict[Key, tuple[int, ...]]) -> dict[Key, Move]:
    """Kafka's calculateProposedMoveMap: the moves in progress plus the new ones.

    A partition already moving keeps the sources it had before its move (its
    replicas less those being added); the others are copied from their
    current replicas. Destinations are the target replicas not among the sources.
    """
    moves = {key: (frozenset(r.replicas) - frozenset(r.adding_replicas), frozenset(r.adding_replicas))
             for key, r in in_progress.items()}
    for key, replicas in targets.items():
        sources = moves[key][0] if key in moves else frozenset(current[key])
        moves[key] = (sources, frozenset(replicas) - sources)
    return moves


def throttled_replicas(moves: dict[Key, Move]) -> dict[str, tuple[str, str]]:
    """Each moving topic's ``(leader, follower)`` throttled replicas, ``partition:broker`` sorted as Kafka's TreeSet."""
    leader: dict[str, set[str]] = {}
    follower: dict[str, set[str]] = {}
    for (topic, partition), (sources, destinations) in moves.items():
        leader.setdefault(topic, set()).update(f"{partition}:{b}" for b in sources)
        follower.setdefault(topic, set()).update(f"{partition}:{b}" for b in destinations)
    return {topic: (",".join(sorted(leader[topic])), ",".join(sorted(follower[topic]))) for topic in leader}


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
@click.option("--throttle", type=click.IntRange(min=-1), default=-1, show_default=True,
              help="With --execute: cap the movement of partitions between brokers at this many bytes/s.")
@click.option("--additional", is_flag=True,
              help="With --execute: start these moves while others are in progress (or change their throttle).")
@click.option("--preserve-throttles", is_flag=True,
              help="With --verify or --cancel: leave the throttles in place even if every move is done.")
def reassign_partitions(bootstrap_server: str, command_config: Path | None, action: str | None,
                        topics_to_move_json_file: Path | None, broker_list: str | None,
                        reassignment_json_file: Path | None, throttle: int, additional: bool,
                        preserve_throttles: bool) -> None:
    """Move partitions between brokers."""
    if action is None:
        raise click.UsageError("Command must include exactly one action: --generate, --execute, --verify, --cancel, "
                               "--list")
    if action == "generate" and (topics_to_move_json_file is None or not broker_list):
        raise click.UsageError("--generate needs --topics-to-move-json-file and --broker-list")
    if action in ("execute", "verify", "cancel") and reassignment_json_file is None:
        raise click.UsageError(f"--{action} needs --reassignment-json-file")
    if action == "generate":
        work = _generate(bootstrap_server, command_config, topics_to_move_json_file, broker_list)
    elif action == "execute":
        work = _execute(bootstrap_server, command_config, reassignment_json_file, throttle, additional)
    elif action == "verify":
        work = _verify(bootstrap_server, command_config, reassignment_json_file, preserve_throttles)
    elif action == "cancel":
        work = _cancel(bootstrap_server, command_config, reassignment_json_file, preserve_throttles)
    else:
        work = _list(bootstrap_server, command_config)
    for line in run(work):
        click.echo(line)


async def _current(admin: Any, topics: list[str]) -> dict[tuple[str, int], tuple[int, ...]]:
    described = await admin.describe_topics(topics)
    return {(name, p.partition): p.replicas for name, d in described.items() for p in d.partitions}


async def _generate(bootstrap: str, config: Path | None, topics_file: Path, broker_list: str) -> list[str]:
    try:
        topics = [str(t["topic"]) for t in json.loads(topics_file.read_text())["topics"]]
        brokers = [int(b) for b in broker_list.split(",")]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"Invalid --topics-to-move-json-file or --broker-list: {exc}") from None
    async with admin_client(bootstrap, config) as admin:
        current = await _current(admin, topics)
    return ["Current partition replica assignment", _json(current), "",
            "Proposed partition reassignment configuration", _json(propose(current, brokers))]


async def _execute(bootstrap: str, config: Path | None, path: Path, throttle: int, additional: bool) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        in_progress = {(tp.topic, tp.partition): r for tp, r in (await admin.list_partition_reassignments()).items()}
        if in_progress and not additional:
            raise click.ClickException(CANNOT_EXECUTE_BECAUSE_OF_EXISTING)
        current = await _current(admin, sorted({t for t, _ in targets}))
        missing = [k for k in targets if k not in current]
        if missing:
            raise click.ClickException("Topic or partition not found: " + ", ".join(_tp(k) for k in missing))
        lines = ["Current partition replica assignment", "",
                 _json({k: current[k] for k in targets}), "",
                 "Save this to use as the --reassignment-json-file option during rollback"]
        if throttle >= 0:
            lines.append("Warning: You must run --verify periodically, until the reassignment completes, to ensure "
                         "the throttle is removed.")
            await _throttle(admin, proposed_moves(in_progress, targets, current), throttle)
            lines.append(f"The inter-broker throttle limit was set to {throttle} B/s")
        results = await admin.alter_partition_reassignments({TopicPartition(*k): r for k, r in targets.items()})
    failed = {f"{tp.topic}-{tp.partition}": error for tp, error in results.items() if error is not None}
    if failed:
        raise click.ClickException("Error reassigning partition(s):\n"
                                   + "\n".join(f"{tp}: {error}" for tp, error in sorted(failed.items())))
    return lines + [f"Successfully started partition reassignment{_plural(targets)} for "
                    + ",".join(_tp(k) for k in sorted(targets))]


async def _throttle(admin: Any, moves: dict[Key, Move], rate: int) -> None:
    """Kafka's modifyReassignmentThrottle: the moving topics' throttled replicas, then the rates on every broker involved."""
    from josef_client.admin import ConfigResource

    await admin.alter_configs({ConfigResource.topic(topic): dict(zip(TOPIC_THROTTLES, replicas))
                               for topic, replicas in throttled_replicas(moves).items()})
    brokers = sorted(set().union(*(sources | destinations for sources, destinations in moves.values())))
    await admin.alter_configs({ConfigResource.broker(b): dict.fromkeys(BROKER_THROTTLES, str(rate)) for b in brokers})


async def _clear_throttles(admin: Any, targets: dict[Key, list[int]]) -> list[str]:
    """Kafka's clearAllThrottles: the rates of every broker (live or targeted) and the throttled replicas of the topics."""
    from josef_client.admin import ConfigResource

    brokers = {b.node_id for b in (await admin.describe_cluster()).brokers}.union(*targets.values())
    topics = sorted({t for t, _ in targets})
    await admin.alter_configs({ConfigResource.broker(b): dict.fromkeys(BROKER_THROTTLES) for b in brokers})
    await admin.alter_configs({ConfigResource.topic(t): dict.fromkeys(TOPIC_THROTTLES) for t in topics})
    return [f"Clearing broker-level throttles on broker{_plural(brokers)} {_ids(sorted(brokers))}",
            f"Clearing topic-level throttles on topic{_plural(topics)} {','.join(topics)}"]


async def _verify(bootstrap: str, config: Path | None, path: Path, preserve_throttles: bool) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        moving = await admin.list_partition_reassignments()
        current = await _current(admin, sorted({t for t, _ in targets}))
        lines = ["Status of partition reassignment:"]
        for key, replicas in sorted(targets.items()):
            if TopicPartition(*key) in moving:
                lines.append(f"Reassignment of partition {_tp(key)} is still in progress.")
            elif list(current.get(key, ())) == replicas:
                lines.append(f"Reassignment of partition {_tp(key)} is completed.")
            else:
                lines.append(f"There is no active reassignment of partition {_tp(key)}, but replica set is "
                             f"{_ids(current.get(key, ()))} rather than {_ids(replicas)}.")
        if not moving and not preserve_throttles:  # Kafka waits for every move, not only these, to be done
            lines += await _clear_throttles(admin, targets)
    return lines


async def _cancel(bootstrap: str, config: Path | None, path: Path, preserve_throttles: bool) -> list[str]:
    from josef_client.admin import TopicPartition

    targets = parse_reassignment(path)
    async with admin_client(bootstrap, config) as admin:
        results = await admin.alter_partition_reassignments({TopicPartition(*k): None for k in targets})
        cancelled = sorted(f"{tp.topic}-{tp.partition}" for tp, error in results.items() if error is None)
        failed = {f"{tp.topic}-{tp.partition}": error for tp, error in results.items() if error is not None}
        lines = [f"Successfully cancelled partition reassignment{_plural(cancelled)} for: " + ",".join(cancelled)
                 ] if cancelled else []
        if failed:
            for line in lines:
                click.echo(line)
            raise click.ClickException("Error cancelling partition reassignment(s):\n"
                                       + "\n".join(f"{tp}: {error}" for tp, error in sorted(failed.items())))
        if not preserve_throttles:
            lines += await _clear_throttles(admin, targets)
    return lines


async def _list(bootstrap: str, config: Path | None) -> list[str]:
    async with admin_client(bootstrap, config) as admin:
        moving = await admin.list_partition_reassignments()
    if not moving:
        return ["No partition reassignments found."]
    return ["Current partition reassignments:"] + [
        f"{tp.topic}-{tp.partition}: replicas: {_ids(r.replicas)}."
        + (f" adding: {_ids(r.adding_replicas)}." if r.adding_replicas else "")
        + (f" removing: {_ids(r.removing_replicas)}." if r.removing_replicas else "")
        for tp, r in sorted(moving.items(), key=lambda item: (item[0].topic, item[0].partition))]
