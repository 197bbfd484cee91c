"""``josef configs``: topic, broker and client-metrics configs, client quotas and users' SCRAM credentials, as ``kafka-configs.sh`` does.

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

For ``users``, ``clients`` and ``ips`` the configs are also client quotas
(``producer_byte_rate``, ``consumer_byte_rate``, ``request_percentage``,
``controller_mutation_rate``; ``connection_creation_rate`` for ips), kept by
AlterClientQuotas. A user and a client id combine, as in Kafka:
``--entity-type users --entity-name alice --entity-type clients --entity-name app``
(names go to the types in order; ``--entity-default`` gives the remaining
type its default entity), or ``--user alice --client-defaults``.

For ``--entity-type client-metrics`` (or ``--client-metrics NAME``) the
configs are a client-metrics subscription's (KIP-714: ``metrics``,
``interval.ms``, ``match``), what ``josef client-metrics`` manages.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from josef_client.commands.common import (
    Group,
    admin_client,
    bootstrap_option,
    command_config_option,
    run,
)

if TYPE_CHECKING:
    from josef_client.admin import AsyncAdmin, ConfigEntry, ConfigResource, QuotaEntity

ENTITY_TYPES = {"topics": "topics", "topic": "topics", "brokers": "brokers", "broker": "brokers",
                "users": "users", "user": "users", "clients": "clients", "client": "clients", "ips": "ips", "ip": "ips",
                "client-metrics": "client-metrics"}
#: The client quota entity type of each of the tool's quota entity kinds.
QUOTA_ENTITY_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
#: Kafka's ConfigCommand pattern of a SCRAM credential's value.
_SCRAM_VALUE = re.compile(r"(?:iterations=(-?[0-9]*),)?password=(.*)", re.S)
#: Kafka's user and client-id quota configs (QuotaConfig), and the ip ones.
_CLIENT_QUOTAS = {"producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"}
_IP_QUOTAS = {"connection_creation_rate"}


@click.group("configs", cls=Group, actions=("describe", "alter"))
def configs() -> None:
    """Describe and alter topic, broker and client-metrics configs, client quotas and users' SCRAM credentials (kafka-configs).

    Kafka's spelling works too: josef configs --describe --entity-type topics ...
    """


def entity_options(func):  # type: ignore[no-untyped-def]
    for option in reversed([
        bootstrap_option,
        command_config_option,
        click.option("--entity-type", "entity_types", multiple=True,
                     type=click.Choice(sorted(ENTITY_TYPES), case_sensitive=False),
                     help="topics, brokers, users, clients, ips or client-metrics (users and clients together for a "
                          "user's client)."),
        click.option("--entity-name", "entity_names", multiple=True,
                     help="A topic name, broker id, user, client id, ip or client-metrics resource name, for the entity "
                          "types in order (describe: all of them when left out)."),
        click.option("--entity-default", is_flag=True,
                     help="The default entity of the type without a name (brokers, users, clients or ips)."),
        click.option("--topic", "topic_name", help="Shorthand for --entity-type topics --entity-name TOPIC."),
        click.option("--broker", "broker_name", help="Shorthand for --entity-type brokers --entity-name ID."),
        click.option("--user", "user_name", help="Shorthand for --entity-type users --entity-name USER."),
        click.option("--client", "client_name", help="Shorthand for --entity-type clients --entity-name CLIENT_ID."),
        click.option("--ip", "ip_name", help="Shorthand for --entity-type ips --entity-name IP."),
        click.option("--client-metrics", "client_metrics_name",
                     help="Shorthand for --entity-type client-metrics --entity-name NAME."),
        click.option("--user-defaults", is_flag=True, help="Shorthand for --entity-type users --entity-default."),
        click.option("--client-defaults", is_flag=True, help="Shorthand for --entity-type clients --entity-default."),
        click.option("--ip-defaults", is_flag=True, help="Shorthand for --entity-type ips --entity-default."),
    ]):
        func = option(func)
    return func


Entity = tuple[str, "str | None"]


def _entities(options: dict) -> list[Entity]:  # type: ignore[type-arg]
    """The entities the options name, as Kafka's ConfigCommand reads them: ``(kind, name)`` with name "" for a
    default entity and None for all of them (describe)."""
    flags = [(kind, name) for kind, name in (("topics", options["topic_name"]), ("brokers", options["broker_name"]),
                                             ("users", options["user_name"]), ("clients", options["client_name"]),
                                             ("ips", options["ip_name"]),
                                             ("client-metrics", options["client_metrics_name"])) if name is not None]
    flags += [(kind, "") for kind, flag in (("users", options["user_defaults"]), ("clients", options["client_defaults"]),
                                            ("ips", options["ip_defaults"])) if flag]
    types, names = [ENTITY_TYPES[t.lower()] for t in options["entity_types"]], list(options["entity_names"])
    if flags and (types or names or options["entity_default"]):
        raise click.ClickException("--entity-{type,name,default} should not be used in conjunction with specific "
                                   "entity flags")
    if flags:
        entities: list[Entity] = flags
    else:
        if not types:
            raise click.ClickException("At least one entity type must be specified")
        if len(names) > len(types):
            raise click.ClickException("More entity names specified than entity types")
        if options["entity_default"] and len(names) == len(types):
            raise click.ClickException("--entity-default names the default entity of a type given no --entity-name")
        entities = [(t, names[i] if i < len(names) else "" if options["entity_default"] else None)
                    for i, t in enumerate(types)]
    kinds = [k for k, _ in entities]
    if len(set(kinds)) != len(kinds):
        raise click.ClickException(f"Duplicate entity type(s) specified: {', '.join(sorted(set(k for k in kinds if kinds.count(k) > 1)))}")
    if len(kinds) > 1 and set(kinds) != {"users", "clients"}:
        raise click.ClickException("Only 'users' and 'clients' entity types may be specified together")
    for kind, name in entities:
        if name == "" and kind in ("topics", "client-metrics"):
            raise click.ClickException(f"--entity-default is not for {kind}")
        if name is not None and name != "":
            if kind == "brokers" and not name.strip().isdigit():
                raise click.ClickException(f"the entity name for brokers must be a broker id, not {name!r}")
    return [(k, n.strip() if k == "brokers" and n else n) for k, n in entities]


def _resource(kind: str, name: str) -> ConfigResource:
    from josef_client.admin import ConfigResource

    if kind == "client-metrics":
        return ConfigResource.client_metrics(name)
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
    if kind == "client-metrics":
        from josef_client.admin import ResourceType

        return [r.name for r in await admin.list_config_resources([ResourceType.CLIENT_METRICS])]
    cluster = await admin.describe_cluster()
    return [str(b.node_id) for b in cluster.brokers] + [""]


@configs.command()
@entity_options
@click.option("--all", "all_", is_flag=True, help="Every config, not only the dynamic overrides.")
def describe(bootstrap_server: str, command_config: Path | None, all_: bool, **options: Any) -> None:
    """Describe the configs of topics, brokers or client-metrics resources (the dynamic overrides, or with --all
    every config), or client quotas and users' SCRAM credentials."""
    entities = _entities(options)
    kind, name = entities[0]
    if kind in QUOTA_ENTITY_TYPES:
        lines = run(_describe_quotas(bootstrap_server, command_config, entities))
        if [k for k, _ in entities] == ["users"] and name != "":
            lines += run(_describe_scram(bootstrap_server, command_config, name))
        for line in lines:
            click.echo(line)
        return
    from josef_client.admin import ConfigSource

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            names = await _names(admin, kind, name)
            resources = [_resource(kind, n) for n in names]
            described = await admin.describe_configs(resources, include_synonyms=True)
        lines = []
        for n, resource in zip(names, resources):
            if kind == "topics":
                dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG
            elif kind == "client-metrics":
                dynamic = ConfigSource.CLIENT_METRICS_CONFIG
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
def alter(bootstrap_server: str, command_config: Path | None, add_configs: tuple[str, ...],
          delete_configs: tuple[str, ...], **options: Any) -> None:
    """Set (--add-config) or remove (--delete-config) config overrides of a topic, broker or client-metrics
    resource, client quotas, or a user's SCRAM credentials."""
    from josef_client.admin import AlterConfigOp, AlterOp

    entities = _entities(options)
    kind, name = entities[0]
    if any(n is None for _, n in entities):
        raise click.ClickException("An entity name must be specified for every entity type")
    assert name is not None
    added: dict[str, str] = {}
    for text in add_configs:
        added.update(parse_add_config(text))
    deleted = [k.strip() for text in delete_configs for k in text.split(",") if k.strip()]
    if not added and not deleted:
        raise click.ClickException("give --add-config or --delete-config (or both)")
    both = sorted(set(added) & set(deleted))
    if both:
        raise click.ClickException(f"config(s) both added and deleted: {', '.join(both)}")
    if kind in QUOTA_ENTITY_TYPES:
        # Refused before connecting, as Kafka's tool does.
        scram_changes = quota_or_scram(entities, added, deleted)
        if scram_changes is not None:
            run(_alter_scram(bootstrap_server, command_config, scram_changes))
        else:
            run(_alter_quotas(bootstrap_server, command_config, entities, added, deleted))
        click.echo(f"Completed updating config for {kind[:-1]} {name}." if name
                   else f"Completed updating default config for {kind} in the cluster.")
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


def _quota_entity(entities: list[Entity]) -> QuotaEntity:
    return tuple(sorted((QUOTA_ENTITY_TYPES[k], n or None) for k, n in entities))


def quota_or_scram(entities: list[Entity], added: dict[str, str], deleted: list[str]) -> list | None:  # type: ignore[type-arg]
    """Kafka's ConfigCommand checks of users', clients' and ips' configs: the SCRAM changes they ask for, or None
    when they are quota changes."""
    kinds = [k for k, _ in entities]
    from josef import scram

    keys = [*added, *deleted]
    if kinds == ["ips"]:
        unknown = [k for k in keys if k not in _IP_QUOTAS]
        if unknown:
            raise click.ClickException(f"Only connection quota configs can be added for 'ips' using "
                                       f"--bootstrap-server. Unexpected config names: {','.join(unknown)}")
        return None
    if "clients" in kinds:
        for verb, some in (("added", list(added)), ("deleted", deleted)):
            unknown = [k for k in some if k not in _CLIENT_QUOTAS]
            if unknown:
                raise click.ClickException(f"Only quota configs can be {verb} for 'clients' using --bootstrap-server. "
                                           f"Unexpected config names: Set({', '.join(unknown)})")
        return None
    for verb, some in (("added", list(added)), ("deleted", deleted)):
        unknown = [k for k in some if k not in scram.BY_NAME and k not in _CLIENT_QUOTAS]
        if unknown:
            raise click.ClickException(f"Only quota and SCRAM credential configs can be {verb} for 'users' using "
                                       f"--bootstrap-server. Unexpected config names: Set({', '.join(unknown)})")
    if not any(k in scram.BY_NAME for k in keys):
        return None
    if entities[0][1] == "":
        raise click.ClickException("The use of --entity-default or --user-defaults is not allowed with User SCRAM "
                                   "Credentials using --bootstrap-server.")
    if any(k in _CLIENT_QUOTAS for k in keys):
        raise click.ClickException("Cannot alter both quota and SCRAM credential configs simultaneously for 'users' "
                                   "using --bootstrap-server.")
    return scram_alterations(entities[0][1] or "", added, deleted)


async def _alter_quotas(bootstrap_server: str, command_config: Path | None, entities: list[Entity],
                        added: dict[str, str], deleted: list[str]) -> None:
    values: dict[str, float | None] = {k: None for k in deleted}
    for key, text in added.items():
        try:
            values[key] = float(text)
        except ValueError:
            raise click.ClickException(f"Invalid value {text!r} for quota {key}: a number is expected") from None
    async with admin_client(bootstrap_server, command_config) as admin:
        await admin.alter_client_quotas({_quota_entity(entities): values})


async def _describe_quotas(bootstrap_server: str, command_config: Path | None, entities: list[Entity]) -> list[str]:
    """Kafka's lines, one per entity with quotas: ``Quota configs for user-principal 'alice', client-id 'app' are
    producer_byte_rate=1024.0``."""
    from josef_client.admin import QuotaFilterComponent

    components = [QuotaFilterComponent(QUOTA_ENTITY_TYPES[k], name=n or None, default=n == "") for k, n in entities]
    async with admin_client(bootstrap_server, command_config) as admin:
        described = await admin.describe_client_quotas(components, strict=True)
    words = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
    lines = []
    for entity, values in sorted(described.items(), key=lambda item: repr(item[0])):
        parts = {t: f"{words[t]} '{n}'" if n is not None else f"the default {words[t]}" for t, n in entity}
        who = ", ".join(parts[t] for t in ("user", "client-id", "ip") if t in parts)
        lines.append(f"Quota configs for {who} are " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return lines


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
