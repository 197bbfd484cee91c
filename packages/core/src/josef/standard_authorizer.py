"""Kafka's StandardAuthorizer: decisions on the ACLs of the metadata log.

Selected with ``authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer``
(or ``acl``). The rules, in Kafka's order:

1. a principal of ``super.users`` may do anything;
2. the ACLs that apply to a resource are its LITERAL ones, the LITERAL ``*``
   ones of its type, and the PREFIXED ones whose prefix starts its name;
   of those, the ones for the principal (or ``User:*``) and host (or ``*``);
3. a DENY for the operation (or ALL) wins over everything;
4. an ALLOW for the operation, ALL, or one implying it (READ, WRITE, DELETE
   and ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows;
5. otherwise: denied if the resource has any ACL at all, else
   ``allow.everyone.if.no.acl.found`` decides (default false: denied).

The ACLs are indexed by resource type and name, and prefixed ones by the
lengths of their prefixes, so a decision is a few dictionary lookups however
many ACLs there are: a Metadata request over 10,000 topics is decided in one
pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from josef.acls import WILDCARD, WILDCARD_PRINCIPAL, AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from josef.authorizer import Action, AuthorizableRequestContext
from josef.config import Config

#: Kafka's class name for it, which ``authorizer.class.name`` takes as it is.
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

#: ALLOW ACLs of these operations also allow the key (Kafka's implied operations; DENY implies nothing).
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                      AclOperation.DELETE, AclOperation.ALTER, AclOperation.ALL}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                                              AclOperation.ALL}),
}
_OPERATIONS = {o.name: o for o in AclOperation}
_TYPES = {t.name: t for t in ResourceType}


class _TypeIndex:
    """The ACLs of one resource type: literal by name, prefixed by prefix (and the set of prefix lengths)."""

    def __init__(self) -> None:
        self.literal: dict[str, list[AclBinding]] = defaultdict(list)
        self.prefixed: dict[str, list[AclBinding]] = defaultdict(list)
        self.prefix_lengths: list[int] = []

    def add(self, acl: AclBinding) -> None:
        if acl.pattern_type == PatternType.PREFIXED:
            self.prefixed[acl.resource_name].append(acl)
        else:
            self.literal[acl.resource_name].append(acl)

    def seal(self) -> None:
        self.prefix_lengths = sorted({len(prefix) for prefix in self.prefixed})

    def applying_to(self, name: str) -> list[AclBinding]:
        """Every ACL whose pattern covers the resource ``name``."""
        found: list[AclBinding] = []
        literal = self.literal
        if name in literal:
            found += literal[name]
        if WILDCARD in literal and name != WILDCARD:
            found += literal[WILDCARD]
        prefixed = self.prefixed
        for length in self.prefix_lengths:
            if length > len(name):
                break
            acls = prefixed.get(name[:length])
            if acls:
                found += acls
        return found


class StandardAuthorizer:
    """Decides on the ACLs the broker hands it (:meth:`load_acls`), by Kafka's rules (see the module)."""

    def __init__(self, config: Config) -> None:
        self.super_users = frozenset(p.strip() for p in (config["super.users"] or "").split(";") if p.strip())
        self.allow_if_no_acl = bool(config["allow.everyone.if.no.acl.found"])
        self._index: dict[ResourceType, _TypeIndex] = {}

    def load_acls(self, acls: Mapping[Any, AclBinding]) -> None:
        index: dict[ResourceType, _TypeIndex] = defaultdict(_TypeIndex)
        for acl in acls.values():
            index[acl.resource_type].add(acl)
        for by_type in index.values():
            by_type.seal()
        self._index = dict(index)

    def authorize(self, context: AuthorizableRequestContext, actions: Sequence[Action]) -> list[bool]:
        principal = str(context.principal)
        if principal in self.super_users:
            return [True] * len(actions)
        host = context.client_host
        return [self._decide(principal, host, _OPERATIONS[a.operation], _TYPES[a.resource_type], a.resource_name)
                for a in actions]

    def _decide(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                name: str) -> bool:
        by_type = self._index.get(resource_type)
        acls = by_type.applying_to(name) if by_type is not None else []
        if not acls:
            return self.allow_if_no_acl
        allowing = _IMPLIED_BY.get(operation) or (operation, AclOperation.ALL)
        allowed = False
        for acl in acls:
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.host != WILDCARD and acl.host != host:
                continue
            if acl.permission_type == AclPermissionType.DENY:
                if acl.operation == operation or acl.operation == AclOperation.ALL:
                    return False
            elif acl.operation in allowing:
                allowed = True
        return allowed

    def authorize_by_resource_type(self, context: AuthorizableRequestContext, operation: str,
                                   resource_type: str) -> bool:
        """Kafka's ``Authorizer.authorizeByResourceType``: an ALLOW on some resource of the type no DENY covers."""
        principal, host = str(context.principal), context.client_host
        op, kind = _OPERATIONS[operation], _TYPES[resource_type]
        # Kafka asks about a made-up name first, so super users and wildcard grants are allowed whatever the DENYs.
        if principal in self.super_users or self._decide(principal, host, op, kind, "hardcode"):
            return True
        by_type = self._index.get(kind)
        if by_type is None:
            return False
        denied: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        allowed: dict[PatternType, set[str]] = {PatternType.LITERAL: set(), PatternType.PREFIXED: set()}
        for acls in (*by_type.literal.values(), *by_type.prefixed.values()):
            for acl in acls:
                if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                    continue
                if acl.operation not in (op, AclOperation.ALL):
                    continue
                side = denied if acl.permission_type == AclPermissionType.DENY else allowed
                side[acl.pattern_type].add(acl.resource_name)
        if WILDCARD in denied[PatternType.LITERAL]:
            return False
        if WILDCARD in allowed[PatternType.LITERAL]:
            return True

        def dominated(name: str) -> bool:
            return any(name.startswith(prefix) for prefix in denied[PatternType.PREFIXED])

        return (any(not dominated(name) for name in allowed[PatternType.PREFIXED])
                or any(name not in denied[PatternType.LITERAL] and not dominated(name)
                       for name in allowed[PatternType.LITERAL]))
