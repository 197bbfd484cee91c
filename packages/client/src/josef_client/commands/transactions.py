"""``josef transactions``: list, describe and abort transactions, and find hanging ones (kafka-transactions.sh).

The subcommands, flags and output columns are those of Kafka's tool, with
``--bootstrap-server`` before the subcommand as there::

    josef transactions --bootstrap-server localhost:9092 list
    josef transactions --bootstrap-server localhost:9092 describe --transactional-id tx
    josef transactions --bootstrap-server localhost:9092 describe-producers --topic t --partition 0
    josef transactions --bootstrap-server localhost:9092 abort --topic t --partition 0 --start-offset 42
    josef transactions --bootstrap-server localhost:9092 find-hanging --broker-id 1

``abort`` writes an abort marker for a transaction left open in a partition
(a hanging transaction its coordinator forgot), finding the producer from
DescribeProducers as Kafka's ``Admin.abortTransaction`` is used there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from josef_client.commands.common import Group, admin_client, command_config_option, run, tab_table

if TYPE_CHECKING:
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.admin import AsyncAdmin, ProducerState

LIST_HEADERS = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_HEADERS = ("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                    "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions")
PRODUCER_HEADERS = ("ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                    "CurrentTransactionStartOffset")
HANGING_HEADERS = ("Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                   "LastTimestamp", "Duration(min)")


@click.group("transactions", cls=Group)
@click.option("--bootstrap-server", "bootstrap_server", required=True, metavar="HOST:PORT[,HOST:PORT]",
              help="The broker(s) to connect to.")
@command_config_option
@click.pass_context
def transactions(ctx: click.Context, bootstrap_server: str, command_config: Path | None) -> None:
    """Analyze the transactional state of producers, and recover from hanging transactions (kafka-transactions.sh)."""
    ctx.obj = (bootstrap_server, command_config)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _tp(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


@contextlib.contextmanager
def _failing(what: str) -> Iterator[None]:
    """A broker's refusal as Kafka's ``<what>: <cause>`` line; an unreachable broker keeps its own message."""
    from josef.protocol.errors import KafkaConnectionError, KafkaError

    try:
        yield
    except KafkaConnectionError:
        raise
    except KafkaError as exc:
        raise click.ClickException(" ".join(f"{what}: {exc.message}".split())) from None


async def _with_admin(obj: tuple[str, Path | None], work: Any) -> Any:
    admin = admin_client(*obj)
    async with admin:
        return await work(admin)


# list / describe ------------------------------------------------------------------------------------


@transactions.command("list")
@click.option("--duration-filter", type=click.IntRange(min=0), metavar="MS",
              help="Only transactions running longer than this many milliseconds (KIP-994).")
@click.pass_obj
def list_transactions(obj: tuple[str, Path | None], duration_filter: int | None) -> None:
    """List transactions."""
    async def work(admin: AsyncAdmin) -> dict[int, list[Any]]:
        with _failing("Failed to list transactions"):
            return await admin.list_transactions(duration_ms=duration_filter)

    by_broker = run(_with_admin(obj, work))
    rows = [(t.transactional_id, str(broker), str(t.producer_id), t.state)
            for broker, listings in sorted(by_broker.items()) for t in listings]
    click.echo("\n".join(tab_table(LIST_HEADERS, rows)))


@transactions.command("describe")
@click.option("--transactional-id", required=True, help="The transactional id.")
@click.pass_obj
def describe(obj: tuple[str, Path | None], transactional_id: str) -> None:
    """Describe the state of an active transactional-id."""
    async def work(admin: AsyncAdmin) -> Any:
        with _failing(f"Failed to describe transaction state of transactional-id `{transactional_id}`"):
            return (await admin.describe_transactions([transactional_id]))[transactional_id]

    d = run(_with_admin(obj, work))
    started = d.transaction_start_time_ms
    row = (str(d.coordinator_id), transactional_id, str(d.producer_id), str(d.producer_epoch), d.state,
           str(d.transaction_timeout_ms), "None" if started is None else str(started),
           "None" if started is None else str(_now_ms() - started), ",".join(_tp(tp) for tp in d.topic_partitions))
    click.echo("\n".join(tab_table(DESCRIBE_HEADERS, [row])))


# describe-producers ---------------------------------------------------------------------------------


def _producer_row(state: ProducerState) -> tuple[str, ...]:
    start = state.current_transaction_start_offset
    return (str(state.producer_id), str(state.producer_epoch),
            str(-1 if state.coordinator_epoch is None else state.coordinator_epoch), str(state.last_sequence),
            str(state.last_timestamp), "None" if start is None else str(start))


@transactions.command("describe-producers")
@click.option("--broker-id", type=int, help="Describe the producer state on this replica instead of the leader.")
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", required=True, type=int, help="Partition number.")
@click.pass_obj
def describe_producers(obj: tuple[str, Path | None], broker_id: int | None, topic: str, partition: int) -> None:
    """Describe the states of active producers for a topic partition."""
    from josef.protocol.topic_partition import TopicPartition

    tp = TopicPartition(topic, partition)
    where = "leader" if broker_id is None else f"broker {broker_id}"

    async def work(admin: AsyncAdmin) -> list[ProducerState]:
        with _failing(f"Failed to describe producers for partition {_tp(tp)} on {where}"):
            return (await admin.describe_producers([tp], broker_id=broker_id))[tp]

    states = run(_with_admin(obj, work))
    click.echo("\n".join(tab_table(PRODUCER_HEADERS, [_producer_row(s) for s in states])))


# abort -----------------------------------------------------------------------------------------------


@transactions.command("abort")
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", required=True, type=int, help="Partition number.")
@click.option("--start-offset", type=int, help="Start offset of the transaction to abort (brokers 3.0 and newer).")
@click.option("--producer-id", type=int, help="Producer id (older brokers, with --producer-epoch and --coordinator-epoch).")
@click.option("--producer-epoch", type=int, help="Producer epoch (older brokers).")
@click.option("--coordinator-epoch", type=int, help="Coordinator epoch (older brokers).")
@click.pass_obj
def abort(obj: tuple[str, Path | None], topic: str, partition: int, start_offset: int | None, producer_id: int | None,
          producer_epoch: int | None, coordinator_epoch: int | None) -> None:
    """Abort a hanging transaction (requires administrative privileges)."""
    from josef.protocol.topic_partition import TopicPartition
    from josef_client.admin import AbortTransactionSpec

    tp = TopicPartition(topic, partition)
    if start_offset is None and producer_id is None:
        raise click.ClickException("The transaction to abort must be identified either with --start-offset (for brokers "
                                   "on 3.0 or above) or with --producer-id, --producer-epoch, and --coordinator-epoch "
                                   "(for older brokers)")
    if start_offset is None:
        if producer_epoch is None:
            raise click.ClickException("Missing required argument --producer-epoch")
        if coordinator_epoch is None:
            raise click.ClickException("Missing required argument --coordinator-epoch")

    async def work(admin: AsyncAdmin) -> None:
        if start_offset is None:
            # A producer whose transaction hung before any marker has coordinator epoch -1; 0 is <= any real one.
            spec = AbortTransactionSpec(tp, producer_id, producer_epoch, max(coordinator_epoch, 0))  # type: ignore[arg-type]
        else:
            with _failing(f"Failed to validate producer state for partition {_tp(tp)}"):
                states = (await admin.describe_producers([tp]))[tp]
            found = next((s for s in states if s.current_transaction_start_offset == start_offset), None)
            if found is None:
                raise click.ClickException(f"Could not find any open transactions starting at offset {start_offset} "
                                           f"on partition {_tp(tp)}")
            spec = AbortTransactionSpec(tp, found.producer_id, found.producer_epoch, found.coordinator_epoch or 0)
        with _failing(f"Failed to abort transaction {spec}"):
            await admin.abort_transaction(spec)

    run(_with_admin(obj, work))


# find-hanging -----------------------------------------------------------------------------------------


@transactions.command("find-hanging")
@click.option("--broker-id", type=int, help="Broker id to search for hanging transactions.")
@click.option("--max-transaction-timeout", type=int, default=15, show_default=True,
              help="Maximum transaction timeout in minutes to limit the scope of the search.")
@click.option("--topic", help="Topic name to limit the search to.")
@click.option("--partition", type=int, help="Partition number (with --topic).")
@click.pass_obj
def find_hanging(obj: tuple[str, Path | None], broker_id: int | None, max_transaction_timeout: int, topic: str | None,
                 partition: int | None) -> None:
    """Find hanging transactions: open in a partition longer than the timeout, unknown to their coordinator."""
    if topic is None and broker_id is None:
        raise click.ClickException("The `find-hanging` command requires either --topic or --broker-id to limit the "
                                   "scope of the search")
    if partition is not None and topic is None:
        raise click.ClickException("The --partition argument requires --topic to be provided")

    from josef_client.admin import TransactionDescription

    async def work(admin: AsyncAdmin) -> list[tuple[TopicPartition, ProducerState]]:
        partitions = await _partitions_to_search(admin, topic, partition, broker_id)
        now = _now_ms()
        producers = await admin.describe_producers(partitions, broker_id=broker_id) if partitions else {}
        candidates = [(tp, s) for tp, states in producers.items() for s in states
                      if s.current_transaction_start_offset is not None
                      and now - s.last_timestamp > max_transaction_timeout * 60_000]
        if not candidates:
            return []
        producer_ids = {s.producer_id for _, s in candidates}
        listings = await admin.list_transactions(producer_ids=producer_ids)
        ids = {t.producer_id: t.transactional_id for ts in listings.values() for t in ts if t.producer_id in producer_ids}
        descriptions = await admin.describe_transactions(set(ids.values()), raise_errors=False)
        hanging = []
        for tp, state in candidates:
            description = descriptions.get(ids.get(state.producer_id, ""))
            if not isinstance(description, TransactionDescription) or tp not in description.topic_partitions:
                hanging.append((tp, state))  # no transactional id, or its coordinator no longer writes to tp
        return hanging

    hanging = run(_with_admin(obj, work))
    now = _now_ms()
    rows = [(tp.topic, str(tp.partition), str(s.producer_id), str(s.producer_epoch),
             str(-1 if s.coordinator_epoch is None else s.coordinator_epoch), str(s.current_transaction_start_offset),
             str(s.last_timestamp), str((now - s.last_timestamp) // 60_000)) for tp, s in hanging]
    click.echo("\n".join(tab_table(HANGING_HEADERS, rows)))


async def _partitions_to_search(admin: AsyncAdmin, topic: str | None, partition: int | None,
                                broker_id: int | None) -> list[TopicPartition]:
    from josef.protocol.topic_partition import TopicPartition

    if topic is not None and partition is not None:
        return [TopicPartition(topic, partition)]
    topics = [topic] if topic is not None else list(await admin.list_topics())
    described = await admin.describe_topics(topics) if topics else {}
    return [TopicPartition(name, p.partition) for name, d in described.items() for p in d.partitions
            if broker_id is None or broker_id in p.replicas]
