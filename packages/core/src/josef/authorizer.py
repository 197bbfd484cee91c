"""The authorizer contract, and the permissive default.

An authorizer answers Kafka's question, ``authorize(context, actions)``: may
the principal of this request perform each of these operations? It is asked
once per request with every action the request needs (a Metadata request
over 10,000 topics is one call with 10,000 actions, not 10,000 calls) and
answers with one bool per action, in order. The broker decides what a
request needs and what a refusal means for it (Kafka's mapping of APIs to
operations, :mod:`josef.server.authorization`); the authorizer only
decides.

An authorizer that keeps Kafka's ACLs implements :meth:`AclAuthorizer.load_acls`:
the broker hands it every ACL of the metadata log when it starts and again
whenever they change, and only then accepts CreateAcls and DeleteAcls (with
another authorizer they answer SECURITY_DISABLED, as Kafka's do without an
ACL authorizer).

Plugin API 1.0 had ``authorize(principal, host, action) -> bool``, one
action at a time. An authorizer that still has that form is wrapped
(:func:`adapt`) and warned about; plugin API 2 drops it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from josef.acls import AclBinding
from josef.plugin_api import warn_deprecated
from josef.security import KafkaPrincipal

#: The name of the one CLUSTER resource (Kafka's ``Resource.CLUSTER_NAME``).
CLUSTER_NAME = "kafka-cluster"


@attrs.frozen
class Action:
    """An operation on a resource, named as in Kafka's ACLs (``WRITE`` on ``TOPIC`` ``orders``)."""

    operation: str
    resource_type: str
    resource_name: str


class AuthorizableRequestContext(Protocol):
    """What an authorizer may know of the request it decides on (Kafka's ``AuthorizableRequestContext``)."""

    @property
    def principal(self) -> KafkaPrincipal: ...

    @property
    def client_host(self) -> str:
        """The client's address ("" for a request the broker makes to itself)."""

    @property
    def listener_name(self) -> str: ...

    @property
    def security_protocol(self) -> str: ...

    @property
    def api_key(self) -> int: ...

    @property
    def api_version(self) -> int: ...

    @property
    def client_id(self) -> str | None: ...

    @property
    def correlation_id(self) -> int: ...


class Authorizer(Protocol):
    def authorize(self, context: AuthorizableRequestContext, actions: Sequence[Action]) -> list[bool]:
        """For each action, whether ``context``'s principal may perform it. Called on the event loop: must not block."""

    def authorize_by_resource_type(self, context: AuthorizableRequestContext, operation: str,
                                   resource_type: str) -> bool:
        """Whether the principal may perform ``operation`` on at least one resource of ``resource_type``.

        Kafka asks this of an idempotent producer without IDEMPOTENT_WRITE on
        the cluster: WRITE on any topic is enough for it to get a producer id.
        """


@runtime_checkable
class AclAuthorizer(Authorizer, Protocol):
    """An authorizer deciding on Kafka's ACLs, which the broker keeps in the metadata log and hands it."""

    def load_acls(self, acls: Mapping[Any, AclBinding]) -> None:
        """Every ACL of the cluster, by id, replacing those of the previous call. Called on the event loop."""


class AllowAll:
    """Allows everything: the default until an ACL authorizer is configured."""

    def __init__(self, config: object = None) -> None:
        pass

    def authorize(self, context: AuthorizableRequestContext, actions: Sequence[Action]) -> list[bool]:
        return [True] * len(actions)

    def authorize_by_resource_type(self, context: AuthorizableRequestContext, operation: str,
                                   resource_type: str) -> bool:
        return True


class _OneByOne:
    """An authorizer of plugin API 1.0 (``authorize(principal, host, action)``) behind the batch contract."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def authorize(self, context: AuthorizableRequestContext, actions: Sequence[Action]) -> list[bool]:
        principal, host = str(context.principal), context.client_host
        return [bool(self.inner.authorize(principal, host, action)) for action in actions]

    def authorize_by_resource_type(self, context: AuthorizableRequestContext, operation: str,
                                   resource_type: str) -> bool:
        # Kafka's default asks about the resource type's ACLs; an authorizer of the old form has none to ask
        # about, so ask about the wildcard resource.
        return self.authorize(context, [Action(operation, resource_type, "*")])[0]


@attrs.frozen
class _Caller:
    """The request context a plugin of plugin API 1.0 gave as ``authorize(principal, host, action)``."""

    principal: KafkaPrincipal
    client_host: str
    listener_name: str = ""
    security_protocol: str = "PLAINTEXT"
    api_key: int = -1
    api_version: int = -1
    client_id: str | None = None
    correlation_id: int = -1


class CallerFacade:
    """The authorizer as plugins call it (``BrokerServices.authorizer``): the batch form, and, deprecated, plugin
    API 1.0's ``authorize(principal, host, action) -> bool`` that coordinators of that API still call."""

    def __init__(self, inner: Authorizer) -> None:
        self.inner = inner

    def authorize(self, context: Any, actions: Any, action: Action | None = None) -> Any:
        if action is None:
            return self.inner.authorize(context, actions)
        warn_deprecated("calling authorize(principal, host, action)", "authorize(context, actions) -> list[bool]",
                        "2.0", stacklevel=3)
        return self.inner.authorize(_Caller(KafkaPrincipal.parse(str(context)), str(actions)), [action])[0]

    def authorize_by_resource_type(self, context: AuthorizableRequestContext, operation: str,
                                   resource_type: str) -> bool:
        return self.inner.authorize_by_resource_type(context, operation, resource_type)


def adapt(authorizer: Any) -> Authorizer:
    """``authorizer`` under the batch contract; one of plugin API 1.0's form is wrapped, with a deprecation warning."""
    parameters = list(inspect.signature(authorizer.authorize).parameters)
    if parameters[:3] == ["principal", "host", "action"]:
        warn_deprecated(f"{type(authorizer).__qualname__}.authorize(principal, host, action)",
                        "authorize(context, actions) -> list[bool]", "2.0", stacklevel=2)
        return _OneByOne(authorizer)
    return authorizer
