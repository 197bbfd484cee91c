"""Envelope (v0): an admin request a broker forwards to the active controller, with the client it came from.

Kafka's brokers forward CreateTopics, configs, quotas and the like wrapped in
an Envelope carrying the original request (header and body), the client's
principal and address, so the controller decides, and later authorizes, as
if the client had asked it. The controller runs the embedded request through
the same dispatch as any other (versions, errors, handlers) and returns the
embedded response. The principal is serialised as Kafka's
DefaultKafkaPrincipalBuilder does.
"""

from __future__ import annotations

import io
import ipaddress
import struct
from typing import Any

from kio.schema.default_principal_data.v0.data import DefaultPrincipalData
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from josef.protocol.api_keys import ApiKey
from josef.protocol.messages import MalformedRequestError, is_flexible, parse_header
from josef.security import ANONYMOUS, KafkaPrincipal, Session
from josef.server.dispatch import RequestContext, UnanswerableRequestError

_VERSION = struct.Struct(">h")
#: Forwarded by brokers only once the client's own connection passed Kafka's allowTokenRequests.
CHECKED_BEFORE_FORWARDING = frozenset({ApiKey.CREATE_DELEGATION_TOKEN, ApiKey.RENEW_DELEGATION_TOKEN,
                                       ApiKey.EXPIRE_DELEGATION_TOKEN})
#: Quorum APIs Kafka serves on broker listeners too, by forwarding them (their schemas list both listeners).
QUORUM_APIS_ON_BROKERS = frozenset({ApiKey.DESCRIBE_QUORUM, ApiKey.ADD_RAFT_VOTER, ApiKey.REMOVE_RAFT_VOTER})
#: What a broker may forward in an Envelope: the admin requests the controller decides (Kafka's forwardable APIs).
ENVELOPED = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.ALTER_CONFIGS, ApiKey.CREATE_PARTITIONS,
                       ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.UPDATE_FEATURES,
                       ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                       ApiKey.LIST_PARTITION_REASSIGNMENTS, ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS,
                       ApiKey.ALTER_USER_SCRAM_CREDENTIALS}
                      | QUORUM_APIS_ON_BROKERS | CHECKED_BEFORE_FORWARDING)
def principal_bytes(principal: KafkaPrincipal, token_authenticated: bool = False) -> bytes:
    """A principal as Kafka serialises it into an Envelope: a version prefix, then DefaultPrincipalData
    (with whether the client authenticated with a delegation token, which the controller refuses token APIs)."""
    out = io.BytesIO()
    out.write(_VERSION.pack(0))
    data = DefaultPrincipalData(type_=principal.principal_type, name=principal.name,  # type: ignore[call-arg]
                                token_authenticated=token_authenticated)
    entity_writer(DefaultPrincipalData)(out, data)  # type: ignore[arg-type]
    return out.getvalue()


def read_principal(data: bytes) -> KafkaPrincipal:
    return read_principal_data(data)[0]


class PrincipalDeserializationError(ValueError):
    """An Envelope's principal that cannot be read: PRINCIPAL_DESERIALIZATION_FAILURE, as Kafka answers."""


def read_principal_data(data: bytes) -> tuple[KafkaPrincipal, bool]:
    """The principal of an Envelope, and whether it authenticated with a delegation token."""
    try:
        version = _VERSION.unpack_from(data, 0)[0]
        if version != 0:
            raise ValueError(f"unknown principal serialisation version {version}")
        principal, _ = entity_reader(DefaultPrincipalData)(data, _VERSION.size)  # type: ignore[arg-type]
    except Exception as exc:  # short bytes, a bad string: whatever a forwarding broker (or anyone) sent
        raise PrincipalDeserializationError(f"cannot read the envelope's principal: {exc}") from None
    return KafkaPrincipal(principal.type_, principal.name), bool(principal.token_authenticated)


def address_bytes(host: str) -> bytes:
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        return b""


async def envelope(ctx: RequestContext, request: Any) -> dict[str, Any]:
    try:
        principal, token_authenticated = (ANONYMOUS, False) if request.request_principal is None \
            else read_principal_data(request.request_principal)
        host = str(ipaddress.ip_address(request.client_host_address)) if request.client_host_address else ""
    except PrincipalDeserializationError:
        return {"response_data": None, "error_code": ErrorCode.principal_deserialization_failure}
    except ValueError:
        return {"response_data": None, "error_code": ErrorCode.invalid_request}
    try:
        if parse_header(request.request_data, is_flexible).api_key not in ENVELOPED:
            return {"response_data": None, "error_code": ErrorCode.invalid_request}
        # The client the broker forwarded for, as the controller's handlers see it.
        origin = Session(ctx.listener_name, ctx.session.security_protocol, host, principal=principal,
                         token_authenticated=token_authenticated, forwarded=True)
        response = await ctx.broker.controller_dispatcher.handle(origin, request.request_data)
    except (MalformedRequestError, UnanswerableRequestError):
        return {"response_data": None, "error_code": ErrorCode.invalid_request}
    if response is None:
        return {"response_data": None, "error_code": ErrorCode.none}
    frame = b"".join(response if isinstance(response, list) else await response)
    return {"response_data": frame[4:], "error_code": ErrorCode.none}
