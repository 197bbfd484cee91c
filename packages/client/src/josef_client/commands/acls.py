"""``josef acls``: add, remove and list ACLs, with the flags, checks and output of Kafka 4.x's ``kafka-acls.sh``.

Scripts written for ``kafka-acls.sh`` should work unchanged, and people
who read its output should find the same lines, so the words are Kafka's
(``AclCommand``, ``ResourcePattern.toString``, ``AccessControlEntry.toString``)::

    josef acls --bootstrap-server localhost:9092 --add --allow-principal User:alice --operation Read --topic orders
    josef acls --bootstrap-server localhost:9092 --add --allow-principal User:bob --producer --topic orders --idempotent
    josef acls --bootstrap-server localhost:9092 --list --topic orders
    josef acls --bootstrap-server localhost:9092 --remove --force --topic orders

Where Kafka prints in hash order, josef sorts (resources by type, name and
pattern type; entries by principal, host, operation and permission), so the
output is the same on every run. Refusals are Kafka's messages as one
``Error:`` line on stderr with exit status 1, like josef's other tools.
``--bootstrap-controller`` is not offered: josef's admin client talks to
brokers only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import click

from josef.acls import (
    SUPPORTED_OPERATIONS,
    WILDCARD,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from josef_client.commands.common import (
    Command,
    admin_client,
    bootstrap_option,
    command_config_option,
    principals,
    run,
)

if TYPE_CHECKING:
    from josef_client.admin import AsyncAdmin

#: The name of the one CLUSTER resource.
CLUSTER_NAME = "kafka-cluster"


def _pascal(name: str) -> str:
    """Kafka's ``SecurityUtils.toPascalCase``: IDEMPOTENT_WRITE is IdempotentWrite."""
    return "".join(part.capitalize() for part in name.split("_"))


#: Operation names as Kafka's tool takes them: ``Read`` or ``READ``, ``IdempotentWrite`` or ``IDEMPOTENTWRITE``
#: (josef also takes ``IDEMPOTENT_WRITE``); anything else is UNKNOWN, which no resource type supports.
OPERATION_NAMES: dict[str, AclOperation] = {
    spelling: op for op in AclOperation for spelling in (_pascal(op.name), _pascal(op.name).upper(), op.name)}


def operation(name: str) -> AclOperation:
    """An ``--operation`` value as Kafka's ``SecurityUtils.operation`` reads it (UNKNOWN when it is none)."""
    name = name.strip()
    return OPERATION_NAMES.get(name, OPERATION_NAMES.get(name.upper(), AclOperation.UNKNOWN))


@attrs.frozen(order=True)
class Resource:
    """Kafka's ``ResourcePattern`` (or, with ANY or MATCH, ``ResourcePatternFilter``), printed as Kafka prints it."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType

    def __str__(self) -> str:
        return (f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
                f"patternType={self.pattern_type.name})")


@attrs.frozen(order=True)
class Entry:
    """Kafka's ``AccessControlEntry``: who, from where, what, allowed or denied."""

    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
                f"permissionType={self.permission_type.name})")


def binding(resource: Resource, entry: Entry) -> AclBinding:
    return AclBinding(resource.resource_type, resource.name, resource.pattern_type, entry.principal, entry.host,
                      entry.operation, entry.permission_type)


def split(acl: AclBinding) -> tuple[Resource, Entry]:
    return (Resource(acl.resource_type, acl.resource_name, acl.pattern_type),
            Entry(acl.principal, acl.host, acl.operation, acl.permission_type))


@attrs.frozen
class Flags:
    """What was given on the command line, as Kafka's ``AclCommandOptions`` sees it (empty tuple: not given)."""

    action: str
    topics: tuple[str, ...] = ()
    cluster: bool = False
    groups: tuple[str, ...] = ()
    transactional_ids: tuple[str, ...] = ()
    delegation_tokens: tuple[str, ...] = ()
    user_principals: tuple[str, ...] = ()
    pattern_type: PatternType = PatternType.LITERAL
    operations: tuple[str, ...] = ()
    allow_principals: tuple[str, ...] = ()
    deny_principals: tuple[str, ...] = ()
    list_principals: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_hosts: tuple[str, ...] = ()
    producer: bool = False
    consumer: bool = False
    idempotent: bool = False
    force: bool = False

    def check(self) -> None:
        """Kafka's ``checkArgs``: combinations the tool refuses before it connects."""
        if self.action == "list":
            for flag, given in (("producer", self.producer), ("consumer", self.consumer),
                                ("allow-host", self.allow_hosts), ("allow-principal", self.allow_principals),
                                ("deny-host", self.deny_hosts), ("deny-principal", self.deny_principals)):
                if given:
                    fail(f'Option "[list]" can\'t be used with option "[{flag}]"')
        for role, used in (("producer", self.producer), ("consumer", self.consumer)):
            for flag, given in (("operation", self.operations), ("deny-principal", self.deny_principals),
                                ("deny-host", self.deny_hosts)):
                if used and given:
                    fail(f'Option "[{role}]" can\'t be used with option "[{flag}]"')
        if self.list_principals and self.action != "list":
            fail("The --principal option is only available if --list is set")
        if self.producer and not self.topics:
            fail("With --producer you must specify a --topic")
        if self.idempotent and not self.producer:
            fail("The --idempotent option is only available if --producer is set")
        if self.consumer and (not self.topics or not self.groups or (
                not self.producer and (self.cluster or self.transactional_ids))):
            fail("With --consumer you must specify a --topic and a --group and no --cluster or --transactional-id "
                 "option should be specified.")


def fail(message: str) -> None:
    raise click.ClickException(message)


def resources(flags: Flags, die_if_none: bool = True) -> list[Resource]:
    """The resources the flags name (Kafka's ``getResourceFilter``); the cluster only with a LITERAL pattern type."""
    pattern = flags.pattern_type
    found = [Resource(ResourceType.TOPIC, t.strip(), pattern) for t in flags.topics]
    if pattern == PatternType.LITERAL and (flags.cluster or flags.idempotent):
        found.append(Resource(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL))
    found += [Resource(ResourceType.GROUP, g.strip(), pattern) for g in flags.groups]
    found += [Resource(ResourceType.TRANSACTIONAL_ID, t, pattern) for t in flags.transactional_ids]
    found += [Resource(ResourceType.DELEGATION_TOKEN, t.strip(), pattern) for t in flags.delegation_tokens]
    found += [Resource(ResourceType.USER, u.strip(), pattern) for u in flags.user_principals]
    if not found and die_if_none:
        fail("You must provide at least one resource: --topic <topic> or --cluster or --group <group> "
             "or --delegation-token <Delegation Token ID>")
    return list(dict.fromkeys(found))


def entries(flags: Flags, operations: Iterable[AclOperation]) -> set[Entry]:
    """Every allowed principal × operation × allowed host, and the same for denials (Kafka's ``getAcl``).

    A host list defaults to ``*`` when its principals are given.
    """
    ops = set(operations)
    result = set()
    for permission, names, hosts in ((AclPermissionType.ALLOW, flags.allow_principals, flags.allow_hosts),
                                     (AclPermissionType.DENY, flags.deny_principals, flags.deny_hosts)):
        chosen_hosts = {h.strip() for h in hosts} or ({WILDCARD} if names else set())
        result |= {Entry(p, h, op, permission) for p in principals(names) for op in ops for h in chosen_hosts}
    return result


def resource_to_entries(flags: Flags) -> dict[Resource, set[Entry]]:
    """The entries to add or remove on each resource (Kafka's ``getResourceFilterToAcls``).

    ``--producer`` is WRITE, DESCRIBE and CREATE on its topics, WRITE and
    DESCRIBE on its transactional ids and, with ``--idempotent``,
    IDEMPOTENT_WRITE on the cluster; ``--consumer`` is READ and DESCRIBE on
    its topics and READ on its groups. Both may be given together.
    """
    plan: dict[Resource, set[Entry]] = {}
    if not flags.producer and not flags.consumer:
        wanted = entries(flags, (operation(n) for n in flags.operations or ("All",)))
        plan.update({r: set(wanted) for r in resources(flags)})
    if flags.producer:
        for r in resources(flags):
            if r.resource_type == ResourceType.TOPIC:
                plan[r] = entries(flags, (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE))
            elif r.resource_type == ResourceType.TRANSACTIONAL_ID:
                plan[r] = entries(flags, (AclOperation.WRITE, AclOperation.DESCRIBE))
        if flags.idempotent:
            plan[Resource(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)] = entries(
                flags, (AclOperation.IDEMPOTENT_WRITE,))
    if flags.consumer:
        for r in resources(flags):
            if r.resource_type == ResourceType.TOPIC:
                plan[r] = plan.get(r, set()) | entries(flags, (AclOperation.READ, AclOperation.DESCRIBE))
            elif r.resource_type == ResourceType.GROUP:
                plan[r] = plan.get(r, set()) | entries(flags, (AclOperation.READ,))
    for r, acls in plan.items():
        valid = (*SUPPORTED_OPERATIONS[r.resource_type], AclOperation.ALL)
        if any(e.operation not in valid for e in acls):
            fail(f"ResourceType {r.resource_type.name} only supports operations [{', '.join(o.name for o in valid)}]")
    return plan


def resource_lines(verb: str, resource: Resource, acls: Iterable[Entry], sep: str = "") -> str:
    """Kafka's block for one resource: a heading, then one tab-indented entry a line, then an empty line."""
    return f"{verb} for resource `{resource}`:{sep}\n{sep}" + "\n".join(f"\t{e}" for e in sorted(acls)) + "\n"


def listing(by_resource: Mapping[Resource, Iterable[Entry]]) -> list[str]:
    return [resource_lines("Current ACLs", r, acls) for r, acls in sorted(by_resource.items())]


def confirm(flags: Flags, message: str) -> bool:
    """Kafka's prompt: the question on stdout, then a line that must be ``y`` (any case); ``--force`` skips it."""
    if flags.force:
        return True
    click.echo(message)
    return sys.stdin.readline().rstrip("\r\n").lower() == "y"


def plan_to_add(flags: Flags) -> dict[Resource, set[Entry]]:
    """The entries to create on each resource, refusing what Kafka refuses when adding (before connecting)."""
    if flags.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        fail(f"A '--resource-pattern-type' value of '{flags.pattern_type.name}' is not valid when adding acls.")
    plan = resource_to_entries(flags)
    if any(not acls for acls in plan.values()):
        fail("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
    return plan


async def add(admin: AsyncAdmin, plan: Mapping[Resource, set[Entry]]) -> None:
    """Create the entries on each resource; those that exist already are named and left alone (Kafka 4.x)."""
    for resource, acls in sorted(plan.items()):
        existing = set(await admin.describe_acls(
            AclBindingFilter(resource.resource_type, resource.name, resource.pattern_type)))
        new = []
        for entry in sorted(acls):
            acl = binding(resource, entry)
            if acl in existing:
                click.echo(f"Acl (pattern={resource}, entry={entry}) already exists.")
            else:
                new.append(entry)
        if new:
            click.echo(resource_lines("Adding ACLs", resource, new, sep=" "))
            await admin.create_acls([binding(resource, e) for e in new])


async def remove(admin: AsyncAdmin, flags: Flags, plan: Mapping[Resource, set[Entry]]) -> None:
    """Delete the entries from each resource filter, or everything on it when no principal was given."""
    for resource, acls in sorted(plan.items()):
        if not acls:
            question = f"Are you sure you want to delete all ACLs for resource filter `{resource}`? (y/n)"
        else:
            question = ("Are you sure you want to remove ACLs: \n " + "\n".join(f"\t{e}" for e in sorted(acls))
                        + f"\n from resource filter `{resource}`? (y/n)")
        if not confirm(flags, question):
            continue
        if not acls:
            filters = [AclBindingFilter(resource.resource_type, resource.name, resource.pattern_type)]
        else:
            filters = [AclBindingFilter(resource.resource_type, resource.name, resource.pattern_type, e.principal,
                                        e.host, e.operation, e.permission_type) for e in sorted(acls)]
        await admin.delete_acls(filters)


async def list_acls(admin: AsyncAdmin, flags: Flags) -> list[str]:
    """The ACLs of the named resources (all of them when none is named), by resource, or by ``--principal``."""
    filters = [AclBindingFilter(r.resource_type, r.name, r.pattern_type) for r in resources(flags, die_if_none=False)]
    found: set[AclBinding] = set()
    for f in filters or [AclBindingFilter()]:
        found.update(await admin.describe_acls(f))
    by_resource: dict[Resource, set[Entry]] = {}
    for acl in found:
        resource, entry = split(acl)
        by_resource.setdefault(resource, set()).add(entry)
    wanted = principals(flags.list_principals)
    if not wanted:
        return listing(by_resource)
    lines = []
    for principal in dict.fromkeys(wanted):
        lines.append(f"ACLs for principal `{principal}`")
        mine = {r: {e for e in acls if e.principal == principal} for r, acls in by_resource.items()}
        lines += listing({r: acls for r, acls in mine.items() if acls})
    return lines


def _many(flag: str, help_text: str, metavar: str):  # type: ignore[no-untyped-def]
    return click.option(flag, multiple=True, metavar=metavar, help=help_text + " (repeatable)")


@click.command("acls", cls=Command)
@bootstrap_option
@command_config_option
@click.option("--add", "add_", is_flag=True, help="Add ACLs.")
@click.option("--remove", "remove_", is_flag=True, help="Remove ACLs.")
@click.option("--list", "list_", is_flag=True, help="List ACLs (of the resources given, or all of them).")
@_many("--topic", "A topic; '*' is every topic.", "TOPIC")
@click.option("--cluster", is_flag=True, help="The cluster resource (kafka-cluster).")
@_many("--group", "A consumer group; '*' is every group.", "GROUP")
@_many("--transactional-id", "A transactional id; '*' is every one.", "ID")
@_many("--delegation-token", "A delegation token id; '*' is every token.", "TOKEN")
@_many("--user-principal", "A user principal as a resource (for CreateTokens, DescribeTokens).", "PRINCIPAL")
@click.option("--resource-pattern-type", type=click.Choice(["any", "match", "literal", "prefixed"],
                                                           case_sensitive=False), default="literal",
              show_default=True, help="literal or prefixed to add; any or match also filter for --list and --remove.")
@_many("--operation", "An operation: " + ", ".join(_pascal(o.name) for o in AclOperation if o > AclOperation.ANY)
       + "; default All.", "OPERATION")
@_many("--allow-principal", "A principal to allow, Type:name (User:* is everyone).", "PRINCIPAL")
@_many("--deny-principal", "A principal to deny, Type:name; denials win over allowances.", "PRINCIPAL")
@_many("--principal", "With --list: only the ACLs of this principal.", "PRINCIPAL")
@_many("--allow-host", "A host the allowed principals may come from; default *.", "HOST")
@_many("--deny-host", "A host the denied principals are refused from; default *.", "HOST")
@click.option("--producer", is_flag=True, help="WRITE, DESCRIBE and CREATE on the topics (and the transactional ids).")
@click.option("--consumer", is_flag=True, help="READ and DESCRIBE on the topics, READ on the groups.")
@click.option("--idempotent", is_flag=True, help="With --producer: IDEMPOTENT_WRITE on the cluster.")
@click.option("--force", is_flag=True, help="Remove without asking.")
def acls(bootstrap_server: str, command_config: Path | None, add_: bool, remove_: bool, list_: bool,
         topic: Sequence[str], cluster: bool, group: Sequence[str], transactional_id: Sequence[str],
         delegation_token: Sequence[str], user_principal: Sequence[str], resource_pattern_type: str,
         operation: Sequence[str], allow_principal: Sequence[str], deny_principal: Sequence[str],
         principal: Sequence[str], allow_host: Sequence[str], deny_host: Sequence[str], producer: bool,
         consumer: bool, idempotent: bool, force: bool) -> None:
    """Add, remove and list ACLs (kafka-acls.sh). Needs a broker with an ACL authorizer."""
    actions = [name for name, given in (("add", add_), ("remove", remove_), ("list", list_)) if given]
    if len(actions) != 1:
        fail("Command must include exactly one action: --list, --add, --remove.")
    flags = Flags(actions[0], tuple(topic), cluster, tuple(group), tuple(transactional_id), tuple(delegation_token),
                  tuple(user_principal), PatternType[resource_pattern_type.upper()], tuple(operation),
                  tuple(allow_principal), tuple(deny_principal), tuple(principal), tuple(allow_host),
                  tuple(deny_host), producer, consumer, idempotent, force)
    flags.check()
    # Refuse bad flags before connecting, as Kafka does before it builds its admin client.
    plan = plan_to_add(flags) if flags.action == "add" else resource_to_entries(flags) if flags.action == "remove" else {}

    async def go() -> list[str]:
        async with admin_client(bootstrap_server, command_config) as admin:
            if flags.action == "add":
                await add(admin, plan)
            elif flags.action == "remove":
                await remove(admin, flags, plan)
            else:
                return await list_acls(admin, flags)
        return []

    for block in run(go()):
        click.echo(block)
