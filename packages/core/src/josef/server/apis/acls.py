"""CreateAcls, DeleteAcls (v1-3: decided by the active controller) and DescribeAcls (v1-3: from the metadata image).

ACLs live in the metadata log (``AccessControlEntryRecord``), so every node
sees the same ones and they survive restarts. They can be changed only
while an ACL authorizer is configured (one implementing
:class:`josef.authorizer.AclAuthorizer`): without one Kafka answers
SECURITY_DISABLED, and so does josef.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from josef.acls import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, InvalidAcl, PatternType, ResourceType
from josef.authorizer import AclAuthorizer
from josef.server.dispatch import RequestContext

NO_AUTHORIZER = "No Authorizer is configured."


def binding_filter(f: Any) -> AclBindingFilter:
    """A DescribeAcls request or a DeleteAcls filter as an :class:`AclBindingFilter` (InvalidAcl for unknown codes)."""
    try:
        return AclBindingFilter(ResourceType(f.resource_type_filter), f.resource_name_filter,
                                PatternType(f.pattern_type_filter), f.principal_filter, f.host_filter,
                                AclOperation(f.operation), AclPermissionType(f.permission_type))
    except ValueError as exc:
        raise InvalidAcl(str(exc)) from None


def _described(acl: AclBinding, **extra: Any) -> dict[str, Any]:
    return {"resource_type": acl.resource_type, "resource_name": acl.resource_name,
            "pattern_type": acl.pattern_type, "principal": acl.principal, "host": acl.host,
            "operation": acl.operation, "permission_type": acl.permission_type, **extra}


async def describe_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "resources": []}
    if not isinstance(ctx.broker.authorizer, AclAuthorizer):
        return {**answer, "error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER}
    try:
        wanted = binding_filter(request)
        wanted.check()
    except InvalidAcl as exc:
        return {**answer, "error_code": ErrorCode.invalid_request, "error_message": str(exc)}
    by_resource: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for acl in ctx.broker.image.acls.values():
        if wanted.matches(acl):
            by_resource.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
                {"principal": acl.principal, "host": acl.host, "operation": acl.operation,
                 "permission_type": acl.permission_type})
    answer["resources"] = [{"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                           for (t, n, p), acls in sorted(by_resource.items())]
    return answer


async def create_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if not isinstance(ctx.broker.authorizer, AclAuthorizer):
        return {"throttle_time": 0, "results": [{"error_code": ErrorCode.security_disabled,
                                                 "error_message": NO_AUTHORIZER} for _ in request.creations]}
    bindings: list[AclBinding | str] = []
    for c in request.creations:
        try:
            bindings.append(AclBinding(ResourceType(c.resource_type), c.resource_name,
                                       PatternType(c.resource_pattern_type), c.principal, c.host,
                                       AclOperation(c.operation), AclPermissionType(c.permission_type)))
        except ValueError as exc:
            bindings.append(str(exc))
    errors = await ctx.broker.controller.create_acls(bindings)
    return {"throttle_time": 0, "results": [
        {"error_code": ErrorCode.none if error is None else ErrorCode.invalid_request, "error_message": error}
        for error in errors]}


async def delete_acls(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if not isinstance(ctx.broker.authorizer, AclAuthorizer):
        return {"throttle_time": 0, "filter_results": [
            {"error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER, "matching_acls": []}
            for _ in request.filters]}
    filters: list[AclBindingFilter | str] = []
    for f in request.filters:
        try:
            parsed = binding_filter(f)
            parsed.check()
            filters.append(parsed)
        except InvalidAcl as exc:
            filters.append(str(exc))
    results = await ctx.broker.controller.delete_acls(filters)
    return {"throttle_time": 0, "filter_results": [
        {"error_code": ErrorCode.invalid_request, "error_message": result, "matching_acls": []}
        if isinstance(result, str) else
        {"error_code": ErrorCode.none, "error_message": None, "matching_acls": [
            _described(acl, error_code=ErrorCode.none, error_message=None) for acl in result]}
        for result in results]}
