"""Client quotas (KIP-546): which entities and keys are valid, and which entities a describe filter matches.

Quotas are kept per entity, a combination of a ``user`` and a ``client-id``
(either may be the type's default entity, a None name), or an ``ip`` alone.
They are stored in the metadata log (:class:`ClientQuotaRecord`) by the
controller, as Kafka's ClientQuotaControlManager does; enforcing them comes
with security and quotas work.
"""

from __future__ import annotations

from typing import Iterable

import attrs

from josef.metadata.records import QuotaEntity

USER, CLIENT_ID, IP = "user", "client-id", "ip"
#: Quota keys by the entity kinds they apply to, with whether the value must be a whole number.
CLIENT_KEYS = {"producer_byte_rate": True, "consumer_byte_rate": True, "request_percentage": False,
               "controller_mutation_rate": False}
IP_KEYS = {"connection_creation_rate": True}
#: DescribeClientQuotas match types.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


class QuotaError(ValueError):
    """An invalid entity, key, value or filter: INVALID_REQUEST with this message."""


@attrs.frozen
class Component:
    """One part of a describe filter: an entity type and how its name must match."""

    entity_type: str
    match_type: int
    match: str | None = None


def _first_duplicate(values: list[str]) -> str:
    seen: set[str] = set()
    return next(v for v in values if v in seen or seen.add(v))  # type: ignore[func-returns-value]


def _shown(value: str, limit: int = 100) -> str:
    """A client's string in an error message, cut short: the message goes back in a response whose strings
    (before flexible versions) hold 32,767 bytes at most, and a request may name thousands of them."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def check_entity(pairs: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    """The entity as stored (sorted pairs), or :class:`QuotaError` for an invalid combination."""
    pairs = list(pairs)
    types = [t for t, _ in pairs]
    if not types:
        raise QuotaError("a client quota entity needs at least one entity type")
    if len(set(types)) != len(types):  # (before sorting, which would compare a default entity's None name)
        raise QuotaError(f"duplicate entity type {_shown(_first_duplicate(types))}")
    entity = tuple(sorted(pairs))
    unknown = set(types) - {USER, CLIENT_ID, IP}
    if unknown:
        raise QuotaError(f"unknown entity type {_shown(sorted(unknown)[0])}; expected user, client-id or ip")
    if IP in types and len(types) > 1:
        raise QuotaError("an ip quota entity cannot be combined with user or client-id")
    return entity


def check_op(entity: QuotaEntity, key: str, value: float, remove: bool) -> None:
    """:class:`QuotaError` unless ``key`` applies to ``entity`` and, when setting it, ``value`` fits it."""
    keys = IP_KEYS if entity[0][0] == IP else CLIENT_KEYS
    if key not in keys:
        kind = "ip" if keys is IP_KEYS else "user/client-id"
        raise QuotaError(f"{_shown(key)} is not a quota key of {kind} entities")
    if not remove and keys[key] and abs(value - round(value)) > 1e-6:
        raise QuotaError(f"{key} must be a whole number, got {value}")


def check_filter(components: Iterable[Component]) -> list[Component]:
    components = list(components)
    types = [c.entity_type for c in components]
    if len(set(types)) != len(types):
        raise QuotaError(f"duplicate entity type in the filter: {_shown(_first_duplicate(types))}")
    for c in components:
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise QuotaError(f"unknown match type {c.match_type}")
        if c.match_type == MATCH_EXACT and c.match is None:
            raise QuotaError(f"an exact match of {_shown(c.entity_type)} needs a name")
    return components


def matches(entity: QuotaEntity, components: list[Component], strict: bool) -> bool:
    """Whether ``entity`` passes the filter: every component matches; strict filters allow no other types."""
    names = dict(entity)
    if strict and set(names) != {c.entity_type for c in components}:
        return False
    for c in components:
        if c.entity_type not in names:
            return False
        name = names[c.entity_type]
        if c.match_type == MATCH_EXACT and name != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and name is not None:
            return False
        if c.match_type == MATCH_SPECIFIED and name is None:
            return False
    return True
