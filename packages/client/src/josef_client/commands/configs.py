"""``josef configs``: describe and change topic and broker configs and users' SCRAM credentials, as ``kafka-configs.sh`` does.

``--add-config`` takes Kafka's syntax, ``k1=v1,k2=[a,b,c]`` (square brackets
around a value that contains commas); ``--delete-config`` takes ``k1,k2``.
Changes are incremental: other overrides stay as they were.

For ``--entity-type users`` the configs are SCRAM credentials:
``SCRAM-SHA-512=[iterations=8192,password=alice-secret]`` (4096 iterations
when left out) sets one, ``--delete-config SCRAM-SHA-512`` removes it. As
Kafka's ConfigCommand does, the tool salts the password here (a random salt)
and sends the salted password in AlterUserScramCredentials: the password
never crosses the network. The controller takes one change per user and
request, as Kafka's does, so two mechanisms are set with two commands.
"""

from __future__ import annotations

import re
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

ENTITY_TYPES = {"topics": "topics", "topic": "topics", "brokers": "brokers", "broker": "brokers",
                "users": "users", "user": "users"}
#: Kafka's ConfigCommand pattern of a SCRAM credential's value.
_SCRAM_VALUE = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.S)
#: Kafka's user quota configs (QuotaConfig): josef configs does not alter them yet.
_USER_QUOTAS = {"producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"}


@click.group("configs", cls=Group, actions=("describe", "alter"))
def configs() -> None:
    """Describe and alter topic and broker configs and users' SCRAM credentials (kafka-configs).

    Kafka's spelling works too: josef configs --describe --entity-type topics ...
    """


def entity_options(func):  # type: ignore[no-untyped-def]
    for option in reversed([
        bootstrap_option,
        command_config_option,
        click.option("--entity-type", type=click.Choice(sorted(ENTITY_TYPES), case_sensitive=False),
                     help="topics, brokers or users."),
        click.option("--entity-name", help="A topic name, broker id or user (describe: all of them when left out)."),
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
    if kind == "users" and entity_default:
        raise click.ClickException("The use of --entity-default or --user-defaults is not allowed with User SCRAM "
                                   "Credentials using --bootstrap-server.")
    if entity_default:
        if kind != "brokers":
            raise click.ClickException("--entity-default is only for --entity-type brokers")
        if entity_name is not None:
            raise click.ClickException("--entity-name and --entity-default cannot be combined")
        return kind, ""
    if entity_name is not None:
        if kind == "brokers" and not entity_name.strip().isdigit():
            raise click.ClickException(f"the entity name for brokers must be a broker id, not {entity_name!r}")
        if kind in ("topics", "users") and not entity_name:
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
    if kind == "users":
        for line in run(_describe_scram(bootstrap_server, command_config, name)):
            click.echo(line)
        return

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
    if kind == "users":
        alterations = scram_alterations(name, added, deleted)  # refused before connecting, as Kafka's tool does
        run(_alter_scram(bootstrap_server, command_config, alterations))
        click.echo(f"Completed updating config for user {name}.")
        return
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


async def _describe_scram(bootstrap_server: str, command_config: Path | None, user: str | None) -> list[str]:
    """Kafka's lines: one per user with a credential (a user without one prints nothing), mechanisms by type."""
    async with admin_client(bootstrap_server, command_config) as admin:
        described = await admin.describe_user_scram_credentials(None if user is None else [user])
    lines = []
    for name, infos in sorted(described.items()):
        if isinstance(infos, Exception):
            lines.append(f"Error retrieving SCRAM credential configs for user-principal '{name}': {infos}")
        else:
            text = ", ".join(f"{info.mechanism}=iterations={info.iterations}" for info in infos)
            lines.append(f"SCRAM credential configs for user-principal '{name}' are {text}")
    return lines


def scram_alterations(user: str, added: dict[str, str], deleted: list[str]) -> list:  # type: ignore[type-arg]
    """Kafka's ConfigCommand checks of users' configs, then the upsertions and deletions they ask for."""
    from josef import scram
    from josef_client.admin import ScramCredentialDeletion, ScramCredentialUpsertion

    quotas = sorted(k for k in [*added, *deleted] if k in _USER_QUOTAS)
    if quotas:
        raise click.ClickException(f"josef configs does not alter user quotas yet: {', '.join(quotas)}")
    for verb, keys in (("added", list(added)), ("deleted", deleted)):
        unknown = [k for k in keys if k not in scram.BY_NAME]
        if unknown:
            raise click.ClickException(f"Only quota and SCRAM credential configs can be {verb} for 'users' using "
                                       f"--bootstrap-server. Unexpected config names: Set({', '.join(unknown)})")
    alterations: list = [ScramCredentialDeletion(user, mechanism) for mechanism in deleted]  # type: ignore[type-arg]
    for mechanism, value in added.items():
        match = _SCRAM_VALUE.fullmatch(value)
        if match is None:  # the value is not shown: it holds the password
            raise click.ClickException(f"Invalid credential property {mechanism}: expected "
                                       f"[iterations=<n>,]password=<password>")
        iterations = int(match[1]) if match[1] not in (None, "", "-1") else scram.DEFAULT_ITERATIONS
        if iterations < scram.MIN_ITERATIONS:
            raise click.ClickException(f"Iterations {iterations} is less than the minimum {scram.MIN_ITERATIONS} "
                                       f"required for {mechanism}")
        alterations.append(ScramCredentialUpsertion(user, mechanism, match[2], iterations))
    return alterations


async def _alter_scram(bootstrap_server: str, command_config: Path | None, alterations: list) -> None:  # type: ignore[type-arg]
    async with admin_client(bootstrap_server, command_config) as admin:
        await admin.alter_user_scram_credentials(alterations)
