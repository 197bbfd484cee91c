"""``josef client-metrics``: client-metrics subscriptions (KIP-714), as ``kafka-client-metrics.sh`` manages them.

::

    $ josef client-metrics --bootstrap-server localhost:9092 --alter --name all \\
          --metrics org.apache.kafka.producer. --interval 1000
    Altered client metrics config for all.
    $ josef client-metrics --bootstrap-server localhost:9092 --describe --name all
    Client metrics configs for all are:
      interval.ms=1000
      match=
      metrics=org.apache.kafka.producer.

A subscription asks the clients its ``--match`` selects (``selector=regex``:
client_id, client_instance_id, client_software_name, client_software_version,
client_source_address, client_source_port; every client without one) to push
the metrics whose names start with one of its ``--metrics`` prefixes (``*``
for all) every ``--interval`` milliseconds. It is a config resource of type
client-metrics, so ``josef configs --entity-type client-metrics`` shows and
changes it too. An empty ``--metrics``, ``--interval`` or ``--match`` value
removes that config, as in Kafka's tool; ``--delete`` removes them all, which
deletes the subscription.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import click

from josef_client.commands.common import (
    Group,
    admin_client,
    bootstrap_option,
    command_config_option,
    run,
)

_SELECTORS = ("client_id", "client_instance_id", "client_software_name", "client_software_version",
              "client_source_address", "client_source_port")


@click.group("client-metrics", cls=Group, actions=("alter", "delete", "describe", "list"))
def client_metrics() -> None:
    """Manage client-metrics subscriptions (kafka-client-metrics): which metrics clients push, and how often.

    Kafka's spelling works too: josef client-metrics --list --bootstrap-server ...
    """


def _joined(values: tuple[str, ...]) -> str | None:
    """Repeated or comma-separated values as one list config (None when the flag was not given)."""
    return ",".join(values) if values else None


@client_metrics.command()
@bootstrap_option
@command_config_option
@click.option("--name", help="Name of the client metrics configuration resource.")
@click.option("--generate-name", is_flag=True, help="Generate a UUID to use as the name.")
@click.option("--metrics", multiple=True, metavar="M1,M2", help="Telemetry metric name prefixes ('*': every metric).")
@click.option("--interval", type=int, metavar="MS", help="The metrics push interval in milliseconds.")
@click.option("--match", multiple=True, metavar="K1=V1,K2=V2",
              help=f"Matching selectors 'k1=v1,k2=v2' (regexes); selector names: {', '.join(_SELECTORS)}.")
def alter(bootstrap_server: str, command_config: Path | None, name: str | None, generate_name: bool,
          metrics: tuple[str, ...], interval: int | None, match: tuple[str, ...]) -> None:
    """Create or change a subscription: its metrics, push interval and client match."""
    from josef.metadata.records import uuid_to_text
    from josef_client.admin import AlterConfigOp, AlterOp, ConfigResource

    if (name is None) == (not generate_name):
        raise click.ClickException("One of --name or --generate-name must be specified with --alter.")
    entity = name if name is not None else uuid_to_text(uuid.uuid4())
    wanted = {"interval.ms": None if interval is None else str(interval), "metrics": _joined(metrics),
              "match": _joined(match)}
    ops = [AlterConfigOp(key, value, AlterOp.SET if value else AlterOp.DELETE)
           for key, value in wanted.items() if value is not None]

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            await admin.alter_configs({ConfigResource.client_metrics(entity): ops})

    run(go())
    click.echo(f"Altered client metrics config for {entity}.")


@client_metrics.command()
@bootstrap_option
@command_config_option
@click.option("--name", help="Name of the client metrics configuration resource.")
def delete(bootstrap_server: str, command_config: Path | None, name: str | None) -> None:
    """Delete a subscription (every config of its resource)."""
    from josef_client.admin import AlterConfigOp, AlterOp, ConfigResource

    if name is None:
        raise click.ClickException("A client metrics resource name must be specified with --delete.")
    resource = ConfigResource.client_metrics(name)

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            configs = (await admin.describe_configs([resource], include_synonyms=False))[resource]
            await admin.alter_configs({resource: [AlterConfigOp(key, None, AlterOp.DELETE) for key in configs]})

    run(go())
    click.echo(f"Deleted client metrics config for {name}.")


@client_metrics.command()
@bootstrap_option
@command_config_option
@click.option("--name", help="Name of the client metrics configuration resource (all of them when left out).")
def describe(bootstrap_server: str, command_config: Path | None, name: str | None) -> None:
    """Show the configs of one subscription, or of every one."""
    from josef_client.admin import ConfigResource, ResourceType

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            if name is not None:
                resources = [ConfigResource.client_metrics(name)]
            else:
                resources = await admin.list_config_resources([ResourceType.CLIENT_METRICS])
            described = await admin.describe_configs(resources, include_synonyms=False) if resources else {}
        lines = []
        for resource in resources:
            lines.append(f"Client metrics configs for {resource.name} are:")
            lines += [f"  {entry.name}={entry.value}" for entry in sorted(described[resource].values(),
                                                                            key=lambda e: e.name)]
        return lines

    for line in run(go()):
        click.echo(line)


@client_metrics.command("list")
@bootstrap_option
@command_config_option
def list_(bootstrap_server: str, command_config: Path | None) -> None:
    """List the subscriptions' names."""
    from josef_client.admin import ResourceType

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            return [r.name for r in await admin.list_config_resources([ResourceType.CLIENT_METRICS])]

    click.echo("\n".join(run(go())))
