"""ApiVersions: the API keys and version ranges this broker answers, exactly."""

from __future__ import annotations

from typing import Any

from josef.server.dispatch import RequestContext


async def api_versions(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return ctx.broker.dispatcher.api_versions_body()
