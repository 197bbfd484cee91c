"""``josef log-dirs describe``: where each broker keeps its partitions, as kafka-log-dirs.sh prints it.

::

    $ josef log-dirs describe --bootstrap-server localhost:9092 --topic-list orders
    Querying brokers for log directories information
    Received log directory information from brokers 1
    {"brokers":[{"broker":1,"logDirs":[{"partitions":[{"partition":"orders-0","size":120,"offsetLag":0,"isFuture":false}],"error":null,"logDir":"/data"}]}],"version":1}

Kafka's tool builds its JSON from ``HashMap``s, so the order of keys, brokers,
log dirs and partitions is Java's hash order; it is reproduced here
(:func:`java_hash_order`) so that the output is Kafka's byte for byte.
``josef log-dirs --describe`` (Kafka's spelling) works too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from josef_client.commands.common import Group, client_config, command_config_option, make_client, read_properties, run

if TYPE_CHECKING:
    from josef.protocol.errors import KafkaError
    from josef_client.admin import LogDirDescription

T = TypeVar("T")

#: Kafka's exception classes whose names do not follow ``<ErrorCodeInCamelCase>Exception``.
_EXCEPTIONS = {"cluster_authorization_failed": "ClusterAuthorizationException"}


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as an unsigned 32-bit value."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h


def java_hash_order(items: Iterable[T], hash_of: Callable[[T], int]) -> list[T]:
    """``items`` in the iteration order of a Java ``HashMap`` they were put into in this order.

    A ``HashMap`` iterates its buckets in index order (the spread hash masked
    by the table size, a power of two from 16 that keeps the load under
    0.75), and each bucket in insertion order.
    """
    ordered = list(items)
    capacity = 16
    while len(ordered) > capacity * 3 // 4:
        capacity *= 2

    def bucket(item: T) -> int:
        h = hash_of(item) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return [item for _, _, item in sorted((bucket(item), i, item) for i, item in enumerate(ordered))]


def _partition_hash(topic: str, partition: int) -> int:
    """Java's ``TopicPartition.hashCode``."""
    return 31 * (31 + partition) + java_string_hash(topic)


def _java_object(**fields: Any) -> dict[str, Any]:
    """A ``HashMap<String, Object>`` as Jackson writes it: its keys in Java's order."""
    return {key: fields[key] for key in java_hash_order(fields, java_string_hash)}


def _exception_name(error: KafkaError | None) -> str | None:
    if error is None:
        return None
    name = error.code.name
    camel = _EXCEPTIONS.get(name) or "".join(part.capitalize() for part in name.removesuffix("_error").split("_")) + "Exception"
    return f"org.apache.kafka.common.errors.{camel}"


def format_as_json(by_broker: dict[int, dict[str, LogDirDescription]], topics: set[str],
                   remote: dict[tuple[str, int], int] | None = None) -> str:
    """Kafka's ``LogDirsCommand.formatAsJson``: every broker's dirs, with the partitions of ``topics`` (all when empty).

    ``remote`` (``--remote``): the bytes in remote storage of tiered partitions, added to each of their entries as
    ``remoteSize``; Kafka's tool reports local sizes only.
    """
    brokers = []
    for broker in java_hash_order(by_broker, lambda b: b):
        dirs = []
        for path in java_hash_order(by_broker[broker], java_string_hash):
            description = by_broker[broker][path]
            replicas = [tp for tp in description.replicas if not topics or tp.topic in topics]
            partitions = [
                _java_object(partition=f"{tp.topic}-{tp.partition}", size=description.replicas[tp].size,
                             offsetLag=description.replicas[tp].offset_lag,
                             isFuture=description.replicas[tp].is_future,
                             **({"remoteSize": remote[(tp.topic, tp.partition)]}
                                if remote and (tp.topic, tp.partition) in remote else {}))
                for tp in java_hash_order(replicas, lambda tp: _partition_hash(tp.topic, tp.partition))]
            dirs.append(_java_object(logDir=path, error=_exception_name(description.error), partitions=partitions))
        brokers.append(_java_object(broker=broker, logDirs=dirs))
    return json.dumps(_java_object(version=1, brokers=brokers), separators=(",", ":"), ensure_ascii=False)


def _ids(text: str, flag: str) -> set[int]:
    try:
        return {int(part) for part in text.split(",") if part}
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of broker ids", param_hint=flag) from None


def _comma_list(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in java_hash_order(ids, lambda i: i))


@click.group("log-dirs", cls=Group, actions=("describe",))
def log_dirs() -> None:
    """Query log directory usage on the specified brokers (kafka-log-dirs.sh)."""


@log_dirs.command("describe")
@click.option("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]",
              help="REQUIRED: the server(s) to use for bootstrapping.")
@command_config_option
@click.option("--topic-list", default="", metavar="TOPIC[,TOPIC...]",
              help='The list of topics to be queried in the form "topic1,topic2,topic3". All topics will be queried '
                   "if no topic list is specified.")
@click.option("--broker-list", default="", metavar="ID[,ID...]",
              help='The list of brokers to be queried in the form "0,1,2". All brokers in the cluster will be queried '
                   "if no broker list is specified.")
@click.option("--remote", is_flag=True,
              help="josef: also give each tiered partition's bytes in remote storage (remoteSize), read from "
                   "__remote_log_metadata as the brokers count them.")
def describe(bootstrap_server: str, command_config: Path | None, topic_list: str, broker_list: str,
             remote: bool) -> None:
    """Describe the specified log directories on the specified brokers."""
    from josef_client.admin import AsyncAdmin

    topics = {t for t in topic_list.split(",") if t}
    wanted = _ids(broker_list, "--broker-list")
    config = client_config(bootstrap_server, {"client.id": "log-dirs-tool"}, read_properties(command_config))
    admin = make_client(AsyncAdmin, config)

    async def work() -> tuple[set[int], dict[int, dict[str, LogDirDescription]] | None]:
        async with admin:
            cluster = {b.node_id for b in (await admin.describe_cluster()).brokers}
            if wanted - cluster:
                return cluster, None
            click.echo("Querying brokers for log directories information")
            return cluster, await admin.describe_log_dirs(sorted(wanted or cluster))

    cluster, by_broker = run(work())
    if by_broker is None:  # Kafka's TerseException: its message alone on stderr, status 1
        click.echo(f"ERROR: The given brokers do not exist from --broker-list: {_comma_list(wanted - cluster)}. "
                   f"Current existent brokers: {_comma_list(cluster)}", err=True)
        sys.exit(1)
    click.echo(f"Received log directory information from brokers {_comma_list(by_broker)}")
    sizes = remote_sizes(config, by_broker, topics) if remote else None
    click.echo(format_as_json(by_broker, topics, sizes))


def remote_sizes(config: dict[str, Any], by_broker: dict[int, dict[str, LogDirDescription]],
                 topics: set[str]) -> dict[tuple[str, int], int]:
    """Bytes in remote storage of the partitions described, as Kafka's RemoteLogSizeBytes metric counts them: every
    segment the metadata lists (copies started or finished, deletions not yet finished)."""
    from josef_client.remote_log_metadata import remote_log_metadata

    partitions = {(tp.topic, tp.partition) for dirs in by_broker.values() for description in dirs.values()
                  for tp in description.replicas if not topics or tp.topic in topics}
    found = remote_log_metadata({**config, "group.id": "log-dirs-tool"}, partitions)
    return {tp: cache.remote_log_size() for tp, cache in found.items()}
