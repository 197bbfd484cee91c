"""DescribeUserScramCredentials (v0: from the metadata image) and AlterUserScramCredentials (v0: the active controller).

SCRAM credentials live in the metadata log (UserScramCredentialRecord), so
every broker authenticates a user the moment the controller commits it, and
a restart keeps them. Describe shows a user's mechanisms and iteration
counts only: salts and keys never leave the image. Alter carries a salt and
a salted password computed by the client (never the password), from which
the controller derives the keys it stores, as Kafka's ScramControlManager
does. The authorization stage asks DESCRIBE / ALTER on the cluster first.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.metadata.controller import ControllerError, ScramUpsertion
from josef.server.dispatch import RequestContext

#: Kafka's messages (ScramImage.describe), followed by the user's name.
DESCRIBE_USER_THAT_DOES_NOT_EXIST = "Attempt to describe a user credential that does not exist: "
DESCRIBE_DUPLICATE_USER = "Cannot describe SCRAM credentials for the same user twice in a single request: "


async def describe_user_scram_credentials(ctx: RequestContext, request: Any) -> dict[str, Any]:
    by_user: dict[str, list[dict[str, int]]] = {}
    for (user, mechanism), credential in sorted(ctx.broker.image.scram_credentials.items()):
        by_user.setdefault(user, []).append({"mechanism": mechanism, "iterations": credential.iterations})
    results = []
    if not request.users:  # null or empty: every user with a credential
        results = [_result(user, infos=infos) for user, infos in by_user.items()]
    else:
        named: dict[str, int] = {}
        for u in request.users:
            named[u.name] = named.get(u.name, 0) + 1
        for user, count in named.items():
            if count > 1:
                results.append(_result(user, ErrorCode.duplicate_resource, DESCRIBE_DUPLICATE_USER + user))
            elif user not in by_user:
                results.append(_result(user, ErrorCode.resource_not_found, DESCRIBE_USER_THAT_DOES_NOT_EXIST + user))
            else:
                results.append(_result(user, infos=by_user[user]))
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}


def _result(user: str, error: ErrorCode = ErrorCode.none, message: str | None = None,
            infos: list[dict[str, int]] | None = None) -> dict[str, Any]:
    return {"user": user, "error_code": error, "error_message": message, "credential_infos": infos or []}


async def alter_user_scram_credentials(ctx: RequestContext, request: Any) -> dict[str, Any]:
    upsertions = [ScramUpsertion(u.name, u.mechanism, u.iterations, bytes(u.salt), bytes(u.salted_password))
                  for u in request.upsertions]
    try:
        results = await ctx.broker.controller.alter_user_scram_credentials(
            [(d.name, d.mechanism) for d in request.deletions], upsertions)
    except ControllerError as exc:  # NOT_CONTROLLER: every user gets it, and the client retries
        names = dict.fromkeys([d.name for d in request.deletions] + [u.name for u in request.upsertions])
        results = [(name, exc.code, exc.message) for name in names]
    return {"throttle_time": 0, "results": [{"user": user, "error_code": error, "error_message": message}
                                            for user, error, message in results]}
