"""``josef configs``: describe and change topic and broker configs, as ``kafka-configs.sh`` does.

``--add-config`` takes Kafka's syntax, ``k1=v1,k2=[a,b,c]`` (square brackets
around a value that contains commas); ``--delete-config`` takes ``k1,k2``.
Changes are incremental: other overrides stay as they were.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from josef_client.commands.common import (
    Group,
    admin_client,
    bootstrap_option,
    command_config_option,
    run,
)

if TYPE_CHECKING:
    from josef_client.admin import AsyncAdmin, ConfigEntry, ConfigResource

ENTITY_TYPES = {"topics": "topics", "topic": "topics", "brokers": "brokers", "broker": "brokers"}


@click.group("configs", cls=Group, actions=("describe", "alter"))
def configs() -> None:
    """Describe and alter topic and broker configs (kafka-configs).

    Kafka's spelling works too: josef configs --describe --entity-type topics ...
    """


def entity_options(func):  # type: ignore[no-untyped-def]
    for option in reversed([
        bootstrap_option,
        command_config_option,
        click.option("--entity-type", type=click.Choice(sorted(ENTITY_TYPES), case_sensitive=False),
                     help="topics or brokers."),
        click.option("--entity-name", help="A topic name or broker id (describe: all of them when left out)."),
        click.option("--entity-default", is_flag=True, help="The cluster-wide default of brokers."),
        click.option("--topic", "topic_name", help="Shorthand for --entity-type topics --entity-name TOPIC."),
        click.option("--broker", "broker_name", help="Shorthand for --entity-type brokers --entity-name ID."),
    ]):
        func = option(func)
    return func


def _entity(entity_type: str | None, entity_name: str | None, entity_default: bool, topic_name: str | None,
            broker_name: str | None) -> tuple[str, str | None]:
    """(``topics``|``brokers``, name, "" for the broker default, or None for all of them)."""
    shorthands = [(t, n) for t, n in (("topics", topic_name), ("brokers", broker_name)) if n is not None]
    if len(shorthands) > 1 or (shorthands and (entity_type or entity_name is not None)):
        raise click.ClickException("give the entity once: --entity-type with --entity-name, or --topic, or --broker")
    if shorthands:
        entity_type, entity_name = shorthands[0]
    if entity_type is None:
        raise click.ClickException("--entity-type is required (topics or brokers)")
    kind = ENTITY_TYPES[entity_type.lower()]
    if entity_default:
        if kind != "brokers":
            raise click.ClickException("--entity-default is only for --entity-type brokers")
        if entity_name is not None:
            raise click.ClickException("--entity-name and --entity-default cannot be combined")
        return kind, ""
    if entity_name is not None:
        if kind == "brokers" and not entity_name.strip().isdigit():
            raise click.ClickException(f"the entity name for brokers must be a broker id, not {entity_name!r}")
        if kind == "topics" and not entity_name:
            raise click.ClickException("--entity-name must not be empty")
        entity_name = entity_name.strip() if kind == "brokers" else entity_name
    return kind, entity_name


def _resource(kind: str, name: str) -> ConfigResource:
    from josef_client.admin import ConfigResource

    return ConfigResource.topic(name) if kind == "topics" else ConfigResource.broker(name)


def _title(kind: str, name: str) -> str:
    if kind == "brokers" and name == "":
        return "brokers in the cluster"
    return f"{kind[:-1]} {name}"


def parse_add_config(text: str) -> dict[str, str]:
    """Kafka's ``k1=v1,k2=[v1,v2]``: commas split pairs except inside square brackets."""
    pairs, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(0, depth - 1)
        if char == "," and depth == 0:
            pairs.append("".join(current))
            current = []
        else:
            current.append(char)
    pairs.append("".join(current))
    result = {}
    for pair in pairs:
        if not pair.strip():
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.ClickException(f"invalid --add-config entry {pair!r}: expected KEY=VALUE")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        result[key.strip()] = value
    return result


def format_entry(entry: ConfigEntry) -> str:
    """Kafka's line for one config: value, whether it is sensitive, and where it could come from."""
    value = "null" if entry.is_sensitive or entry.value is None else entry.value
    synonyms = ", ".join(f"{s.source.name}:{s.name}={'null' if entry.is_sensitive or s.value is None else s.value}"
                         for s in entry.synonyms)
    return f"  {entry.name}={value} sensitive={str(entry.is_sensitive).lower()} synonyms={{{synonyms}}}"


async def _names(admin: AsyncAdmin, kind: str, name: str | None) -> list[str]:
    if name is not None:
        return [name]
    if kind == "topics":
        return list(await admin.list_topics(include_internal=True))
    cluster = await admin.describe_cluster()
    return [str(b.node_id) for b in cluster.brokers] + [""]


@configs.command()
@entity_options
@click.option("--all", "all_", is_flag=True, help="Every config, not only the dynamic overrides.")
def describe(bootstrap_server: str, command_config: Path | None, entity_type: str | None, entity_name: str | None,
             entity_default: bool, topic_name: str | None, broker_name: str | None, all_: bool) -> None:
    """Describe the configs of topics or brokers: the dynamic overrides, or with --all every config."""
    from josef_client.admin import ConfigSource

    kind, name = _entity(entity_type, entity_name, entity_default, topic_name, broker_name)

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            names = await _names(admin, kind, name)
            resources = [_resource(kind, n) for n in names]
            described = await admin.describe_configs(resources, include_synonyms=True)
        lines = []
        for n, resource in zip(names, resources):
            if kind == "topics":
                dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG
            elif n == "":
                dynamic = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
            else:
                dynamic = ConfigSource.DYNAMIC_BROKER_CONFIG
            if n == "" and kind == "brokers":
                lines.append(f"{'All' if all_ else 'Default'} configs for brokers in the cluster are:")
            else:
                lines.append(f"{'All' if all_ else 'Dynamic'} configs for {_title(kind, n)} are:")
            for entry in sorted(described[resource].values(), key=lambda e: e.name):
                if all_ or entry.source == dynamic:
                    lines.append(format_entry(entry))
        return lines

    for line in run(go()):
        click.echo(line)


@configs.command()
@entity_options
@click.option("--add-config", "add_configs", multiple=True, metavar="K=V,K2=[A,B]",
              help="Configs to set, Kafka's syntax (repeatable).")
@click.option("--delete-config", "delete_configs", multiple=True, metavar="K1,K2",
              help="Overrides to remove (repeatable, or comma-separated).")
def alter(bootstrap_server: str, command_config: Path | None, entity_type: str | None, entity_name: str | None,
          entity_default: bool, topic_name: str | None, broker_name: str | None, add_configs: tuple[str, ...],
          delete_configs: tuple[str, ...]) -> None:
    """Set (--add-config) or remove (--delete-config) config overrides of a topic or broker."""
    from josef_client.admin import AlterConfigOp, AlterOp

    kind, name = _entity(entity_type, entity_name, entity_default, topic_name, broker_name)
    if name is None:
        raise click.ClickException(f"--entity-name{' or --entity-default' if kind == 'brokers' else ''} is required to alter {kind}")
    added: dict[str, str] = {}
    for text in add_configs:
        added.update(parse_add_config(text))
    deleted = [k.strip() for text in delete_configs for k in text.split(",") if k.strip()]
    if not added and not deleted:
        raise click.ClickException("give --add-config or --delete-config (or both)")
    both = sorted(set(added) & set(deleted))
    if both:
        raise click.ClickException(f"config(s) both added and deleted: {', '.join(both)}")
    resource = _resource(kind, name)

    async def go() -> None:
        async with admin_client(bootstrap_server, command_config) as admin:
            if deleted:
                current = (await admin.describe_configs([resource], keys=deleted, include_synonyms=False))[resource]
                unknown = [k for k in deleted if k not in current]
                if unknown:
                    raise click.ClickException(f"invalid config(s): {', '.join(unknown)}")
            ops = [AlterConfigOp(k, v, AlterOp.SET) for k, v in added.items()]
            ops += [AlterConfigOp(k, None, AlterOp.DELETE) for k in deleted]
            await admin.alter_configs({resource: ops})

    run(go())
    if kind == "brokers" and name == "":
        click.echo("Completed updating default config for brokers in the cluster.")
    else:
        click.echo(f"Completed updating config for {_title(kind, name)}.")
