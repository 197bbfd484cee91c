"""``josef leader-election``: Kafka's ``kafka-leader-election.sh``.

Asks the controller (through the bootstrap broker) for preferred or
unclean leader elections, and prints Kafka's lines::

    $ josef leader-election --bootstrap-server localhost:9092 --election-type preferred --all-topic-partitions
    Successfully completed leader election (PREFERRED) for partitions orders-0, orders-2
    Valid replica already elected for partitions orders-1

Partitions that could not get a leader each print an ``Error completing
leader election`` line, and the command fails with ``N replica(s) could
not be elected``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from josef_client.commands.common import admin_client, bootstrap_option, command_config_option, run


def parse_partitions_file(path: Path) -> list[tuple[str, int]]:
    """Kafka's election JSON: ``{"partitions": [{"topic": "foo", "partition": 1}, ...]}``, duplicates refused."""
    try:
        entries = json.loads(path.read_text())["partitions"]
        partitions = [(str(e["topic"]), int(e["partition"])) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise click.ClickException(f"Invalid JSON in {path}: {exc}") from None
    duplicates = sorted({p for p in partitions if partitions.count(p) > 1})
    if duplicates:
        raise click.ClickException("Replica election data contains duplicate partitions: "
                                   + ",".join(f"{t}-{p}" for t, p in duplicates))
    return partitions


@click.command("leader-election")
@bootstrap_option
@command_config_option
@click.option("--election-type", required=True, type=click.Choice(["PREFERRED", "UNCLEAN"], case_sensitive=False),
              help="PREFERRED: the first replica leads if it is in sync; UNCLEAN: a leaderless partition gets any "
                   "live replica, at the risk of losing data.")
@click.option("--topic", help="The topic of the partition to elect a leader for (with --partition).")
@click.option("--partition", type=int, help="The partition to elect a leader for (with --topic).")
@click.option("--all-topic-partitions", is_flag=True, help="Elect leaders wherever the election type applies.")
@click.option("--path-to-json-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='The partitions, as {"partitions": [{"topic": "foo", "partition": 1}]}.')
def leader_election(bootstrap_server: str, command_config: Path | None, election_type: str, topic: str | None,
                    partition: int | None, all_topic_partitions: bool, path_to_json_file: Path | None) -> None:
    """Elect partition leaders: preferred replicas, or any live replica of leaderless partitions."""
    from josef_client.admin import ElectionType, TopicPartition

    chosen = [topic is not None, all_topic_partitions, path_to_json_file is not None]
    if sum(chosen) != 1:
        raise click.UsageError("One and only one of the following options is required: "
                               "--all-topic-partitions, --topic, --path-to-json-file")
    if (topic is None) != (partition is None):
        raise click.UsageError("--topic and --partition are given together")
    election = ElectionType[election_type.upper()]
    if all_topic_partitions:
        partitions = None
    elif path_to_json_file is not None:
        partitions = [TopicPartition(t, p) for t, p in parse_partitions_file(path_to_json_file)]
    else:
        partitions = [TopicPartition(topic, partition)]  # type: ignore[arg-type]

    async def go() -> dict:  # type: ignore[type-arg]
        async with admin_client(bootstrap_server, command_config) as admin:
            return await admin.elect_leaders(election, partitions)

    results = run(go())
    from kio.schema.errors import ErrorCode

    succeeded = [tp for tp, error in results.items() if error is None]
    noop = [tp for tp, error in results.items() if error is not None and error.code == ErrorCode.election_not_needed]
    failed = {tp: error for tp, error in results.items() if error is not None and tp not in noop}
    if succeeded:
        click.echo(f"Successfully completed leader election ({election.name}) for partitions "
                   + ", ".join(f"{tp.topic}-{tp.partition}" for tp in succeeded))
    if noop:
        click.echo("Valid replica already elected for partitions " + ", ".join(f"{tp.topic}-{tp.partition}" for tp in noop))
    for tp, error in failed.items():
        click.echo(f"Error completing leader election ({election.name}) for partition: {tp.topic}-{tp.partition}: "
                   f"{error}")
    if failed:
        raise click.ClickException(f"{len(failed)} replica(s) could not be elected")
