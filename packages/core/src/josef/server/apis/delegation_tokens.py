"""CreateDelegationToken (v1-3), RenewDelegationToken (v1-2), ExpireDelegationToken (v1-2), DescribeDelegationToken (v1-3).

As in Kafka's KafkaApis and ControllerApis: a broker refuses the token APIs
over a connection that cannot hold a token safely (authenticated with a
token, PLAINTEXT, SSL without a client certificate:
DELEGATION_TOKEN_REQUEST_NOT_ALLOWED), then forwards Create, Renew and
Expire to the active controller, which decides (owner and renewers, expiry,
the secret key) and writes the records; Describe is answered from the
broker's image, with HMACs the broker computes from its own
``delegation.token.secret.key``. Who may create a token for another owner
(CREATE_TOKENS on the owner) and which tokens Describe shows are decided by
the authorization stage (:mod:`josef.server.authorization`); renewing and
expiring are decided by ownership alone, in the controller.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from josef import delegation_tokens
from josef.delegation_tokens import ERROR_TIMESTAMP, TokenInformation, allow_token_requests
from josef.metadata.controller import ControllerError
from josef.security import KafkaPrincipal
from josef.server.dispatch import RequestContext


def _ms(value: Any) -> int:
    """A period of kio's request (a timedelta) in milliseconds; -1 stays -1."""
    return round(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


def requested_owner(ctx: RequestContext, request: Any) -> KafkaPrincipal:
    """The token's owner: the request's (v3+, KIP-373), else the requester."""
    name = getattr(request, "owner_principal_name", None)
    if not name:
        return ctx.principal
    return KafkaPrincipal(request.owner_principal_type or "User", name)


def create_answer(ctx: RequestContext, error: ErrorCode, owner: KafkaPrincipal | None = None,
                  token: TokenInformation | None = None, token_hmac: bytes = b"") -> dict[str, Any]:
    """Kafka's CreateDelegationTokenResponse.prepareResponse: a refusal names the owner and requester only."""
    owner = token.owner if token is not None else owner or ctx.principal
    requester = token.requester if token is not None else ctx.principal
    return {"error_code": error, "principal_type": owner.principal_type, "principal_name": owner.name,
            "token_requester_principal_type": requester.principal_type,
            "token_requester_principal_name": requester.name,
            "issue_timestamp": token.issue_timestamp if token else ERROR_TIMESTAMP,
            "expiry_timestamp": token.expiry_timestamp if token else ERROR_TIMESTAMP,
            "max_timestamp": token.max_timestamp if token else ERROR_TIMESTAMP,
            "token_id": token.token_id if token else "", "hmac": token_hmac, "throttle_time": 0}


def _expiry_answer(error: ErrorCode, expiry: int = ERROR_TIMESTAMP) -> dict[str, Any]:
    return {"error_code": error, "expiry_timestamp": expiry, "throttle_time": 0}


# On brokers: refuse what Kafka's broker refuses, forward the rest ------------------------------------------


async def create_delegation_token(ctx: RequestContext, request: Any) -> Any:
    if not allow_token_requests(ctx.session):
        return create_answer(ctx, ErrorCode.delegation_token_request_not_allowed, requested_owner(ctx, request))
    return await ctx.broker.channel.forward(ctx, request)


async def renew_delegation_token(ctx: RequestContext, request: Any) -> Any:
    if not allow_token_requests(ctx.session):
        return _expiry_answer(ErrorCode.delegation_token_request_not_allowed)
    return await ctx.broker.channel.forward(ctx, request)


async def expire_delegation_token(ctx: RequestContext, request: Any) -> Any:
    if not allow_token_requests(ctx.session):
        return _expiry_answer(ErrorCode.delegation_token_request_not_allowed)
    return await ctx.broker.channel.forward(ctx, request)


async def describe_delegation_token(ctx: RequestContext, request: Any) -> dict[str, Any]:
    """Every token the owners filter keeps (null: all of them; empty: none); the authorization stage then hides
    the tokens the principal neither owns, renews, nor may describe."""
    answer: dict[str, Any] = {"error_code": ErrorCode.none, "tokens": [], "throttle_time": 0}
    secret = ctx.broker.config[delegation_tokens.SECRET_KEY]
    if not allow_token_requests(ctx.session):
        return {**answer, "error_code": ErrorCode.delegation_token_request_not_allowed}
    if not secret:
        return {**answer, "error_code": ErrorCode.delegation_token_auth_disabled}
    if request.owners is not None and not request.owners:
        return answer
    owners = None if request.owners is None else [KafkaPrincipal(o.principal_type, o.principal_name)
                                                  for o in request.owners]
    answer["tokens"] = [described(t, delegation_tokens.create_hmac(t.token_id, str(secret)))
                        for t in ctx.broker.image.delegation_tokens.values() if delegation_tokens.eligible(t, owners)]
    return answer


def described(token: TokenInformation, token_hmac: bytes) -> dict[str, Any]:
    return {"principal_type": token.owner.principal_type, "principal_name": token.owner.name,
            "token_requester_principal_type": token.requester.principal_type,
            "token_requester_principal_name": token.requester.name, "issue_timestamp": token.issue_timestamp,
            "expiry_timestamp": token.expiry_timestamp, "max_timestamp": token.max_timestamp,
            "token_id": token.token_id, "hmac": token_hmac,
            "renewers": [{"principal_type": r.principal_type, "principal_name": r.name} for r in token.renewers]}


# On the active controller (ControllerApis, DelegationTokenControlManager) ----------------------------------


async def controller_create_delegation_token(ctx: RequestContext, request: Any) -> dict[str, Any]:
    owner = requested_owner(ctx, request)
    if not allow_token_requests(ctx.session):
        return create_answer(ctx, ErrorCode.delegation_token_request_not_allowed, owner)
    renewers = [KafkaPrincipal(r.principal_type, r.principal_name) for r in request.renewers]
    try:
        created = await ctx.broker.controller.create_delegation_token(
            ctx.principal, owner, renewers, _ms(request.max_lifetime))
    except ControllerError as exc:
        return create_answer(ctx, exc.code, owner)
    return create_answer(ctx, ErrorCode.none, token=created.token, token_hmac=created.hmac)


async def controller_renew_delegation_token(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if not allow_token_requests(ctx.session):
        return _expiry_answer(ErrorCode.delegation_token_request_not_allowed)
    try:
        expiry = await ctx.broker.controller.renew_delegation_token(ctx.principal, bytes(request.hmac),
                                                                    _ms(request.renew_period))
    except ControllerError as exc:
        return _expiry_answer(exc.code)
    return _expiry_answer(ErrorCode.none, expiry)


async def controller_expire_delegation_token(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if not allow_token_requests(ctx.session):
        return _expiry_answer(ErrorCode.delegation_token_request_not_allowed)
    try:
        expiry = await ctx.broker.controller.expire_delegation_token(ctx.principal, bytes(request.hmac),
                                                                     _ms(request.expiry_time_period))
    except ControllerError as exc:
        return _expiry_answer(exc.code)
    return _expiry_answer(ErrorCode.none, expiry)
