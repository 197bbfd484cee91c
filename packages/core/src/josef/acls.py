"""Kafka's ACLs as data: bindings, the filters that find them, and the codes the wire and the metadata log use.

The controller stores ACLs (``AccessControlEntryRecord``), brokers answer
DescribeAcls from their metadata image, the ACL authorizer decides on them
and ``josef acls`` prints them: all with these types, so the codes and the
filter semantics (Kafka's ``AclBindingFilter.matches``) exist once.
"""

from __future__ import annotations

import enum

import attrs


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    #: A filter only: literal, wildcard and prefixed bindings that apply to the filter's name.
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: The wildcard resource name and host.
WILDCARD = "*"
#: The principal that matches every user.
WILDCARD_PRINCIPAL = "User:*"

#: The operations an ACL on each resource type can be about (Kafka's ``AclEntry.supportedOperations``),
#: which is also what ``authorized_operations`` reports on.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
                         AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
                           AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
                           AclOperation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}


class InvalidAcl(ValueError):
    """A binding that cannot be stored (Kafka answers INVALID_REQUEST with this message)."""


@attrs.frozen
class AclBinding:
    """One ACL: ``permission_type`` of ``principal`` from ``host`` to ``operation`` on the resources of the pattern."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def check(self) -> None:
        """Raise :class:`InvalidAcl` unless this binding can be stored, with Kafka's reasons."""
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise InvalidAcl("Invalid resourceType " + self.resource_type.name)
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAcl("Invalid patternType " + self.pattern_type.name)
        if self.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise InvalidAcl("Invalid operation " + self.operation.name)
        if self.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAcl("Invalid permissionType " + self.permission_type.name)
        if not self.resource_name:
            raise InvalidAcl("Resource name should not be empty")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != "kafka-cluster":
            raise InvalidAcl("The only valid name for the CLUSTER resource is kafka-cluster")
        kind, sep, name = self.principal.partition(":")
        if not sep or not kind or not name:
            raise InvalidAcl(f"Could not parse principal from `{self.principal}` (no colon is present separating "
                             "the principal type from the principal name)")
        if not self.host:
            raise InvalidAcl("Invalid empty host")
        if self.operation != AclOperation.ALL and self.operation not in SUPPORTED_OPERATIONS[self.resource_type]:
            # Kafka stores these, but they can never grant anything; it refuses them in its tools.
            raise InvalidAcl(f"ACL operation {self.operation.name} is not supported on {self.resource_type.name} "
                             f"(supported: {', '.join(o.name for o in SUPPORTED_OPERATIONS[self.resource_type])})")


@attrs.frozen
class AclBindingFilter:
    """Which bindings a DescribeAcls or DeleteAcls asks for: ANY and None match everything (Kafka's semantics)."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def check(self) -> None:
        """Raise :class:`InvalidAcl` for a filter that can match nothing by construction."""
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission_type):
            if value.name == "UNKNOWN":
                raise InvalidAcl(f"Filter contains UNKNOWN elements: {self}")

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if not self._pattern_matches(binding):
            return False
        if self.principal is not None and self.principal != binding.principal:
            return False
        if self.host is not None and self.host != binding.host:
            return False
        if self.operation not in (AclOperation.ANY, binding.operation):
            return False
        return self.permission_type in (AclPermissionType.ANY, binding.permission_type)

    def _pattern_matches(self, binding: AclBinding) -> bool:
        name, pattern = self.resource_name, self.pattern_type
        if pattern == PatternType.MATCH:
            # Every binding that applies to a resource called ``name``: itself, the wildcard, and prefixes of it.
            if name is None:
                return True
            if binding.pattern_type == PatternType.LITERAL:
                return binding.resource_name in (name, WILDCARD)
            return binding.pattern_type == PatternType.PREFIXED and name.startswith(binding.resource_name)
        if pattern not in (PatternType.ANY, binding.pattern_type):
            return False
        return name is None or name == binding.resource_name
