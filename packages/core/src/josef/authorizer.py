"""The authorizer contract, and the permissive default."""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen
class Action:
    """An operation on a resource, named as in Kafka's ACLs (``WRITE`` on ``TOPIC`` ``orders``)."""

    operation: str
    resource_type: str
    resource_name: str


class Authorizer(Protocol):
    def authorize(self, principal: str, host: str, action: Action) -> bool:
        """Whether ``principal`` connecting from ``host`` may perform ``action``. Must not block."""


class AllowAll:
    """Allows everything: the default until an ACL authorizer is configured."""

    def __init__(self, config: object = None) -> None:
        pass

    def authorize(self, principal: str, host: str, action: Action) -> bool:
        return True
