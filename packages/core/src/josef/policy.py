"""Topic policies: Kafka's CreateTopicPolicy and AlterConfigPolicy, offered by plugins.

A deployment that wants to constrain what clients may create or change
(naming rules, partition limits, a retention floor...) installs a plugin that
registers a policy through the ``register_policies`` hook and selects it by
name with Kafka's two keys::

    create.topic.policy.class.name=naming
    alter.config.policy.class.name=naming

As in Kafka's KRaft mode, the controller applies them: a CreateTopics request
(``validate_only`` ones, and the topics brokers create themselves: automatic
creation, internal topics) is checked topic by topic after the controller's
own validation and replica placement, and an AlterConfigs or
IncrementalAlterConfigs request resource by resource (topics and brokers)
after the new values were validated. A policy refuses by raising
:class:`PolicyViolation`: that topic or resource alone is answered
POLICY_VIOLATION (error code 44) with the exception's message; the others of
the request go on. CreatePartitions is not checked, as Kafka's controller
does not check it.

A policy is built once per controller, by ``factory(config)`` with the node's
:class:`josef.config.Config` (Kafka's ``configure()``); one object may
implement both contracts and be selected by both keys, and is then built
once. Policies are called on the event loop and must not block.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Protocol, runtime_checkable

import attrs

from josef.plugins import PluginError, collect

if TYPE_CHECKING:
    import pluggy

    from josef.config import Config

#: The broker configuration keys that select a registered policy by name (Kafka's names).
CREATE_TOPIC_POLICY = "create.topic.policy.class.name"
ALTER_CONFIG_POLICY = "alter.config.policy.class.name"


class PolicyViolation(Exception):
    """A request a policy refuses (Kafka's PolicyViolationException).

    The topic or resource it was raised for is answered POLICY_VIOLATION with
    ``str(exception)`` as the error message, which clients show their users.
    """


def _frozen(mapping: Mapping[Any, Any] | None) -> Mapping[Any, Any] | None:
    return None if mapping is None else MappingProxyType(dict(mapping))


def _frozen_assignments(mapping: Mapping[int, Any] | None) -> Mapping[int, tuple[int, ...]] | None:
    return None if mapping is None else MappingProxyType({p: tuple(r) for p, r in mapping.items()})


@attrs.frozen(hash=False)
class CreateTopicRequest:
    """One topic of a CreateTopics request, as a create-topic policy sees it (Kafka's ``CreateTopicPolicy.RequestMetadata``).

    Either ``num_partitions`` and ``replication_factor`` are set (the
    broker's ``num.partitions`` and ``default.replication.factor`` already
    applied where the request asked for the default) and
    ``replicas_assignments`` is None, or the request gave a manual assignment:
    then ``replicas_assignments`` maps each partition to its replicas' broker
    ids and the other two are None. ``configs`` holds the topic configs the
    request gives, not the broker defaults (those are in the ``Config`` the
    policy was built with).
    """

    topic: str
    num_partitions: int | None
    replication_factor: int | None
    replicas_assignments: Mapping[int, tuple[int, ...]] | None = attrs.field(converter=_frozen_assignments)
    configs: Mapping[str, str] = attrs.field(converter=_frozen, factory=dict)


class ConfigResourceType(enum.IntEnum):
    """The kinds of resource whose configs AlterConfigs changes, with Kafka's ids (``ConfigResource.Type``)."""

    TOPIC = 2
    BROKER = 4


@attrs.frozen
class ConfigResource:
    """A topic by name, or a broker by id (``""``: the default of every broker)."""

    type: ConfigResourceType = attrs.field(converter=ConfigResourceType)
    name: str


@attrs.frozen(hash=False)
class AlterConfigRequest:
    """One resource of an AlterConfigs or IncrementalAlterConfigs request (Kafka's ``AlterConfigPolicy.RequestMetadata``).

    ``configs`` holds only the keys the request names, each with the value it
    would have afterwards: None for a key the request deletes, the whole
    resulting list for an APPEND or SUBTRACT. Keys a legacy AlterConfigs
    request removes by leaving them out are not included, as in Kafka.
    """

    resource: ConfigResource
    configs: Mapping[str, str | None] = attrs.field(converter=_frozen)


@runtime_checkable
class CreateTopicPolicy(Protocol):
    """What ``create.topic.policy.class.name`` selects."""

    def validate_create_topic(self, request: CreateTopicRequest) -> None:
        """Return if ``request`` may go on; raise :class:`PolicyViolation` with the reason if not. Must not block."""


@runtime_checkable
class AlterConfigPolicy(Protocol):
    """What ``alter.config.policy.class.name`` selects."""

    def validate_alter_config(self, request: AlterConfigRequest) -> None:
        """Return if ``request`` may go on; raise :class:`PolicyViolation` with the reason if not. Must not block."""


@attrs.frozen
class Policies:
    """The policies a node's configuration selects: None where its key names none."""

    create_topic: CreateTopicPolicy | None = None
    alter_config: AlterConfigPolicy | None = None

    @classmethod
    def from_plugins(cls, pm: pluggy.PluginManager, config: Config) -> Policies:
        """Build the selected policies, each name once; an unknown name or a missing method is a :class:`PluginError`."""
        wanted = {CREATE_TOPIC_POLICY: "validate_create_topic", ALTER_CONFIG_POLICY: "validate_alter_config"}
        if not any(config[key] for key in wanted):
            return cls()
        registry = collect(pm, "register_policies", "policy")
        built: dict[str, Any] = {}
        selected: list[Any] = []
        for key, method in wanted.items():
            name = config[key]
            if not name:
                selected.append(None)
                continue
            if name not in built:
                try:
                    factory = registry.get(name)
                except PluginError as exc:
                    raise PluginError(f"{key}: {exc}") from None
                built[name] = factory(config)
            policy = built[name]
            if not callable(getattr(policy, method, None)):
                raise PluginError(f"{key}: the policy {name!r} ({type(policy).__qualname__}) has no {method}(request) "
                                  "method")
            selected.append(policy)
        return cls(*selected)
